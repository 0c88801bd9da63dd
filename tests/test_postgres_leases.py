"""PostgreSQL lease renewals do not queue behind task commits for a pooled connection."""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import pytest

from conftest import drop_schema, require_postgres
from duragent.errors import StoreUnavailable
from duragent.store._postgres import PostgresStore
from duragent.types import Task

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
