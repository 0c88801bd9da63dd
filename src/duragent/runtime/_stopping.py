"""The Runtime's verbs that stop a task and let it go on: pause, abort, resume.

A task this process runs is stopped by its runner; one another live process
runs gets the request on its row (its worker hears of it at once); one nobody
runs is stopped here, under a lease taken for the purpose.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from duragent.errors import Conflict, ControlPending, InvalidTransition, WaitTimedOut
from duragent.runtime._agent import Agent, BuiltinTools
from duragent.runtime._engine import Control, TaskRunner
from duragent.runtime._worker import lease_alive
from duragent.store._commits import Commit, DocumentWrite, TaskPatch, TaskQuery
from duragent.types import Task, TaskStatus

if TYPE_CHECKING:
    from duragent.runtime._worker import Worker
    from duragent.store._protocol import Store

ACTIVE = (TaskStatus.PENDING, TaskStatus.RUNNING, TaskStatus.WAITING)


def acted_on(held: Task) -> Callable[[Task], bool]:
    """Whether a control request left on `held` was acted on, or can be here: the task
    stopped running, its lease ended (its worker is gone), or another worker took it."""
    epoch = held.lease.epoch
    return lambda t: (
        t.status is not TaskStatus.RUNNING or not lease_alive(t) or t.lease.epoch != epoch
    )


class StopsTasks:
    """Mixed into Runtime (_runtime.py), whose store, worker and agents these use."""

    store: Store
    worker: Worker | None
    agents: dict[str, Agent]

    if TYPE_CHECKING:

        def start_worker(self) -> None: ...
        def _wake(self) -> None: ...
        async def _wait(
            self,
            task_id: str,
            timeout: float | None,
            until: Callable[[Task], bool] | None,
            waited_for: str,
        ) -> Task: ...

    async def pause(self, task_id: str, rollback: bool = False, *, timeout: float = 60.0) -> Task:
        """Stop at the next safe point; returns once `paused` is committed.

        With `rollback`, the round in progress is taken out of the model's view and
        asked again, except what must not be repeated: if a never-replay call of the
        round has a result (or a running sub-task), the assistant message and those
        results stay, every other call is answered "rolled back", and the model goes
        on from there. UI entries are kept (marked voided). Active sub-tasks pause too.
        """
        task = await self._stop(task_id, Control("pause", rollback), timeout)
        for child in await self._descendants(task_id, ACTIVE):
            with contextlib.suppress(InvalidTransition, Conflict):
                await self._stop(child.id, Control("pause"), timeout)
        return task

    async def abort(
        self, task_id: str, reason: str | None = None, *, timeout: float = 60.0
    ) -> Task:
        """End the task for good (terminal), cancelling its model call and tools; children too."""
        task = await self._stop(task_id, Control("abort", reason=reason or "aborted"), timeout)
        for child in await self._descendants(
            task_id, (*ACTIVE, TaskStatus.PAUSED, TaskStatus.BLOCKED)
        ):
            with contextlib.suppress(InvalidTransition, Conflict):
                await self._stop(child.id, Control("abort", reason="parent task aborted"), timeout)
        return task

    async def _stop(self, task_id: str, control: Control, timeout: float) -> Task:
        target = TaskStatus.PAUSED if control.action == "pause" else TaskStatus.ABORTED
        give_up = asyncio.get_running_loop().time() + timeout
        for _ in range(50):
            task = await self.store.get_task(task_id)
            if task.status is target or task.status.terminal:
                if task.status.terminal and task.status is not target:
                    raise InvalidTransition(task.status.value, target.value)
                return task
            if target is TaskStatus.PAUSED and task.status in (
                TaskStatus.PAUSED,
                TaskStatus.BLOCKED,
            ):
                raise InvalidTransition(task.status.value, target.value)
            runner = self.worker.runner(task_id) if self.worker else None
            if runner is not None:
                runner.request(control)
                await self.worker.wait_task(task_id)  # type: ignore[union-attr]
                continue
            if lease_alive(task):
                # Another process runs it: leave the request on the row; its worker
                # hears of it at once (watch_controls) and stops at a safe point.
                try:
                    await self.store.commit(
                        Commit(
                            patches=[
                                TaskPatch(
                                    task_id,
                                    {
                                        "control": {
                                            "action": control.action,
                                            "rollback": control.rollback,
                                            "reason": control.reason,
                                        }
                                    },
                                    expect_status=[TaskStatus.RUNNING],
                                    expect_version=task.version,
                                )
                            ]
                        )
                    )
                except Conflict:
                    continue
                # Until its worker acts on it, or its lease ends (a dead worker: then
                # the next look finds the task unowned and stops it here).
                left = give_up - asyncio.get_running_loop().time()
                try:
                    await self._wait(
                        task_id, max(left, 0.0), acted_on(task), "its worker to reach a safe point"
                    )
                except WaitTimedOut:
                    holder = task.lease.owner or "?"
                    raise ControlPending(task_id, control.action, timeout, holder) from None
                continue
            try:
                return await self._stop_unowned(task, control)
            except Conflict:
                continue  # it moved under us (claimed, answered): look again
        raise Conflict(f"task {task_id!r} kept changing; could not {control.action} it")

    async def _stop_unowned(self, task: Task, control: Control) -> Task:
        if task.status is TaskStatus.RUNNING:
            # Its worker is gone: take the lease so no one else runs it meanwhile.
            claimed = await self.store.claim_task("runtime-stop", task_id=task.id, ttl=30.0)
            if claimed is None:
                raise Conflict("claimed by someone else")
            runner = TaskRunner(self.store, self._agent_for(claimed), claimed)
        else:
            runner = TaskRunner(self.store, self._agent_for(task), task, detached=True)
        return await runner.stop_now(control)

    def _agent_for(self, task: Task) -> Agent:
        return self.agents.get(task.agent) or Agent(
            name=task.agent, model="scripted:none", builtin_tools=BuiltinTools(plan=False)
        )

    async def _descendants(self, task_id: str, statuses: Sequence[TaskStatus]) -> list[Task]:
        out: list[Task] = []
        page = await self.store.list_tasks(TaskQuery(parent_id=task_id, limit=1000))
        for child in page.tasks:
            if child.status in statuses:
                out.append(child)
            out += await self._descendants(child.id, statuses)
        return out

    async def resume(self, task_id: str | None = None) -> Task | None:
        """Make a paused or blocked task runnable again (a `running` task whose
        worker died is taken over by itself). With no id: start the scheduler."""
        self.start_worker()
        if task_id is None:
            self._wake()
            return None
        return await self._resume(task_id, ())

    async def _resume(self, task_id: str, documents: Sequence[DocumentWrite]) -> Task | None:
        """`resume(task_id)`, with `documents` written in the same commit as the status."""
        self.start_worker()
        task = await self.store.get_task(task_id)
        if task.status is TaskStatus.RUNNING:
            if lease_alive(task):
                raise InvalidTransition(task.status.value, "pending", "it is running right now")
            self._wake()  # its lease is expired: any worker takes it over
            return task
        if task.status not in (TaskStatus.PAUSED, TaskStatus.BLOCKED):
            raise InvalidTransition(
                task.status.value,
                "pending",
                "only a paused or blocked task (or a running one whose worker is gone) "
                "can be resumed",
            )
        changes: dict[str, Any] = {"status": TaskStatus.PENDING, "error": None}
        if task.status_reason == "restart_limit":
            changes["restarts"] = 0
        res = await self.store.commit(
            Commit(
                patches=[
                    TaskPatch(
                        task_id, changes, expect_status=[task.status], expect_version=task.version
                    )
                ],
                documents=list(documents),
            )
        )
        for child in await self._descendants(task_id, (TaskStatus.PAUSED,)):
            with contextlib.suppress(InvalidTransition, Conflict):
                await self.store.commit(
                    Commit(
                        patches=[
                            TaskPatch(
                                child.id,
                                {"status": TaskStatus.PENDING},
                                expect_status=[TaskStatus.PAUSED],
                            )
                        ]
                    )
                )
        self._wake()
        return res.tasks[task_id]
