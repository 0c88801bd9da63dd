"""The Runtime's verbs for running many tasks: queues, counts, schedules, retention."""

from __future__ import annotations

import builtins
import contextlib
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from duragent.errors import Conflict, InvalidTransition
from duragent.runtime._schedules import (
    Overlap,
    Schedule,
    delete_schedule,
    get_schedule,
    list_schedules,
    new_schedule,
    put_schedule,
    set_paused,
)
from duragent.store._commits import Commit, DocumentWrite, TaskQuery
from duragent.store._purge import PurgeResult, erase_owner, purge
from duragent.store._queues import Queue, define_queue, delete_queue, list_queues
from duragent.types import TaskStatus, session_scope

if TYPE_CHECKING:
    from duragent.runtime._agent import Agent
    from duragent.store._protocol import Store
    from duragent.types import Task


class ManyTasks:
    """Mixed into Runtime (_runtime.py), whose store, agents and verbs these use."""

    store: Store

    if TYPE_CHECKING:

        def agent(self, name: str) -> Agent: ...
        def start_worker(self) -> None: ...
        async def abort(
            self, task_id: str, reason: str | None = None, *, timeout: float = 60.0
        ) -> Task: ...

    # --- queues ---

    async def queue(
        self,
        name: str,
        *,
        concurrency: int | None = None,
        per_worker: int | None = None,
        per_owner: int | None = None,
        rate: tuple[int, float] | None = None,
        ttl: float | timedelta | None = None,
    ) -> Queue:
        """Define (or redefine) a queue's limits, shared by every worker using this store."""
        if isinstance(ttl, timedelta):
            ttl = ttl.total_seconds()
        q = Queue(
            name,
            concurrency=concurrency,
            per_worker=per_worker,
            per_owner=per_owner,
            rate=rate,
            ttl=ttl,
        )
        return await define_queue(self.store, q)

    async def queues(self) -> builtins.list[Queue]:
        return await list_queues(self.store)

    async def delete_queue(self, name: str) -> None:
        """Forget a queue's limits (its tasks stay, now unlimited); QueueNotFound if it
        had none."""
        await delete_queue(self.store, name)

    async def counts(
        self,
        *,
        owner: str | None = None,
        queue: str | None = None,
        agent: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
    ) -> dict[str, dict[str, int]]:
        """Tasks per queue and status: `{"emails": {"pending": 120, "running": 3}}`."""
        raw = await self.store.count_tasks(
            TaskQuery(
                owner=owner,
                queue=queue,
                agent=agent,
                metadata=dict(metadata) if metadata else None,
                created_after=created_after,
                created_before=created_before,
            )
        )
        out: dict[str, dict[str, int]] = {}
        for (q, status), n in sorted(raw.items()):
            out.setdefault(q, {})[status] = n
        return out

    # --- schedules ---

    async def schedule(
        self,
        name: str,
        agent: str,
        input: Any,
        *,
        cron: str | None = None,
        every: float | timedelta | None = None,
        overlap: Overlap = "skip",
        owner: str | None = None,
        queue: str | None = None,
        priority: int = 0,
        metadata: Mapping[str, Any] | None = None,
        start_at: datetime | None = None,
    ) -> Schedule:
        """Submit `agent(input)` on a cron expression (UTC) or every N seconds.

        Creating a schedule with a name the owner already uses replaces it.
        Workers that run `agent` fire its ticks; each tick submits one task.
        """
        self.agent(agent)  # an unknown agent is an error now, not at the first tick
        sched = new_schedule(
            name,
            agent,
            input,
            cron=cron,
            every=every,
            overlap=overlap,
            owner=owner,
            queue=queue,
            priority=priority,
            metadata=metadata,
            start_at=start_at,
        )
        await put_schedule(self.store, sched)
        self.start_worker()
        return sched

    async def schedules(self, *, owner: str | None = None) -> builtins.list[Schedule]:
        return await list_schedules(self.store, owner)

    async def get_schedule(self, name: str, *, owner: str | None = None) -> Schedule:
        return await get_schedule(self.store, name, owner)

    async def pause_schedule(self, name: str, *, owner: str | None = None) -> Schedule:
        return await set_paused(self.store, name, owner, True)

    async def resume_schedule(self, name: str, *, owner: str | None = None) -> Schedule:
        """Tick again from the next tick after now (ticks missed while paused do not run)."""
        return await set_paused(self.store, name, owner, False)

    async def delete_schedule(self, name: str, *, owner: str | None = None) -> None:
        await delete_schedule(self.store, name, owner)

    # --- retention ---

    async def purge(
        self,
        *,
        before: datetime | timedelta | None = None,
        status: TaskStatus | str | Sequence[TaskStatus | str] | None = None,
        owner: str | None = None,
        agent: str | None = None,
        queue: str | None = None,
        batch: int = 100,
    ) -> PurgeResult:
        """Delete finished tasks for good, with their logs, documents and sub-tasks."""
        return await purge(
            self.store,
            before=before,
            status=status,
            owner=owner,
            agent=agent,
            queue=queue,
            batch=batch,
        )

    async def erase_owner(self, owner: str, *, batch: int = 100) -> PurgeResult:
        """Abort the owner's active tasks, then delete all of the owner's tasks (with their
        logs, documents and sub-tasks), schedules and session documents."""
        active = (TaskStatus.PENDING, TaskStatus.RUNNING, TaskStatus.WAITING, TaskStatus.PAUSED)
        page = await self.store.list_tasks(TaskQuery(owner=owner, status=active, limit=1000))
        for task in page.tasks:
            if task.parent_id is None:
                with contextlib.suppress(InvalidTransition, Conflict):
                    await self.abort(task.id, "the owner's data was erased", timeout=30.0)
        for sched in await list_schedules(self.store, owner):
            await delete_schedule(self.store, sched.name, sched.owner)
        # The owner's session documents (scoped per owner, so no one else's).
        sessions: set[str] = set()
        cursor = None
        while True:
            page = await self.store.list_tasks(TaskQuery(owner=owner, limit=500, cursor=cursor))
            sessions |= {t.session_id for t in page.tasks if t.session_id is not None}
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        for session_id in sorted(sessions):
            scope = session_scope(owner, session_id)
            docs = await self.store.list_documents(scope)
            if docs:
                writes = [DocumentWrite(scope, d.key, delete=True) for d in docs]
                await self.store.commit(Commit(documents=writes))
        return await erase_owner(self.store, owner, batch=batch)
