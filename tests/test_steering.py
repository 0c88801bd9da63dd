"""Steering a finished or running task: its history round by round, and forks (issue 13)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from duragent import (
    Agent,
    Edit,
    Runtime,
    ScriptedModel,
    Store,
    TaskNotFound,
    TaskStatus,
    ToolCall,
    UsageError,
    tool,
)
from duragent.types import AssistantMessage, EntryKind, ToolMessage, UserMessage


class Counter:
    """Counts the runs of each tool, across every task of the test."""

    def __init__(self) -> None:
        self.runs: dict[str, int] = {}

    def tools(self) -> list[Any]:
        @tool
        def add(a: int, b: int) -> int:
            """Add two numbers."""
            self.runs["add"] = self.runs.get("add", 0) + 1
            return a + b

        @tool
        def explode() -> str:
            """Always fails."""
            self.runs["explode"] = self.runs.get("explode", 0) + 1
            raise RuntimeError("boom")

        return [add, explode]


def three_rounds(messages: list[Any]) -> Any:
    """Round 1 adds, round 2 explodes, round 3 answers with what it last saw."""
    done = sum(isinstance(m, AssistantMessage) for m in messages)
    if done == 0:
        return [ToolCall("add", {"a": 2, "b": 3})]
    if done == 1:
        return [ToolCall("explode")]
    last_user = [m.content for m in messages if isinstance(m, UserMessage)][-1]
    return f"answer to {last_user!r} after {done} rounds"


def agent(counter: Counter) -> Agent:
    return Agent(
        name="a", model=ScriptedModel(three_rounds), tools=counter.tools(), plan_tool=False
    )


async def finished_source(store: Store, counter: Counter) -> str:
    async with Runtime(store, agents=[agent(counter)]) as rt:
        task = await (await rt.submit("a", "add them", owner="u")).wait(20)
    assert task.status is TaskStatus.COMPLETED and task.iterations == 3
    return task.id


@pytest.mark.slow
async def test_history_lists_rounds_with_calls_results_and_outcomes(store: Store) -> None:
    counter = Counter()
    tid = await finished_source(store, counter)
    rt = Runtime(store, agents=[agent(counter)], run_worker=False)
    hist = await rt.history(tid, owner="u")
    assert [r.round for r in hist.rounds] == [1, 2, 3]
    assert all(r.status == "complete" and not r.voided for r in hist.rounds)
    r1, r2, r3 = hist.rounds
    assert r1.user == ["add them"] and r2.user == [] and r3.user == []
    assert [(c.name, c.result, c.outcome) for c in r1.calls] == [("add", "5", "ok")]
    assert r2.calls[0].name == "explode" and r2.calls[0].outcome == "error"
    assert "RuntimeError: boom" in (r2.calls[0].result or "")
    assert r3.calls == [] and r3.assistant == "answer to 'add them' after 2 rounds"
    assert r1.first_seq <= r1.last_seq < r2.first_seq <= r2.last_seq < r3.first_seq
    assert hist.iterations == 3 and hist.forked_from is None
    with pytest.raises(TaskNotFound):
        await rt.history(tid, owner="someone else")


@pytest.mark.slow
async def test_fork_copies_the_view_through_round_n_and_never_reruns_its_tools(
    store: Store,
) -> None:
    counter = Counter()
    tid = await finished_source(store, counter)
    assert counter.runs == {"add": 1, "explode": 1}
    before = await store.entries(tid)
    async with Runtime(store, agents=[agent(counter)]) as rt:
        source_view = await rt.model_view(tid)
        sub = await rt.fork(tid, at_round=1, owner="u")
        fork = await sub.wait(20)
        assert sub.created and fork.id != tid
        assert fork.status is TaskStatus.COMPLETED
        assert fork.owner == "u" and fork.agent == "a"
        assert fork.config["forked_from"] == {"task_id": tid, "round": 1}
        view = await rt.model_view(fork.id)
        hist = await rt.history(fork.id)
    # Round 1 (user, the add call, its result) is copied; the fork ran rounds 2 and 3.
    assert view[:3] == source_view[:3]
    assert isinstance(view[2], ToolMessage) and view[2].content == "5"
    assert counter.runs == {"add": 1, "explode": 2}  # add never re-ran
    assert [r.round for r in hist.rounds] == [1, 2, 3]
    assert hist.forked_from is not None and hist.forked_from.task_id == tid
    # The source is untouched.
    assert await store.entries(tid) == before
    first = (await store.entries(fork.id))[0]
    assert first.kind is EntryKind.CHECKPOINT and first.payload["type"] == "fork"


@pytest.mark.slow
async def test_fork_edits_are_entries_in_the_forks_log(store: Store) -> None:
    counter = Counter()
    tid = await finished_source(store, counter)
    rt = Runtime(store, agents=[agent(counter)], run_worker=False)
    source = await rt.model_view(tid)

    replaced = await rt.fork(tid, 2, edit=Edit(replace_last_user="add them twice"))
    view = await rt.model_view(replaced.task_id)
    assert view[0] == UserMessage(content="add them twice") and view[1:] == source[1:5]

    dropped = await rt.fork(tid, 2, edit=Edit(drop_last_assistant=True))
    view = await rt.model_view(dropped.task_id)
    assert view == source[:3]  # round 2's call and its result are gone together
    hist = await rt.history(dropped.task_id)
    assert [(r.round, r.voided) for r in hist.rounds] == [(1, False), (2, True)]

    appended = await rt.fork(tid, 3, edit=Edit(append_user="and now subtract"))
    view = await rt.model_view(appended.task_id)
    assert view[:-1] == source and view[-1] == UserMessage(content="and now subtract")
    kinds = [e.kind for e in await store.entries(appended.task_id)]
    assert kinds.count(EntryKind.ROLLBACK) == 0

    # Each fork runs from its edited view; the source still says what it said.
    async with Runtime(store, agents=[agent(counter)]) as worker_rt:
        out = await worker_rt.wait(appended.task_id, timeout=20)
        assert out.output == "answer to 'and now subtract' after 3 rounds"
        out = await worker_rt.wait(replaced.task_id, timeout=20)
        assert out.output == "answer to 'add them twice' after 2 rounds"
        assert (await worker_rt.get(tid)).output == "answer to 'add them' after 2 rounds"
    assert counter.runs["add"] == 1


async def test_fork_refuses_a_round_whose_calls_are_not_all_answered(store: Store) -> None:
    @tool(requires_approval=True)
    def deploy() -> str:
        """Deploy."""
        return "deployed"

    script = ScriptedModel([[ToolCall("deploy")], "done"])
    waiting_agent = Agent(name="w", model=script, tools=[deploy], plan_tool=False)
    async with Runtime(store, agents=[waiting_agent]) as rt:
        sub = await rt.submit("w", "ship it", owner="u")
        task = await rt.wait(sub.task_id, timeout=20, until=lambda t: t.status.value == "waiting")
        assert task.iterations == 0
        with pytest.raises(UsageError, match=r"round 1 .* not complete: calls call_\w+ have no"):
            await rt.fork(task.id, 1)
        with pytest.raises(UsageError, match="round 2 does not exist"):
            await rt.fork(task.id, 2)
        with pytest.raises(UsageError, match="at_round must be 1 or more"):
            await rt.fork(task.id, 0)
        hist = await rt.history(task.id)
        assert [(r.round, r.status) for r in hist.rounds] == [(1, "open")]
        assert hist.rounds[0].calls[0].outcome is None
        # Nothing was created by the refusals.
        assert len((await rt.list(owner="u")).tasks) == 1


@pytest.mark.slow
async def test_fork_is_owner_scoped_and_idempotent_by_request_id(store: Store) -> None:
    counter = Counter()
    tid = await finished_source(store, counter)
    rt = Runtime(store, agents=[agent(counter)], run_worker=False)
    with pytest.raises(TaskNotFound):
        await rt.fork(tid, 1, owner="intruder")
    a = await rt.fork(tid, 1, owner="u", request_id="r1")
    b = await rt.fork(tid, 1, owner="u", request_id="r1")
    assert a.created and not b.created and a.task_id == b.task_id
    # Back to the start with another prompt: drop round 1's answer, replace the question.
    restart = await rt.fork(tid, 1, edit=Edit(drop_last_assistant=True, replace_last_user="x"))
    assert await rt.model_view(restart.task_id) == [UserMessage(content="x")]
    forked = await rt.get(a.task_id)
    assert forked.status is TaskStatus.PENDING and forked.iterations == 1


async def test_a_fork_of_a_fork_links_to_its_own_source(store: Store) -> None:
    counter = Counter()
    tid = await finished_source(store, counter)
    rt = Runtime(store, agents=[agent(counter)], run_worker=False)
    first = await rt.fork(tid, 3)
    # A fork's copied rounds are complete rounds of its own: it can be forked there.
    second = await rt.fork(first.task_id, 2)
    assert (await rt.get(second.task_id)).config["forked_from"] == {
        "task_id": first.task_id,
        "round": 2,
    }
    assert await rt.model_view(second.task_id) == (await rt.model_view(tid))[:5]


async def test_a_tool_timeout_tells_the_model_the_limit(tmp_path: Any) -> None:
    @tool(timeout=0.05)
    async def slow() -> str:
        """Takes too long."""
        await asyncio.sleep(30)
        return "late"

    @tool(timeout=5)
    async def own_timeout() -> str:
        """Raises its own TimeoutError."""
        raise TimeoutError("upstream took too long")

    script = ScriptedModel([[ToolCall("slow"), ToolCall("own_timeout")], "ok"])
    a = Agent(name="t", model=script, tools=[slow, own_timeout], plan_tool=False)
    async with Runtime(f"sqlite:///{tmp_path}/t.db", agents=[a]) as rt:
        task = await (await rt.submit("t", "go")).wait(20)
        results = [m.content for m in await rt.model_view(task.id) if isinstance(m, ToolMessage)]
    assert sorted(results) == [
        "Error: TimeoutError: upstream took too long",
        "Error: Tool call timed out after 0.05 s (the tool's time limit).",
    ]


@pytest.mark.slow
def test_the_guides_steering_example_runs(tmp_path: Any) -> None:
    import subprocess
    import sys

    from support.readme import first_block_under

    script = tmp_path / "steer.py"
    script.write_text(first_block_under("Steering a task"))
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert out.count("add(2, 3) runs") == 1  # the fork did not run the copied call again
    assert "Answered: now explain it {'task_id': 't_" in out and "'round': 1}" in out


@pytest.mark.slow
async def test_a_rolled_back_round_is_shown_voided_and_never_copied(store: Store) -> None:
    release = asyncio.Event()

    # Replay-safe: a rollback voids the whole round. (A never-replay call that
    # completed would keep its result in the model's view, and close the round.)
    @tool(replay="safe")
    async def slow() -> str:
        """A tool the test holds open."""
        await release.wait()
        return "slow done"

    @tool(replay="safe")
    def quick() -> str:
        """Returns at once."""
        return "quick done"

    model = ScriptedModel([[ToolCall("quick")], [ToolCall("slow")], "finished"])
    a = Agent(name="r", model=model, tools=[quick, slow], plan_tool=False, tool_grace=10)
    async with Runtime(store, agents=[a]) as rt:
        sub = await rt.submit("r", "go")
        await rt.wait(sub.task_id, timeout=20, until=lambda t: t.iterations == 1)
        async for e in rt.subscribe(sub.task_id):
            if e.kind is EntryKind.TOOL_INTENT and e.round == 2:
                break
        pausing = asyncio.ensure_future(rt.pause(sub.task_id, rollback=True))

        async def requested() -> None:  # the runner has the pause before the tool ends
            assert rt.worker is not None
            while (runner := rt.worker.runner(sub.task_id)) is None or runner.control is None:
                await asyncio.sleep(0.01)

        await asyncio.wait_for(requested(), 30)
        release.set()
        paused = await asyncio.wait_for(pausing, 20)
        assert paused.status is TaskStatus.PAUSED and paused.iterations == 1
        hist = await rt.history(sub.task_id)
        assert [(r.round, r.status, r.voided) for r in hist.rounds] == [
            (1, "complete", False),
            (2, "voided", True),
        ]
        with pytest.raises(UsageError, match=r"round 2 .* not complete"):
            await rt.fork(sub.task_id, 2)
        early = await rt.fork(sub.task_id, 1)
        assert len(await rt.model_view(early.task_id)) == 3  # user, quick call, its result
        await rt.resume(sub.task_id)
        done = await sub.wait(20)
        assert done.status is TaskStatus.COMPLETED and done.output == "finished"
        hist = await rt.history(sub.task_id)
        assert [(r.round, r.status, r.voided) for r in hist.rounds] == [
            (1, "complete", False),
            (2, "complete", True),  # redone after the rollback
            (3, "complete", False),
        ]
        late = await rt.fork(sub.task_id, 2)
        view = await rt.model_view(late.task_id)
    # The redone round only: every call answered exactly once, nothing voided copied.
    calls = [c.id for m in view if isinstance(m, AssistantMessage) for c in m.tool_calls or ()]
    answers = [m.tool_call_id for m in view if isinstance(m, ToolMessage)]
    assert calls == answers and len(calls) == 2
    assert view == (await Runtime(store, run_worker=False).model_view(sub.task_id))[:5]
