"""Library behaviour a user meets (issue 37 item 21), each on a real store."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from duragent import (
    Agent,
    BuiltinTools,
    Queue,
    Runtime,
    ScriptedModel,
    Store,
    TaskNotFound,
    TaskStatus,
    Timing,
    ToolCall,
    tool,
)
from duragent.llm.messages import WorkingView
from duragent.types import EntryKind, Task, ToolMessage, UserMessage, utcnow


def quick_agent() -> Agent:
    return Agent(name="q", model=ScriptedModel(["done"]), builtin_tools=BuiltinTools(plan=False))


async def test_the_views_of_a_missing_or_purged_task_raise_task_not_found(store: Store) -> None:
    async with Runtime(store, agents=[quick_agent()]) as rt:
        for read in (rt.model_view, rt.ui_messages, rt.messages, rt.get, rt.history):
            with pytest.raises(TaskNotFound):
                await read("t_nosuchtask")
        sub = await rt.submit("q", "hi")
        await sub.wait(20)
        assert await rt.model_view(sub.task_id)  # a task that is there has its view
        await rt.purge(before=timedelta(0), agent="q")
        for read in (rt.model_view, rt.ui_messages, rt.messages, rt.get, rt.history):
            with pytest.raises(TaskNotFound):
                await read(sub.task_id)


async def test_an_async_status_hook_is_awaited_for_every_change_in_order(store: Store) -> None:
    seen: list[tuple[str, str]] = []

    async def hook(task: Task, old: TaskStatus, new: TaskStatus) -> None:
        await asyncio.sleep(0)  # a real coroutine: it only counts once awaited
        seen.append((old.value, new.value))

    async with Runtime(store, agents=[quick_agent()], on_status_change=hook) as rt:
        sub = await rt.submit("q", "hi")
        await sub.wait(20)
    assert seen == [("pending", "running"), ("running", "completed")]


def rollback_agent(release: asyncio.Event, entered: asyncio.Event) -> Agent:
    @tool
    async def send() -> str:
        """Send (never replayed: its result stays)."""
        return "sent"

    @tool(replay="safe")
    async def lookup() -> str:
        """Look up (harmless to repeat)."""
        entered.set()
        await release.wait()
        return "looked up"

    def say(messages: list[Any]) -> Any:
        last = messages[-1]
        if isinstance(last, UserMessage) and last.content == "go":
            return [ToolCall("send"), ToolCall("lookup")]
        return f"re {getattr(last, 'content', '')!r}"

    return Agent(
        name="r",
        model=ScriptedModel(say),
        tools=[send, lookup],
        builtin_tools=BuiltinTools(plan=False),
        timing=Timing(tool_grace=0.0),
    )


async def test_a_round_rolled_back_by_a_new_message_says_so_not_paused(store: Store) -> None:
    release, entered = asyncio.Event(), asyncio.Event()
    async with Runtime(store, agents=[rollback_agent(release, entered)]) as rt:
        sub = await rt.submit("r", "go", owner="u")
        await entered.wait()
        await rt.send(sub.task_id, "never mind", owner="u", multitask_strategy="rollback")
        task = await sub.wait(20)
        view = await rt.model_view(task.id)
    assert task.status is TaskStatus.COMPLETED
    rolled = [m.content for m in view if isinstance(m, ToolMessage) and "Rolled back" in m.content]
    assert len(rolled) == 1, view
    assert "a new message came in" in rolled[0] and "paused" not in rolled[0]


def relay_agent(seen: list[list[str]]) -> Agent:
    """Three calls in one round, finishing last to first: each waits for the next."""
    done = {name: asyncio.Event() for name in ("a", "b", "c")}

    @tool
    async def step(name: str) -> str:
        """One leg of the relay."""
        after = {"a": "b", "b": "c"}.get(name)
        if after is not None:
            await done[after].wait()
        done[name].set()
        return f"leg {name}"

    def say(messages: list[Any]) -> Any:
        results = [m.content for m in messages if isinstance(m, ToolMessage)]
        if not results:
            return [ToolCall("step", {"name": n}) for n in ("a", "b", "c")]
        seen.append(results)
        return "relayed"

    return Agent(
        name="relay", model=ScriptedModel(say), tools=[step], builtin_tools=BuiltinTools(plan=False)
    )


async def test_parallel_results_reach_the_model_in_call_order(store: Store) -> None:
    seen: list[list[str]] = []
    async with Runtime(store, agents=[relay_agent(seen)]) as rt:
        sub = await rt.submit("relay", "go")
        task = await sub.wait(20)
        view = await rt.model_view(task.id)
        finished = [  # the log keeps them as they finished
            e.payload["content"]
            for e in await store.entries(task.id)
            if e.kind is EntryKind.TOOL_RESULT
        ]
        resumed = WorkingView(await store.model_view_data(task.id))  # what a takeover reads
    assert task.status is TaskStatus.COMPLETED
    assert finished == ["leg c", "leg b", "leg a"]
    in_order = ["leg a", "leg b", "leg c"]
    assert seen == [in_order]  # the model call after the round
    assert [m.content for m in view if isinstance(m, ToolMessage)] == in_order
    assert [m.content for m in resumed.messages() if isinstance(m, ToolMessage)] == in_order


async def test_a_queue_ttl_purges_a_finished_task_when_it_comes_due(store: Store) -> None:
    """Not at the worker's next periodic look (every 60 s): at the task's expiry."""
    async with Runtime(store, agents=[quick_agent()], queues=[Queue("q", ttl=0.5)]) as rt:
        sub = await rt.submit("q", "hi")
        task = await sub.wait(20)
        due = task.updated_at + timedelta(seconds=0.5)
        deadline = asyncio.get_running_loop().time() + 15  # far below the 60 s cycle
        while True:
            try:
                await rt.get(task.id)
            except TaskNotFound:
                break
            assert asyncio.get_running_loop().time() < deadline, "not purged at its ttl"
            await asyncio.sleep(0.05)
        assert utcnow() >= due  # not before its time either


def test_a_result_re_run_after_a_takeover_goes_to_its_call_s_place() -> None:
    """Calls a, b, c; a and c were answered before a crash, b is run again by the
    next owner: the model sees a, b, c (the view from the store, then b appended)."""
    calls = [
        {"id": c, "type": "function", "function": {"name": "step", "arguments": "{}"}}
        for c in "abc"
    ]
    view = WorkingView(
        [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": None, "tool_calls": calls},
            {"role": "tool", "tool_call_id": "a", "content": "leg a"},
            {"role": "tool", "tool_call_id": "c", "content": "leg c"},
        ]
    )
    view.append(ToolMessage(tool_call_id="b", content="leg b"))
    sent = view.messages()
    assert [m.tool_call_id for m in sent if isinstance(m, ToolMessage)] == ["a", "b", "c"]
    assert [m.get("tool_call_id") for m in sent.wire()][2:] == ["a", "b", "c"]
