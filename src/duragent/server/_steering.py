"""REST routes for steering a task: its history round by round, forks, and messages
into a live task (docs/steering.md)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field

from duragent.errors import InvalidTransition
from duragent.runtime._inbox import MAX_MESSAGE_CHARS
from duragent.runtime._steering import Edit as RuntimeEdit, History
from duragent.runtime._versions import VERSION_PATTERN
from duragent.server._deps import OwnedTask, RuntimeDep, UserDep
from duragent.server._limits import ServerLimits, human_bytes, json_size
from duragent.server._problems import TaskFinished, problem_responses
from duragent.server._schemas import Strategy, TaskOut
from duragent.server._strict_json import StrictJsonRoute
from duragent.server._tasks import task_out
from duragent.types import TaskStatus

# Strict JSON like every other route: NUL, lone surrogates, NaN are a 422 here too.
router = APIRouter(prefix="/v1/tasks", tags=["steering"], route_class=StrictJsonRoute)


class Edit(RuntimeEdit):
    # Strict like every request body: "true" is not a boolean. (Named as the
    # library's: it is the same edit, read strictly.)
    model_config = ConfigDict(extra="forbid", strict=True)


class ForkRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    at_round: int = Field(
        ge=1,
        le=2**31 - 1,
        description="Continue from the end of this round (1..the task's iterations).",
    )
    edit: Edit | None = Field(
        default=None,
        description="Changes to the copied view; its texts together are held to the "
        "server's input limit (serve --max-input).",
    )
    request_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="Idempotency key: the same one returns the same fork.",
    )


class MessageRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    text: str = Field(
        min_length=1,
        max_length=MAX_MESSAGE_CHARS,
        pattern=r"\S",
        description="The user message (some text besides white space).",
    )
    multitask_strategy: Strategy | None = Field(
        default=None,
        description="What the message does while a turn runs (default: the task's): "
        "enqueue (after the turn's answer), reject (409), interrupt (stop at the next "
        "safe point, then go on with it), rollback (the same, the round in progress "
        "rolled back).",
    )
    request_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="Idempotency key, per task: the same one with the same text sends "
        "nothing again (also once the task took the message) and answers 202 with the "
        "task; with another text, 409.",
    )


@router.get(
    "/{task_id}/history",
    response_model=History,
    summary="The task round by round: what the model said, its calls and their results",
    responses=problem_responses(401, 404, 422),
)
async def get_history(task: OwnedTask, runtime: RuntimeDep) -> History:
    return await runtime.history(task.id, owner=task.owner)


@router.post(
    "/{task_id}/fork",
    status_code=201,
    response_model=TaskOut,
    summary="Start a new task from the end of one of this task's rounds",
    description="The source task is untouched. Only a complete round (every tool call "
    "answered) can be forked, so no tool of the copied rounds runs again; a round still "
    "open is refused with 400.",
    responses={
        200: {"model": TaskOut, "description": "A fork with this request_id already exists"},
        **problem_responses(400, 401, 404, 422),
    },
)
async def fork_task(
    task: OwnedTask,
    user: UserDep,
    runtime: RuntimeDep,
    body: ForkRequest,
    request: Request,
    response: Response,
) -> TaskOut:
    if body.edit is not None:
        _check_edit_size(body.edit, request.app.state.limits)
    sub = await runtime.fork(
        task.id, body.at_round, edit=body.edit, owner=user, request_id=body.request_id
    )
    if not sub.created:
        response.status_code = 200
    return await task_out(runtime, await runtime.get(sub.task_id, owner=user))


class MigrateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    to_version: str = Field(
        min_length=1,
        max_length=64,
        pattern=VERSION_PATTERN,
        description="The version of the task's agent it goes on with (e.g. 'v4', or a "
        "fingerprint): 1-64 letters, digits, '.', '_', '+' or '-'.",
    )


@router.post(
    "/{task_id}/migrate",
    response_model=TaskOut,
    summary="Move the task to another version of its agent",
    description="Recorded in the task's log (a migration entry: from, to, by). A task a "
    "worker runs is handed back by it at its next safe point (its running tool calls "
    "end within their grace, or are answered 'interrupted') and goes on in a worker "
    "of the new version; any other task is started next by such a worker. A pending "
    "call to a tool the new version lacks blocks the task (missing_definition). "
    "An ended task is refused (409).",
    responses=problem_responses(400, 401, 404, 409, 422),
)
async def migrate_task(
    task: OwnedTask, user: UserDep, runtime: RuntimeDep, body: MigrateRequest
) -> TaskOut:
    moved = await runtime.migrate(task.id, body.to_version, owner=user, by=user)
    return await task_out(runtime, moved)


def _check_edit_size(edit: RuntimeEdit, limits: ServerLimits) -> None:
    """An edit puts user text into the fork's view: no more than a task's input may be."""
    size = json_size(edit.model_dump(mode="json", exclude_defaults=True))
    if size > limits.max_input:
        msg = (
            f"is {size} bytes as JSON; this server takes at most "
            f"{human_bytes(limits.max_input)} (serve --max-input)"
        )
        raise RequestValidationError([{"loc": ("body", "edit"), "msg": msg, "type": "too_large"}])


@router.post(
    "/{task_id}/messages",
    status_code=202,
    response_model=TaskOut,
    summary="Send a user message into a live task (double texting)",
    description="The message is committed before the answer; the task takes it exactly "
    "once at a safe point (never between a tool call and its result), when its "
    "multitask_strategy says. A paused or blocked task keeps it until resumed; a "
    "finished task takes none (409), nor does a running one under `reject` (409). "
    "A repeat with the same request_id and text sends nothing and answers 202.",
    responses=problem_responses(400, 401, 404, 409, 422),
)
async def send_message(
    task: OwnedTask, user: UserDep, runtime: RuntimeDep, body: MessageRequest
) -> TaskOut:
    try:
        sent = await runtime.send(
            task.id,
            body.text,
            owner=user,
            multitask_strategy=body.multitask_strategy,
            request_id=body.request_id,
        )
    except InvalidTransition as exc:
        if TaskStatus(exc.old).terminal:  # the library's advice names Python calls
            raise TaskFinished(task.id, exc.old) from exc
        raise
    return await task_out(runtime, sent)
