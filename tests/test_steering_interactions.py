"""Where steering verbs meet: a stop cutting a round with a call awaiting approval, a
control request written while an interrupt commits, a pause of a delayed start."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from duragent import (
    Agent,
    BuiltinTools,
    Runtime,
    ScriptedModel,
    Store,
    TaskStatus,
    Timing,
    ToolCall,
    ToolContext,
    tool,
)
from duragent.runtime._waits import open_waits
from duragent.store import Commit, TaskPatch
from duragent.types import AssistantMessage, ToolMessage


async def control_held(rt: Runtime, task_id: str, *, interrupt: bool) -> None:
    """Until the task's runner holds the request (an interrupt, or a pause)."""

    async def look() -> None:
        assert rt.worker is not None
        while True:
            runner = rt.worker.runner(task_id)
            held = None if runner is None else runner.control
            if held is not None and bool(held.resume) == interrupt:
                return
            await asyncio.sleep(0.01)

    await asyncio.wait_for(look(), 30)


@pytest.mark.parametrize("how", ["pause", "interrupt"])
async def test_a_call_awaiting_approval_cut_by_a_stop_never_runs_unapproved(
    store: Store, how: str
) -> None:
    started, go, peeked = asyncio.Event(), asyncio.Event(), []

    @tool
    async def slow() -> str:
        """Slow."""
        started.set()
        await go.wait()
        return "slow done"

    @tool(replay="safe", requires_approval=True)
    def peek(path: str) -> str:
        """Read a private file (safe to repeat, but a person must approve)."""
        peeked.append(path)
        return "secret"

    def script(messages: list[Any]) -> Any:
        if not any(isinstance(m, AssistantMessage) for m in messages):
            return [ToolCall("slow", {}), ToolCall("peek", {"path": "/etc/shadow"})]
        return "done"

    agent = Agent(
        name="a",
        model=ScriptedModel(script),
        tools=[slow, peek],
        builtin_tools=BuiltinTools(plan=False),
        timing=Timing(tool_grace=60),
    )
    async with Runtime(store, agents=[agent]) as rt:
        sub = await rt.submit("a", "hi", owner="u")
        await asyncio.wait_for(started.wait(), 30)
        if how == "pause":
            stopping = asyncio.ensure_future(rt.pause(sub.task_id))
            await control_held(rt, sub.task_id, interrupt=False)
            go.set()  # slow finishes within the grace; peek's wait was never written
            assert (await stopping).status is TaskStatus.PAUSED
            await rt.resume(sub.task_id)
        else:
            await rt.send(sub.task_id, "also this", multitask_strategy="interrupt")
            await control_held(rt, sub.task_id, interrupt=True)
            go.set()
        task = await rt.wait(
            sub.task_id,
            timeout=30,
            until=lambda t: t.status in (TaskStatus.WAITING, TaskStatus.COMPLETED),
        )
        assert peeked == [], "peek ran although nobody approved it"
        assert task.status is TaskStatus.WAITING
        waits = await open_waits(rt.store, task)
        assert [w["wait"] for w in waits.values()] == ["approval"]  # peek's, asked now
        results = [m for m in await rt.model_view(sub.task_id) if isinstance(m, ToolMessage)]
        assert [m.content for m in results] == ["slow done"]  # peek: still unanswered
        await rt.respond(sub.task_id, approve=True)
        done = await sub.wait(30)
        assert done.status is TaskStatus.COMPLETED and peeked == ["/etc/shadow"]


async def test_an_abort_written_while_an_interrupt_commits_is_not_lost(store: Store) -> None:
    started, go = asyncio.Event(), asyncio.Event()

    @tool
    async def slow() -> str:
        """Slow."""
        started.set()
        await go.wait()
        return "done"

    def script(messages: list[Any]) -> Any:
        rounds = sum(isinstance(m, AssistantMessage) for m in messages)
        return [ToolCall("slow", {})] if rounds < 3 else "fin"

    agent = Agent(
        name="a", model=ScriptedModel(script), tools=[slow], builtin_tools=BuiltinTools(plan=False)
    )
    async with Runtime(store, agents=[agent]) as rt:
        sub = await rt.submit("a", "x", owner="u")
        await asyncio.wait_for(started.wait(), 30)
        real = store.commit
        aborted = False

        async def abort_first(commit: Commit) -> Any:
            """Another process (the REST server, say) aborts just before the runner's
            'Interrupted by a new message' commit lands."""
            nonlocal aborted
            if not aborted and any(
                "Interrupted by a new message" in str(e.payload) for e in commit.entries
            ):
                aborted = True
                row = await store.get_task(sub.task_id)
                request = {"action": "abort", "rollback": False, "reason": "stop it"}
                await real(
                    Commit(
                        patches=[
                            TaskPatch(
                                sub.task_id,
                                {"control": request},
                                expect_status=[TaskStatus.RUNNING],
                                expect_version=row.version,
                            )
                        ]
                    )
                )
            return await real(commit)

        store.commit = abort_first  # type: ignore[method-assign]
        try:
            await rt.send(sub.task_id, "also", multitask_strategy="interrupt")
            await control_held(rt, sub.task_id, interrupt=True)
            go.set()
            task = await rt.wait(sub.task_id, timeout=30, until=lambda t: t.status.terminal)
        finally:
            store.commit = real  # type: ignore[method-assign]
        assert aborted
        assert task.status is TaskStatus.ABORTED, task.status


async def test_pausing_a_delayed_start_keeps_its_start_time(store: Store) -> None:
    agent = Agent(
        name="a", model=ScriptedModel(lambda m: "ran"), builtin_tools=BuiltinTools(plan=False)
    )
    async with Runtime(store, agents=[agent]) as rt:
        sub = await rt.submit("a", "x", owner="u", start_at=timedelta(hours=2))
        task = await rt.get(sub.task_id)
        assert task.status is TaskStatus.PENDING and task.wake_at is not None
        paused = await rt.pause(task.id)
        assert paused.status is TaskStatus.PAUSED and paused.wake_at == task.wake_at
        resumed = await rt.resume(task.id)
        assert resumed is not None
        assert resumed.status is TaskStatus.PENDING and resumed.wake_at == task.wake_at


async def test_an_interrupt_leaves_a_recorded_wait_open(store: Store) -> None:
    """A resumed round asks its recorded timer again while an approved call runs;
    an interrupt then stops the round. The timer's wait stays open, as the log
    holds it: it is never answered "cancelled before its wait began"."""
    started, go = asyncio.Event(), asyncio.Event()

    @tool
    def nap(ctx: ToolContext) -> Any:
        """Sleep an hour."""
        return ctx.sleep(3600)

    @tool(requires_approval=True)
    async def deploy() -> str:
        """Deploy (a person approves)."""
        started.set()
        await go.wait()
        return "deployed"

    def boss(messages: list[Any]) -> Any:
        if not any(isinstance(m, AssistantMessage) for m in messages):
            return [ToolCall("nap"), ToolCall("deploy")]
        return "done"

    a = Agent(
        name="a",
        model=ScriptedModel(boss),
        tools=[nap, deploy],
        builtin_tools=BuiltinTools(plan=False),
    )
    async with Runtime(store, agents=[a]) as rt:
        sub = await rt.submit("a", "go", owner="u", multitask_strategy="interrupt")
        parked = await rt.wait(sub.task_id, timeout=30, until=lambda t: t.status.value == "waiting")
        waits = await open_waits(store, parked)
        assert sorted(w["wait"] for w in waits.values()) == ["approval", "timer"]
        await rt.pause(sub.task_id)
        await rt.respond(sub.task_id, approve=True)  # recorded; the task stays paused
        await rt.resume(sub.task_id)
        await asyncio.wait_for(started.wait(), 30)  # deploy runs, nap's timer asked again
        await rt.send(sub.task_id, "also this", owner="u")
        await control_held(rt, sub.task_id, interrupt=True)
        go.set()
        task = await rt.wait(
            sub.task_id,
            timeout=30,
            until=lambda t: t.status.value == "waiting" and t.control is None,
        )
        waits = await open_waits(store, task)
        results = [m.content for m in await rt.model_view(task.id) if isinstance(m, ToolMessage)]
    assert [w["wait"] for w in waits.values()] == ["timer"]  # still the hour's sleep
    assert results == ["deployed"]  # and nothing for nap
