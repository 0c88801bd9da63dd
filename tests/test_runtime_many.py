"""The Runtime's verbs for many tasks: queues with limits, priorities, metadata,
delayed starts, counts, purge and erase, with a real worker."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from duragent import (
    Agent,
    BuiltinTools,
    Queue,
    Runtime,
    ScriptedModel,
    TaskStatus,
    ToolCall,
    ToolContext,
    tool,
)
from duragent.errors import TaskNotFound, UsageError
from duragent.store import Commit, DocumentWrite, Store
from duragent.types import session_scope, utcnow

running_now = 0
most_at_once = 0


@tool
async def work(ctx: ToolContext) -> str:
    """Do a little work."""
    global running_now, most_at_once
    running_now += 1
    most_at_once = max(most_at_once, running_now)
    await asyncio.sleep(0.05)
    running_now -= 1
    return "ok"


def script(messages: list[object]) -> str | list[ToolCall]:
    from duragent.types import AssistantMessage

    if not any(isinstance(m, AssistantMessage) for m in messages):
        return [ToolCall("work", {})]
    return "done"


AGENT = Agent(name="w", model=ScriptedModel(script), tools=[work])


@pytest.mark.slow
async def test_queue_limit_priority_and_metadata_through_the_runtime(tmp_path: Path) -> None:
    global most_at_once
    most_at_once = 0
    url = f"sqlite:///{tmp_path}/rt.db"
    async with Runtime(url, agents=[AGENT], queues=[Queue("slow", concurrency=2)]) as rt:
        subs = [
            await rt.submit("w", f"job {i}", queue="slow", metadata={"batch": "b1"})
            for i in range(8)
        ]
        urgent = await rt.submit("w", "urgent", queue="slow", priority=10)
        for s in [*subs, urgent]:
            assert (await s.wait(30)).status is TaskStatus.COMPLETED
        assert most_at_once <= 2
        assert [q.name for q in await rt.queues()] == ["slow"]
        counts = await rt.counts()
        assert counts == {"slow": {"completed": 9}}
        assert await rt.counts(metadata={"batch": "b1"}) == {"slow": {"completed": 8}}
        page = await rt.list_tasks(queue="slow", metadata={"batch": "b1"}, limit=100)
        assert len(page.tasks) == 8
        first_started = await rt.get(urgent.task_id)
        later = await rt.get(subs[-1].task_id)
        assert first_started.queue == "slow" and later.metadata == {"batch": "b1"}


@pytest.mark.slow
async def test_start_at_holds_a_task_until_then(tmp_path: Path) -> None:
    async with Runtime(f"sqlite:///{tmp_path}/rt.db", agents=[AGENT]) as rt:
        with pytest.raises(UsageError, match="timezone-aware"):
            await rt.submit("w", "x", start_at=datetime.now())
        at = datetime.now(UTC) + timedelta(seconds=0.5)
        sub = await rt.submit("w", "later", start_at=at)
        done = await sub.wait(30)
        assert done.status is TaskStatus.COMPLETED
        # A worker was there all along: its claim (the first status entry) came
        # only at the start time, however long the submit itself took.
        started = [e for e in await rt.store.entries(sub.task_id) if e.kind.value == "status"]
        assert started[0].created_at >= at


async def test_purge_and_erase_owner(tmp_path: Path) -> None:
    async with Runtime(f"sqlite:///{tmp_path}/rt.db", agents=[AGENT]) as rt:
        a = await (await rt.submit("w", "a", owner="ann")).wait(30)
        b = await (await rt.submit("w", "b", owner="bob")).wait(30)
        held = await rt.submit("w", "c", owner="bob", session_id="s1", start_at=timedelta(hours=1))
        for owner in ("bob", "ann"):
            await rt.store.commit(
                Commit(documents=[DocumentWrite(session_scope(owner, "s1"), "notes", {"x": 1})])
            )
        await rt.schedule("nightly", "w", "x", cron="0 3 * * *", owner="bob")
        assert (await rt.purge(owner="ann", before=timedelta(seconds=-1))).tasks == 1
        with pytest.raises(TaskNotFound):
            await rt.get(a.id)
        result = await rt.erase_owner("bob")
        assert result.tasks == 2
        for tid in (b.id, held.task_id):
            with pytest.raises(TaskNotFound):
                await rt.get(tid)
        assert await rt.schedules(owner="bob") == []
        assert await rt.store.list_documents(session_scope("bob", "s1")) == []
        assert len(await rt.store.list_documents(session_scope("ann", "s1"))) == 1


def quick_agent() -> Agent:
    return Agent(name="q", model=ScriptedModel(["done"]), builtin_tools=BuiltinTools(plan=False))


@pytest.mark.slow
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
