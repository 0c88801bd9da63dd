"""GET /v1/tasks/{id}/wait: long-poll until a task is finished or waits for input.

Waiters hold no thread and read nothing per commit: the app's TaskWatch
(server/_watch.py) reads a task once per commit that moved it, whoever waits,
and wakes its waiters, who test their own condition on the task read for them.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request

from duragent.errors import TaskNotFound
from duragent.server._deps import OwnedTask, RuntimeDep
from duragent.server._problems import problem_responses
from duragent.server._schemas import TaskWaitOut
from duragent.server._strict_json import StrictJsonRoute
from duragent.server._tasks import task_out
from duragent.server._watch import TaskWatch
from duragent.types import Task, TaskStatus

__all__ = ["TaskWatch", "reached", "router"]

router = APIRouter(prefix="/v1/tasks", tags=["tasks"], route_class=StrictJsonRoute)

MAX_TIMEOUT = 300.0  # seconds; proxies commonly cut idle requests after a few minutes
DEFAULT_TIMEOUT = 30.0

Until = Literal["finished", "input"]


def reached(task: Task, until: Until) -> bool:
    """`finished`: the task is terminal. `input`: it is terminal, or it waits for a
    person (an approval or an answer), or it is paused or blocked: every state in
    which it will not go on by itself."""
    if task.status.terminal or until == "finished":
        return task.status.terminal
    return task.status in (TaskStatus.PAUSED, TaskStatus.BLOCKED) or (
        task.status is TaskStatus.WAITING and task.status_reason == "input"
    )


@router.get(
    "/{task_id}/wait",
    response_model=TaskWaitOut,
    summary="Wait until the task is finished or waits for input (long poll)",
    description="Answers 200 as soon as the task is as `until` asks (at once if it already "
    "is), or when `timeout` seconds pass first: then with `timed_out: true` and the task "
    "as it is. `until=finished`: completed, failed or aborted. `until=input`: that, or "
    "waiting for an approval or an answer, or paused or blocked: anything that will not "
    "go on by itself. Call again to keep waiting.",
    responses=problem_responses(401, 404, 422),
)
async def wait_task(
    task: OwnedTask,
    runtime: RuntimeDep,
    request: Request,
    until: Annotated[Until, Query(description="What to wait for.")] = "finished",
    timeout: Annotated[
        float, Query(gt=0, le=MAX_TIMEOUT, description="Seconds to wait at most.")
    ] = DEFAULT_TIMEOUT,
) -> TaskWaitOut:
    watch: TaskWatch = request.app.state.task_watch
    found, ok = await watch.wait(task, lambda t: reached(t, until), timeout)
    if found is None:
        raise TaskNotFound(task.id)  # deleted while waited on
    out = await task_out(runtime, found)
    return TaskWaitOut.model_validate({**out.__dict__, "timed_out": not ok})
