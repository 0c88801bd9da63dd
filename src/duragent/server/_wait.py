"""GET /v1/tasks/{id}/wait: long-poll until a task is finished or waits for input.

Waiters hold no thread and read nothing per commit: one watcher loop per app
waits on the store's `wait_for_change` and, after each change, reads each task
someone waits on once, then wakes that task's waiters, who test their own
condition on the task read for them. With nobody waiting, the loop ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request

from duragent.errors import TaskNotFound
from duragent.server._deps import OwnedTask, RuntimeDep
from duragent.server._problems import problem_responses
from duragent.server._schemas import TaskWaitOut
from duragent.server._strict_json import StrictJsonRoute
from duragent.server._tasks import task_out
from duragent.store._protocol import Store
from duragent.types import Task, TaskStatus

log = logging.getLogger("duragent.server")

router = APIRouter(prefix="/v1/tasks", tags=["tasks"], route_class=StrictJsonRoute)

MAX_TIMEOUT = 300.0  # seconds; proxies commonly cut idle requests after a few minutes
DEFAULT_TIMEOUT = 30.0
RECHECK = 1.0  # seconds between reads when no change is heard (a missed wake-up is late, not lost)

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


@dataclass
class _Watched:
    task: Task | None
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    waiters: int = 0


class TaskWatch:
    """The tasks someone waits on, read once per change, whoever waits."""

    def __init__(self, store: Store, recheck: float = RECHECK) -> None:
        self.store = store
        self.recheck = recheck
        self.reads = 0  # store reads made for waiters, and
        self.rounds = 0  # rounds of them (one per change heard): tests count both
        self._watched: dict[str, _Watched] = {}
        self._loop: asyncio.Task[None] | None = None

    async def wait(
        self, task: Task, done: Callable[[Task], bool], timeout: float
    ) -> tuple[Task | None, bool]:
        """(the task, True) once `done(task)`; (the task as last read, False) when
        `timeout` seconds pass first; (None, False) if it was deleted meanwhile."""
        if done(task):
            return task, True
        w = self._watched.get(task.id)
        if w is None:
            w = self._watched[task.id] = _Watched(task)
        w.waiters += 1
        if self._loop is None or self._loop.done():
            self._loop = asyncio.create_task(self._run(), name="duragent-task-watch")
        try:
            async with w.changed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        w.changed.wait_for(lambda: w.task is None or done(w.task)), timeout
                    )
                return w.task, w.task is not None and done(w.task)
        finally:
            w.waiters -= 1
            if w.waiters == 0 and self._watched.get(task.id) is w:
                del self._watched[task.id]

    async def _run(self) -> None:
        while self._watched:
            # Listening starts before the reads: a commit landing while they run
            # still wakes the next round.
            heard = asyncio.ensure_future(self.store.wait_for_change(self.recheck))
            await asyncio.sleep(0)
            self.rounds += 1
            try:
                for task_id, w in list(self._watched.items()):
                    await self._read(task_id, w)
                await heard
            except Exception as exc:  # a store out of reach: waiters keep the last read
                log.warning(
                    "waiting on tasks: %s; trying again",
                    str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                )
                await asyncio.sleep(self.recheck)
            finally:
                heard.cancel()
                if heard.done() and not heard.cancelled():
                    heard.exception()  # seen (a closed store's), not left to the loop's log

    async def _read(self, task_id: str, w: _Watched) -> None:
        try:
            w.task = await self.store.get_task(task_id)
        except TaskNotFound:
            w.task = None
        self.reads += 1
        async with w.changed:
            w.changed.notify_all()


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
