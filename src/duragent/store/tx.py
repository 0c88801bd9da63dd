"""The commit algorithm, written once over a synchronous transaction.

Each backend supplies a `Tx` (its rows inside one open transaction) and runs
these functions inside it; what a commit, claim or release means is decided
here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any, Protocol, TypeVar

from duragent.errors import Conflict, TaskNotFound
from duragent.store.base import (
    Commit,
    CommitResult,
    apply_patch,
    check_fence,
    check_new_child,
    claim,
    released,
    renewed,
)
from duragent.types import Document, Entry, NewEntry, Task, utcnow


class Tx(Protocol):
    def load_task(self, task_id: str) -> Task | None: ...
    def find_by_request(self, owner: str | None, request_id: str) -> Task | None: ...
    def insert_task(self, task: Task) -> None: ...
    def update_task(self, task: Task) -> None: ...
    def append(self, entries: list[Entry]) -> None: ...
    def load_document(self, scope: str, key: str) -> Document | None: ...
    def put_document(self, doc: Document) -> None: ...
    def delete_document(self, scope: str, key: str) -> None: ...
    def find_claimable(
        self, now: datetime, agents: Sequence[str] | None, task_id: str | None
    ) -> Task | None: ...


def task_columns(
    task: Task, when: Callable[[datetime | None], Any], *, created: bool = False
) -> dict[str, Any]:
    """A task row as SQL columns: the fields stores query on, and the rest as
    JSON in `data` (input apart, written only when it changes). `created` adds
    the columns fixed at creation; `when` encodes times the backend's way."""
    cols: dict[str, Any] = {
        "id": task.id,
        "status": task.status.value,
        "status_reason": task.status_reason,
        "updated_at": when(task.updated_at),
        "wake_at": when(task.wake_at),
        "lease_owner": task.lease.owner,
        "lease_expires": when(task.lease.expires_at),
        "lease_epoch": task.lease.epoch,
        "last_seq": task.last_seq,
        "version": task.version,
        "data": task.model_dump_json(exclude={"input"}),
    }
    if created:
        cols.update(
            owner=task.owner,
            request_id=task.request_id,
            session_id=task.session_id,
            parent_id=task.parent_id,
            root_id=task.root_id,
            agent=task.agent,
            created_at=when(task.created_at),
        )
    return cols


class _Touched:
    """Task rows read and changed within one transaction, written back once."""

    def __init__(self, tx: Tx) -> None:
        self.tx = tx
        self.rows: dict[str, Task] = {}
        self.dirty: set[str] = set()
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
            out.append(
                Entry.model_construct(
                    task_id=e.task_id,
                    seq=seq,
                    kind=e.kind,
                    round=e.round,
                    payload=e.payload,
                    created_at=now,
                )
            )
        for task_id, seq in last.items():
            self.put(self.get(task_id).model_copy(update={"last_seq": seq}))
        return out

    def flush(self) -> None:
        for task_id in self.dirty:
            task = self.rows[task_id]
            if task_id in self.created:
                self.tx.insert_task(task)
            else:
                self.tx.update_task(task)


def apply_commit(tx: Tx, commit: Commit, now: datetime) -> CommitResult:
    rows = _Touched(tx)
    for task in commit.new_tasks:
        check_new_child(task)
        if tx.load_task(task.id) is not None:
            raise Conflict(f"a task with id {task.id!r} already exists")
        task = task.model_copy(update={"created_at": now, "updated_at": now, "last_seq": 0})
        rows.rows[task.id] = task
        rows.created.add(task.id)
        rows.dirty.add(task.id)
    for task_id, epoch in commit.fence.items():
        check_fence(rows.get(task_id), epoch)
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


def apply_claim(
    tx: Tx,
    worker_id: str,
    agents: Sequence[str] | None,
    ttl: float,
    task_id: str | None,
    now: datetime,
) -> Task | None:
    task = tx.find_claimable(now, agents, task_id)
    if task is None:
        return None
    task, entry = claim(task, worker_id, ttl, now)
    rows = _Touched(tx)
    rows.rows[task.id] = task
    rows.dirty.add(task.id)
    entries = rows.append([entry], now)
    rows.flush()
    tx.append(entries)
    return rows.rows[task.id]


def apply_renew(
    tx: Tx, task_id: str, worker_id: str, epoch: int, ttl: float, now: datetime
) -> Task:
    task = tx.load_task(task_id)
    if task is None:
        raise TaskNotFound(task_id)
    task = renewed(task, worker_id, epoch, ttl, now)
    tx.update_task(task)
    return task


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

    async def commit(self, commit: Commit) -> CommitResult:
        return await self._write(lambda tx: apply_commit(tx, commit, utcnow()))

    async def create_task(self, task: Task, entries: Sequence[NewEntry] = ()) -> tuple[Task, bool]:
        return await self._write(lambda tx: apply_create(tx, task, entries, utcnow()))

    async def claim_task(
        self,
        worker_id: str,
        *,
        agents: Iterable[str] | None = None,
        ttl: float = 30.0,
        task_id: str | None = None,
    ) -> Task | None:
        names = None if agents is None else list(agents)
        return await self._write(
            lambda tx: apply_claim(tx, worker_id, names, ttl, task_id, utcnow())
        )

    async def renew_lease(self, task_id: str, worker_id: str, epoch: int, ttl: float) -> Task:
        return await self._write(
            lambda tx: apply_renew(tx, task_id, worker_id, epoch, ttl, utcnow())
        )

    async def release_lease(self, task_id: str, epoch: int) -> None:
        await self._write(lambda tx: apply_release(tx, task_id, epoch, utcnow()))
