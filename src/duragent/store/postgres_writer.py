"""The PostgreSQL store's writer: the commits of a process grouped into one transaction.

Every commit asked for while a transaction is in flight (or in the same
event-loop tick) joins the next one, so one fsync and two round trips carry
many commits: the writes of the whole batch go in one message (BEGIN, the
statements, pg_notify), then COMMIT, with one UPDATE per task row however
many of the batch's commits changed it and one INSERT for all their entries
(postgres_tx.py `Deferred`). A commit whose task row this process
wrote last needs no read: its UPDATE is guarded by the row's stamp, and a row
someone else changed meanwhile makes the batch run again with row locks (the
way every commit ran before). A job needing a read (a claim, a document, a
task created elsewhere) runs on the connection inside a savepoint, so a
refused job (stale lease, conflict) leaves its batch-mates untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
import psycopg_pool
from psycopg.pq import TransactionStatus

from duragent.errors import CommitOutcomeUnknown, StoreUnavailable
from duragent.store.base import PendingCommit, mark_failed
from duragent.store.postgres_notify import CHANNEL, CONTROL_CHANNEL, WORK_CHANNEL, control_payload
from duragent.store.postgres_schema import Conn
from duragent.store.postgres_tx import (
    PREPARED_GONE,
    BufferedPgTx,
    Deferred,
    NeedsServer,
    PgTx,
    StaleRow,
    Statement,
    send,
    send_and_commit,
)
from duragent.store.tx import task_columns
from duragent.types import Task

Outcome = tuple[bool, Any]  # (ok, result or exception)

HOLD_SECONDS = 60.0  # the longest the writer keeps a pooled connection


@dataclass(slots=True)
class _Job:
    fn: Callable[[PgTx], Any]
    future: asyncio.Future[Any]
    loop: asyncio.AbstractEventLoop
    link: PendingCommit | None = None  # a commit_soon's, told of its failure at once


class _Retry(Exception):
    """The batch's transaction was lost before COMMIT was sent: run it again."""


class PgWriter:
    """One writer thread per store; `submit` from any event loop."""

    def __init__(
        self,
        pool: psycopg_pool.ConnectionPool[Conn],
        namespace: str,
        *,
        where: str,
        retries: int,
        translate: Callable[[BaseException], BaseException],
        lost: Callable[[psycopg.Error], bool],
        on_commit: Callable[[asyncio.AbstractEventLoop, bool], None],
        max_batch: int = 256,
    ) -> None:
        self.pool = pool
        self.namespace = namespace
        self.where = where  # the store, as error messages name it
        self.retries = retries
        self.translate = translate
        self.lost = lost
        self.on_commit = on_commit  # (loop, work) after a batch that changed something
        self.max_batch = max_batch
        self.batches = 0  # transactions committed or attempted: jobs_done / batches = group size
        self.jobs_done = 0
        self.rereads = 0  # batches run again, reading their rows, because a copy was stale
        self.rows: dict[str, Task] = {}  # task rows as this process last committed them
        self._lock = threading.Lock()
        self._pending: list[_Job] = []
        self._busy = False
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="duragent-pg-writer")
        self._held: Conn | None = None  # the writer thread's connection (see _connection)
        self._held_since = 0.0

    def submit(self, fn: Callable[[PgTx], Any], link: PendingCommit | None) -> asyncio.Future[Any]:
        """Queue `fn` for the next transaction; the future answers once it committed."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        with self._lock:
            self._pending.append(_Job(fn, future, loop, link))
            start = not self._busy
            self._busy = True
        if start:
            # call_soon, not now: every coroutine already runnable in this tick
            # gets to add its commit to the same transaction.
            loop.call_soon(self._executor.submit, self._drain)
        return future

    def renewed(self, rows: Mapping[str, Task]) -> None:
        """Take in rows as lease renewals left them: renewals run beside the writer
        (PostgresStore.renew_leases) and move only `lease.expires_at`, which the
        guard of the next UPDATE compares. Without this, the first commit after
        every renewal would miss its guard and its whole batch would run again.

        Only a copy the renewal is the next version of is replaced. A copy left
        older by a race with the writer thread is merely stale: its guarded
        UPDATE matches nothing and the batch reads the row again.
        """
        for task_id, fresh in rows.items():
            mine = self.rows.get(task_id)
            if mine is not None and _same_but_expiry(mine, fresh):
                self.rows[task_id] = fresh

    @property
    def busy(self) -> bool:
        return self._busy

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        conn, self._held = self._held, None
        if conn is not None:
            self.pool.putconn(conn)

    @contextlib.contextmanager
    def _connection(self) -> Iterator[Conn]:
        """A pooled connection, kept by the writer thread between batches.

        A checkout and return cost a tenth of a commit's CPU. The connection
        goes back to the pool after any failure (the pool replaces a broken
        one), when it is not idle, after `HOLD_SECONDS` (so the pool's checks
        and lifetimes apply to it) and when the store closes; with a pool of
        one connection it goes back after every batch, for the readers.
        """
        conn, self._held = self._held, None
        if conn is None:
            conn = self.pool.getconn()
            self._held_since = time.monotonic()
        try:
            yield conn
        except BaseException:
            self.pool.putconn(conn)
            raise
        if (
            conn.info.transaction_status is TransactionStatus.IDLE
            and self.pool.max_size > 1
            and time.monotonic() - self._held_since < HOLD_SECONDS
        ):
            self._held = conn
        else:
            self.pool.putconn(conn)

    # --- the writer thread ---

    def _drain(self) -> None:
        while True:
            with self._lock:
                batch = self._pending[: self.max_batch]
                del self._pending[: self.max_batch]
                if not batch:
                    self._busy = False
                    return
            try:
                outcomes, changed, work = self._run(batch)
            except BaseException as exc:  # never leave a caller waiting
                outcomes, changed, work = [(False, exc)] * len(batch), False, False
            mark_failed([job.link for job in batch], outcomes)  # before the next batch runs
            self.batches += 1
            self.jobs_done += len(batch)
            by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Job, Outcome]]] = {}
            for job, outcome in zip(batch, outcomes, strict=True):
                by_loop.setdefault(job.loop, []).append((job, outcome))
            for loop, settled in by_loop.items():
                # One wake-up per loop: each call_soon_threadsafe writes to its self-pipe.
                loop.call_soon_threadsafe(self._settle, loop, settled, changed, work)

    def _settle(
        self,
        loop: asyncio.AbstractEventLoop,
        settled: list[tuple[_Job, Outcome]],
        changed: bool,
        work: bool,
    ) -> None:
        for job, (ok, value) in settled:
            _settle(job.future, ok, value)
        if changed:
            self.on_commit(loop, work)

    def _run(self, batch: list[_Job]) -> tuple[list[Outcome], bool, bool]:
        """The batch's outcomes, whether it changed anything and whether it made work.

        Retried like any write: whatever failed before COMMIT was sent (a lost
        connection, a deadlock) left nothing behind. A connection lost while
        COMMIT was in flight may or may not have committed, and is reported so.
        """
        attempt = 0
        cached = True
        while True:
            attempt += 1
            committing = False
            try:
                with self._connection() as conn:
                    try:
                        outcomes, txs, committed = self._attempt(conn, batch, cached)
                        changed = any(tx.changed for tx in txs)
                        if not committed:
                            committing = True
                            send(conn, _COMMIT)
                    except BaseException:
                        if not committing and not conn.closed:
                            with contextlib.suppress(psycopg.Error):
                                conn.execute("ROLLBACK")
                        raise
            except psycopg_pool.PoolTimeout as exc:
                self.rows.clear()
                busy: BaseException = StoreUnavailable(
                    f"{self.where}: no connection available: {exc}"
                )
                return [(False, busy)] * len(batch), False, False
            except _LostInFlight as flight:
                # The whole transaction went as one message, COMMIT included, and
                # the connection broke before its answer: look whether it landed.
                self.rows.clear()
                landed = self._landed(flight.txs, flight.backend_pid, flight.sent_at)
                if landed:
                    outcomes, txs = flight.outcomes, flight.txs
                    changed = any(tx.changed for tx in txs)
                elif landed is False and attempt <= self.retries:
                    with contextlib.suppress(Exception):
                        self.pool.check()  # the pool may hold more dropped connections
                    continue
                else:
                    err = CommitOutcomeUnknown(
                        f"{self.where}: the connection was lost while committing; the commit "
                        "may or may not have been applied, re-read the task to find out"
                    )
                    return [(False, err)] * len(batch), False, False
            except StaleRow:
                self.rereads += 1
                self.rows.clear()
                cached = False  # again, reading every row under its lock
                continue
            except psycopg.Error as exc:
                self.rows.clear()
                lost = self.lost(exc)
                if committing and lost:
                    err = CommitOutcomeUnknown(
                        f"{self.where}: the connection was lost while committing; the commit "
                        "may or may not have been applied, re-read the task to find out"
                    )
                    return [(False, err)] * len(batch), False, False
                if cached and not lost and exc.sqlstate not in _AGAIN:
                    # A statement of the batch failed: find whose, job by job.
                    cached = False
                    continue
                if not (lost or exc.sqlstate in _AGAIN) or attempt > self.retries:
                    failed = self.translate(exc)
                    return [(False, failed)] * len(batch), False, False
                if lost:
                    # The pool may hold more connections the server dropped.
                    with contextlib.suppress(Exception):
                        self.pool.check()
                if attempt > 1:
                    time.sleep(min(0.05 * 2**attempt, 1.0))
                continue
            for tx in txs:
                self.rows.update(tx.written)
            if len(self.rows) > 10_000:
                self.rows.clear()
            return outcomes, changed, any(tx.work for tx in txs)

    def _attempt(
        self, conn: Conn, batch: list[_Job], cached: bool
    ) -> tuple[list[Outcome], list[PgTx], bool]:
        """Run the jobs in one transaction; whether it is committed already (every
        job ran on cached rows: the whole transaction went as one message)."""
        queued: list[Statement] = [Statement("BEGIN", None, False)]
        sent = False
        outcomes: list[Outcome] = []
        txs: list[PgTx] = []
        alone = len(batch) == 1
        written: dict[str, Task] = {}  # rows as earlier jobs of this batch left them

        def row(task_id: str) -> Task | None:
            return written.get(task_id) or self.rows.get(task_id)

        for job in batch:  # an earlier attempt's verdicts do not stand
            if job.link is not None:
                job.link.failed = None
        deferred = Deferred()  # the row updates and entries of jobs run on cached rows
        for job in batch:
            if outcomes:  # a job that follows a refused one is refused before it runs
                mark_failed([batch[len(outcomes) - 1].link], outcomes[-1:])
            if cached:
                btx = BufferedPgTx(self.namespace, row)
                try:
                    value = job.fn(btx)
                except NeedsServer:
                    pass  # run it on the connection, below
                except Exception as exc:  # refused before writing anything...
                    if not btx.based_on:
                        outcomes.append((False, exc))
                        continue
                    # ...but judged on this process's copy of a row, which another
                    # process may have changed since: ask the row as stored.
                else:
                    queued += btx.statements
                    deferred.take_in(btx)
                    written.update(btx.written)
                    outcomes.append((True, value))
                    txs.append(btx)
                    continue
            queued += deferred.statements()  # the jobs before this one: not under its savepoint
            if not alone:
                queued.append(Statement("SAVEPOINT job", None, False))
            send(conn, queued)
            queued, sent = [], True
            tx = PgTx(conn, self.namespace)
            try:
                value = job.fn(tx)
                if not alone:
                    tx.flush()  # under its savepoint: a failing write is this job's alone
            except psycopg.Error as exc:
                if alone or self.lost(exc) or exc.sqlstate in ("40001", "40P01"):
                    raise  # the whole batch is retried or fails
                conn.execute("ROLLBACK TO SAVEPOINT job")
                outcomes.append((False, self.translate(exc)))
            except Exception as exc:
                if alone:
                    # Nothing else to keep: report the refusal, write nothing.
                    conn.execute("ROLLBACK")
                    conn.execute("BEGIN")
                else:
                    conn.execute("ROLLBACK TO SAVEPOINT job")
                outcomes.append((False, exc))
            else:
                if alone:
                    queued = tx.take_pending()  # sent with the notifications, below
                else:
                    queued.append(Statement("RELEASE SAVEPOINT job", None, False))
                written.update(tx.written)
                outcomes.append((True, value))
                txs.append(tx)
        queued += deferred.statements()
        if any(tx.changed for tx in txs):
            # Delivered by the server only if and when this commits.
            channel = WORK_CHANNEL if any(tx.work for tx in txs) else CHANNEL
            queued.append(Statement("SELECT pg_notify(%s, %s)", (channel, self.namespace), False))
        for tx in txs:
            # One per control request, delivered only if and when this commits,
            # in commit order, to the listener of the task's owning worker.
            for task_id in tx.notes.controlled:
                payload = control_payload(self.namespace, task_id)
                queued.append(
                    Statement("SELECT pg_notify(%s, %s)", (CONTROL_CHANNEL, payload), False)
                )
        if not sent:
            pid, sent_at = conn.info.backend_pid, datetime.now(UTC)
            try:
                send_and_commit(conn, queued)
            except psycopg.Error as exc:
                if self.lost(exc):
                    raise _LostInFlight(outcomes, txs, pid, sent_at) from exc
                raise
            return outcomes, txs, True
        send(conn, queued)
        return outcomes, txs, False

    def _landed(self, txs: list[PgTx], backend_pid: int, sent_at: datetime) -> bool | None:
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
            self.pool.check()  # what broke that connection may have broken the others
        try:
            with self.pool.connection() as conn:
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
                rows = conn.execute(
                    "SELECT id, data FROM tasks WHERE id = ANY(%s)", (list(after),)
                ).fetchall()
        except psycopg.Error:
            return None
        # `data` holds the whole row (its stamp too) as the last write left it.
        stored = {r["id"]: r["data"] for r in rows}

        def as_stored(t: Task) -> str:
            return str(task_columns(t, lambda when: when)["data"])

        if all(stored.get(i) == as_stored(t) for i, t in after.items()):
            return True
        if all(
            (i not in stored) if t is None else stored.get(i) == as_stored(t)
            for i, t in before.items()
        ):
            return False
        return None


class _LostInFlight(Exception):
    """The connection broke while a whole transaction, COMMIT included, was in flight."""

    def __init__(
        self, outcomes: list[Outcome], txs: list[PgTx], backend_pid: int, sent_at: datetime
    ) -> None:
        super().__init__("connection lost with a commit in flight")
        self.outcomes = outcomes
        self.txs = txs
        self.backend_pid = backend_pid
        self.sent_at = sent_at


_COMMIT = [Statement("COMMIT", None, False)]
# Failures that leave nothing behind and pass when the batch runs again: a
# serialization failure, a deadlock, a prepared statement gone (postgres_tx.py).
_AGAIN = ("40001", "40P01", PREPARED_GONE)


def _same_but_expiry(mine: Task, fresh: Task) -> bool:
    a, b = mine.lease, fresh.lease
    return (mine.version, mine.last_seq, a.epoch, a.owner) == (
        fresh.version,
        fresh.last_seq,
        b.epoch,
        b.owner,
    )


def _settle(future: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if future.done():
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)
