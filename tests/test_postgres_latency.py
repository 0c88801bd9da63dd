"""PostgreSQL over a slow link: round trips counted at a proxy (support/pgturns.py),
and a claim that does not wait behind the worker's commits.

What each round trip costs is bench/latency_net.py's to measure; here the
number of them, and what waits for what, is forced and counted."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
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


async def test_a_claim_is_three_round_trips(schema: str, counter: TurnCounter) -> None:
    """BEGIN with the queues and the server's now(); the candidates; the writes,
    NOTIFY and COMMIT as one message. (In the writer's batch it was four.)"""
    store = PostgresStore(counter.url(PG_URL), schema=schema, min_size=1, max_size=2)
    async with store:
        for i in range(3):
            await store.create_task(Task(agent="a", input=f"job {i}"))
        assert len(await store.claim_tasks("w", 1, ttl=60)) == 1  # the connection warmed
        before = counter.turns
        claimed = await store.claim_tasks("w", 2, ttl=60)
        assert len(claimed) == 2
        assert counter.turns - before == 3


async def test_a_runners_start_reads_are_one_round_trip(schema: str, counter: TurnCounter) -> None:
    """The open round's entries and the model's view, which a runner reads before
    its first round, go in one pipeline on one connection: one round trip (they
    were two reads on two pooled connections, queued behind a wave's others)."""
    store = PostgresStore(counter.url(PG_URL), schema=schema, min_size=1, max_size=1)
    async with store:
        task, _ = await store.create_task(Task(agent="a", input="job"))
        await store.commit(Commit(entries=[_note(task.id, "one"), _note(task.id, "two")]))
        expected = await store.entries(task.id), await store.model_view_data(task.id)
        before = counter.turns
        assert await store.start_reads(task.id, 0) == expected
        assert counter.turns - before == 1


async def test_a_claim_does_not_wait_for_a_commit_in_flight(schema: str) -> None:
    """A commit of this worker stuck on a row lock (a slow link holds it the same
    way) does not hold up the worker's claim: the claim lands while it waits."""
    url = require_postgres()
    store = PostgresStore(url, schema=schema, lease_ttl=600)  # lock waits of 100 s
    async with store:
        held, _ = await store.create_task(Task(agent="a", input="held"))
        await store.create_task(Task(agent="a", input="waiting"))
        running = await store.claim_task("w", task_id=held.id, ttl=600)
        assert running is not None
        taken, release = threading.Event(), threading.Event()

        def lock_row() -> None:
            with store._pool.connection() as conn, conn.transaction():
                conn.execute("SELECT 1 FROM tasks WHERE id = %s FOR UPDATE", (held.id,))
                taken.set()
                release.wait(120)

        locker = asyncio.ensure_future(asyncio.to_thread(lock_row))
        try:
            assert await asyncio.to_thread(taken.wait, 30)
            stuck = asyncio.ensure_future(
                store.commit(
                    Commit(fence={held.id: running.lease.epoch}, entries=[_note(held.id, "x")])
                )
            )
            await asyncio.sleep(0)  # queued: the writer's batch now waits on the lock
            claimed = await asyncio.wait_for(store.claim_tasks("w", 5, ttl=600), 60)
            assert [t.input for t in claimed] == ["waiting"]
            assert not stuck.done()
        finally:
            release.set()
            await locker
        await stuck  # and the commit lands once the row is free


async def test_a_batch_that_missed_its_guard_runs_again_in_a_few_round_trips(
    schema: str, counter: TurnCounter
) -> None:
    """Another connection (a lease renewal racing the writer) moved every row the
    writer has a copy of: the next batch of eight commits misses its guard and
    runs again on copies read in one query, not job by job under row locks
    (a savepoint, a read and the writes each: 3 round trips per commit)."""
    store = PostgresStore(counter.url(PG_URL), schema=schema, min_size=1, max_size=3)
    other = PostgresStore(PG_URL, schema=schema)
    async with store, other:
        fence = {}
        for i in range(8):
            task, _ = await store.create_task(Task(agent="a", input=f"job {i}"))
            claimed = await store.claim_task("w", task_id=task.id, ttl=60)
            assert claimed is not None
            fence[task.id] = claimed.lease.epoch
        await store.commit(Commit(fence=fence, entries=[_note(t, "warm") for t in fence]))
        renewal = await other.renew_leases("w", fence, 120)  # behind the writer's back
        assert set(renewal.kept) == set(fence)
        before, rereads = counter.turns, store._writer.rereads
        await asyncio.gather(
            *(
                store.commit(Commit(fence={t: e}, entries=[_note(t, "after")]))
                for t, e in fence.items()
            )
        )
        assert store._writer.rereads == rereads + 1  # the guard was missed, once
        # The batch (1), its ROLLBACK (1), the copies (1), the batch again (1).
        assert counter.turns - before <= 5
        for task_id in fence:
            entries = await store.entries(task_id, kinds=[EntryKind.PROGRESS])
            assert [e.payload["text"] for e in entries] == ["warm", "after"]
