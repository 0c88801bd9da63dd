"""PostgreSQL claims beside the writer: three round trips, never queued behind commits.

A claim reads before it writes (the queue documents, then the candidates), so
in the writer's group transaction (_postgres_writer.py) it held every commit of
its process for the round trips of its reads, and it ran only once the batch
before it had landed; over a slow link each claim stalled every running task
of its worker. Here it runs on a thread of its own (`PgClaims.claim_tasks`),
on a pooled connection, in three messages:

1. `BEGIN` and the queue documents (locked) with the server's now(), one query;
2. the candidates (SKIP LOCKED: another worker's claim is passed over);
3. the claimed rows, their status entries, the queues' spent buckets, the
   NOTIFY and `COMMIT`, as one message (_postgres_message.py `send_and_commit`).

A claim that finds nothing ends with a ROLLBACK instead. The rows it leaves
become the writer's copies, so the runners' first commits need no read.
Retried like any write: whatever failed before the last message was sent;
a connection lost with that message in flight is CommitOutcomeUnknown (the
worker then looks for the tasks it may hold, `Worker._adopt_lost_claims`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import psycopg
import psycopg_pool
from psycopg import sql
from psycopg.pq import TransactionStatus

from duragent.errors import CommitOutcomeUnknown, StoreError, StoreUnavailable
from duragent.store._postgres_connect import connection_lost, translate
from duragent.store._postgres_message import PREPARED_GONE, send_and_commit
from duragent.store._postgres_notify import change_notifies
from duragent.store._postgres_schema import Conn
from duragent.store._postgres_tx import QUEUES_QUERY, PgTx
from duragent.store._queues import QUEUES_SCOPE
from duragent.store._tx import apply_claim
from duragent.types import Document, Task

if TYPE_CHECKING:
    from duragent.store._postgres_writer import PgWriter

# `BEGIN` and the claim's first question in one simple query (no parameters).
_BEGIN_AND_QUEUES = sql.SQL("BEGIN; ") + sql.SQL(QUEUES_QUERY.replace("%s", "{}")).format(
    sql.Literal(QUEUES_SCOPE)
)


class ClaimTx(PgTx):
    """A claim's transaction, begun by its first read (see the module's docstring)."""

    committing = False  # its last message, COMMIT included, was sent

    def load_queues(self) -> list[Document]:
        cur = self.conn.execute(_BEGIN_AND_QUEUES)
        cur.nextset()  # past BEGIN's answer
        return self.took_queues(cur.fetchall())


def claim_on(tx: ClaimTx, claim: Callable[[PgTx], list[Task]]) -> list[Task]:
    """Run `claim` (apply_claim) in `tx`, its own transaction, and commit it."""
    conn, namespace = tx.conn, tx.namespace
    try:
        claimed = claim(tx)
        statements = tx.take_pending()
        if not tx.changed:
            conn.execute("ROLLBACK")
            return claimed
        statements += change_notifies(namespace, tx.work, tx.notes.tasks)
    except BaseException:
        if not conn.closed and conn.info.transaction_status is not TransactionStatus.IDLE:
            with contextlib.suppress(psycopg.Error):
                conn.execute("ROLLBACK")
        raise
    tx.committing = True  # from here a lost connection leaves the outcome unknown
    send_and_commit(conn, statements)
    return claimed


class PgClaims:
    """PostgresStore's claims (see the module's docstring), and the threads its
    reads run on."""

    if TYPE_CHECKING:
        _pool: psycopg_pool.ConnectionPool[Conn]
        _writer: PgWriter
        _where: str
        namespace: str
        retries: int
        _max_size: int

        def _check_opened(self) -> None: ...
        def _committed(
            self, loop: asyncio.AbstractEventLoop, work: bool, tasks: frozenset[str]
        ) -> None: ...

    _claims: ThreadPoolExecutor | None = None
    _readers: ThreadPoolExecutor | None = None

    async def claim_tasks(
        self,
        worker_id: str,
        n: int = 1,
        *,
        agents: Iterable[str] | None = None,
        ttl: float = 30.0,
        task_id: str | None = None,
        queues: Iterable[str] | None = None,
        versions: Mapping[str, str] | None = None,
    ) -> list[Task]:
        self._check_opened()
        if n < 1:
            return []
        names = None if agents is None else list(agents)
        only = None if queues is None else sorted(set(queues))
        pins = None if versions is None else dict(versions)
        if self._claims is None:
            self._claims = ThreadPoolExecutor(1, thread_name_prefix="duragent-claims")
        loop = asyncio.get_running_loop()
        claimed, tx = await loop.run_in_executor(
            self._claims,
            self._claim,
            lambda tx: apply_claim(tx, worker_id, n, names, ttl, task_id, only, pins),
        )
        # The writer's copies of the rows (see PgWriter.rows): the next commit of
        # each claimed task runs on it, with no read. A copy someone changes later
        # only fails its guard, and that batch reads the row again.
        self._writer.rows.update(tx.written)
        if tx.changed:
            self._committed(loop, tx.work, frozenset(tx.notes.tasks))
        return claimed

    def readers(self) -> ThreadPoolExecutor:
        """The threads reads run on: as many as the pool has connections. (asyncio's
        default executor has cpu_count + 4: on a slow link, the reads of thirty
        tasks starting at once queued for a handful of threads, each holding
        one for a round trip, while pooled connections sat idle.)"""
        if self._readers is None:
            self._readers = ThreadPoolExecutor(self._max_size, thread_name_prefix="duragent-reads")
        return self._readers

    def close_threads(self) -> None:
        """At the store's close: the claims' and reads' threads, after what they run."""
        for pool in (self._claims, self._readers):
            if pool is not None:
                pool.shutdown(wait=True)
        self._claims = self._readers = None

    def _claim(self, job: Callable[[PgTx], list[Task]]) -> tuple[list[Task], ClaimTx]:
        """`claim_on` a pooled connection, retried as PostgresStore._execute retries."""
        attempt = 0
        reprepared = False
        while True:
            attempt += 1
            tx: ClaimTx | None = None
            try:
                with self._pool.connection() as conn:
                    tx = ClaimTx(conn, self.namespace)
                    return claim_on(tx, job), tx
            except psycopg_pool.PoolTimeout as exc:
                raise StoreUnavailable(f"{self._where}: no connection available: {exc}") from exc
            except psycopg_pool.PoolClosed as exc:
                raise StoreError(f"{self._where} is closed") from exc
            except psycopg.Error as exc:
                lost = connection_lost(exc)
                if tx is not None and tx.committing and lost:
                    raise CommitOutcomeUnknown(
                        f"{self._where}: the connection was lost while committing a claim; "
                        "it may or may not have been applied"
                    ) from exc
                if exc.sqlstate == PREPARED_GONE and not reprepared:
                    reprepared = True  # prepared again on this try, at once
                    attempt -= 1
                    continue
                if not (lost or exc.sqlstate in ("40001", "40P01")) or attempt > self.retries:
                    raise translate(exc, self._where) from exc
                if lost:
                    with contextlib.suppress(Exception):
                        self._pool.check()
                if attempt > 1:
                    time.sleep(min(0.05 * 2**attempt, 1.0))
