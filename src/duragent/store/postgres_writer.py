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

from duragent.errors import CommitOutcomeUnknown, StoreError, StoreUnavailable
from duragent.store.commits import PendingCommit, mark_failed
from duragent.store.postgres_flight import Flight
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
    check_commit,
    commit_message,
    send,
    send_and_commit,
)
from duragent.store.turns import Turn, watch
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


class _Run:
    """One attempt at a batch as its jobs run: the statements still to send, the
    jobs' outcomes and transactions, the rows as the jobs so far left them."""

    __slots__ = ("batch", "deferred", "outcomes", "queued", "rows", "txs", "written")

    def __init__(self, batch: list[_Job], rows: Mapping[str, Task]) -> None:
        self.batch = batch
        self.rows = rows  # this process's copies, as the last batch left them
        self.queued: list[Statement] = [Statement("BEGIN", None, False)]
        self.outcomes: list[Outcome] = []
        self.txs: list[PgTx] = []
        self.written: dict[str, Task] = {}
        self.deferred = Deferred()  # the row updates and entries of jobs run on cached rows
        for job in batch:  # an earlier attempt's verdicts do not stand
            if job.link is not None:
                job.link.failed = None

    def row(self, task_id: str) -> Task | None:
        return self.written.get(task_id) or self.rows.get(task_id)

    def next_job(self) -> None:
        """Before the next job runs: tell the last one's link if it was refused
        (a job that follows a refused one is refused before it runs)."""
        if self.outcomes:
            mark_failed([self.batch[len(self.outcomes) - 1].link], self.outcomes[-1:])

    def took(self, btx: BufferedPgTx, outcome: Outcome) -> None:
        """A job that ran on cached rows: its writes wait to go with the batch's."""
        self.outcomes.append(outcome)
        if outcome[0]:
            self.queued += btx.statements
            self.deferred.take_in(btx)
            self.written.update(btx.written)
            self.txs.append(btx)


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
        self.flights = 0  # batches sent from their event loop, answered or not (`_fly`)
        self.rows: dict[str, Task] = {}  # task rows as this process last committed them
        self._lock = threading.Lock()
        self._pending: list[_Job] = []
        self._busy = False
        self._stopped = False  # no new work: the store is closing (see stop)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="duragent-pg-writer")
        self._held: Conn | None = None  # the writer thread's connection (see _connection)
        self._held_since = 0.0
        # Whether a batch on cached rows is sent from its event loop (`_fly`);
        # off, every batch runs on the writer thread.
        self.on_loop = True
        self._flight: Flight | None = None  # the batch sent from a loop, answer unread
        self._turn = Turn()  # the loop whose `_next` runs the next batch (store/turns.py)

    def submit(self, fn: Callable[[PgTx], Any], link: PendingCommit | None) -> asyncio.Future[Any]:
        """Queue `fn` for the next transaction; the future answers once it committed."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        with self._lock:
            if self._stopped:
                raise StoreError(f"{self.where} is closed")
            self._pending.append(_Job(fn, future, loop, link))
            start = not self._busy
            self._busy = True
            if start:
                turn = self._turn.give(loop)
            elsewhere = self._turn.loop not in (None, loop)
        if start:
            # call_soon, not now: every coroutine already runnable in this tick
            # gets to add its commit to the same transaction.
            loop.call_soon(self._next, loop, turn)
        elif elsewhere:  # that loop may have stopped with the turn, or stop later
            watch(loop, future, self.rescue)
        return future

    def rescue(self) -> None:
        """Hand to the writer thread a turn an event loop holds and cannot use
        (store/turns.py): else the writer stays busy, and every later commit,
        and closing the store, waits for ever.

        A batch in flight is taken over only from a loop that closed before
        reading its answer (a closed loop runs no callback again, so the two
        never read the socket at once); its callers, on that loop, are gone,
        and it lands or fails as any batch. A next step still waiting in a
        loop that is not running is taken over at once: if that loop runs
        again, the step finds the turn gone and does nothing."""
        flight = self._flight
        if flight is not None:
            if not flight.loop.is_closed():
                return
            with self._lock:
                if self._flight is not flight:
                    return
                self._flight = None
                self._turn.take()
            self._executor.submit(flight.finish)
            return
        with self._lock:
            if not self._busy or self._flight is not None or not self._turn.stranded():
                return
            self._turn.take()
        self._executor.submit(self._drain)

    def _next(self, loop: asyncio.AbstractEventLoop, turn: int) -> None:
        """Run the next batch: on this loop if it can (`_fly`), else on the thread."""
        with self._lock:
            if not self._turn.holds(turn):
                return  # taken from this loop meanwhile (`rescue`)
        if not self._fly(loop):
            self._to_thread()

    def _to_thread(self, handed: tuple[list[_Job], BaseException] | None = None) -> None:
        """The writer thread takes the turn (`_drain`)."""
        with self._lock:
            self._turn.take()
        self._executor.submit(self._drain, handed)

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

    def stop(self) -> bool:
        """Take no new work, if none is left: whether it stopped. Until then
        the commits already asked for still land (the store's `close()` waits).
        Decided under the lock `submit` queues with: a commit from another
        thread is queued before this, and lands, or refused."""
        with self._lock:
            if self._busy:
                return False
            self._stopped = True
            return True

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
        self._release(conn)

    def _release(self, conn: Conn) -> None:
        """Keep the connection for the next batch, or give it back (see `_connection`)."""
        if (
            conn.info.transaction_status is TransactionStatus.IDLE
            and self.pool.max_size > 1
            and time.monotonic() - self._held_since < HOLD_SECONDS
        ):
            self._held = conn
        else:
            self.pool.putconn(conn)

    # --- on the event loop: a batch on cached rows, sent from where its commits came ---

    def _fly(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Send the next batch from `loop` (postgres_flight.py) if it can go
        from here: its jobs are all this loop's and all run on cached rows, and
        the writer holds an idle connection. False: the thread must run it.
        Its answer is read on the loop; if it reports a failure, the thread
        takes the batch over (`_run`), with the failure as its first attempt's."""
        conn = self._held
        if (
            not self.on_loop
            or conn is None
            or conn.info.transaction_status is not TransactionStatus.IDLE
            or time.monotonic() - self._held_since >= HOLD_SECONDS
        ):
            return False
        with self._lock:
            batch = self._pending[: self.max_batch]
            if not batch:
                self._busy = False
                self._turn.take()
                return True
            if any(job.loop is not loop for job in batch):
                return False
            del self._pending[: len(batch)]
        try:
            plan = self._plan(batch)
        except Exception:  # the thread runs it again and tells its callers
            plan = None
        if plan is None or not conn.lock.acquire(blocking=False):
            with self._lock:
                self._pending[:0] = batch
            return False
        statements, outcomes, txs = plan
        self._held = None
        pid, sent_at = conn.info.backend_pid, datetime.now(UTC)

        def answered(results: list[Any] | None, error: Exception | None) -> None:
            self._flight = None
            conn.lock.release()
            if error is None:
                assert results is not None
                try:
                    check_commit(message, statements, message.answered(results))
                except Exception as exc:
                    error = exc
            if error is None:
                self._release(conn)
                self._landed_here(loop, batch, outcomes, txs)
                return
            if isinstance(error, psycopg.Error) and self.lost(error):
                lost = _LostInFlight(outcomes, txs, pid, sent_at)
                lost.__cause__ = error
                error = lost
            self._held = conn  # for the thread's attempt, which hands it back to the pool
            self._to_thread((batch, error))

        try:
            message = commit_message(conn, statements)
            message.send(conn)
        except Exception as exc:  # nothing went out: the thread runs the batch again
            conn.lock.release()
            self._held = conn
            self._to_thread((batch, exc))
            return True
        self.flights += 1
        self._flight = Flight(loop, conn.pgconn, answered)
        self._flight.start()
        return True

    def _plan(self, batch: list[_Job]) -> tuple[list[Statement], list[Outcome], list[PgTx]] | None:
        """The batch's transaction, `BEGIN` to the notifications, when every job runs
        on this process's copies of its rows; None when one must run on the server."""
        run = _Run(batch, self.rows)
        for job in batch:
            run.next_job()
            ran = self._on_cached_rows(job, run.row)
            if ran is None:
                return None
            run.took(*ran)
        run.queued += run.deferred.statements() + _notifications(self.namespace, run.txs)
        return run.queued, run.outcomes, run.txs

    def _landed_here(
        self,
        loop: asyncio.AbstractEventLoop,
        batch: list[_Job],
        outcomes: list[Outcome],
        txs: list[PgTx],
    ) -> None:
        """A batch sent from `loop` committed: answer its callers, then run the next.
        If `loop` closed while it was in flight (the writer thread read the answer,
        `rescue`), nobody waits there: the thread runs the next."""
        self._keep_rows(txs)
        self._ended(batch, outcomes)
        if loop.is_closed():
            self._to_thread()
            return
        changed = any(tx.changed for tx in txs)
        work = any(tx.work for tx in txs)
        try:
            self._settle(loop, list(zip(batch, outcomes, strict=True)), changed, work)
        finally:
            # After the callers just answered, which may add their next commits.
            with self._lock:
                turn = self._turn.give(loop)
            loop.call_soon(self._next, loop, turn)

    # --- the writer thread ---

    def _drain(self, handed: tuple[list[_Job], BaseException] | None = None) -> None:
        """Run batches until none is left, the first the one `handed` over by the
        loop with its failure (`_fly`); give the rest back to their loop when
        they all come from one (it sends them from there, if it can)."""
        while True:
            failed: BaseException | None = None
            if handed is not None:
                (batch, failed), handed = handed, None
            else:
                with self._lock:
                    batch = self._pending[: self.max_batch]
                    del self._pending[: self.max_batch]
                    if not batch:
                        self._busy = False
                        return
            try:
                outcomes, changed, work = self._run(batch, failed)
            except BaseException as exc:  # never leave a caller waiting
                outcomes, changed, work = [(False, exc)] * len(batch), False, False
            self._ended(batch, outcomes)
            by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Job, Outcome]]] = {}
            for job, outcome in zip(batch, outcomes, strict=True):
                by_loop.setdefault(job.loop, []).append((job, outcome))
            for loop, settled in by_loop.items():
                # One wake-up per loop: each call_soon_threadsafe writes to its self-pipe.
                with contextlib.suppress(RuntimeError):  # closed: nobody waits there now
                    loop.call_soon_threadsafe(self._settle, loop, settled, changed, work)
            with self._lock:
                if not self._pending:
                    self._busy = False
                    return
                first = self._pending[0].loop
                if self.on_loop and all(job.loop is first for job in self._pending):
                    turn = self._turn.give(first)  # a loop that stops with it is rescued
                    try:
                        first.call_soon_threadsafe(self._next, first, turn)
                    except RuntimeError:  # closed: run them here
                        self._turn.take()
                    else:
                        return

    def _ended(self, batch: list[_Job], outcomes: list[Outcome]) -> None:
        """A batch's outcomes are known: tell its commits' links (before the next
        batch runs) and count it."""
        mark_failed([job.link for job in batch], outcomes)
        self.batches += 1
        self.jobs_done += len(batch)

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

    def _run(
        self, batch: list[_Job], failed: BaseException | None = None
    ) -> tuple[list[Outcome], bool, bool]:
        """The batch's outcomes, whether it changed anything and whether it made work.

        Retried like any write: whatever failed before COMMIT was sent (a lost
        connection, a deadlock) left nothing behind. A connection lost while
        COMMIT was in flight may or may not have committed, and is reported so.
        `failed`: how the first attempt, made on the event loop (`_fly`), failed.
        """
        attempt = 0
        cached = True
        reprepared = False
        while True:
            attempt += 1
            committing = False
            try:
                with self._connection() as conn:
                    try:
                        if failed is not None:
                            exc, failed = failed, None
                            raise exc
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
                if exc.sqlstate == PREPARED_GONE and not reprepared:
                    # The connection lost the statements prepared on it; they
                    # are prepared again on this try (postgres_tx.py), at once.
                    reprepared = True
                    attempt -= 1
                    continue
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
            self._keep_rows(txs)
            return outcomes, changed, any(tx.work for tx in txs)

    def _keep_rows(self, txs: list[PgTx]) -> None:
        """Keep the rows a committed batch wrote, as the next batch's copies."""
        for tx in txs:
            self.rows.update(tx.written)
        if len(self.rows) > 10_000:
            self.rows.clear()

    def _attempt(
        self, conn: Conn, batch: list[_Job], cached: bool
    ) -> tuple[list[Outcome], list[PgTx], bool]:
        """Run the jobs in one transaction; whether it is committed already (every
        job ran on cached rows: the whole transaction went as one message)."""
        run = _Run(batch, self.rows)
        sent = False
        alone = len(batch) == 1
        for job in batch:
            run.next_job()
            ran = self._on_cached_rows(job, run.row) if cached else None
            if ran is not None:
                run.took(*ran)
                continue
            # The jobs before this one: not under its savepoint.
            run.queued += run.deferred.statements()
            if not alone:
                run.queued.append(Statement("SAVEPOINT job", None, False))
            send(conn, run.queued)
            run.queued, sent = [], True
            tx = PgTx(conn, self.namespace)
            try:
                value = job.fn(tx)
                if not alone:
                    tx.flush()  # under its savepoint: a failing write is this job's alone
            except psycopg.Error as exc:
                if alone or self.lost(exc) or exc.sqlstate in _AGAIN:
                    # The whole batch is retried or fails: a prepared statement
                    # gone is the connection's loss, not this job's failure.
                    raise
                conn.execute("ROLLBACK TO SAVEPOINT job")
                run.outcomes.append((False, self.translate(exc)))
            except Exception as exc:
                if alone:
                    # Nothing else to keep: report the refusal, write nothing.
                    conn.execute("ROLLBACK")
                    conn.execute("BEGIN")
                else:
                    conn.execute("ROLLBACK TO SAVEPOINT job")
                run.outcomes.append((False, exc))
            else:
                if alone:
                    run.queued = tx.take_pending()  # sent with the notifications, below
                else:
                    run.queued.append(Statement("RELEASE SAVEPOINT job", None, False))
                run.written.update(tx.written)
                run.outcomes.append((True, value))
                run.txs.append(tx)
        outcomes, txs = run.outcomes, run.txs
        queued = run.queued + run.deferred.statements() + _notifications(self.namespace, txs)
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

    def _on_cached_rows(
        self, job: _Job, row: Callable[[str], Task | None]
    ) -> tuple[BufferedPgTx, Outcome] | None:
        """Run `job` on this process's copies of its rows: its writes and outcome,
        or None when it must run on the connection (it reads there)."""
        btx = BufferedPgTx(self.namespace, row)
        try:
            return btx, (True, job.fn(btx))
        except NeedsServer:
            return None
        except Exception as exc:  # refused before writing anything...
            # ...but if judged on this process's copy of a row, which another
            # process may have changed since: ask the row as stored.
            return None if btx.based_on else (btx, (False, exc))

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


def _notifications(namespace: str, txs: list[PgTx]) -> list[Statement]:
    """The NOTIFYs a batch sends, delivered by the server only if and when it commits."""
    out = []
    if any(tx.changed for tx in txs):
        channel = WORK_CHANNEL if any(tx.work for tx in txs) else CHANNEL
        out.append(Statement("SELECT pg_notify(%s, %s)", (channel, namespace), False))
    for tx in txs:
        # One per control request, in commit order, to the listener of the
        # task's owning worker.
        for task_id in tx.notes.controlled:
            payload = control_payload(namespace, task_id)
            out.append(Statement("SELECT pg_notify(%s, %s)", (CONTROL_CHANNEL, payload), False))
    return out


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
