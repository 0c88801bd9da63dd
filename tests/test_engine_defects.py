"""Defects from the feature audit (issue 11 item 9), each on every store.

- a sync tool calling ctx.update_state (it runs in a thread) got an error result
  and a "coroutine '_save_after' was never awaited" warning;
- on_status_change never reported pending -> running;
- a task for an agent no worker knows stayed pending forever, with no reason.
"""

from __future__ import annotations

import asyncio
import gc
import warnings

import pytest

from duragent import Agent, Runtime, ScriptedModel, TaskStatus, Timing, ToolCall, ToolContext, tool
from duragent.runtime.presence import WORKERS_SCOPE, block_unserved, served_agents
from duragent.runtime.submit import new_task
from duragent.runtime.worker import Worker, WorkerOptions
from duragent.store.protocol import Store
from duragent.types import EntryKind, ToolMessage


@tool
def remember_sync(fact: str, ctx: ToolContext) -> str:
    """Remember a fact (a sync tool: it runs in a thread)."""
    ctx.update_state(facts=[*ctx.context.get("facts", []), fact])
    return "noted"


@pytest.mark.slow
async def test_a_sync_tool_updates_state_without_error_or_warning(store: Store) -> None:
    model = ScriptedModel([[ToolCall("remember_sync", {"fact": "sky"})], "done"])
    agent = Agent(name="a", model=model, tools=[remember_sync], timing=Timing(state_debounce=0.01))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        async with Runtime(store, agents=[agent]) as rt:
            task = await (await rt.submit("a", "x")).wait(30)
            view = await rt.messages(task.id)
        gc.collect()  # an un-awaited coroutine warns when it is collected
    assert [m.content for m in view if isinstance(m, ToolMessage)] == ["noted"]
    assert task.status is TaskStatus.COMPLETED and task.context == {"facts": ["sky"]}
    never_awaited = [w for w in caught if "never awaited" in str(w.message)]
    assert never_awaited == []


async def test_status_hook_reports_every_change_from_pending_to_completed(store: Store) -> None:
    seen: list[tuple[str, str]] = []
    model = ScriptedModel([[ToolCall("remember_sync", {"fact": "x"})], "ok"])
    agent = Agent(name="a", model=model, tools=[remember_sync])
    async with Runtime(
        store, agents=[agent], on_status_change=lambda t, a, b: seen.append((a.value, b.value))
    ) as rt:
        await (await rt.submit("a", "x")).wait(30)
    assert seen == [("pending", "running"), ("running", "completed")]


async def _pending(store: Store, agent: str) -> str:
    task, first = new_task(Agent(name=agent, model="scripted:none"), "hello")
    stored, _ = await store.create_task(task, [first])
    return stored.id


@pytest.mark.slow
async def test_a_task_no_worker_can_run_is_blocked_after_the_grace_period(store: Store) -> None:
    lost = await _pending(store, "nobody-knows-me")
    agent = Agent(name="known", model=ScriptedModel(["fine"]))
    async with Runtime(store, agents=[agent], missing_agent_grace=0.2) as rt:
        done = await (await rt.submit("known", "x")).wait(30)
        task = await rt.wait(lost, timeout=30, until=lambda t: t.status is TaskStatus.BLOCKED)
        ui = await rt.ui_messages(lost)
    assert done.status is TaskStatus.COMPLETED  # the known agent's task is not held up
    assert task.status_reason == "missing_definition"
    assert task.error is not None and "'nobody-knows-me'" in task.error
    assert "start a worker that defines it" in task.error
    assert any(getattr(m, "detail", None) == task.error for m in ui)
    statuses = [e.payload for e in await store.entries(lost) if e.kind is EntryKind.STATUS]
    assert statuses[-1]["to"] == "blocked" and statuses[-1]["reason"] == "missing_definition"


async def test_a_live_worker_that_knows_the_agent_keeps_its_task_unblocked(store: Store) -> None:
    """Worker B knows agent "b" but every slot of it is busy: its pending task is
    not blocked by worker A, whatever the grace; once B is gone, it is."""
    release = asyncio.Event()

    @tool
    async def hold() -> str:
        """Hold the only slot."""
        await release.wait()
        return "held"

    b_agent = Agent(
        name="b",
        model=ScriptedModel(lambda m: [ToolCall("hold")] if len(m) < 2 else "ok"),
        tools=[hold],
    )
    busy = await _pending(store, "b")
    waiting = await _pending(store, "b")
    worker_b = Worker(store, [b_agent], WorkerOptions(concurrency=1, missing_agent_grace=3600))
    job = asyncio.ensure_future(worker_b.run())
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while "b" not in await served_agents(store) or not worker_b.runners:
            assert loop.time() < deadline, "worker B did not start"
            await asyncio.sleep(0.01)
        queued = waiting if busy in worker_b.runners else busy
        assert (await store.get_task(queued)).status is TaskStatus.PENDING
        assert await block_unserved(store, ["a"], grace=0) == []  # B is alive and knows "b"
    finally:
        release.set()
        await worker_b.stop(graceful=False)
        await job
    assert await store.get_document(WORKERS_SCOPE, worker_b.id) is None  # B withdrew
    blocked = await block_unserved(store, ["a"], grace=0)
    assert queued in blocked
    for tid in blocked:
        task = await store.get_task(tid)
        assert (task.status, task.status_reason) == (TaskStatus.BLOCKED, "missing_definition")


async def test_the_grace_period_counts_from_when_the_task_became_pending(store: Store) -> None:
    lost = await _pending(store, "ghost")
    assert await block_unserved(store, [], grace=3600) == []  # too soon
    assert await block_unserved(store, [], grace=0) == [lost]
    assert await block_unserved(store, [], grace=0) == []  # blocked once, not again
    # Resumed (someone says the worker is back): the grace starts again.
    async with Runtime(store, agents=[], run_worker=False) as rt:
        await rt.resume(lost)
    assert await block_unserved(store, [], grace=3600) == []
