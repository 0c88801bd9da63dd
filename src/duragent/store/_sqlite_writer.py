"""The SQLite store's writer: the commits of a process grouped into one transaction.

Every commit asked for while a transaction is in flight (or in the same
event-loop tick) shares the next transaction (one fsync); a refused commit
(stale lease, conflict) leaves its batch-mates untouched. The queue, the turn
and the settlement are `GroupCommit`'s (store/_group_commit.py); this module
says how a batch runs: inline on the loop, or on the writer thread.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from duragent.errors import StoreCorrupt, StoreError, StoreUnavailable
from duragent.store._group_commit import GroupCommit, Job, Outcome
from duragent.store._sqlite_schema import ready_wal
from duragent.store._sqlite_tx import Deferred, RowCache, SqliteTx, TaskNumbers
from duragent.types import Task

# How many of the store's last batches must come from the same one asyncio task
# for a FULL batch to run inline (run_here).
RECENT = 16


@dataclass(slots=True)
class BatchNotes:
    """What a committed batch announces: whether it made work, which tasks got
    a control request, which tasks it wrote or deleted."""

    work: bool = False
    controlled: list[str] = field(default_factory=list)
    tasks: set[str] = field(default_factory=set)
    announced: bool = False  # to other processes once, whatever the loops it settles on


class _Refused(Exception):
    """A job of an unguarded batch failed: undo the batch, run it guarded."""


Announce = Callable[[BatchNotes | None, bool], None]  # (notes, any job committed)


class SqliteWriter(GroupCommit[SqliteTx, BatchNotes]):
    """At FULL, transactions run on the writer thread unless nothing else could
    run meanwhile, so the loop never waits for an fsync or for another
    process's write lock (see `run_here`)."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        *,
        where: str,
        full: bool,
        rows: RowCache,
        nums: TaskNumbers,
        announce: Announce,
        max_batch: int,
    ) -> None:
        super().__init__(where=where, max_batch=max_batch, thread_name="duragent-sqlite-writer")
        self.conn = conn
        self.full = full
        self.wal_short = full  # until the first write transaction readies it
        self.rows = rows
        self.nums = nums  # task id -> its number in the entries table
        self._announce = announce
        # Set per batch: 0 inline (the loop never waits for another process's
        # lock), 30 s on the writer thread.
        self._busy_ms = -1
        # Which asyncio tasks the last batches' commits came from (run_here).
        self._recent: deque[asyncio.Task[Any] | None] = deque(maxlen=RECENT)

    def announce(self, loop: asyncio.AbstractEventLoop, notes: BatchNotes | None, ok: bool) -> None:
        self._announce(notes, ok)

    def _busy_wait(self, ms: int) -> None:
        if self._busy_ms != ms:
            self.conn.execute(f"PRAGMA busy_timeout={ms}")
            self._busy_ms = ms

    def run_here(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Run the next batch inline when nothing else could run meanwhile.

        Without fsyncs (NORMAL) a batch is a fraction of a millisecond of CPU,
        less than a hand-off to a thread. At FULL a batch runs inline only when
        its commits, and those of the store's last `RECENT` batches, all come
        from one asyncio task: a task committing alone (a round's closing commit
        and the next model call's share one) has nobody to overlap its fsync
        with. When several tasks commit to this store (several runners, a
        stream's progress beside another task's round), other work is under
        way: the writer thread runs the batch, the GIL released during the
        fsync, so that work runs meanwhile. (Whether the loop has callbacks
        ready would tell more, but no public API says; asyncio's private
        `_ready` list is not there on uvloop.) A batch holding another loop's
        commits always goes to the thread, which answers each loop on its own.
        Only if another process holds the write lock does the batch go to the
        thread, which waits for the lock.
        """
        batch = self.take(loop)
        if batch is None:
            return False
        if not batch:
            return True
        if self.full and not self._alone(batch):
            self.put_back(batch)
            return False
        self._busy_wait(0)
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError:
            self.put_back(batch)
            return False
        outcomes, notes = self._run_batch(batch)
        self.landed_here(loop, batch, outcomes, notes)
        return True

    def _alone(self, batch: list[Job[SqliteTx]]) -> bool:
        """Whether `batch` and the last `RECENT` batches all come from one asyncio
        task; `batch` is then counted among the recent ones (FULL only: NORMAL
        runs every batch it can on the loop and keeps no count)."""
        origins = {job.origin for job in batch}
        # (a tuple first: the writer thread extends the deque too; copying it is one step)
        alone = len(origins) == 1 and origins.issuperset(tuple(self._recent))
        self._recent.extend(origins)
        return alone

    def run_batch(
        self, batch: list[Job[SqliteTx]], failed: BaseException | None
    ) -> tuple[list[Outcome], BatchNotes | None]:
        self._busy_wait(30000)  # here waiting for another process is the point
        if self.full:
            self._alone(batch)  # counted among the recent batches all the same
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            return [(False, translate(exc))] * len(batch), None
        return self._run_batch(batch)

    def _run_batch(self, batch: list[Job[SqliteTx]]) -> tuple[list[Outcome], BatchNotes | None]:
        """Run the jobs in the open transaction and commit; return their outcomes
        and what the committed ones announce (None when nothing committed).

        A refused job (stale lease, conflict) is undone alone. Refusals are
        rare, so several jobs first run one after another with nothing between
        them; only if one is refused is the batch undone to its start (one
        savepoint for all) and run again with each job in a savepoint of its
        own, which spares two statements per job in the common case. Run
        unguarded, the jobs' task-row updates and entries wait (_sqlite_tx.py
        `Deferred`) and are written together before the commit: a task two
        commits of the batch change is written once, all entries in one
        statement. A job alone in its batch needs neither savepoint: its failure
        rolls the transaction back.
        """
        conn = self.conn
        notes: BatchNotes | None = None
        try:
            if self.wal_short:  # the write lock is held, and nothing written yet
                self.wal_short = False
                ready_wal(conn)
            # The write lock is held: nobody commits until this batch does. A
            # cached row confirmed at this data_version needs no stamp read
            # (RowCache.fresh); this connection's own commits never move it.
            version = conn.execute("PRAGMA data_version").fetchone()[0]
            if len(batch) == 1:
                run = self._run_jobs(batch, guard=False, data_version=version)
            else:
                conn.execute("SAVEPOINT batch")
                try:
                    run = self._run_jobs(batch, guard=None, data_version=version)
                except _Refused:
                    conn.execute("ROLLBACK TO batch")
                    run = self._run_jobs(batch, guard=True, data_version=version)
                conn.execute("RELEASE batch")
            outcomes, written, numbered, notes = run
            if conn.in_transaction:
                conn.execute("COMMIT")
            for task in written.values():
                self.rows.put(task, version)
            self.nums.update(numbered)
        except Exception as exc:  # the transaction itself failed: nothing was written
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            self.rows.rows.clear()
            self.nums.clear()
            outcomes = [(False, translate(exc))] * len(batch)
        return outcomes, notes if any(ok for ok, _ in outcomes) else None

    def _run_jobs(
        self, batch: list[Job[SqliteTx]], *, guard: bool | None, data_version: int
    ) -> tuple[list[Outcome], dict[str, Task], dict[str, int], BatchNotes]:
        """Run the jobs; `guard`: each in a savepoint (True), alone in the
        transaction (False), or unguarded, raising _Refused at a job's failure
        (None) for the caller to undo the batch and run it guarded. `data_version`:
        the writer connection's, for the row cache (RowCache.fresh)."""
        conn = self.conn
        outcomes: list[Outcome] = []
        written: dict[str, Task] = {}
        numbered: dict[str, int] = {}
        notes = BatchNotes()
        # Unguarded, the rows and entries the jobs write wait to be written together.
        deferred = Deferred() if guard is None else None
        for job in batch:
            if guard:
                conn.execute("SAVEPOINT job")
            tx = SqliteTx(conn, self.rows, self.nums, written, deferred, data_version=data_version)
            try:
                outcomes.append((True, job.fn(tx)))
            except Exception as exc:  # the job's own failure: undo only this job
                if guard is None:
                    self._forget([*written, *tx.written])
                    raise _Refused from exc
                conn.execute("ROLLBACK TO job" if guard else "ROLLBACK")
                self._forget(tx.written)
                outcomes.append((False, translate(exc)))
                self.refused(job, outcomes[-1])  # before a job that follows it runs
                if not guard:
                    break
            else:
                written.update(tx.written)
                numbered.update(tx.new_nums)
                notes.work = notes.work or tx.notes.work
                notes.controlled += tx.notes.controlled
                notes.tasks |= tx.notes.tasks
            if guard:
                conn.execute("RELEASE job")
        if deferred is not None:
            try:
                deferred.write(conn)
            except Exception as exc:  # whose write failed is for the guarded run to find
                self._forget(written)
                raise _Refused from exc
        return outcomes, written, numbered, notes

    def _forget(self, task_ids: Iterable[str]) -> None:
        """Drop from the row cache the rows of writes that never reached the file."""
        for task_id in task_ids:
            self.rows.rows.pop(task_id, None)


def translate(exc: BaseException) -> BaseException:
    """A sqlite3 error as the store's own."""
    if isinstance(exc, sqlite3.OperationalError):
        msg = str(exc)
        if "locked" in msg or "busy" in msg:
            return StoreUnavailable(f"the SQLite store is busy: {msg}")
        if "disk" in msg or "I/O" in msg:
            return StoreUnavailable(f"the SQLite store could not write: {msg}")
        return StoreError(f"SQLite error: {msg}")
    if isinstance(exc, sqlite3.DatabaseError):
        return StoreCorrupt(f"the SQLite store cannot be read: {exc}")
    return exc
