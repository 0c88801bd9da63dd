"""PostgreSQL leases: renewals do not queue behind task commits for a pooled
connection, and the server's clock, not a worker's, decides who owns a task."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from conftest import PG_URL, drop_schema, require_postgres
from duragent import Runtime, TaskStatus
from duragent.errors import StoreUnavailable
from duragent.store._postgres import PostgresStore
from duragent.store._postgres_tx import PgTx
from duragent.types import Task
from support.workerlib import WorkerProc
from worker_agents import AGENTS

pytestmark = pytest.mark.postgres


async def test_renewals_succeed_while_every_pooled_connection_is_busy() -> None:
    url = require_postgres()
    schema = f"test_{uuid.uuid4().hex[:12]}"
    store = PostgresStore(url, schema=schema, min_size=1, max_size=1, connect_timeout=10)
    await store.open()
    taken, release = threading.Event(), threading.Event()

    def long_transaction() -> None:
        with store._pool.connection() as conn, conn.transaction():
            conn.execute("SELECT 1")
            taken.set()
            release.wait(60)

    holder = asyncio.ensure_future(asyncio.to_thread(long_transaction))
    try:
        assert await asyncio.to_thread(taken.wait, 30)
        for _ in range(3):  # and again, on the same dedicated connection
            try:
                renewal: Any = await store.renew_leases("w1", {"no-such-task": 1}, 30)
            except StoreUnavailable as exc:
                pytest.fail(f"a renewal waited for the shared pool: {exc}")
            assert renewal.kept == {}
    finally:
        release.set()
        await holder
        await store.close()
        drop_schema(schema)


@pytest.mark.slow
async def test_a_renewal_skips_a_row_a_commit_holds_instead_of_waiting_for_it() -> None:
    """A renewal waiting for a row the writer holds, while the writer waits for a
    row the renewal holds, was a deadlock: PostgreSQL failed one of them after a
    second, and two failed renewals let a 2 s lease lapse. A held row is skipped
    (neither renewed nor lost), the others are renewed, and it is renewed once free."""
    url = require_postgres()
    schema = f"test_{uuid.uuid4().hex[:12]}"
    store = PostgresStore(url, schema=schema, connect_timeout=10)
    await store.open()
    try:
        ids, epochs = [], {}
        for _ in range(3):
            task, _ = await store.create_task(Task(agent="a"))
            claimed = await store.claim_task("w1", task_id=task.id, ttl=30)
            assert claimed is not None
            ids.append(task.id)
            epochs[task.id] = claimed.lease.epoch
        taken, release = threading.Event(), threading.Event()

        def hold_row() -> None:  # a task commit in flight on another connection
            with store._pool.connection() as conn, conn.transaction():
                conn.execute("SELECT 1 FROM tasks WHERE id = %s FOR UPDATE", (ids[0],))
                taken.set()
                release.wait(60)

        holder = asyncio.ensure_future(asyncio.to_thread(hold_row))
        try:
            assert await asyncio.to_thread(taken.wait, 30)
            # ttl=3: the renewal tries the held row again for 1 s, then leaves it.
            renewal = await asyncio.wait_for(store.renew_leases("w1", epochs, 3), 30)
            assert set(renewal.kept) == set(ids[1:])
            assert renewal.lost == set()
        finally:
            release.set()
            await holder
        renewal = await store.renew_leases("w1", epochs, 30)
        assert set(renewal.kept) == set(ids) and renewal.lost == set()
        epochs[ids[2]] += 1  # not ours any more: lost
        renewal = await store.renew_leases("w1", epochs, 30)
        assert renewal.lost == {ids[2]}
    finally:
        await store.close()
        drop_schema(schema)


# --- the server's clock decides ------------------------------------------------


@pytest.fixture
def url() -> Iterator[str]:
    require_postgres()
    schema = f"test_{uuid.uuid4().hex[:12]}"
    yield f"{PG_URL}?schema={schema}"
    drop_schema(schema)


@pytest.fixture
async def rt(url: str) -> AsyncIterator[Runtime]:
    """A Runtime without a worker, in this (test) process: it submits and reads."""
    async with Runtime(url, agents=AGENTS, run_worker=False) as runtime:
        yield runtime


@pytest.fixture
def procs() -> Iterator[list[WorkerProc]]:
    started: list[WorkerProc] = []
    yield started
    for p in started:
        p.stop()


HELD = 3  # tasks the first worker holds, all its slots
TTL = 30.0  # shorter than the skew: a lease on the wrong clock is over at once


def worker(url: str, skew: float, concurrency: int) -> WorkerProc:
    """A `duragent worker` whose clock is `skew` seconds off, its nap tool held."""
    return WorkerProc(
        url,
        ttl=TTL,
        concurrency=concurrency,
        unset=("PGAPPNAME",),
        HOLD="nap",
        HOLD_SECONDS="3600",
        CLOCK_SKEW=str(skew),
    )


async def until(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        await asyncio.sleep(0.05)


async def held_by_first_then_second_runs(
    rt: Runtime, procs: list[WorkerProc], url: str, first_skew: float, second_skew: float
) -> None:
    """The first worker holds HELD tasks (in a tool, every slot taken); the
    second starts and runs a task of its own, so it has claimed at least once
    with the held tasks there to take: none of them changed hands."""
    first = worker(url, first_skew, concurrency=HELD)
    procs.append(first)
    ids = [(await rt.submit("sleeper", f"hold {i}")).task_id for i in range(HELD)]

    async def all_held() -> bool:
        return sum(line.startswith("AT nap") for line in first.out) == HELD

    await until(all_held, 60, f"the first worker holds {HELD} tasks")
    before = {i: (await rt.store.get_task(i)).lease for i in ids}
    assert len({lease.owner for lease in before.values()}) == 1

    second = worker(url, second_skew, concurrency=10)
    procs.append(second)
    marker = await rt.submit("chat", "hello")  # the first worker has no slot for it
    done = await rt.wait(marker.task_id, timeout=60)
    assert done.status is TaskStatus.COMPLETED
    for i in ids:
        task = await rt.store.get_task(i)
        assert task.status is TaskStatus.RUNNING and task.restarts == 0, task
        assert (task.lease.owner, task.lease.epoch) == (
            before[i].owner,
            before[i].epoch,
        ), f"task {i} changed hands"
    assert not any("lease lost" in line for line in first.err), first.err[-10:]


@pytest.mark.slow
async def test_a_worker_whose_clock_is_60s_ahead_takes_no_live_lease(
    rt: Runtime, procs: list[WorkerProc], url: str
) -> None:
    """On its own clock every lease of the healthy worker (30 s) is over."""
    await held_by_first_then_second_runs(rt, procs, url, first_skew=0, second_skew=60)


@pytest.mark.slow
async def test_a_worker_whose_clock_is_60s_behind_keeps_its_leases(
    rt: Runtime, procs: list[WorkerProc], url: str
) -> None:
    """On its own clock it sets leases that ended 30 s ago; a healthy worker
    beside it must still not take them."""
    await held_by_first_then_second_runs(rt, procs, url, first_skew=-60, second_skew=0)


@pytest.mark.slow
async def test_a_renewal_answered_after_its_lease_ended_is_not_reported_kept(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The renewal's transaction is held, after it set the lease, until the
    server's clock is past that lease: the renewal must count it lost."""
    store = PostgresStore(url, connect_timeout=10)
    await store.open()
    try:
        task, _ = await store.create_task(Task(agent="a"))
        claimed = await store.claim_task("w1", task_id=task.id, ttl=30)
        assert claimed is not None
        real = PgTx.renew_leases

        def late(self: PgTx, *args: Any) -> Any:
            result = real(self, *args)
            past = "SELECT clock_timestamp() > lease_expires AS past FROM tasks WHERE id = %s"
            deadline = time.monotonic() + 30
            while not self.conn.execute(past, (task.id,)).fetchone()["past"]:  # type: ignore[index]
                assert time.monotonic() < deadline, "the lease never ended"
                time.sleep(0.02)
            return result

        monkeypatch.setattr(PgTx, "renew_leases", late)
        # The renewal itself, unbounded: its answer came after the lease it set.
        renewal = await store._renew_leases("w1", {task.id: claimed.lease.epoch}, 0.5)
        assert renewal.kept == {} and renewal.lost == {task.id}
        # As the worker calls it, bounded by half the lease (store/_postgres_bounds.py):
        # cut off before then, and not renewed either.
        with pytest.raises(StoreUnavailable, match="not renewed"):
            await store.renew_leases("w1", {task.id: claimed.lease.epoch}, 0.5)
    finally:
        await store.close()
