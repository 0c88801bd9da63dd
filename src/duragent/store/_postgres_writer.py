"""The PostgreSQL store's writer: the commits of a process grouped into one transaction.

Every commit asked for while a transaction is in flight (or in the same
event-loop tick) joins the next one, so one fsync and two round trips carry
many commits: the writes of the whole batch go in one message (BEGIN, the
statements, pg_notify), then COMMIT, with one UPDATE per task row however
many of the batch's commits changed it and one INSERT for all their entries
(_postgres_tx.py `Deferred`). A commit whose task row this process
wrote last needs no read: its UPDATE is guarded by the row's stamp, and a row
someone else changed meanwhile makes the batch run again with row locks (the
way every commit ran before). A job needing a read (a claim, a document, a
task created elsewhere) runs on the connection inside a savepoint, so a
refused job (stale lease, conflict) leaves its batch-mates untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

import psycopg
import psycopg_pool
from psycopg.pq import TransactionStatus

from duragent.errors import CommitOutcomeUnknown, StoreUnavailable
from duragent.store._commits import mark_failed
from duragent.store._group_commit import GroupCommit, Job, Outcome
from duragent.store._postgres_copies import refresh_copies
from duragent.store._postgres_landed import LostInFlight, landed_in, server_of
from duragent.store._postgres_lanes import (
    MAX_LANES,
    Lane,
    Probe,
    Spares,
    pick,
    statements_of,
    tasks_of,
)
from duragent.store._postgres_message import (
    PREPARED_GONE,
    StaleRow,
    Statement,
    raw,
    send,
    send_and_commit,
)
from duragent.store._postgres_notify import (
    CONTROL_CHANNEL,
    change_notifies,
    control_payload,
)
from duragent.store._postgres_schema import Conn
from duragent.store._postgres_tx import BufferedPgTx, Deferred, NeedsServer, PgTx
from duragent.store._postgres_wire import fly
from duragent.types import Task

# A committed batch: (it changed anything, it made work, the tasks it wrote or deleted).
Changes = tuple[bool, bool, frozenset[str]]

HOLD_SECONDS = 60.0  # the longest the writer keeps a pooled connection


class _Run:
    """One attempt at a batch as its jobs run: the statements still to send, the
    jobs' outcomes and transactions, the rows as the jobs so far left them."""

    __slots__ = ("batch", "deferred", "outcomes", "queued", "rows", "txs", "written")

    def __init__(self, batch: list[Job[PgTx]], rows: Mapping[str, Task]) -> None:
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


@dataclass(slots=True)
class _Tries:
    """Where the attempts at one batch are (`PgWriter.run_batch`)."""

    attempt: int = 0
    cached: bool = True  # jobs run on this process's copies of their rows
    reprepared: bool = False  # the prepared statements were made again once
    committing: bool = False  # COMMIT was sent on its own, its answer not read
    refreshed: int = 0  # times the copies of the rows were read again


class PgWriter(GroupCommit[PgTx, Changes]):
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
        on_commit: Callable[[asyncio.AbstractEventLoop, bool, frozenset[str]], None],
        max_batch: int = 256,
    ) -> None:
        super().__init__(where=where, max_batch=max_batch, thread_name="duragent-pg-writer")
        self.pool = pool
        self.namespace = namespace
        self.retries = retries
        self.translate = translate
        self.lost = lost
        self.on_commit = on_commit  # (loop, work, tasks) after a batch that changed something
        self.rereads = 0  # batches run again, reading their rows, because a copy was stale
        self.flights = 0  # batches sent from their event loop, answered or not (`run_here`)
        self.rows: dict[str, Task] = {}  # task rows as this process last committed them
        self._held: Conn | None = None  # the writer thread's connection (see _connection)
        self._held_since = 0.0
        # Whether a batch on cached rows is sent from its event loop (`run_here`);
        # off, every batch runs on the writer thread.
        self.on_loop = True
        self._air: list[Lane] = []  # batches sent from a loop, answers unread (lanes)
        self._spares = Spares(pool, HOLD_SECONDS, self.submit_to_thread)  # lanes' connections
        self._handed: list[tuple[list[Job[PgTx]], BaseException]] = []  # lanes that failed
        self._more_due = False  # `_more` is scheduled
        self.lanes = 0  # batches sent while another was in flight

    def rescue(self) -> None:
        """Hand to the writer thread a turn an event loop holds and cannot use
        (store/_turns.py): else the writer stays busy, and every later commit,
        and closing the store, waits for ever.

        Batches in flight (lanes) are taken over only from a loop that closed
        before reading their answers (a closed loop runs no callback again, so
        the two never read a socket at once); their callers, on that loop, are
        gone, and each lands or fails as any batch. A next step still waiting
        in a loop that is not running is taken over at once
        (`GroupCommit.rescue`)."""
        air = self._air
        if not air:
            super().rescue()
            return
        with self._lock:
            taken = [lane for lane in self._air if not lane.rescued and _closed(lane)]
            for lane in taken:
                lane.rescued = True
        for lane in taken:
            assert lane.flight is not None
            self.submit_to_thread(lane.flight.finish)

    def flying(self) -> bool:
        return bool(self._air)

    def queued(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._air and not self._more_due:
            self._more_due = True
            loop.call_soon(self._more, loop)

    def next_handed(self) -> tuple[list[Job[PgTx]], BaseException] | None:
        with self._lock:
            return self._handed.pop(0) if self._handed else None

    def handed_waiting(self) -> bool:
        return bool(self._handed)

    def back_to_loop(self) -> bool:
        return self.on_loop

    def announce(self, loop: asyncio.AbstractEventLoop, notes: Changes | None, ok: bool) -> None:
        if notes is not None and notes[0]:
            self.on_commit(loop, notes[1], notes[2])

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

    def close(self) -> None:
        """After `finish`: the connection kept between batches back to the pool."""
        self.shutdown()
        conn, self._held = self._held, None
        if conn is not None:
            self.pool.putconn(conn)
        self._spares.close()

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

    def run_here(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Send the next batch from `loop` (a `Flight`, _postgres_wire.py) if it can
        go from here: its jobs are all this loop's and all run on cached rows, and
        the writer holds an idle connection on the raw wire. False: the thread must
        run it. Its answer is read on the loop; if it reports a failure, the thread
        takes the batch over (`run_batch`), with the failure as its first attempt's.
        While it flies, jobs queued behind it may go in lanes of their own (`_more`)."""
        conn = self._held
        if (
            not self.on_loop
            or conn is None
            or conn.info.transaction_status is not TransactionStatus.IDLE
            or time.monotonic() - self._held_since >= HOLD_SECONDS
            or not raw(conn)
        ):
            return False
        batch = self.take(loop)
        if batch is None:
            return False
        if not batch:
            return True
        try:
            plan = self._plan(batch)
        except Exception:  # the thread runs it again and tells its callers
            plan = None
        if plan is None:
            self.put_back(batch)
            return False
        statements, outcomes, txs = plan
        tasks: frozenset[str] | None = frozenset()
        for tx in txs:
            touched = tasks_of(tx)
            tasks = None if tasks is None or touched is None else tasks | touched
        lane = self._lane(batch, outcomes, txs, conn, tasks, self._held_since)
        # The lane's from here on: a flight that fails at once answers inside
        # `_launch`, giving the connection back and waking the writer thread,
        # which must not find it still held as its own.
        self._held = None
        try:
            flown = self._launch(loop, lane, statements)
        except Exception as exc:  # nothing went out: the thread runs the batch again
            self._held = conn
            self.to_thread((batch, exc))
            return True
        if not flown:  # the connection is in use: nothing went out
            self._held = conn
            self.put_back(batch)
            return False
        return True

    def _lane(
        self,
        batch: list[Job[PgTx]],
        outcomes: list[Outcome],
        txs: list[PgTx],
        conn: Conn,
        tasks: frozenset[str] | None,
        taken_at: float,
    ) -> Lane:
        info = conn.info
        return Lane(
            batch, outcomes, txs, conn, tasks, info.backend_pid, datetime.now(UTC),
            server_of(conn), taken_at,
        )  # fmt: skip

    def _launch(
        self, loop: asyncio.AbstractEventLoop, lane: Lane, statements: list[Statement]
    ) -> bool:
        """Send `lane`'s batch from `loop`; False, nothing sent, if its connection is in use."""
        flight = fly(loop, lane.conn, statements, lambda error: self._landed(loop, lane, error))
        if flight is None:
            return False
        lane.flight = flight
        with self._lock:
            self._air.append(lane)
        self.flights += 1
        flight.start()
        return True

    def _landed(self, loop: asyncio.AbstractEventLoop, lane: Lane, error: Exception | None) -> None:
        """A lane's answer is in: its callers answered, or the batch left for the
        thread; the next batch once no lane is left in the air."""
        with self._lock:
            self._air.remove(lane)
        if error is None:
            self._give_back(lane.conn, lane.taken_at)
            self._keep_rows(lane.txs)
            self.ended(lane.batch, lane.outcomes)
            if not loop.is_closed():
                settled = list(zip(lane.batch, lane.outcomes, strict=True))
                try:
                    self._settle(loop, settled, _changes(lane.txs))
                finally:
                    self._after_lane(loop)
                return
        else:
            if isinstance(error, psycopg.Error) and self.lost(error):
                lost = LostInFlight(lane.outcomes, lane.txs, lane.pid, lane.sent_at, lane.server)
                lost.__cause__ = error
                error = lost
            conn = lane.conn
            self.submit_to_thread(lambda: self._discard(conn))
            with self._lock:
                self._handed.append((lane.batch, error))
        self._after_lane(loop)

    def _after_lane(self, loop: asyncio.AbstractEventLoop) -> None:
        """After a lane landed: more lanes while others fly; once none is left, the
        next batch on `loop`, or on the thread if one failed or the loop closed."""
        if self._air:
            if not loop.is_closed():
                self.queued(loop)
            return
        if self._handed or loop.is_closed():
            self.to_thread()
            return
        self._next_here(loop)

    def _more(self, loop: asyncio.AbstractEventLoop) -> None:
        """While lanes fly from `loop`: the jobs queued behind them that touch none
        of their tasks go now, in a lane of their own (_postgres_lanes.py)."""
        self._more_due = False
        air = self._air
        # A lane per two connections the pool may open, so readers and claims keep theirs.
        if not air or len(air) >= min(MAX_LANES, self.pool.max_size // 2) or self._handed:
            return
        if loop.is_closed():
            return
        if any(lane.flight is None or lane.flight.loop is not loop for lane in air):
            return
        with self._lock:
            pending = self._pending[: self.max_batch]
        try:
            picked = pick(pending, loop, air, self.rows, self.namespace)
        except Exception:  # left queued: the next batch meets it again
            return
        if not picked.batch:
            return
        conn, taken_at = self._spares.take(lambda: _call_soon(loop, self.queued, loop))
        if conn is None:
            for job in picked.batch:  # its verdicts are reached again when it runs
                if job.link is not None:
                    job.link.failed = None
            return
        chosen = {id(job) for job in picked.batch}
        with self._lock:  # only this loop takes jobs off the queue while lanes fly
            self._pending = [job for job in self._pending if id(job) not in chosen]
        statements = statements_of(picked, notifications(self.namespace, picked.txs))
        lane = self._lane(
            picked.batch, picked.outcomes, picked.txs, conn, frozenset(picked.tasks), taken_at
        )
        try:
            flown = self._launch(loop, lane, statements)
        except Exception as exc:  # nothing went out
            flown = True
            self.submit_to_thread(lambda: self._discard(conn))
            with self._lock:
                self._handed.append((picked.batch, exc))
        if not flown:
            self.pool.putconn(conn)
            self.put_back(picked.batch)
            return
        self.lanes += 1

    def _give_back(self, conn: Conn, taken_at: float) -> None:
        """A landed lane's connection: kept for the next batch, or for a lane, or back."""
        if (
            self._held is None
            and conn.info.transaction_status is TransactionStatus.IDLE
            and self.pool.max_size > 1
            and time.monotonic() - taken_at < HOLD_SECONDS
        ):
            self._held, self._held_since = conn, taken_at
        else:
            self._spares.give_back(conn, taken_at)

    def _discard(self, conn: Conn) -> None:
        """On the thread: a failed lane's connection rolled back and given back."""
        if not conn.closed and conn.info.transaction_status is not TransactionStatus.IDLE:
            with contextlib.suppress(psycopg.Error):
                conn.execute("ROLLBACK")
        self.pool.putconn(conn)

    def _plan(
        self, batch: list[Job[PgTx]]
    ) -> tuple[list[Statement], list[Outcome], list[PgTx]] | None:
        """The batch's transaction, `BEGIN` to the notifications, when every job runs
        on this process's copies of its rows; None when one must run on the server."""
        run = _Run(batch, self.rows)
        for job in batch:
            run.next_job()
            ran = self._on_cached_rows(job, run.row)
            if ran is None:
                return None
            run.took(*ran)
        run.queued += run.deferred.statements() + notifications(self.namespace, run.txs)
        return run.queued, run.outcomes, run.txs

    def run_batch(
        self, batch: list[Job[PgTx]], failed: BaseException | None
    ) -> tuple[list[Outcome], Changes | None]:
        """The batch's outcomes, and whether it changed anything and made work.

        Retried like any write: whatever failed before COMMIT was sent (a lost
        connection, a deadlock) left nothing behind. A connection lost while
        COMMIT was in flight may or may not have committed, and is reported so.
        `failed`: how the first attempt, made on the event loop (`run_here`), failed.
        """
        tries = _Tries()
        while True:
            tries.attempt += 1
            tries.committing = False
            try:
                outcomes, txs = self._attempt_on_connection(batch, tries, failed)
            except psycopg_pool.PoolTimeout as exc:
                self.rows.clear()
                busy = StoreUnavailable(f"{self.where}: no connection available: {exc}")
                return [(False, busy)] * len(batch), None
            except LostInFlight as flight:
                # The whole transaction went as one message, COMMIT included, and
                # the connection broke before its answer: look whether it landed.
                self.rows.clear()
                landed = landed_in(
                    self.pool, flight.txs, flight.backend_pid, flight.sent_at, flight.server
                )
                if landed:
                    outcomes, txs = flight.outcomes, flight.txs
                elif landed is False and tries.attempt <= self.retries:
                    with contextlib.suppress(Exception):
                        self.pool.check()  # the pool may hold more dropped connections
                    continue
                else:
                    return [(False, self._unknown())] * len(batch), None
            except StaleRow:
                self.rereads += 1
                if tries.cached and tries.refreshed < 3 and self._refresh():
                    tries.refreshed += 1  # again on fresh copies (_postgres_copies.py)
                    continue
                self.rows.clear()
                tries.cached = False  # again, reading every row under its lock
                continue
            except psycopg.Error as exc:
                self.rows.clear()
                final = self._after_error(exc, tries)
                if final is not None:
                    return [(False, final)] * len(batch), None
                continue
            finally:
                failed = None
            self._keep_rows(txs)
            return outcomes, _changes(txs)

    def _attempt_on_connection(
        self, batch: list[Job[PgTx]], tries: _Tries, failed: BaseException | None
    ) -> tuple[list[Outcome], list[PgTx]]:
        """One attempt at the batch, committed; `failed`, if given, is raised as
        its failure (the attempt made on the event loop)."""
        with self._connection() as conn:
            try:
                if failed is not None:
                    raise failed
                outcomes, txs, committed = self._attempt(conn, batch, tries.cached)
                if not committed:
                    tries.committing = True
                    send(conn, _COMMIT)
            except BaseException:
                if not tries.committing and not conn.closed:
                    with contextlib.suppress(psycopg.Error):
                        conn.execute("ROLLBACK")
                raise
        return outcomes, txs

    def _refresh(self) -> bool:
        """Read this process's copies of its rows again (_postgres_copies.py)."""
        try:
            with self._connection() as conn:
                return refresh_copies(conn, self.rows)
        except psycopg.Error:
            return False

    def _after_error(self, exc: psycopg.Error, tries: _Tries) -> BaseException | None:
        """What failed attempt `exc` ends in: the error every job gets, or None to try again."""
        lost = self.lost(exc)
        if tries.committing and lost:
            return self._unknown()
        if exc.sqlstate == PREPARED_GONE and not tries.reprepared:
            # The connection lost the statements prepared on it; they are
            # prepared again on this try (_postgres_wire.py), at once.
            tries.reprepared = True
            tries.attempt -= 1
            return None
        if tries.cached and not lost and exc.sqlstate not in _AGAIN:
            # A statement of the batch failed: find whose, job by job.
            tries.cached = False
            return None
        if not (lost or exc.sqlstate in _AGAIN) or tries.attempt > self.retries:
            return self.translate(exc)
        if lost:
            # The pool may hold more connections the server dropped.
            with contextlib.suppress(Exception):
                self.pool.check()
        if tries.attempt > 1:
            time.sleep(min(0.05 * 2**tries.attempt, 1.0))
        return None

    def _unknown(self) -> CommitOutcomeUnknown:
        return CommitOutcomeUnknown(
            f"{self.where}: the connection was lost while committing; the commit "
            "may or may not have been applied, re-read the task to find out"
        )

    def _keep_rows(self, txs: list[PgTx]) -> None:
        """Keep the rows a committed batch wrote, as the next batch's copies."""
        for tx in txs:
            self.rows.update(tx.written)
        if len(self.rows) > 10_000:
            self.rows.clear()

    def _attempt(
        self, conn: Conn, batch: list[Job[PgTx]], cached: bool
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
        queued = run.queued + run.deferred.statements() + notifications(self.namespace, txs)
        if not sent:
            pid, sent_at, server = conn.info.backend_pid, datetime.now(UTC), server_of(conn)
            try:
                send_and_commit(conn, queued)
            except psycopg.Error as exc:
                if self.lost(exc):
                    raise LostInFlight(outcomes, txs, pid, sent_at, server) from exc
                raise
            return outcomes, txs, True
        send(conn, queued)
        return outcomes, txs, False

    def _on_cached_rows(
        self, job: Job[PgTx], row: Callable[[str], Task | None]
    ) -> tuple[BufferedPgTx, Outcome] | None:
        """Run `job` on this process's copies of its rows: its writes and outcome,
        or None when it must run on the connection (it reads there)."""
        btx = Probe(self.namespace, row)  # the tasks it touched, for lanes
        try:
            return btx, (True, job.fn(btx))
        except NeedsServer:
            return None
        except Exception as exc:  # refused before writing anything...
            # ...but if judged on this process's copy of a row, which another
            # process may have changed since: ask the row as stored.
            return None if btx.based_on else (btx, (False, exc))


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: object) -> None:
    with contextlib.suppress(RuntimeError):  # closed: nobody waits there now
        loop.call_soon_threadsafe(fn, *args)


def _closed(lane: Lane) -> bool:
    return lane.flight is not None and lane.flight.loop.is_closed()


def _changes(txs: list[PgTx]) -> Changes:
    moved = frozenset().union(*(tx.notes.tasks for tx in txs))
    return any(tx.changed for tx in txs), any(tx.work for tx in txs), moved


def notifications(namespace: str, txs: list[PgTx]) -> list[Statement]:
    """The NOTIFYs a batch sends, delivered by the server only if and when it commits."""
    out = []
    if any(tx.changed for tx in txs):
        _, work, moved = _changes(txs)
        out += change_notifies(namespace, work, moved)
    for tx in txs:
        # One per control request, in commit order, to the listener of the
        # task's owning worker.
        for task_id in tx.notes.controlled:
            payload = control_payload(namespace, task_id)
            out.append(Statement("SELECT pg_notify(%s, %s)", (CONTROL_CHANNEL, payload), False))
    return out


_COMMIT = [Statement("COMMIT", None, False)]
# Failures that leave nothing behind and pass when the batch runs again: a
# serialization failure, a deadlock, a prepared statement gone (_postgres_wire.py).
_AGAIN = ("40001", "40P01", PREPARED_GONE)


def _same_but_expiry(mine: Task, fresh: Task) -> bool:
    a, b = mine.lease, fresh.lease
    return (mine.version, mine.last_seq, a.epoch, a.owner) == (
        fresh.version,
        fresh.last_seq,
        b.epoch,
        b.owner,
    )
