"""Lanes: more than one PostgreSQL batch in flight, on as many pooled connections.

Over a slow link a batch costs at least one round trip, and with one batch at
a time a commit asked for while a batch flies waits for that one's answer and
then its own: about a round trip and a half. A lane is a batch in flight on a
connection of its own; while lanes fly from an event loop, the commits that
queue behind them from that loop go at once in another lane (up to
`MAX_LANES`), as long as they touch only tasks none of the lanes in the air
touches (`pick`). The rows of one task therefore commit in order: a task's
next commit waits until the lane that holds the task has landed.

`pick` runs the waiting jobs in order on this process's copies of their rows
(as a flight does), each on a `Probe` that notes every task it reads or
writes. A job that touches a task in the air, or that names (`after=`) a
commit in the air or one left waiting, is left waiting, and its tasks with
it, so no later job of them overtakes it. Anything `pick` cannot see the whole
of stops it, and everything after stays queued in order: a job from another
loop, one that must read on the server (`NeedsServer`), one refused on a copy,
one that writes what is not a task row (a new task, a document).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg_pool
from psycopg.pq import TransactionStatus

from duragent.store._commits import WATCH, PendingCommit, Watch, mark_failed
from duragent.store._group_commit import Job, Outcome
from duragent.store._postgres_message import Statement
from duragent.store._postgres_schema import Conn
from duragent.store._postgres_tx import BufferedPgTx, Deferred, NeedsServer, PgTx
from duragent.store._postgres_wire import Flight
from duragent.types import Entry, Task

MAX_LANES = 2  # batches in flight from one loop at once (fewer with a small pool)


class Probe(BufferedPgTx):
    """A job run on copies, noting each task whose entries it appends."""

    def __init__(self, namespace: str, rows: Callable[[str], Task | None]) -> None:
        super().__init__(namespace, rows)
        self.entry_tasks: set[str] = set()

    def append(self, entries: list[Entry]) -> None:
        super().append(entries)
        self.entry_tasks.update(e.task_id for e in entries)


def tasks_of(tx: PgTx) -> frozenset[str] | None:
    """The tasks a job ran on copies touched; None if it wrote anything else
    (its order against other lanes cannot be told)."""
    if isinstance(tx, BufferedPgTx) and tx.statements:
        return None
    extra = tx.entry_tasks if isinstance(tx, Probe) else set()
    return frozenset(tx.based_on) | frozenset(tx.written) | extra


@dataclass(slots=True)
class Lane:
    """A batch in flight on a connection of its own."""

    batch: list[Job[PgTx]]
    outcomes: list[Outcome]
    txs: list[PgTx]
    conn: Conn
    tasks: frozenset[str] | None  # None: it must fly alone (see `tasks_of`)
    pid: int
    sent_at: datetime
    server: Any
    taken_at: float  # when its connection came from the pool
    flight: Flight | None = None
    rescued: bool = False  # its answer is read by the writer thread

    def links(self) -> set[PendingCommit]:
        return {job.link for job in self.batch if job.link is not None}


@dataclass(slots=True)
class Picked:
    """The jobs `pick` chose, in order, as one batch run on copies."""

    batch: list[Job[PgTx]] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)
    txs: list[PgTx] = field(default_factory=list)
    tasks: set[str] = field(default_factory=set)
    written: dict[str, Task] = field(default_factory=dict)


def pick(
    pending: list[Job[PgTx]],
    loop: object,
    air: list[Lane],
    rows: Mapping[str, Task],
    namespace: str,
) -> Picked:
    """The waiting jobs that may fly now beside the lanes in `air` (see the module)."""
    blocked: set[str] = set()
    links: set[PendingCommit] = set()
    spec: dict[str, Task] = {}  # rows as the lanes in the air leave them
    for lane in air:
        if lane.tasks is None:
            return Picked()
        blocked |= lane.tasks
        links |= lane.links()
        for tx in lane.txs:
            spec.update(tx.written)
    out = Picked()

    def row(task_id: str) -> Task | None:
        return out.written.get(task_id) or spec.get(task_id) or rows.get(task_id)

    watch = Watch(links)
    token = WATCH.set(watch)
    try:
        for job in pending:
            if job.loop is not loop:
                break
            watch.hit = False
            probe = Probe(namespace, row)
            try:
                value = job.fn(probe)
            except NeedsServer:
                break
            except Exception as exc:
                if probe.based_on or watch.hit or probe.entry_tasks:
                    break  # judged on a copy, or after a commit in the air: the server's call
                outcome: Outcome = (False, exc)
            else:
                outcome = (True, value)
            tasks = tasks_of(probe)
            if tasks is None:
                break
            if watch.hit or tasks & blocked:
                blocked |= tasks  # it waits, and the rest of its tasks with it
                spec.update(probe.written)
                if job.link is not None:
                    links.add(job.link)
                continue
            mark_failed([job.link], [outcome])  # before a later job of the batch runs
            out.batch.append(job)
            out.outcomes.append(outcome)
            if outcome[0]:
                out.txs.append(probe)
                out.written.update(probe.written)
                out.tasks |= tasks
    finally:
        WATCH.reset(token)
    return out


def statements_of(picked: Picked, notifications: list[Statement]) -> list[Statement]:
    """A picked batch's transaction, `BEGIN` to its notifications."""
    queued = [Statement("BEGIN", None, False)]
    deferred = Deferred()
    for tx in picked.txs:
        assert isinstance(tx, BufferedPgTx)
        queued += tx.statements
        deferred.take_in(tx)
    return queued + deferred.statements() + notifications


class Spares:
    """Idle connections kept for lanes, each for up to `hold` seconds since it
    left the pool (as the writer keeps its own); `take` never waits: with none
    kept or ready in the pool, it asks the writer thread (`submit`) to wait for
    one for the next lane."""

    def __init__(
        self,
        pool: psycopg_pool.ConnectionPool[Conn],
        hold: float,
        submit: Callable[[Callable[[], None]], None],
    ) -> None:
        self.pool = pool
        self.hold = hold
        self.submit = submit
        self.kept: list[tuple[Conn, float]] = []
        self.fetching = False

    def take(self, then: Callable[[], None]) -> tuple[Conn | None, float]:
        """An idle connection and when it left the pool, or None (`then` is called,
        on the thread, once one is kept for the next lane)."""
        now = time.monotonic()
        while self.kept:
            conn, since = self.kept.pop()
            if conn.info.transaction_status is TransactionStatus.IDLE and now - since < self.hold:
                return conn, since
            self.pool.putconn(conn)
        try:
            return self.pool.getconn(timeout=0), now  # one ready in the pool, or none
        except psycopg_pool.PoolTimeout:
            if not self.fetching:
                self.fetching = True
                self.submit(lambda: self._fetch(then))
        except psycopg_pool.PoolClosed:
            pass
        return None, now

    def _fetch(self, then: Callable[[], None]) -> None:
        """On the writer thread: a connection for the next lane (the pool may open one)."""
        try:
            conn = self.pool.getconn(timeout=min(self.pool.timeout, 1.0))
        except Exception:  # no lane then; the pool's errors show where it is used
            return
        finally:
            self.fetching = False
        self.kept.append((conn, time.monotonic()))
        then()

    def give_back(self, conn: Conn, taken_at: float) -> None:
        """A lane's connection, kept if idle and young, else back to the pool."""
        idle = conn.info.transaction_status is TransactionStatus.IDLE
        if idle and time.monotonic() - taken_at < self.hold and len(self.kept) < MAX_LANES - 1:
            self.kept.append((conn, taken_at))
        else:
            self.pool.putconn(conn)

    def close(self) -> None:
        kept, self.kept = self.kept, []
        for conn, _ in kept:
            self.pool.putconn(conn)
