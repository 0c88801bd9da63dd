"""Lanes (store/_postgres_lanes.py): while a batch is in flight, the commits of
other tasks go at once on another connection; a task's own commits wait for it.

The batch is kept in flight by holding the server's answers at a proxy
(support/pgturns.py `hold`), so what is sent meanwhile, and on how many
connections, is seen there, not timed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import pytest

from conftest import PG_URL, require_postgres
from duragent.store import Commit
from duragent.store._postgres import PostgresStore
from duragent.types import EntryKind, NewEntry, Task
from support.pgproxy import schema
from support.pgturns import TurnCounter, turn_counter

__all__ = ["schema"]

pytestmark = pytest.mark.postgres


@pytest.fixture
def counter() -> Iterator[TurnCounter]:
    require_postgres()
    parts = urlsplit(PG_URL)
    with turn_counter(parts.hostname or "127.0.0.1", parts.port or 5432) as c:
        yield c


def _note(task_id: str, text: str) -> NewEntry:
    return NewEntry(task_id=task_id, kind=EntryKind.PROGRESS, payload={"text": text})


async def _until(done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 30
    while not done():
        assert time.monotonic() < deadline, "not reached in 30 s"
        await asyncio.sleep(0.005)


async def _running(store: PostgresStore, n: int) -> dict[str, int]:
    """`n` claimed tasks (task id -> lease epoch), each with a commit landed, so
    the writer holds their copies and a connection; the pool filled."""
    fence = {}
    for i in range(n):
        task, _ = await store.create_task(Task(agent="a", input=f"job {i}"))
        claimed = await store.claim_task("w", task_id=task.id, ttl=600)
        assert claimed is not None
        fence[task.id] = claimed.lease.epoch
    await store.commit(Commit(fence=fence, entries=[_note(t, "warm") for t in fence]))
    await _until(lambda: store._pool.get_stats().get("pool_available", 0) >= 2)
    return fence


async def _texts(store: PostgresStore, task_id: str) -> list[str]:
    entries = await store.entries(task_id, kinds=[EntryKind.PROGRESS])
    return [e.payload["text"] for e in entries]


async def test_two_tasks_commits_are_in_flight_at_once(schema: str, counter: TurnCounter) -> None:
    """A's commit is in flight (its answer held at the proxy); B's commit, asked
    for meanwhile, is sent at once on a second connection, not after A's answer."""
    store = PostgresStore(counter.url(PG_URL), schema=schema, min_size=4, max_size=6)
    async with store:
        fence = await _running(store, 2)
        a, b = fence
        counter.hold()
        try:
            first = asyncio.ensure_future(
                store.commit(Commit(fence={a: fence[a]}, entries=[_note(a, "a1")]))
            )
            await _until(lambda: counter.waiting == 1)
            second = asyncio.ensure_future(
                store.commit(Commit(fence={b: fence[b]}, entries=[_note(b, "b1")]))
            )
            await _until(lambda: counter.waiting == 2)
            assert store._writer.lanes == 1
            assert not first.done() and not second.done()
        finally:
            counter.release()
        await asyncio.wait_for(asyncio.gather(first, second), 30)
        assert await _texts(store, a) == ["warm", "a1"]
        assert await _texts(store, b) == ["warm", "b1"]


async def test_a_tasks_commits_wait_for_its_batch_in_flight(
    schema: str, counter: TurnCounter
) -> None:
    """A's first commit is in flight. A's next commit, and C's commit that names
    A's (`after=`), wait for it; B's goes at once in a lane. Once the answers
    come, every commit lands, A's in the order they were made."""
    store = PostgresStore(counter.url(PG_URL), schema=schema, min_size=4, max_size=6)
    async with store:
        fence = await _running(store, 3)
        a, b, c = fence
        writer = store._writer
        counter.hold()
        try:
            a1 = store.commit_soon(Commit(fence={a: fence[a]}, entries=[_note(a, "a1")]))
            await _until(lambda: counter.waiting == 1)
            a2 = asyncio.ensure_future(
                store.commit(Commit(fence={a: fence[a]}, entries=[_note(a, "a2")], after=a1))
            )
            c1 = asyncio.ensure_future(
                store.commit(Commit(fence={c: fence[c]}, entries=[_note(c, "c1")], after=a1))
            )
            b1 = asyncio.ensure_future(
                store.commit(Commit(fence={b: fence[b]}, entries=[_note(b, "b1")]))
            )
            await _until(lambda: counter.waiting == 2)
            assert writer.lanes == 1
            assert len(writer._air) == 2
            assert len(writer._pending) == 2  # a2 and c1: not sent
        finally:
            counter.release()
        await asyncio.wait_for(asyncio.gather(a1, a2, b1, c1), 30)
        assert await _texts(store, a) == ["warm", "a1", "a2"]
        assert await _texts(store, b) == ["warm", "b1"]
        assert await _texts(store, c) == ["warm", "c1"]


async def test_a_lane_that_missed_its_guard_runs_again_in_order(
    schema: str, counter: TurnCounter
) -> None:
    """B's row was moved behind the writer's back (a renewal elsewhere): B's lane,
    sent while A's batch flies, misses its guard. The thread runs it again once
    no lane is in the air, before B's next commit, which waited for it."""
    store = PostgresStore(counter.url(PG_URL), schema=schema, min_size=4, max_size=6)
    other = PostgresStore(PG_URL, schema=schema)
    async with store, other:
        fence = await _running(store, 2)
        a, b = fence
        renewal = await other.renew_leases("w", {b: fence[b]}, 900)
        assert set(renewal.kept) == {b}
        writer = store._writer
        rereads = writer.rereads
        counter.hold()
        try:
            a1 = asyncio.ensure_future(
                store.commit(Commit(fence={a: fence[a]}, entries=[_note(a, "a1")]))
            )
            await _until(lambda: counter.waiting == 1)
            b1 = store.commit_soon(Commit(fence={b: fence[b]}, entries=[_note(b, "b1")]))
            await _until(lambda: counter.waiting == 2)
            b2 = asyncio.ensure_future(
                store.commit(Commit(fence={b: fence[b]}, entries=[_note(b, "b2")], after=b1))
            )
            assert writer.lanes == 1
        finally:
            counter.release()
        await asyncio.wait_for(asyncio.gather(a1, b1, b2), 30)
        assert writer.rereads == rereads + 1
        assert await _texts(store, a) == ["warm", "a1"]
        assert await _texts(store, b) == ["warm", "b1", "b2"]
