"""Library behaviour a user meets (issue 37 item 21), each on a real store."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from duragent import Agent, Runtime, ScriptedModel, Store, TaskNotFound, TaskStatus, ToolCall, tool
from duragent.types import Task, ToolMessage, UserMessage


def quick_agent() -> Agent:
    return Agent(name="q", model=ScriptedModel(["done"]), plan_tool=False)


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
        name="r", model=ScriptedModel(say), tools=[send, lookup], plan_tool=False, tool_grace=0.0
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
