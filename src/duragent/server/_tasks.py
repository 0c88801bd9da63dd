"""REST routes for tasks under /v1/tasks. Every route sees only the caller's own tasks."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Body, Query, Request, Response
from pydantic import StringConstraints

from duragent.runtime._presence import last_seen
from duragent.runtime._runtime import Submission
from duragent.runtime._versions import VERSION_PATTERN
from duragent.runtime._waits import open_waits
from duragent.server._deps import OwnedTask, RuntimeDep, UserDep
from duragent.server._limits import MAX_SEQ, check_task_sizes
from duragent.server._problems import BadRequest, problem_responses
from duragent.server._schemas import (
    AbortRequest,
    EntriesOut,
    IsoTime,
    MessagesOut,
    OpenWait,
    PauseRequest,
    PlanRequest,
    RespondRequest,
    RetryRequest,
    StepsOut,
    TaskCreate,
    TaskOut,
    TaskPageOut,
    TaskSummary,
    TreeOut,
    WaitingOn,
)
from duragent.server._strict_json import StrictJsonRoute
from duragent.store._codec import decode_cursor, encode_cursor
from duragent.types import Task, TaskStatus

MetaPair = Annotated[str, StringConstraints(max_length=400, pattern=r"^[^:\x00]+:[^\x00]*$")]

router = APIRouter(prefix="/v1/tasks", tags=["tasks"], route_class=StrictJsonRoute)

_READ = problem_responses(401, 404, 422)
# What store.codec.encode_cursor makes: "<created_at timestamp>|<task id>".
CURSOR_PATTERN = r"^[0-9]{1,12}\.[0-9]{1,9}\|[^|]{1,200}$"
_CONTROL = problem_responses(400, 401, 404, 409, 422)


async def task_out(runtime: RuntimeDep, task: Task) -> TaskOut:
    waits: list[OpenWait] = []
    if task.status in (TaskStatus.WAITING, TaskStatus.PAUSED):
        for call_id, w in (await open_waits(runtime.store, task)).items():
            waits.append(
                OpenWait(
                    call_id=call_id,
                    wait=w["wait"],
                    question=w.get("question"),
                    child_id=w.get("child_id"),
                    wake_at=_at(w.get("wake_at")),
                    tool=w.get("tool"),
                    arguments=w.get("arguments"),
                    expires_at=_at(w.get("expires_at")),
                    editable=not w.get("rerun", False),
                )
            )
    holder = None
    if task.status is TaskStatus.RUNNING and task.lease.owner:
        # Whether the lease's worker still lives, for the page (a dead one's lease
        # reads the same as a live one's until it ends).
        holder = await last_seen(runtime.store, task.lease.owner)
    why = await runtime.unserved([task])
    return TaskOut.full(task, waits, holder, why.get(task.id))


async def submission_out(runtime: RuntimeDep, sub: Submission, response: Response) -> TaskOut:
    """A submission's task, with the status code saying what happened: 202 sent
    into a running turn of its session, 200 an existing task, else the route's 201."""
    if sub.sent:
        response.status_code = 202
    elif not sub.created:
        response.status_code = 200
    return await task_out(runtime, await runtime.get(sub.task_id))


async def summary(runtime: RuntimeDep, task: Task, unserved: str | None = None) -> TaskSummary:
    """A task for a listing: what a waiting one waits for too (an approval or a question
    share status_reason 'input'); one read of its open round, only for those.
    `unserved`: why a pending one will not start (`Runtime.unserved`)."""
    if task.status is not TaskStatus.WAITING:
        return TaskSummary.of(task, unserved=unserved)
    waits = await open_waits(runtime.store, task)
    return TaskSummary.of(
        task, [WaitingOn(wait=w["wait"], tool=w.get("tool")) for w in waits.values()]
    )


def _at(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


@router.post(
    "",
    status_code=201,
    response_model=TaskOut,
    summary="Start a task",
    responses={
        200: {"model": TaskOut, "description": "A task with this request_id already exists"},
        202: {
            "model": TaskOut,
            "description": "continue_session while a turn of the session runs: the input "
            "was sent into that task (this one) as a message",
        },
        **problem_responses(400, 401, 409, 413, 422),
    },
)
async def create_task(
    body: TaskCreate, user: UserDep, runtime: RuntimeDep, response: Response, request: Request
) -> TaskOut:
    check_task_sizes(body.input, body.context, request.app.state.limits, body.metadata)
    sub = await runtime.submit(
        body.agent,
        body.input,
        request_id=body.request_id,
        owner=user,
        session_id=body.session_id,
        context=body.context,
        continue_session=body.continue_session,
        queue=body.queue,
        priority=body.priority,
        metadata=body.metadata,
        start_at=body.start_at,
        multitask_strategy=body.multitask_strategy,
        deadline=body.deadline,
    )
    return await submission_out(runtime, sub, response)


@router.get(
    "",
    response_model=TaskPageOut,
    summary="List my tasks",
    responses=problem_responses(400, 401, 422),
)
async def list_tasks(
    user: UserDep,
    runtime: RuntimeDep,
    request: Request,
    status: Annotated[list[TaskStatus] | None, Query()] = None,
    session_id: Annotated[str | None, Query(max_length=200)] = None,
    agent: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[
        str | None,
        Query(pattern=CURSOR_PATTERN, description="A next_cursor from the previous page."),
    ] = None,
    queue: Annotated[str | None, Query(max_length=200)] = None,
    meta: Annotated[
        list[MetaPair] | None,
        Query(description="key:value, metadata equal to (repeat for more)."),
    ] = None,
    created_after: IsoTime | None = None,
    created_before: IsoTime | None = None,
    updated_after: IsoTime | None = None,
    updated_before: IsoTime | None = None,
    id_prefix: Annotated[
        str | None,
        Query(min_length=1, max_length=200, description="Task ids starting with this text."),
    ] = None,
    version: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=64,
            pattern=VERSION_PATTERN,
            description="Tasks pinned to this version of their agent.",
        ),
    ] = None,
) -> TaskPageOut:
    if cursor is not None:
        try:
            ts, _ = decode_cursor(cursor)
            datetime.fromtimestamp(ts, UTC)  # a time stores can compare with (year <= 9999)
        except (ValueError, OverflowError, OSError):
            ts = math.nan
        if not math.isfinite(ts):
            raise BadRequest(f"invalid cursor {cursor!r}: pass a next_cursor from a previous page")
    page = await runtime.list_tasks(
        owner=user,
        status=status or None,
        session_id=session_id,
        agent=agent,
        limit=limit,
        cursor=cursor,
        queue=queue,
        metadata=_metadata(meta),
        created_after=created_after,
        created_before=created_before,
        updated_after=updated_after,
        updated_before=updated_before,
        id_prefix=id_prefix,
        version=version,
    )
    return await _bounded_page(
        runtime, page.tasks, page.next_cursor, request.app.state.limits.max_page
    )


async def _bounded_page(
    runtime: RuntimeDep, tasks: list[Task], next_cursor: str | None, max_bytes: int
) -> TaskPageOut:
    """The page's summaries up to about `max_bytes` of JSON (at least one); where it
    is cut, next_cursor continues after the last one given."""
    out: list[TaskSummary] = []
    size = 0
    why = await runtime.unserved(tasks)
    for i, task in enumerate(tasks):
        one = await summary(runtime, task, why.get(task.id))
        size += len(one.model_dump_json())
        if out and size > max_bytes:
            return TaskPageOut(tasks=out, next_cursor=encode_cursor(tasks[i - 1]))
        out.append(one)
    return TaskPageOut(tasks=out, next_cursor=next_cursor)


def _metadata(pairs: list[str] | None) -> dict[str, str] | None:
    if not pairs:
        return None
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition(":")
        if not sep or not key:
            raise BadRequest(f"meta={pair!r} should be key:value")
        out[key] = value
    return out


@router.get("/{task_id}", response_model=TaskOut, summary="A task's status", responses=_READ)
async def get_task(task: OwnedTask, runtime: RuntimeDep) -> TaskOut:
    return await task_out(runtime, task)


@router.get(
    "/{task_id}/messages",
    response_model=MessagesOut,
    summary="The model's messages or the UI's",
    responses=_READ,
)
async def get_messages(
    task: OwnedTask,
    runtime: RuntimeDep,
    view: Annotated[Literal["model", "ui"], Query()] = "model",
) -> MessagesOut:
    return MessagesOut(view=view, messages=await runtime.messages(task.id, view=view))


@router.get(
    "/{task_id}/entries",
    response_model=EntriesOut,
    summary="Committed log entries after a seq",
    responses=_READ,
)
async def get_entries(
    task: OwnedTask,
    runtime: RuntimeDep,
    after: Annotated[int, Query(ge=0, le=MAX_SEQ)] = 0,
    limit: Annotated[int, Query(ge=1, le=5000)] = 1000,
) -> EntriesOut:
    entries = await runtime.store.entries(task.id, after_seq=after, limit=limit)
    return EntriesOut(entries=entries, last_seq=task.last_seq)


@router.get(
    "/{task_id}/steps",
    response_model=StepsOut,
    summary="Completed and pending steps",
    responses=_READ,
)
async def get_steps(task: OwnedTask, runtime: RuntimeDep) -> StepsOut:
    return StepsOut.of(await runtime.steps(task.id))


@router.put(
    "/{task_id}/plan",
    response_model=StepsOut,
    summary="Set the pending steps",
    description="What the model's update_plan tool does: the task's plan, shown by /steps.",
    responses=problem_responses(400, 401, 404, 422),
)
async def set_plan(task: OwnedTask, runtime: RuntimeDep, body: PlanRequest) -> StepsOut:
    return StepsOut.of(await runtime.set_plan(task.id, body.steps, owner=task.owner))


@router.get(
    "/{task_id}/tree", response_model=TreeOut, summary="The task and its sub-tasks", responses=_READ
)
async def get_tree(task: OwnedTask, runtime: RuntimeDep) -> TreeOut:
    return TreeOut.of(await runtime.tree(task.id))


@router.post(
    "/{task_id}/pause",
    response_model=TaskOut,
    summary="Pause at the next safe point",
    responses=_CONTROL,
)
async def pause_task(
    task: OwnedTask, runtime: RuntimeDep, body: Annotated[PauseRequest | None, Body()] = None
) -> TaskOut:
    paused = await runtime.pause(task.id, rollback=body.rollback if body else False)
    return await task_out(runtime, paused)


@router.post(
    "/{task_id}/resume",
    response_model=TaskOut,
    summary="Resume a paused or blocked task",
    responses=_CONTROL,
)
async def resume_task(task: OwnedTask, runtime: RuntimeDep) -> TaskOut:
    resumed = await runtime.resume(task.id)
    return await task_out(runtime, resumed or await runtime.get(task.id))


@router.post(
    "/{task_id}/retry",
    response_model=TaskOut,
    summary="Continue a failed task from its last commit",
    responses=_CONTROL,
)
async def retry_task(
    task: OwnedTask, runtime: RuntimeDep, body: Annotated[RetryRequest | None, Body()] = None
) -> TaskOut:
    deadline = body.deadline if body else None
    retried = await runtime.retry(task.id, owner=task.owner, deadline=deadline)
    return await task_out(runtime, retried)


@router.post(
    "/{task_id}/abort", response_model=TaskOut, summary="End the task for good", responses=_CONTROL
)
async def abort_task(
    task: OwnedTask, runtime: RuntimeDep, body: Annotated[AbortRequest | None, Body()] = None
) -> TaskOut:
    aborted = await runtime.abort(task.id, reason=body.reason if body else None)
    return await task_out(runtime, aborted)


@router.post(
    "/{task_id}/respond",
    response_model=TaskOut,
    summary="Approve (optionally with edited arguments) or deny tool calls, or answer a question",
    description="One answer (`approve`, `reason`, `arguments` or `answer`, with `call_id` when "
    "several are open), or `decisions` for several approvals in one commit. Edited arguments "
    "that don't fit the tool's schema answer 422 and change nothing; an approval past its "
    "time limit answers 409.",
    responses=_CONTROL,
)
async def respond_to_task(task: OwnedTask, runtime: RuntimeDep, body: RespondRequest) -> TaskOut:
    answered = await runtime.respond(
        task.id,
        approve=body.approve,
        reason=body.reason,
        answer=body.answer,
        call_id=body.call_id,
        arguments=body.arguments,
        decisions=body.decisions,
    )
    return await task_out(runtime, answered)
