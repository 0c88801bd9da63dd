"""Every wait of the PostgreSQL store over the network is bounded by the lease (issue 40 item 2).

A forwarder the test starts stands between the store and the server; `stall`
makes it a silent link (nothing passes, nothing is closed), as a partition
does. The bounds come from the store's lease TTL (_postgres_bounds.py).
"""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from psycopg import conninfo as pg_conninfo, sql

from conftest import require_postgres
from duragent import Runtime
from duragent.errors import StoreUnavailable
from duragent.store._postgres import PostgresStore
from duragent.store._postgres_bounds import WaitBounds
from duragent.store._postgres_schema import Conn
from duragent.types import Task
from support.pgproxy import Forwarder, proxy, schema

__all__ = ["proxy", "schema"]  # the fixtures this module uses from support.pgproxy

pytestmark = pytest.mark.postgres

LEASE = 3.0  # bound: 1 s; a renewal's bound: 1.5 s
SLACK = 2.0  # the server checks timeouts on its own schedule; a loaded 2-core host


def backend_alive(pid: int) -> bool:
    with psycopg.connect(require_postgres(), autocommit=True) as conn:
        row = conn.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
    return row is not None


def show(conn: Conn, setting: str) -> str:
    row = conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(setting))).fetchone()
    assert row is not None
    return str(row[setting])


def hold_row_in_open_transaction(store: PostgresStore, task_id: str) -> Conn:
    """A commit in flight on one of the store's sessions: its transaction open, the row locked."""
    conn = store._pool.getconn()
    conn.execute("BEGIN")
    conn.execute("SELECT 1 FROM tasks WHERE id = %s FOR UPDATE", (task_id,))
    return conn


@pytest.mark.slow
async def test_the_store_sessions_carry_bounds_from_the_lease_and_the_url_wins() -> None:
    url = require_postgres()
    store = PostgresStore(url, lease_ttl=12)
    async with store:
        with store._pool.connection() as conn:
            shown = {
                name: show(conn, name)
                for name in (
                    "statement_timeout",
                    "lock_timeout",
                    "idle_in_transaction_session_timeout",
                )
            }
        assert set(shown.values()) == {"2s"}  # 12 / 6
        client = pg_conninfo.conninfo_to_dict(store._conninfo)
        assert client["tcp_user_timeout"] == "2000" and client["keepalives"] == "1"
    sep = "&" if "?" in url else "?"
    given = PostgresStore(
        f"{url}{sep}keepalives_idle=60&options=-c%20statement_timeout%3D0", lease_ttl=12
    )
    async with given:
        assert pg_conninfo.conninfo_to_dict(given._conninfo)["keepalives_idle"] == "60"
        with given._pool.connection() as conn:
            assert show(conn, "statement_timeout") == "0"
            assert show(conn, "lock_timeout") == "2s"
    assert WaitBounds(30).bound == 5 and WaitBounds(30).renewal_bound == 15
    # A Runtime's lease bounds the store it opens, unless the URL names one.
    assert Runtime(url, lease_ttl=18).store.bounds.bound == 3  # type: ignore[attr-defined]
    named = Runtime(f"{url}{sep}lease_ttl=24", lease_ttl=18).store
    assert named.bounds.bound == 4  # type: ignore[attr-defined]


@pytest.mark.slow
async def test_a_partitioned_workers_session_is_gone_from_the_server_within_the_bound(
    schema: str, proxy: Forwarder
) -> None:
    store = PostgresStore(proxy.url(require_postgres()), schema=schema, lease_ttl=LEASE)
    await store.open()
    try:
        task, _ = await store.create_task(Task(agent="a"))
        conn = await asyncio.to_thread(hold_row_in_open_transaction, store, task.id)
        pid = conn.info.backend_pid
        proxy.stall()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + store.bounds.bound + SLACK
        while await asyncio.to_thread(backend_alive, pid):
            assert loop.time() < deadline, "the silent session outlived the bound"
            await asyncio.sleep(0.05)
    finally:
        proxy.restore()
        store._pool.putconn(conn)
        await store.close()


@pytest.mark.slow
async def test_a_row_locked_by_a_silent_session_does_not_block_takeover_past_the_bound(
    schema: str, proxy: Forwarder
) -> None:
    silent = PostgresStore(proxy.url(require_postgres()), schema=schema, lease_ttl=LEASE)
    await silent.open()
    other = PostgresStore(require_postgres(), schema=schema)
    await other.open()
    try:
        task, _ = await other.create_task(Task(agent="a"))
        assert await silent.claim_task("w1", task_id=task.id, ttl=1) is not None
        conn = await asyncio.to_thread(hold_row_in_open_transaction, silent, task.id)
        proxy.stall()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 1 + silent.bounds.bound + SLACK  # the lease, then the bound
        while await other.claim_task("w2", task_id=task.id, ttl=30) is None:
            assert loop.time() < deadline, "a silent session's row lock blocked the takeover"
            await asyncio.sleep(0.05)
    finally:
        proxy.restore()
        silent._pool.putconn(conn)
        await silent.close()
        await other.close()


@pytest.mark.slow
async def test_a_renewal_stuck_behind_a_dead_link_is_not_renewed_within_its_bound(
    schema: str, proxy: Forwarder
) -> None:
    store = PostgresStore(proxy.url(require_postgres()), schema=schema, lease_ttl=LEASE)
    await store.open()
    try:
        task, _ = await store.create_task(Task(agent="a"))
        claimed = await store.claim_task("w1", task_id=task.id, ttl=30)
        assert claimed is not None
        leases = {task.id: claimed.lease.epoch}
        assert task.id in (await store.renew_leases("w1", leases, LEASE)).kept
        proxy.stall()
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(StoreUnavailable, match="not renewed"):
            await asyncio.wait_for(store.renew_leases("w1", leases, LEASE), 15)
        assert loop.time() - started < WaitBounds(LEASE).renewal_bound + 0.5
        proxy.restore()  # and the next renewal, on a new connection, keeps the lease
        deadline = loop.time() + 15
        while True:
            try:
                if task.id in (await store.renew_leases("w1", leases, 30)).kept:
                    break
            except StoreUnavailable:
                pass
            assert loop.time() < deadline, "renewals did not recover after the link came back"
            await asyncio.sleep(0.05)
    finally:
        proxy.restore()
        await store.close()


@pytest.mark.slow
async def test_a_lock_wait_past_the_bound_is_store_unavailable_not_a_hang(schema: str) -> None:
    url = require_postgres()
    store = PostgresStore(url, schema=schema, lease_ttl=6)  # bound: 1 s
    async with store:
        task, _ = await store.create_task(Task(agent="a"))
        with psycopg.connect(url, autocommit=True) as holder, holder.transaction():
            tasks = sql.Identifier(schema, "tasks")
            lock = sql.SQL("SELECT 1 FROM {} WHERE id = %s FOR UPDATE").format(tasks)
            holder.execute(lock, (task.id,))
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(StoreUnavailable, match="timeout"):
                await asyncio.wait_for(store.delete_task(task.id), 15)
            assert loop.time() - started < store.bounds.bound + SLACK


@pytest.mark.slow
async def test_the_listen_session_carries_the_bounds_but_no_statement_timeout(
    schema: str,
) -> None:
    """Its keepalives and tcp_user_timeout end it on the server once its worker is
    cut off (test_postgres_netns.py shows it); a statement_timeout bounds nothing
    of a session that waits idle for notifications, so it is not set."""
    store = PostgresStore(require_postgres(), schema=schema, lease_ttl=12)
    async with store:
        store.watch_controls(lambda task_id: None)
        assert store._listener is not None
        await asyncio.wait_for(store._listener.ready.wait(), 15)
        with psycopg.connect(require_postgres(), autocommit=True) as conn:
            row = conn.execute(
                "SELECT query FROM pg_stat_activity WHERE application_name = %s AND query LIKE %s",
                (store.application_name, "%LISTEN%"),
            ).fetchone()
        assert row is not None
        setup = row[0]  # the LISTEN session's one message: LISTEN, then its settings
        assert "SET \"tcp_user_timeout\" = '2000ms'" in setup
        assert "SET \"tcp_keepalives_idle\" = '1'" in setup
        assert "SET \"idle_in_transaction_session_timeout\" = '2000ms'" in setup
        assert "statement_timeout" not in setup
