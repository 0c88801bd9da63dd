"""Bulk operations: one action (retry, abort, ...) on every task a filter matches.

A bulk operation is itself a task, of the built-in agent `duragent.bulk`
(runtime/_bulk_run.py): a worker claims it, runs it page by page with each
page's result committed, and after a crash the next worker finishes the rest,
exactly like any task. So it is listed, shown and resumed like one; what this
module adds is the filter (`TaskFilter`, shared with the REST API), the
operation as people see it (`BulkOperation`) and the Runtime's verbs.

What an operation touches: the tasks matching its filter that were created
before it started (later ones are never reached) and that still match when
their page is read (a task that left the filter meanwhile is not touched).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, overload

from duragent.errors import InvalidOption, TaskNotFound
from duragent.runtime._agent import Agent
from duragent.runtime._bulk_filter import TaskFilter
from duragent.runtime._bulk_run import BULK_AGENT, check_options, count_matching, query_for
from duragent.runtime._submit import new_task
from duragent.store._commits import TaskQuery
from duragent.types import Task, TaskStatus

__all__ = ["BulkOperation", "BulkOperations", "TaskFilter"]

if TYPE_CHECKING:
    from duragent.store._protocol import Store

BulkStatus = Literal["running", "done", "failed"]


@dataclass(frozen=True, slots=True)
class BulkOperation:
    """A bulk operation as it stands: `done` tasks acted on, `skipped` ones no longer
    in a status the action applies to, `failed` ones it could not act on (`errors`:
    the first few, with the reason). `total`: the tasks matching when it started."""

    id: str
    action: str
    filter: TaskFilter
    status: BulkStatus
    total: int
    done: int
    skipped: int
    failed: int
    owner: str | None
    created_at: datetime
    errors: tuple[dict[str, str], ...] = ()
    error: str | None = None  # why a failed operation stopped
    options: Mapping[str, Any] = field(default_factory=dict)  # e.g. migrate's {"to": version}

    @classmethod
    def of(cls, task: Task) -> BulkOperation:
        spec = task.input if isinstance(task.input, dict) else {}
        progress = task.context.get("bulk") or {}
        status: BulkStatus = "running"
        error = None
        if task.status is TaskStatus.COMPLETED and progress.get("finished"):
            status = "done"
        elif task.status.terminal or task.status is TaskStatus.BLOCKED:
            status = "failed"
            error = task.error or (str(task.output) if task.output is not None else None)
        return cls(
            id=task.id,
            action=str(spec.get("action", "")),
            filter=TaskFilter.model_validate(spec.get("filter") or {}),
            status=status,
            total=int(progress.get("total", 0)),
            done=int(progress.get("done", 0)),
            skipped=int(progress.get("skipped", 0)),
            failed=int(progress.get("failed", 0)),
            owner=task.owner,
            created_at=task.created_at,
            errors=tuple(progress.get("errors", ())),
            error=error,
            options=dict(spec.get("options") or {}),
        )


class BulkOperations:
    """Mixed into Runtime (_runtime.py): bulk operations by filter."""

    store: Store
    bulk_agent: Agent  # the built-in agent running bulk operations (_bulk_run.py)

    if TYPE_CHECKING:

        def start_worker(self) -> None: ...
        def _wake(self) -> None: ...

    @overload
    async def bulk(
        self,
        action: str,
        filter: TaskFilter | None = None,
        *,
        dry_run: Literal[True],
        owner: str | None = None,
        page_size: int = 100,
        options: Mapping[str, Any] | None = None,
    ) -> int: ...

    @overload
    async def bulk(
        self,
        action: str,
        filter: TaskFilter | None = None,
        *,
        dry_run: Literal[False] = False,
        owner: str | None = None,
        page_size: int = 100,
        options: Mapping[str, Any] | None = None,
    ) -> BulkOperation: ...

    async def bulk(
        self,
        action: str,
        filter: TaskFilter | None = None,
        *,
        dry_run: bool = False,
        owner: str | None = None,
        page_size: int = 100,
        options: Mapping[str, Any] | None = None,
    ) -> BulkOperation | int:
        """Act on every task `filter` matches: "retry", "abort", "pause", "resume",
        "migrate" or "purge" (the keys of `runtime._bulk_run.ACTIONS`).

        `dry_run=True` touches nothing and returns how many tasks match now.
        Otherwise the operation starts as a task (owned by `owner`, who alone
        sees it) that a worker runs `page_size` tasks at a time, each page
        committed: a crash finishes the rest once, never twice. `filter.owner`
        narrows it to one owner's tasks (None: every owner's). `options`: what
        the action needs besides the filter (JSON): migrate needs `{"to": version}` (a task
        already on it is skipped); the others take none.
        """
        filter = filter or TaskFilter()
        query = query_for(action, filter)  # checks the action and the statuses
        check_options(action, options or {})
        if not 1 <= page_size <= 1000:
            raise InvalidOption("page_size is between 1 and 1000")
        if dry_run:
            return await count_matching(self.store, query)
        spec: dict[str, Any] = {
            "action": action,
            "filter": filter.model_dump(mode="json", exclude_none=True),
        }
        if options:
            spec["options"] = dict(options)
        task, first = new_task(self.bulk_agent, {**spec, "page_size": page_size}, owner=owner)
        task.queue = BULK_AGENT
        task.context = {"bulk": {"total": 0, "done": 0, "skipped": 0, "failed": 0}}
        stored, _ = await self.store.create_task(task, [first])
        self.start_worker()
        self._wake()
        return BulkOperation.of(stored)

    async def bulk_operation(self, op_id: str, *, owner: str | None = None) -> BulkOperation:
        """A bulk operation by id; with `owner`, another owner's is not found."""
        try:
            task = await self.store.get_task(op_id)
        except TaskNotFound:
            task = None
        if task is None or task.agent != BULK_AGENT or (owner is not None and task.owner != owner):
            raise TaskNotFound(op_id)
        return BulkOperation.of(task)

    async def bulk_operations(
        self, *, owner: str | None = None, limit: int = 50, cursor: str | None = None
    ) -> tuple[list[BulkOperation], str | None]:
        """Bulk operations, newest first (`owner`'s only, if given), and the next cursor."""
        page = await self.store.list_tasks(
            TaskQuery(agent=BULK_AGENT, owner=owner, limit=limit, cursor=cursor)
        )
        return [BulkOperation.of(t) for t in page.tasks], page.next_cursor
