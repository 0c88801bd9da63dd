"""How a bulk operation runs: the built-in agent `duragent.bulk` and its actions.

The operation's task has one tool call, `run_bulk_operation` (replay "safe"),
whose durable steps are "count" and then two steps per page of matching tasks:
"read n" records the page's task ids and the cursor after it, "page n" the
counts after acting on them, and its commit carries the counts into the task's
context, which `BulkOperation` reads. A crash re-runs the call: recorded steps
are skipped, and the page the crash cut short is acted on again (the same
tasks: its ids were recorded, so a task acted on that left the filter since is
still counted), where each action must not act twice:

- every action commits a marker document (`acted:<task id>` in the
  operation's task scope) once it has acted, and a task with one is counted
  done and left alone (the markers are deleted once the last page is recorded);
- retry and resume write that marker in the same commit as the action, and
  only if it is not there yet, so even two runs at once act once;
- migrate writes it in the migration's commit too, and leaves a task already
  on the target version alone (skipped): a re-run migrates nothing twice;
- pause, abort and purge move a task to a status the action does not apply
  to, so a task acted on before a crash and not yet marked is skipped
  (counted "skipped", not "done": the count may be off by what one page did).

Adding an action is one entry in `ACTIONS`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from duragent.errors import (
    Conflict,
    ControlPending,
    DuragentError,
    InvalidOption,
    InvalidTransition,
)
from duragent.llm._scripted import ScriptedModel, ToolCall
from duragent.runtime._agent import Agent, BuiltinTools
from duragent.runtime._bulk_filter import TaskFilter
from duragent.runtime._context import ToolContext
from duragent.runtime._fingerprint import check_version
from duragent.runtime._tools import tool
from duragent.store._commits import Commit, DocumentWrite, TaskPage, TaskQuery
from duragent.store._protocol import Store
from duragent.types import TERMINAL, Task, TaskStatus, task_scope

BULK_AGENT = "duragent.bulk"
MAX_ERRORS = 20  # failures kept with their reasons in the operation's progress
# How long a pause or abort waits for a running task's worker before it leaves
# the request on the task's row (its worker acts on it at its next safe point)
# and goes on to the next task: a page of running tasks is not waited out one by one.
STOP_TIMEOUT = 1.0


class BulkVerbs(Protocol):
    """What the actions use of the Runtime."""

    @property
    def store(self) -> Store: ...

    async def _retry(
        self, task_id: str, *, owner: str | None, deadline: Any, documents: Sequence[DocumentWrite]
    ) -> Task: ...

    async def _resume(self, task_id: str, documents: Sequence[DocumentWrite]) -> Task | None: ...

    async def pause(
        self, task_id: str, rollback: bool = False, *, timeout: float = 60.0
    ) -> Task: ...

    async def abort(
        self, task_id: str, reason: str | None = None, *, timeout: float = 60.0
    ) -> Task: ...

    async def _migrate(
        self,
        task_id: str,
        to_version: str,
        *,
        owner: str | None,
        by: str | None,
        documents: Sequence[DocumentWrite],
    ) -> Task: ...


TraceFn = Callable[..., Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Acting:
    """What an action is given for one task: the Runtime's verbs, the task as just
    read, the marker to commit with the action if it can, and the operation's
    `options` (what an action needs besides the filter, e.g. a target)."""

    verbs: BulkVerbs
    task: Task
    marker: DocumentWrite
    options: Mapping[str, Any]


# Acts on one task; whether it committed `marker` itself (else it is written after).
ActFn = Callable[[Acting], Awaitable[bool]]


@dataclass(frozen=True, slots=True)
class BulkAction:
    """One bulk action: the statuses it applies to, what it does to one task, and
    the names of the options it takes (`Runtime.bulk(options=)`)."""

    statuses: tuple[TaskStatus, ...]
    act: ActFn
    options: tuple[str, ...] = ()
    # Checks the options given (all of them named in `options`): raises InvalidOption.
    check: Callable[[Mapping[str, Any]], None] | None = None


async def _retry(a: Acting) -> bool:
    await a.verbs._retry(a.task.id, owner=None, deadline=None, documents=[a.marker])
    return True


async def _resume(a: Acting) -> bool:
    await a.verbs._resume(a.task.id, [a.marker])
    return True


async def _pause(a: Acting) -> bool:
    # A running task's worker stops it at its next safe point; the request is on its row.
    with contextlib.suppress(ControlPending):
        await a.verbs.pause(a.task.id, timeout=STOP_TIMEOUT)
    return False


async def _abort(a: Acting) -> bool:
    with contextlib.suppress(ControlPending):
        await a.verbs.abort(a.task.id, "aborted by a bulk operation", timeout=STOP_TIMEOUT)
    return False


async def _migrate(a: Acting) -> bool:
    to = str(a.options["to"])
    if a.task.agent_version == to:
        # Already there (before the operation, or by a run of it a crash cut short,
        # whose marker would have been found): nothing to do, counted "skipped".
        raise InvalidTransition(a.task.status.value, "migrated", f"already on version {to}")
    op_id = a.marker.scope.removeprefix("task:")
    by = f"bulk operation {op_id}"
    await a.verbs._migrate(a.task.id, to, owner=None, by=by, documents=[a.marker])
    return True


def _check_migrate(options: Mapping[str, Any]) -> None:
    if "to" not in options:
        raise InvalidOption("migrate needs the version to move the tasks to (option 'to')")
    check_version(options["to"])


async def _purge(a: Acting) -> bool:
    await a.verbs.store.delete_task(a.task.id)
    return False


ACTIVE = (TaskStatus.PENDING, TaskStatus.RUNNING, TaskStatus.WAITING)
FINISHED = tuple(sorted(TERMINAL, key=lambda s: s.value))
ACTIONS: dict[str, BulkAction] = {
    "retry": BulkAction((TaskStatus.FAILED,), _retry),
    "abort": BulkAction((*ACTIVE, TaskStatus.PAUSED, TaskStatus.BLOCKED), _abort),
    "pause": BulkAction(ACTIVE, _pause),
    "resume": BulkAction((TaskStatus.PAUSED, TaskStatus.BLOCKED), _resume),
    "purge": BulkAction(FINISHED, _purge),
    "migrate": BulkAction(
        (*ACTIVE, TaskStatus.PAUSED, TaskStatus.BLOCKED), _migrate, ("to",), _check_migrate
    ),
}


def statuses_for(action: str, asked: Sequence[TaskStatus] | None) -> list[TaskStatus]:
    """The statuses `action` touches: those it applies to, of those asked if any (a
    status it does not apply to matches nothing: no task in it would be touched)."""
    if action not in ACTIONS:
        raise InvalidOption(f"unknown bulk action {action!r}; one of: {', '.join(ACTIONS)}")
    applies = ACTIONS[action].statuses
    if asked is None:
        return list(applies)
    return [s for s in applies if s in asked]


def check_options(action: str, options: Mapping[str, Any]) -> None:
    """Refuse an option `action` does not take."""
    unknown = sorted(set(options) - set(ACTIONS[action].options))
    if unknown:
        takes = ", ".join(ACTIONS[action].options) or "none"
        raise InvalidOption(f"{action} takes no option {', '.join(unknown)} (it takes: {takes})")
    check = ACTIONS[action].check
    if check is not None:
        check(options)


def query_for(action: str, flt: TaskFilter, **more: Any) -> TaskQuery:
    """The store query of the tasks `action` would touch (with `more` fields set)."""
    return flt.query(statuses_for(action, flt.status), **more)


def snapshot_query(op: Task, **more: Any) -> TaskQuery:
    """The query of operation `op`'s tasks: its filter, and created before it was."""
    flt = TaskFilter.model_validate(op.input.get("filter") or {})
    before = op.created_at
    if flt.created_before is not None:
        before = min(before, flt.created_before)
    return query_for(op.input["action"], flt, created_before=before, **more)


async def count_matching(store: Store, query: TaskQuery) -> int:
    """How many tasks `query` matches, bulk operations left out (never acted on)."""
    if query.status == []:
        return 0  # no status the action applies to
    every = sum((await store.count_tasks(query)).values())
    if query.agent is None:
        ours = dataclasses.replace(query, agent=BULK_AGENT)
        every -= sum((await store.count_tasks(ours)).values())
    elif query.agent == BULK_AGENT:
        return 0
    return every


def marker_of(op_id: str, task_id: str) -> DocumentWrite:
    return DocumentWrite(task_scope(op_id), f"acted:{task_id}", {"acted": True}, expect_version=0)


async def forget_markers(store: Store, op_id: str) -> int:
    """Delete operation `op_id`'s markers (once its last page is recorded), 500 a commit."""
    keys = [d.key for d in await store.list_documents(task_scope(op_id))]
    acted = [k for k in keys if k.startswith("acted:")]
    for i in range(0, len(acted), 500):
        deletes = [DocumentWrite(task_scope(op_id), k, delete=True) for k in acted[i : i + 500]]
        await store.commit(Commit(documents=deletes))
    return len(acted)


@dataclass
class PageRun:
    """One page of one operation: its tasks acted on, and the counts after it."""

    verbs: BulkVerbs
    op: Task
    action: BulkAction
    trace: TraceFn | None

    async def act_on(self, task_id: str) -> tuple[str, str | None]:
        """("done" | "skipped" | "failed", the reason of a failure)."""
        store = self.verbs.store
        marker = marker_of(self.op.id, task_id)
        if await store.get_document(marker.scope, marker.key) is not None:
            return "done", None  # acted on by a run a crash cut short
        try:
            current = await store.get_task(task_id)
        except DuragentError:
            return "skipped", None  # gone meanwhile (purged with its parent)
        if current.status not in self.action.statuses:
            return "skipped", None
        try:
            options = self.op.input.get("options") or {}
            marked = await self.action.act(Acting(self.verbs, current, marker, options))
        except (InvalidTransition, Conflict):
            # It moved meanwhile: acted on by another run of this page, or not.
            found = await store.get_document(marker.scope, marker.key)
            return ("done" if found is not None else "skipped"), None
        except DuragentError as exc:
            return "failed", f"{type(exc).__name__}: {exc}"
        if not marked:
            with contextlib.suppress(Conflict):
                await store.commit(Commit(documents=[marker]))
        return "done", None

    async def read(self, cursor: str | None, page_size: int) -> dict[str, Any]:
        """The page after `cursor`: its tasks' ids (bulk operations left out) and the
        next cursor, recorded before any is acted on."""
        query = snapshot_query(self.op, limit=page_size, cursor=cursor)
        page = (
            TaskPage([], None) if query.status == [] else await self.verbs.store.list_tasks(query)
        )
        ids = [t.id for t in page.tasks if t.agent != BULK_AGENT]
        return {"ids": ids, "cursor": page.next_cursor}

    async def run(self, progress: dict[str, Any], page: dict[str, Any]) -> dict[str, Any]:
        """Act on the tasks of `page` (from `read`): the counts after it."""
        out = dict(progress, errors=list(progress.get("errors", ())))
        for task_id in page["ids"]:
            outcome, error = await self.act_on(task_id)
            out[outcome] += 1
            if error is not None and len(out["errors"]) < MAX_ERRORS:
                out["errors"].append({"task_id": task_id, "error": error})
            if self.trace is not None:
                await self.trace("bulk_task", task_id=self.op.id, target=task_id, outcome=outcome)
        out["cursor"] = page["cursor"]
        out["finished"] = page["cursor"] is None
        return out


def bulk_agent(verbs: BulkVerbs, trace: TraceFn | None = None) -> Agent:
    """The built-in agent that runs bulk operations through `verbs` (a Runtime)."""

    @tool(name="run_bulk_operation", replay="safe")
    async def run_bulk_operation(ctx: ToolContext) -> str:
        """Run the bulk operation this task describes, page by page."""
        op = await verbs.store.get_task(ctx.task_id)
        spec = op.input
        run = PageRun(verbs, op, ACTIONS[spec["action"]], trace)

        async def count() -> dict[str, Any]:
            total = await count_matching(verbs.store, snapshot_query(op))
            progress = {"total": total, "done": 0, "skipped": 0, "failed": 0, "cursor": None}
            ctx.update_state(bulk=progress)  # rides along with the step's commit
            return progress

        async def page(progress: dict[str, Any], tasks: dict[str, Any]) -> dict[str, Any]:
            out = await run.run(progress, tasks)
            ctx.update_state(bulk=out)
            return out

        progress = await ctx.step("count", count)
        n = 0
        while not progress.get("finished"):
            n += 1
            size = int(spec.get("page_size", 100))
            tasks = await ctx.step(f"read {n}", run.read, progress["cursor"], size)
            progress = await ctx.step(f"page {n}", page, progress, tasks)
        # Every page recorded: no page runs again, so the markers guard nothing now.
        await ctx.step("forget markers", forget_markers, verbs.store, op.id)
        done = {k: progress[k] for k in ("total", "done", "skipped", "failed")}
        return json.dumps(done)

    def answer(messages: list[Any]) -> str:
        return str(messages[-1].content)

    return Agent(
        name=BULK_AGENT,
        model=ScriptedModel([[ToolCall("run_bulk_operation")], answer], name="duragent.bulk"),
        tools=[run_bulk_operation],
        builtin_tools=BuiltinTools(plan=False),
        # Declared, not a fingerprint: an upgrade of duragent that rewords the tool
        # must not leave the operations in flight with no worker serving them.
        # (A new number when the operation's steps change so a run cannot resume.)
        version="1",
    )
