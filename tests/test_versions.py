"""Agent versions (issue 43, item 1): a task is pinned to the version of its agent
it was created with, runs only on a worker serving that version, says so when
none does, and moves to another version only by a recorded migration."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from duragent import Agent, Runtime, ScriptedModel, TaskStatus, Timing, ToolCall, tool
from duragent.errors import ControlPending, InvalidOption, InvalidTransition, TaskNotFound
from duragent.runtime._agent import agents_by_name
from duragent.runtime._presence import WORKERS_SCOPE, announce, served_agents, served_versions
from duragent.runtime._submit import new_task
from duragent.runtime._versions import pinned_version
from duragent.store._memory import MemoryStore
from duragent.types import EntryKind, Task


@tool
def lookup(q: str) -> str:
    """Look something up."""
    return q


class Answer(BaseModel):
    text: str


def agent(**kw: Any) -> Agent:
    return Agent(**{"name": "a", "model": ScriptedModel(["hi"]), **kw})


def test_an_agent_without_a_declared_version_has_a_fingerprint_of_what_makes_it_answer() -> None:
    base = agent(instructions="be brief")
    assert base.version == agent(instructions="be brief").version  # stable
    assert base.version is not None and len(base.version) == 12
    others = [
        agent(instructions="be long"),
        agent(instructions="be brief", tools=[lookup]),
        agent(instructions="be brief", output_type=Answer),
        agent(instructions="be brief", model=ScriptedModel(["hi"], name="other")),
    ]
    assert len({base.version, *(a.version for a in others)}) == 5
    # What does not change the answers (timing) does not change the version.
    assert agent(instructions="be brief", timing=Timing(tool_grace=1)).version == base.version
    assert agent(version="v3").version == "v3"
    with pytest.raises(InvalidOption, match="agent version"):
        agent(version="v 3")


def test_a_task_records_its_agents_version_and_a_stand_in_none() -> None:
    task, _ = new_task(agent(version="v3"), "hi")
    assert task.agent_version == "v3"
    task, _ = new_task(agent(), "hi")
    assert task.agent_version == agent().version
    stand_in = Agent(name="a", model="scripted:none")
    assert pinned_version(stand_in) is None and new_task(stand_in, "hi")[0].agent_version is None
    assert new_task(Agent(name="a", model="scripted:none", version="v2"), "hi")[0].agent_version


async def test_served_versions_come_from_live_workers_that_are_not_draining() -> None:
    store = MemoryStore()
    await announce(store, "w1", ["a"], 30, versions={"a": "v1"})
    await announce(store, "w2", ["a", "b"], 30, versions={"a": "v2", "b": "v9"}, draining=True)
    await announce(store, "old", ["c"], 30)  # from before versions: any version of c
    assert await served_versions(store) == {"a": {"v1"}, "c": None}
    assert await served_agents(store) == {"a", "c"}


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/versions.db"


def v(version: str, turns: list[Any], **kw: Any) -> list[Agent]:
    return [Agent(name="a", model=ScriptedModel(turns), version=version, **kw)]


@pytest.fixture
async def submitter(url: str) -> AsyncIterator[Runtime]:
    """Submits for version v2 of agent `a`, and runs nothing."""
    async with Runtime(url, agents=v("v2", ["two"]), run_worker=False) as rt:
        yield rt


async def announced(rt: Runtime) -> None:
    rt.start_worker()
    assert rt.worker is not None
    while await rt.store.get_document(WORKERS_SCOPE, rt.worker.id) is None:
        await asyncio.sleep(0.01)


async def test_a_worker_runs_only_its_versions_tasks_and_an_unserved_one_says_so(
    url: str, submitter: Runtime
) -> None:
    new = await submitter.submit("a", "for v2")  # older than `old`: claimed first if it could be
    async with Runtime(url, agents=v("v1", ["one"]), concurrency=1, poll_interval=0.05) as rt1:
        old = await rt1.submit("a", "for v1")
        assert (await rt1.get(old.task_id)).agent_version == "v1"
        done = await rt1.wait(old.task_id, timeout=30)
        assert done.status is TaskStatus.COMPLETED and done.output == "one"
        await announced(rt1)
        waiting = await submitter.get(new.task_id)
        assert waiting.status is TaskStatus.PENDING and waiting.lease.epoch == 0  # never claimed
        assert await submitter.unserved([waiting, done]) == {
            new.task_id: "waiting for a@v2: no worker serves it"
        }
        async with Runtime(url, agents=v("v2", ["two"]), poll_interval=0.05) as rt2:
            await announced(rt2)
            finished = await rt2.wait(new.task_id, timeout=30)
            assert finished.status is TaskStatus.COMPLETED and finished.output == "two"


async def test_a_migration_moves_a_waiting_task_to_another_version_and_is_recorded(
    url: str, submitter: Runtime
) -> None:
    task = await submitter.submit("a", "for v2", owner="ann")
    with pytest.raises(TaskNotFound):  # owners act only on their own tasks
        await submitter.migrate(task.task_id, "v1", owner="bob")
    with pytest.raises(InvalidOption):
        await submitter.migrate(task.task_id, "not a version")
    moved = await submitter.migrate(task.task_id, "v1", owner="ann", by="ann")
    assert moved.agent_version == "v1" and moved.status is TaskStatus.PENDING
    async with Runtime(url, agents=v("v1", ["one"]), poll_interval=0.05) as rt1:
        rt1.start_worker()
        done = await rt1.wait(task.task_id, timeout=30)
    assert done.status is TaskStatus.COMPLETED and done.output == "one"
    statuses = await submitter.store.entries(task.task_id, kinds=[EntryKind.STATUS])
    records = [e.payload["migration"] for e in statuses if "migration" in e.payload]
    assert records == [{"from": "v2", "to": "v1", "by": "ann"}]
    ui = [m.model_dump() for m in await submitter.store.ui_messages(task.task_id)]
    assert any("Migrated from a@v2 to a@v1" in str(m) for m in ui)
    with pytest.raises(InvalidTransition, match="fork it"):
        await submitter.migrate(task.task_id, "v2")


async def test_a_running_task_is_handed_back_by_its_worker_and_goes_on_in_the_new_version(
    url: str, submitter: Runtime
) -> None:
    started, let_go = asyncio.Event(), asyncio.Event()

    @tool(replay="safe")
    async def hold() -> str:
        """Wait for the test."""
        started.set()
        await let_go.wait()
        return "held"

    slow = Timing(tool_grace=600)  # the hand-back waits for the tool, not a timer
    v1 = v("v1", [[ToolCall("hold")], "one"], tools=[hold], timing=slow)
    v2 = v("v2", [[ToolCall("hold")], "two"], tools=[hold], timing=slow)
    async with (
        Runtime(url, agents=v1, poll_interval=0.05, lease_ttl=600) as rt1,
        Runtime(url, agents=v2, poll_interval=0.05, lease_ttl=600) as rt2,
    ):
        sub = await rt1.submit("a", "go")
        await asyncio.wait_for(started.wait(), 30)
        await announced(rt2)
        moved = await submitter.migrate(sub.task_id, "v2")
        assert moved.status is TaskStatus.RUNNING and moved.agent_version == "v2"
        let_go.set()  # the tool ends in v1's worker; v1 hands the task back at once
        done = await rt2.wait(sub.task_id, timeout=60)
        assert rt1.worker is not None and rt2.worker is not None
        ids = [rt1.worker.id, rt2.worker.id]
    assert done.status is TaskStatus.COMPLETED and done.output == "two"
    assert done.restarts == 0 and done.control is None  # handed back, no lease waited out
    statuses = [
        e.payload for e in await submitter.store.entries(sub.task_id, kinds=[EntryKind.STATUS])
    ]
    moves = [(s["from"], s["to"]) for s in statuses]
    assert moves.index(("running", "pending")) > next(
        i for i, s in enumerate(statuses) if "migration" in s
    )
    assert [s["worker"] for s in statuses if "worker" in s] == ids  # the claims
    results = await submitter.store.entries(sub.task_id, kinds=[EntryKind.TOOL_RESULT])
    assert [e.payload["outcome"] for e in results] == ["ok"]  # ran once, to its end


async def test_old_tasks_without_a_version_run_on_any_version(url: str) -> None:
    async with Runtime(url, agents=v("v2", ["two"]), poll_interval=0.05) as rt:
        created, _ = await rt.store.create_task(Task(agent="a", input="from before versions"))
        rt.start_worker()
        done = await rt.wait(created.id, timeout=30)
    assert done.status is TaskStatus.COMPLETED and done.agent_version is None


async def test_a_migration_keeps_a_stop_already_requested_on_the_row(
    url: str, submitter: Runtime
) -> None:
    # A pause left on the row for a worker that has not acted on it (gone, its lease
    # not yet expired): the migration must not replace it with its hand-back, or
    # the next claim clears it and the task runs on instead of pausing.
    task = await submitter.submit("a", "for v2")
    held = await submitter.store.claim_task("gone", task_id=task.task_id, ttl=600)
    assert held is not None
    with pytest.raises(ControlPending):
        await submitter.pause(task.task_id, timeout=0.05)
    moved = await submitter.migrate(task.task_id, "v1")
    assert moved.agent_version == "v1"
    assert moved.control is not None and moved.control["action"] == "pause"


def test_an_agents_fingerprint_covers_the_agents_it_hands_off_to() -> None:
    # A task handed off runs its later rounds on the target's definition, under
    # the root's version: a change there (or a new handoff) is a new version.
    def root(target_instructions: str | None) -> Agent:
        targets = (
            []
            if target_instructions is None
            else [agent(name="b", instructions=target_instructions)]
        )
        return agent(instructions="route", handoffs=targets)

    assert root("refund").version == root("refund").version
    assert len({root(None).version, root("refund").version, root("refund twice").version}) == 3
    assert root(None).version == agent(instructions="route").version  # no handoffs: as before

    def cycle(b_instructions: str) -> tuple[Agent, Agent]:
        a = agent(instructions="route")
        b = agent(name="b", instructions=b_instructions, handoffs=[a])
        a.handoffs = [b]  # closed after both exist
        agents_by_name([a])
        return a, b

    (a1, b1), (a2, b2) = cycle("x"), cycle("x")
    assert (a1.version, b1.version) == (a2.version, b2.version)
    a3, b3 = cycle("y")
    assert a3.version != a1.version and b3.version != b1.version
    lone_b = agent(name="b", instructions="x", handoffs=[agent(instructions="route")])
    assert b1.version != lone_b.version  # its target `a` hands back to it now


def test_a_wrapped_framework_agents_version_follows_the_agent_it_wraps() -> None:
    # The wrapper's own definition (one run tool, a driver model) is the same for
    # every agent it wraps: the version must come from the wrapped agent.
    import agents
    from pydantic_ai import Agent as PydanticAgent
    from pydantic_ai.models.test import TestModel

    from duragent import openai_agents, pydantic_ai

    def pyd(instructions: str, model: str = "m", tools: bool = True) -> str | None:
        wrapped = PydanticAgent(TestModel(model_name=model), instructions=instructions)
        if tools:
            wrapped.tool_plain(lookup.fn)
        return pydantic_ai.DurableAgent(wrapped, name="p").agent.version

    assert pyd("be brief") == pyd("be brief")
    assert (
        len({pyd("be brief"), pyd("be long"), pyd("be brief", "n"), pyd("be brief", tools=False)})
        == 4
    )

    def sdk(instructions: str, model: str = "gpt-4o", target: str = "refunds") -> str | None:
        other = agents.Agent(name="b", instructions=target)
        wrapped = agents.Agent(name="a", instructions=instructions, model=model, handoffs=[other])
        return openai_agents.DurableAgent(wrapped, name="o").agent.version

    assert sdk("be brief") == sdk("be brief")
    versions = {
        sdk("be brief"),
        sdk("be long"),
        sdk("be brief", "gpt-5"),
        sdk("be brief", target="x"),
    }
    assert len(versions) == 4
    declared = openai_agents.DurableAgent(
        agents.Agent(name="a"), name="o", options={"version": "v7"}
    )
    assert declared.agent.version == "v7"
