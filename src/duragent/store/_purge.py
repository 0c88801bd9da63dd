"""Retention: deleting finished tasks for good, in batches that never hold the write lock long.

A purge deletes whole tasks: the row, every entry, its documents, its labels and
all of its sub-tasks (rollback markers only ever hide entries; this is the only
way anything leaves a store). Each batch is its own short transaction, so
other writers (workers committing rounds) get the lock between batches.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from duragent.errors import InvalidOption
from duragent.store._commits import TaskQuery
from duragent.store._protocol import Store
from duragent.store._queues import QUEUES_SCOPE, Queue, queue_from_value
from duragent.types import TERMINAL, Document, TaskStatus, utcnow

FINISHED = tuple(sorted(TERMINAL, key=lambda s: s.value))


@dataclass(slots=True)
class PurgeResult:
    tasks: int  # tasks deleted, sub-tasks included
    batches: int


async def purge(
    store: Store,
    *,
    before: datetime | timedelta | None = None,
    status: TaskStatus | str | Sequence[TaskStatus | str] | None = None,
    owner: str | None = None,
    agent: str | None = None,
    queue: str | None = None,
    batch: int = 100,
    reclaim: bool = True,
) -> PurgeResult:
    """Delete the tasks that match, with everything that belongs to them.

    `before`: last changed before this time (or this long ago). `status`:
    default every finished status (completed, failed, aborted); a status that
    is not finished is refused, since a worker may be running the task (to
    remove an owner's tasks whatever their state, see `erase_owner`).
    `reclaim`: afterwards, give the freed space back where the store can
    (SQLite incremental vacuum, JSONL compaction; PostgreSQL: autovacuum).
    """
    statuses = _statuses(status)
    unfinished = [s.value for s in statuses if not s.terminal]
    if unfinished:
        raise InvalidOption(
            f"purge deletes finished tasks only, not {', '.join(unfinished)}; abort them first"
        )
    return await _purge(store, statuses, before, owner, agent, queue, batch, reclaim)


async def erase_owner(store: Store, owner: str, *, batch: int = 100) -> PurgeResult:
    """Delete every task of one owner, whatever its status, with all it holds (GDPR erasure).

    Stop the owner's running tasks first (Runtime.erase_owner aborts them); a
    worker still running one finds it gone at its next commit.
    """
    if not owner:
        raise InvalidOption("erase_owner needs an owner")
    return await _purge(store, None, None, owner, None, None, batch, True)


async def ttl_queues(
    store: Store,
    now: datetime,
    on_bad: Callable[[Document, Exception], None] | None = None,
) -> list[tuple[Queue, datetime]]:
    """Each queue with a `ttl`, and the time before which its finished tasks go.

    A queue whose stored definition cannot be read, or whose ttl gives no time
    (past year 9999), is told to `on_bad` and skipped: one bad row never stops
    every queue's retention."""
    out: list[tuple[Queue, datetime]] = []
    for doc in await store.list_documents(QUEUES_SCOPE):
        try:
            q = queue_from_value(doc.value)
            if q.ttl is not None:
                out.append((q, now - timedelta(seconds=q.ttl)))
        except Exception as exc:
            if on_bad is not None:
                on_bad(doc, exc)
    return out


async def expire_by_ttl(
    store: Store,
    now: datetime | None = None,
    batch: int = 100,
    on_bad: Callable[[Document, Exception], None] | None = None,
    *,
    queues: list[tuple[Queue, datetime]] | None = None,
) -> int:
    """Purge each queue's finished tasks older than its `ttl` (run by workers);
    unreadable queues are told to `on_bad`. `queues`: ttl_queues, when read already."""
    if queues is None:
        queues = await ttl_queues(store, now or utcnow(), on_bad)
    deleted = 0
    for q, before in queues:
        result = await _purge(store, FINISHED, before, None, None, q.name, batch, False)
        deleted += result.tasks
    return deleted


async def ttl_expiries(
    queues: list[tuple[Queue, datetime]], store: Store, within: float
) -> datetime | None:
    """When the first finished task of `queues` (ttl_queues) comes due for purging,
    if one does within `within` seconds (a worker purges it then, not at its next
    periodic look). A page per queue: with very many due, a little late."""
    first: datetime | None = None
    for q, before in queues:
        assert q.ttl is not None  # ttl_queues gives only queues with one
        query = TaskQuery(
            queue=q.name,
            status=FINISHED,
            updated_before=before + timedelta(seconds=within),
            limit=100,
        )
        for task in (await store.list_tasks(query)).tasks:
            due = task.updated_at + timedelta(seconds=q.ttl)
            first = due if first is None else min(first, due)
    return first


async def _purge(
    store: Store,
    statuses: Sequence[TaskStatus] | None,
    before: datetime | timedelta | None,
    owner: str | None,
    agent: str | None,
    queue: str | None,
    batch: int,
    reclaim: bool,
) -> PurgeResult:
    if batch < 1:
        raise InvalidOption("batch must be at least 1")
    if isinstance(before, timedelta):
        before = utcnow() - before
    query = TaskQuery(
        owner=owner,
        agent=agent,
        queue=queue,
        status=statuses,
        updated_before=before,
        limit=batch,
    )
    result = PurgeResult(0, 0)
    while True:
        deleted = await store.purge_tasks(query)
        if deleted == 0:
            break
        result.tasks += deleted
        result.batches += 1
        await asyncio.sleep(0)  # other writers go between batches
    if reclaim and result.tasks:
        await store.reclaim_space()
    return result


def _statuses(status: TaskStatus | str | Sequence[TaskStatus | str] | None) -> list[TaskStatus]:
    if status is None:
        return list(FINISHED)
    if isinstance(status, TaskStatus | str):
        return [TaskStatus(status)]
    return [TaskStatus(s) for s in status]
