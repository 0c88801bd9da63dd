"""The commit algorithm, written once over a synchronous transaction.

Each backend supplies a `Tx` (its rows inside one open transaction) and runs
these functions inside it; what a commit, claim or release means is decided
here and nowhere else.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol, TypeVar

from duragent._model_internals import given_in_full, set_field, updated
from duragent.errors import Conflict, InvalidTransition, StaleLease, TaskNotFound
from duragent.store._commits import (
    Commit,
    CommitResult,
    CopyEntries,
    LeaseRenewal,
    PendingCommit,
    follows,
)
from duragent.store._queues import QUEUES_SCOPE, Candidate, ClaimBudget, queue_from_value
from duragent.store._rules import (
    apply_patch,
    check_fence,
    check_new_child,
    check_seen,
    claim,
    released,
    renewed,
)
from duragent.types import (
    Document,
    Entry,
    NewEntry,
    Task,
    TaskStatus,
    stored_entry,
    utcnow,
)

log = logging.getLogger("duragent.store")


class Tx(Protocol):
    def load_task(self, task_id: str) -> Task | None: ...
    def find_by_request(self, owner: str | None, request_id: str) -> Task | None: ...
    def insert_task(self, task: Task) -> None: ...
    def update_task(self, task: Task) -> None: ...
    def append(self, entries: list[Entry]) -> None: ...
    def copy_entries(self, copy: CopyEntries, task_id: str, after_seq: int, now: datetime) -> int:
        """Copy `copy`'s entries into `task_id` as seqs after_seq+1.. ; returns how many."""
        ...

    def load_document(self, scope: str, key: str) -> Document | None: ...
    def put_document(self, doc: Document) -> None: ...
    def delete_document(self, scope: str, key: str) -> None: ...
    def find_claimable(
        self,
        now: datetime,
        agents: Sequence[str] | None,
        task_id: str | None,
        limit: int,
        closed: set[str],
        queues: Sequence[str] | None = None,
        versions: Mapping[str, str] | None = None,
    ) -> list[Candidate]: ...
    def load_queues(self) -> list[Document]: ...
    def running_counts(
        self, queues: Sequence[str]
    ) -> list[tuple[str, str | None, str | None, int]]: ...
    def lease_now(self) -> datetime:
        """The time leases are set and compared by in this transaction: the
        host's clock on the one-machine stores, the server's on PostgreSQL, so
        no worker's clock decides who owns a task (docs/stores.md)."""
        ...


def task_columns(
    task: Task,
    when: Callable[[datetime | None], Any],
    *,
    created: bool = False,
    stored: Task | None = None,
) -> dict[str, Any]:
    """A task row as SQL columns: the fields stores query on, and the rest as
    JSON in `data` (input apart, written only when it changes). `created` adds
    the columns fixed at creation; `when` encodes times the backend's way.

    With `stored`, the row as the database holds it now, an update leaves out
    the columns most writes leave as they were (status, its reason, the wake-up
    time and the lease) when `stored` has their values already: SQLite rewrites
    an index entry whenever its column is in the SET list, even with the value
    it had (status, wake_at and the lease expiry are indexed: leaving them out
    spares a round's commit three index pages), and PostgreSQL's writer need
    not send their literals.
    """
    lease = task.lease
    cols: dict[str, Any] = {"id": task.id}
    if stored is None or task.status is not stored.status:
        cols["status"] = task.status.value
    if stored is None or task.status_reason != stored.status_reason:
        cols["status_reason"] = task.status_reason
    if stored is None or task.wake_at != stored.wake_at:
        cols["wake_at"] = when(task.wake_at)
    if stored is None or task.agent_version != stored.agent_version:
        cols["agent_version"] = task.agent_version
    held = None if stored is None else stored.lease
    if held is not lease:  # a patch that leaves the lease alone keeps its object
        if held is None or lease.owner != held.owner:
            cols["lease_owner"] = lease.owner
        if held is None or lease.expires_at != held.expires_at:
            cols["lease_expires"] = when(lease.expires_at)
        if held is None or lease.epoch != held.epoch:
            cols["lease_epoch"] = lease.epoch
    cols["updated_at"] = when(task.updated_at)
    cols["last_seq"] = task.last_seq
    cols["version"] = task.version
    cols["data"] = task.model_dump_json(exclude={"input"})
    if created:
        cols.update(
            owner=task.owner,
            request_id=task.request_id,
            session_id=task.session_id,
            parent_id=task.parent_id,
            root_id=task.root_id,
            agent=task.agent,
            created_at=when(task.created_at),
            queue=task.queue or task.agent,
            priority=task.priority,
        )
    return cols


# Row writes a batch holds back to write at its end: task id -> (the row as
# stored before the batch, the row to write).
HeldRows = dict[str, tuple[Task | None, Task]]


def hold_row(rows: HeldRows, before: Task | None, task: Task) -> None:
    """Hold `task` to be written over its row, which holds `before` unless an
    earlier write held here says what the row held first."""
    held = rows.get(task.id)
    rows[task.id] = (before if held is None else held[0], task)


def schedule_key(task: Task) -> tuple[Any, ...]:
    """What decides whether, and from when, a worker may claim the task."""
    return (task.status, task.status_reason, task.wake_at, task.lease.owner, task.lease.epoch)


def may_become_claimable(task: Task) -> bool:
    """Pending; waiting with a wake-up (a timer or a deadline); or running, so
    claimable once its lease expires."""
    status = task.status
    return (
        status is TaskStatus.PENDING
        or status is TaskStatus.RUNNING
        or (status is TaskStatus.WAITING and task.wake_at is not None)
    )


class Notes:
    """What a transaction's writes mean to waiters in other processes, noted as
    the rows are written: `work` when a row may have become claimable (or moved
    when it does: created, claimed, released, resumed, waiting on a timer),
    `controlled` the tasks a control request (pause/abort) was just set on,
    `tasks` every task written or deleted (what `watch_tasks` is told)."""

    def __init__(self) -> None:
        self.loaded: dict[str, tuple[tuple[Any, ...], Any]] = {}  # id -> (schedule, control)
        self.work = False
        self.controlled: list[str] = []
        self.tasks: set[str] = set()

    def read(self, task: Task) -> None:
        self.loaded[task.id] = (schedule_key(task), task.control)

    def wrote(self, task: Task, *, created: bool = False) -> None:
        self.tasks.add(task.id)
        before = self.loaded.get(task.id)
        moved = before is None or before[0] != schedule_key(task)
        if created or (moved and may_become_claimable(task)):
            self.work = True
        if task.control is not None and (before is None or before[1] != task.control):
            self.controlled.append(task.id)
        self.loaded[task.id] = (schedule_key(task), task.control)


class _Touched:
    """Task rows read and changed within one transaction, written back once."""

    def __init__(self, tx: Tx) -> None:
        self.tx = tx
        self.rows: dict[str, Task] = {}
        self.dirty: set[str] = set()  # rows made here, copies nobody else holds yet
        self.created: set[str] = set()

    def get(self, task_id: str) -> Task:
        task = self.rows.get(task_id)
        if task is None:
            task = self.tx.load_task(task_id)
            if task is None:
                raise TaskNotFound(task_id)
            self.rows[task_id] = task
        return task

    def put(self, task: Task) -> None:
        self.rows[task.id] = task
        self.dirty.add(task.id)

    def append(self, new: Iterable[NewEntry], now: datetime) -> list[Entry]:
        out = []
        last: dict[str, int] = {}  # task id -> the last seq given here
        for e in new:
            seq = last.get(e.task_id)
            if seq is None:
                seq = self.get(e.task_id).last_seq
            seq = last[e.task_id] = seq + 1
            out.append(stored_entry(e.task_id, seq, e.kind, e.round, e.payload, now))
        for task_id, seq in last.items():
            if task_id in self.dirty:  # this transaction's own copy: set it in place
                set_field(self.rows[task_id], "last_seq", seq)
            else:
                self.put(updated(self.get(task_id), {"last_seq": seq}))
        return out

    def flush(self) -> None:
        for task_id in self.dirty:
            task = self.rows[task_id]
            if task_id in self.created:
                self.tx.insert_task(task)
            else:
                self.tx.update_task(task)


def apply_commit(tx: Tx, commit: Commit, now: datetime) -> CommitResult:
    follows(commit)
    rows = _Touched(tx)
    for task in commit.new_tasks:
        check_new_child(task)
        if tx.load_task(task.id) is not None:
            raise Conflict(f"a task with id {task.id!r} already exists")
        task = task.model_copy(update={"created_at": now, "updated_at": now, "last_seq": 0})
        given_in_full(task)  # as the row reads back
        rows.rows[task.id] = task
        rows.created.add(task.id)
        rows.dirty.add(task.id)
    for task_id, epoch in commit.fence.items():
        check_fence(rows.get(task_id), epoch, commit.owner)
    for task_id, seq in commit.seen.items():
        check_seen(rows.get(task_id), seq)
    status_entries = []
    for patch in commit.patches:
        task, status_entry = apply_patch(rows.get(patch.task_id), patch, now)
        rows.put(task)
        if status_entry is not None:
            status_entries.append(status_entry)
    entries = rows.append([*commit.entries, *status_entries], now)
    docs = []
    for w in commit.documents:
        current = tx.load_document(w.scope, w.key)
        version = current.version if current else 0
        if w.expect_version is not None and w.expect_version != version:
            raise Conflict(
                f"document {w.scope}/{w.key} is at version {version}, expected {w.expect_version}"
            )
        if w.delete:
            tx.delete_document(w.scope, w.key)
            continue
        doc = Document(scope=w.scope, key=w.key, value=w.value, version=version + 1, updated_at=now)
        tx.put_document(doc)
        docs.append(doc)
    rows.flush()
    if entries:
        tx.append(entries)
    return CommitResult(entries=entries, tasks=dict(rows.rows), documents=docs)


def apply_create(
    tx: Tx, task: Task, entries: Sequence[NewEntry], now: datetime
) -> tuple[Task, bool]:
    if task.request_id is not None:
        existing = tx.find_by_request(task.owner, task.request_id)
        if existing is not None:
            return existing, False
    result = apply_commit(tx, Commit(new_tasks=[task], entries=list(entries)), now)
    return result.tasks[task.id], True


def apply_fork(
    tx: Tx, task: Task, log: Sequence[NewEntry | CopyEntries], now: datetime
) -> tuple[Task, bool]:
    """Create a task whose log is `log`: new entries as given, copies made by the store.

    The new task's seqs are positions in `log`, a copy counting its entries.
    Its first `iterations` rounds are closed: `round_seq` is set to the seq of
    the last entry of one of them (copies hold only those), where recovery
    starts reading.
    """
    if task.request_id is not None:
        existing = tx.find_by_request(task.owner, task.request_id)
        if existing is not None:
            return existing, False
    check_new_child(task)
    if tx.load_task(task.id) is not None:
        raise Conflict(f"a task with id {task.id!r} already exists")
    task = task.model_copy(update={"created_at": now, "updated_at": now, "last_seq": 0})
    tx.insert_task(task)  # first: a store may number the task's entries by its row
    seq = round_seq = 0
    pending: list[Entry] = []
    sources: set[str] = set()
    for part in log:
        if isinstance(part, NewEntry):
            seq += 1
            if part.round <= task.iterations:
                round_seq = seq
            pending.append(
                Entry.model_construct(
                    task_id=task.id,
                    seq=seq,
                    kind=part.kind,
                    round=part.round,
                    payload=part.payload,
                    created_at=now,
                )
            )
            continue
        if part.source_id not in sources:
            if tx.load_task(part.source_id) is None:
                raise TaskNotFound(part.source_id)
            sources.add(part.source_id)
        if pending:
            tx.append(pending)  # in seq order: a store may keep a task's log as a list
            pending = []
        copied = tx.copy_entries(part, task.id, seq, now)
        if part.count is not None and copied != part.count:
            raise Conflict(
                f"task {part.source_id!r} changed while it was being forked: {copied} "
                f"entries of seqs {part.first_seq}..{part.last_seq} found, {part.count} expected"
            )
        seq += copied
        round_seq = seq
    if pending:
        tx.append(pending)
    task = task.model_copy(update={"last_seq": seq, "round_seq": round_seq})
    tx.update_task(task)
    return task, True


def apply_claim(
    tx: Tx,
    worker_id: str,
    n: int,
    agents: Sequence[str] | None,
    ttl: float,
    task_id: str | None,
    queues: Sequence[str] | None = None,
    versions: Mapping[str, str] | None = None,
) -> list[Task]:
    """Claim up to `n` runnable tasks in claim order, within every queue's limits
    (only from `queues`, when given; a task pinned to an agent version only if
    `versions`, when given, maps its agent to that version).

    What is expired, and when the new leases end, is measured by `tx.lease_now()`
    (asked after `load_queues`, which on PostgreSQL brings the server's time along).
    Candidates come in pages; one a limit refuses is passed over (it stays
    queued), so a page may be read again larger, a few times at most.
    """
    if n < 1:
        return []
    docs = {d.key: d for d in tx.load_queues()}
    now = tx.lease_now()
    budget = ClaimBudget((queue_from_value(d.value) for d in docs.values()), worker_id, now)
    if budget.queues:
        budget.count(tx.running_counts(sorted(budget.queues)))
    picked: list[tuple[Task, NewEntry]] = []  # claimed, with its status entry
    seen: set[str] = set()
    # Without limits nothing is refused, so n candidates are enough; with them,
    # a few more, and a larger page when too many were refused.
    limit = n + 8 if budget.queues else n
    for _ in range(4):
        refused = 0
        for found in tx.find_claimable(
            now, agents, task_id, limit, budget.closed(), queues, versions
        ):
            if found.id in seen:
                continue
            seen.add(found.id)
            if budget.admit(found):
                task = found.load()
                try:
                    picked.append(claim(task, worker_id, ttl, now))
                except InvalidTransition as exc:
                    # Its indexed status says runnable, its row says otherwise
                    # (a row written behind the store's back): left as it is,
                    # and counted as refused, so a larger page finds the next.
                    log.warning("task %s not claimed: %s", task.id, exc)
                    refused += 1
                    continue
                if len(picked) == n:
                    break
            else:
                refused += 1
        if len(picked) == n or refused == 0:
            break
        limit *= 8
    rows = _Touched(tx)
    status_entries = []
    for claimed, entry in picked:
        rows.rows[claimed.id] = claimed
        rows.dirty.add(claimed.id)
        status_entries.append(entry)
    entries = rows.append(status_entries, now)
    rows.flush()
    if entries:
        tx.append(entries)
    for q in budget.spent_buckets():
        old = docs[q.name]
        tx.put_document(
            Document(
                scope=QUEUES_SCOPE,
                key=q.name,
                value=q.model_dump(mode="json"),
                version=old.version + 1,
                updated_at=now,
            )
        )
    return [rows.rows[t.id] for t, _ in picked]


def apply_renew(
    tx: Tx, task_id: str, worker_id: str, epoch: int, ttl: float, now: datetime
) -> Task:
    task = tx.load_task(task_id)
    if task is None:
        raise TaskNotFound(task_id)
    task = renewed(task, worker_id, epoch, ttl, now)
    tx.update_task(task)
    return task


def apply_renew_leases(
    tx: Tx, worker_id: str, leases: Mapping[str, int], ttl: float, now: datetime
) -> LeaseRenewal:
    """Renew every lease in one transaction; a lost one is reported, not raised.

    Rows are taken in id order, so two transactions locking several of the
    same rows (where the backend locks) cannot deadlock on the order.
    """
    kept: dict[str, Task] = {}
    lost: set[str] = set()
    for task_id in sorted(leases):
        try:
            kept[task_id] = apply_renew(tx, task_id, worker_id, leases[task_id], ttl, now)
        except (StaleLease, TaskNotFound):
            lost.add(task_id)
        except (ValueError, TypeError) as exc:
            # A row that no longer reads (written around the store) cannot be
            # renewed; the others must still be, or one bad row costs every
            # lease of the worker. Its runner is told it lost the lease.
            log.error("task %s: lease not renewed, its row cannot be read: %s", task_id, exc)
            lost.add(task_id)
    return LeaseRenewal(kept=kept, lost=lost)


def apply_release(tx: Tx, task_id: str, epoch: int, now: datetime) -> None:
    task = tx.load_task(task_id)
    if task is None:
        raise TaskNotFound(task_id)
    task, entry = released(task, epoch, now)
    rows = _Touched(tx)
    rows.put(task)
    entries = rows.append([entry] if entry else [], now)
    rows.flush()
    if entries:
        tx.append(entries)


_T = TypeVar("_T")


class TxWrites:
    """The Store protocol's writes, written once over a backend's `_write(job)`.

    A backend only says how it runs a job inside one transaction (and when the
    job's result counts as committed); what each write means is `apply_*` above.
    """

    async def _write(self, job: Callable[[Any], _T]) -> _T:
        raise NotImplementedError

    def _enqueue(self, job: Callable[[Any], _T], link: PendingCommit) -> asyncio.Future[_T]:
        """Queue `job` behind every job asked for before it; the future answers once
        it is durable. The backend sets `link.failed` as soon as the job's failure
        is known, before it runs any later job (see PendingCommit)."""
        raise NotImplementedError

    async def commit(self, commit: Commit) -> CommitResult:
        return await self._write(lambda tx: apply_commit(tx, commit, utcnow()))

    def commit_soon(self, commit: Commit) -> PendingCommit:
        pending = PendingCommit()
        pending.future = self._enqueue(lambda tx: apply_commit(tx, commit, utcnow()), pending)
        return pending

    async def create_task(self, task: Task, entries: Sequence[NewEntry] = ()) -> tuple[Task, bool]:
        return await self._write(lambda tx: apply_create(tx, task, entries, utcnow()))

    async def create_fork(
        self, task: Task, log: Sequence[NewEntry | CopyEntries]
    ) -> tuple[Task, bool]:
        return await self._write(lambda tx: apply_fork(tx, task, list(log), utcnow()))

    async def claim_task(
        self,
        worker_id: str,
        *,
        agents: Iterable[str] | None = None,
        ttl: float = 30.0,
        task_id: str | None = None,
        queues: Iterable[str] | None = None,
        versions: Mapping[str, str] | None = None,
    ) -> Task | None:
        claimed = await self.claim_tasks(
            worker_id, 1, agents=agents, ttl=ttl, task_id=task_id, queues=queues, versions=versions
        )
        return claimed[0] if claimed else None

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
        names = None if agents is None else list(agents)
        only = None if queues is None else sorted(set(queues))
        pins = None if versions is None else dict(versions)
        return await self._write(
            lambda tx: apply_claim(tx, worker_id, n, names, ttl, task_id, only, pins)
        )

    async def renew_lease(self, task_id: str, worker_id: str, epoch: int, ttl: float) -> Task:
        return await self._write(
            lambda tx: apply_renew(tx, task_id, worker_id, epoch, ttl, tx.lease_now())
        )

    async def renew_leases(
        self, worker_id: str, leases: Mapping[str, int], ttl: float
    ) -> LeaseRenewal:
        """Renew all of a worker's leases at once: one transaction, whatever their number."""
        held = dict(leases)
        if not held:
            return LeaseRenewal(kept={}, lost=set())
        return await self._write(
            lambda tx: apply_renew_leases(tx, worker_id, held, ttl, tx.lease_now())
        )

    async def release_lease(self, task_id: str, epoch: int) -> None:
        # The epoch decides a release, not a clock: the host's time is only its
        # `updated_at` and its status entry's, like any commit's.
        await self._write(lambda tx: apply_release(tx, task_id, epoch, utcnow()))
