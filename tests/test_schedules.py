"""Schedules: each tick submits exactly one task, missed ticks catch up by the
documented policy (only the latest runs), overlap policies, and ticks stay
exactly-once across racing workers and a worker killed with SIGKILL."""

from __future__ import annotations

import asyncio
import signal
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from duragent import Agent, Runtime, ScriptedModel
from duragent.errors import ScheduleNotFound
from duragent.runtime._schedules import (
    Overlap,
    fire_due,
    get_schedule,
    new_schedule,
    put_schedule,
)
from duragent.store import Store, TaskQuery, open_store
from support.workerlib import WorkerProc

CHAT = Agent(name="chat", model=ScriptedModel(lambda messages: "done"))


async def scheduled(store: Store, name: str) -> list[str]:
    page = await store.list_tasks(TaskQuery(metadata={"schedule": name}, limit=1000))
    return sorted(t.request_id or "" for t in page.tasks)


async def test_a_due_tick_submits_one_task_and_moves_on(store: Store) -> None:
    t0 = datetime(2030, 1, 1, tzinfo=UTC)
    await put_schedule(store, new_schedule("s", "chat", "hi", every=60, start_at=t0, owner="u"))
    fired, soonest = await fire_due(store, {"chat": CHAT}, now=t0 - timedelta(seconds=1))
    assert fired == [] and soonest == t0
    fired, _ = await fire_due(store, {"chat": CHAT}, now=t0 + timedelta(seconds=1))
    assert len(fired) == 1
    task = await store.get_task(fired[0])
    assert task.owner == "u" and task.agent == "chat" and task.input == "hi"
    assert task.request_id == f"schedule:s:{t0.isoformat()}"
    again, _ = await fire_due(store, {"chat": CHAT}, now=t0 + timedelta(seconds=2))
    assert again == []  # the same tick never fires twice
    sched = await get_schedule(store, "s", owner="u")
    assert sched.next_at == t0 + timedelta(seconds=60) and sched.last_task_id == task.id


async def test_missed_ticks_catch_up_with_only_the_latest(store: Store) -> None:
    t0 = datetime(2030, 1, 1, tzinfo=UTC)
    await put_schedule(
        store, new_schedule("s", "chat", "x", every=60, start_at=t0, overlap="allow")
    )
    now = t0 + timedelta(minutes=10, seconds=30)  # ticks 0..10 were missed
    fired, _ = await fire_due(store, {"chat": CHAT}, now=now)
    assert len(fired) == 1
    latest = t0 + timedelta(minutes=10)
    assert (await store.get_task(fired[0])).request_id == f"schedule:s:{latest.isoformat()}"
    assert (await get_schedule(store, "s")).next_at == t0 + timedelta(minutes=11)


async def test_racing_workers_fire_a_tick_once(store: Store) -> None:
    t0 = datetime(2030, 1, 1, tzinfo=UTC)
    await put_schedule(store, new_schedule("s", "chat", "x", every=60, start_at=t0))
    now = t0 + timedelta(seconds=5)
    results = await asyncio.gather(*(fire_due(store, {"chat": CHAT}, now=now) for _ in range(5)))
    assert sum(len(fired) for fired, _ in results) == 1
    assert len(await scheduled(store, "s")) == 1


async def test_overlap_skip_and_queue_wait_for_the_previous_run(store: Store) -> None:
    t0 = datetime(2030, 1, 1, tzinfo=UTC)
    overlaps: tuple[tuple[str, Overlap], ...] = (("skip", "skip"), ("queue", "queue"))
    for name, overlap in overlaps:
        await put_schedule(
            store, new_schedule(name, "chat", "x", every=60, start_at=t0, overlap=overlap)
        )
    agents = {"chat": CHAT}
    first, _ = await fire_due(store, agents, now=t0)
    assert len(first) == 2  # nobody ran them: both still pending
    later = t0 + timedelta(seconds=61)
    assert (await fire_due(store, agents, now=later))[0] == []
    assert (await get_schedule(store, "skip")).next_at == t0 + timedelta(seconds=120)  # dropped
    assert (await get_schedule(store, "queue")).next_at == t0 + timedelta(seconds=60)  # waits
    for tid in first:  # the previous runs end
        (claimed,) = await store.claim_tasks("w", 1, task_id=tid)
        from duragent.store import Commit, TaskPatch

        await store.commit(
            Commit(
                fence={tid: claimed.lease.epoch},
                patches=[TaskPatch(tid, {"status": "completed"})],
            )
        )
    fired, _ = await fire_due(store, agents, now=later)
    assert len(fired) == 1 and len(await scheduled(store, "queue")) == 2


@pytest.mark.slow
async def test_runtime_schedule_lifecycle(tmp_path: Path) -> None:
    async with Runtime(f"sqlite:///{tmp_path}/rt.db", agents=[CHAT]) as rt:
        with pytest.raises(ValueError, match="exactly one of cron= or every="):
            await rt.schedule("bad", "chat", "x")
        with pytest.raises(ValueError, match="cron"):
            await rt.schedule("bad", "chat", "x", cron="not a cron")
        daily = await rt.schedule("daily", "chat", "report", cron="0 9 * * *", owner="u")
        assert daily.next_at.hour == 9 and daily.next_at > datetime.now(UTC)
        await rt.schedule("fast", "chat", "tick", every=1, owner="u")  # the shortest

        async def ticks(n: int) -> None:
            while len(await scheduled(rt.store, "fast")) < n:
                await rt.store.wait_for_change(0.2)

        await asyncio.wait_for(ticks(2), 20)
        assert [s.name for s in await rt.schedules(owner="u")] == ["daily", "fast"]
        assert await rt.schedules(owner="someone else") == []
        paused = await rt.pause_schedule("fast", owner="u")
        assert paused.paused
        count = len(await scheduled(rt.store, "fast"))
        before = datetime.now(UTC)
        resumed = await rt.resume_schedule("fast", owner="u")
        # The next tick is from the resume on (no burst of the ticks missed while
        # paused), however long the resume took.
        assert not resumed.paused and resumed.next_at > before
        await asyncio.wait_for(ticks(count + 1), 20)
        await rt.delete_schedule("fast", owner="u")
        with pytest.raises(ScheduleNotFound):
            await rt.get_schedule("fast", owner="u")


@pytest.mark.slow
async def test_ticks_are_exactly_once_across_a_worker_sigkill(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/ticks.db"
    store = open_store(url)
    await store.open()
    start = datetime.now(UTC) + timedelta(seconds=1)
    await put_schedule(
        store, new_schedule("beat", "chat", "x", every=1, start_at=start, overlap="allow")
    )

    async def ticks(n: int) -> list[str]:
        while len(got := await scheduled(store, "beat")) < n:
            await store.wait_for_change(0.2)
        return got

    first = WorkerProc(url)
    second: WorkerProc | None = None
    try:
        before = await asyncio.wait_for(ticks(3), 60)
        first.signal(signal.SIGKILL)
        first.proc.wait(10)
        # Two workers now: both fire ticks, each tick must still land once.
        second, third = WorkerProc(url), WorkerProc(url)
        try:
            after = await asyncio.wait_for(ticks(len(before) + 4), 60)
        finally:
            third.stop()
    finally:
        first.stop()
        if second is not None:
            second.stop()
    final = await scheduled(store, "beat")
    assert len(final) == len(set(final)) >= len(after)
    step = timedelta(seconds=1)
    for rid in final:  # every task is a tick on the schedule's grid
        tick = datetime.fromisoformat(rid.removeprefix("schedule:beat:"))
        assert (tick - start) % step == timedelta(0)
    sched = await get_schedule(store, "beat")
    assert sched.last_tick is not None and f"schedule:beat:{sched.last_tick.isoformat()}" in final
    await store.close()
