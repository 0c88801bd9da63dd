"""Whether a PostgreSQL transaction whose connection broke with its COMMIT in flight landed.

The writer (_postgres_writer.py) sends a batch on cached rows as one message,
`BEGIN` to `COMMIT`. If the connection breaks before the answer, the batch may
or may not have committed: `landed_in` finds out, where it can, from the task
rows the batch wrote, so the batch is run again only if it did not land.
"""

from __future__ import annotations

import contextlib
import time
from datetime import datetime

import psycopg
import psycopg_pool

from duragent.store._group_commit import Outcome
from duragent.store._postgres_schema import Conn
from duragent.store._postgres_tx import PgTx
from duragent.store._tx import task_columns
from duragent.types import Task


class LostInFlight(Exception):
    """The connection broke while a whole transaction, COMMIT included, was in flight."""

    def __init__(
        self,
        outcomes: list[Outcome],
        txs: list[PgTx],
        backend_pid: int,
        sent_at: datetime,
        server: str = "",
    ) -> None:
        super().__init__("connection lost with a commit in flight")
        self.outcomes = outcomes
        self.txs = txs
        self.backend_pid = backend_pid
        self.sent_at = sent_at
        self.server = server  # the host and port it was sent to (`server_of`)


def server_of(conn: Conn) -> str:
    """The host and port a connection reached: of a URL naming several, the one libpq chose."""
    return f"{conn.info.host}:{conn.info.port}"


def landed_in(
    pool: psycopg_pool.ConnectionPool[Conn],
    txs: list[PgTx],
    backend_pid: int,
    sent_at: datetime,
    server: str = "",
) -> bool | None:
    """Whether a transaction whose connection broke with its COMMIT in flight
    committed: True, False, or None when that cannot be told.

    Its backend is ended first and waited for, so it cannot commit after the
    look (a broken connection may leave it running); only a backend that
    started before the message was sent is ours (after a server restart the
    pid may be another session's). Then the task rows the transaction wrote
    tell, by their whole `data` (the stamp and the time of the write among
    it): each as it wrote them (landed), or each as it found them, absent
    if it inserted them (not landed). A transaction that changed anything
    else only, or rows another process moved meanwhile (a message sent to
    the task as soon as the row was free, say), cannot be told apart: None,
    reported as `CommitOutcomeUnknown`.

    When the look reaches another host than `server` (the store's URL names
    several and libpq chose another, the one promoted after a failover), the
    backend was the old server's, which is gone: no backend of this server is
    ended, and the rows as this server has them tell (docs/architecture.md §4,
    failover of the database server).
    """
    before: dict[str, Task | None] = {}
    after: dict[str, Task] = {}
    for tx in txs:
        if tx.changed and not tx.written:
            return None
        for task_id, task in tx.written.items():
            before.setdefault(task_id, tx.based_on.get(task_id))
            after[task_id] = task
    if not after:
        return True  # it changed nothing: landed or not, nothing is lost
    with contextlib.suppress(Exception):
        pool.check()  # what broke that connection may have broken the others
    try:
        with pool.connection() as conn:
            if server and server_of(conn) != server:
                return _judged(conn, before, after)
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE pid = %s AND backend_start <= %s",
                (backend_pid, sent_at),
            )
            for _ in range(500):
                # Any backend with that pid, whenever it started: with the
                # clocks apart, ours may look younger than the message (not
                # ended above); a stranger's only makes the answer None.
                row = conn.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE pid = %s", (backend_pid,)
                ).fetchone()
                if row is None:
                    break
                time.sleep(0.01)
            else:
                return None  # still there after 5 s
            return _judged(conn, before, after)
    except psycopg.Error:
        return None


def _judged(conn: Conn, before: dict[str, Task | None], after: dict[str, Task]) -> bool | None:
    """Landed, not landed or unknown, by the task rows as `conn`'s server holds them."""
    rows = conn.execute("SELECT id, data FROM tasks WHERE id = ANY(%s)", (list(after),)).fetchall()
    # `data` holds the whole row (its stamp too) as the last write left it.
    stored = {r["id"]: r["data"] for r in rows}

    def as_stored(t: Task) -> str:
        return str(task_columns(t, lambda when: when)["data"])

    if all(stored.get(i) == as_stored(t) for i, t in after.items()):
        return True
    if all(
        (i not in stored) if t is None else stored.get(i) == as_stored(t) for i, t in before.items()
    ):
        return False
    return None
