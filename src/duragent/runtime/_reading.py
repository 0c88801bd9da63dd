"""The Runtime's reads of tasks: one task, a page of them, waiting for one, its
messages, steps, tree and entries as they are committed."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, overload

from duragent.errors import StaleLease, StoreUnavailable, TaskNotFound, WaitTimedOut
from duragent.runtime._callbacks import TaskCallbacks
from duragent.runtime._outage import StoreOutage
from duragent.runtime._plans import write_plan
from duragent.runtime._presence import exited
from duragent.runtime._views import Steps, build_steps, partial_output, ui_view
from duragent.runtime._worker import lease_alive
from duragent.store._commits import Commit, TaskPage, TaskPatch, TaskQuery
from duragent.types import (
    ApiMessage,
    Entry,
    Task,
    TaskStatus,
    UIMessage,
    with_partial_output,
)

if TYPE_CHECKING:
    from duragent.runtime._agent import Agent
    from duragent.runtime._worker import Worker
    from duragent.store._protocol import Store

log = logging.getLogger("duragent.runtime")


@dataclass
class TaskTree:
    task: Task
    children: list[TaskTree] = field(default_factory=list)


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


class ReadsTasks:
    """Mixed into Runtime (_runtime.py), whose store, worker and agents these use."""

    store: Store
    worker: Worker | None
    agents: dict[str, Agent]
    _task_callbacks: dict[str, TaskCallbacks]

    if TYPE_CHECKING:

        def start_worker(self) -> None: ...
        def _wake(self) -> None: ...

    async def get(self, task_id: str, *, owner: str | None = None) -> Task:
        """The task; with `owner`, another owner's task is reported as not found.

        A running task's `partial_output` is the answer streamed so far in its
        current round, as committed (read from its log here: a round's commits
        write nothing more for it)."""
        task = await self.store.get_task(task_id)
        if owner is not None and task.owner != owner:
            raise TaskNotFound(task_id)
        if task.status is TaskStatus.RUNNING:
            task = with_partial_output(task, await partial_output(self.store, task))
        return task

    async def list_tasks(
        self,
        *,
        owner: str | None = None,
        status: TaskStatus | Sequence[TaskStatus] | None = None,
        session_id: str | None = None,
        parent_id: str | None = None,
        agent: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        queue: str | None = None,
        metadata: dict[str, Any] | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        updated_after: datetime | None = None,
        updated_before: datetime | None = None,
        id_prefix: str | None = None,
        version: str | None = None,
    ) -> TaskPage:
        """A page of tasks matching every filter given (`TaskQuery`), newest first;
        `next_cursor` asks for the next page. `id_prefix`: ids starting with it;
        `version`: tasks pinned to that agent version (`Task.agent_version`)."""
        return await self.store.list_tasks(
            TaskQuery(
                owner=owner,
                status=status,
                session_id=session_id,
                parent_id=parent_id,
                agent=agent,
                limit=limit,
                cursor=cursor,
                queue=queue,
                metadata=metadata,
                created_after=created_after,
                created_before=created_before,
                updated_after=updated_after,
                updated_before=updated_before,
                id_prefix=id_prefix,
                agent_version=version,
            )
        )

    async def wait(
        self,
        task_id: str,
        *,
        timeout: float | None = None,
        until: Callable[[Task], bool] | None = None,
    ) -> Task:
        """Until the task ends (or `until(task)` holds). Raises TimeoutError; never cancels it."""
        return await self._wait(
            task_id, timeout, until, "it to end" if until is None else "the condition asked"
        )

    async def _wait(
        self,
        task_id: str,
        timeout: float | None,
        until: Callable[[Task], bool] | None,
        waited_for: str,
    ) -> Task:
        """`wait`; a timeout says what was waited for and where the task is (WaitTimedOut).

        A store that cannot be reached (a database restarting, a dropped
        network) is waited for: said once on the `duragent.runtime` logger,
        tried again with back-off, and the wait goes on once it answers.
        """
        self.start_worker()
        done = until or (lambda t: t.status.terminal)
        told: set[str] = set()  # the lease holders this wait has announced

        async def poll() -> Task:
            outage = StoreOutage(f"waiting for task {task_id}", log)
            while True:
                try:
                    task = await self.store.get_task(task_id)
                except StoreUnavailable as exc:
                    await outage.wait_out(exc)
                    continue
                outage.over()
                if done(task):
                    return task
                await self._wait_for_holder(task, told)
                await self.store.wait_for_change(0.5)

        try:
            return await asyncio.wait_for(poll(), timeout)
        except TimeoutError:
            assert timeout is not None
            task = await self.store.get_task(task_id)
            status = task.status.value + (f" ({task.status_reason})" if task.status_reason else "")
            raise WaitTimedOut(task_id, status, timeout, waited_for) from None

    async def _wait_for_holder(self, task: Task, told: set[str]) -> None:
        """When a wait depends on another process's lease: take the task over at once
        if that process has provably exited (presence.exited: same host, its pid
        gone), else say once per holder what the wait is for, and until when.

        A task whose process was killed stays `running` under its lease until the
        lease ends (up to `lease_ttl`, 30 s by default); a wait would otherwise be
        silent all that time, and a process that is alive but slow looks the same.
        """
        holder = task.lease.owner
        if not lease_alive(task) or holder is None or holder in told:
            return
        if self.worker is not None and holder == self.worker.id:
            return  # this runtime runs it
        told.add(holder)
        mine = self.worker is not None and task.agent in self.agents
        gone = await exited(self.store, holder) if mine else None
        if gone is not None:
            # Its lease ends now, the task still `running`: this runtime's worker
            # claims it as after any crash (recovery from the log, a restart counted).
            # Fenced on the holder and epoch read: a newer owner is left alone.
            with contextlib.suppress(StaleLease, TaskNotFound):
                await self.store.renew_lease(task.id, holder, task.lease.epoch, 0.0)
                log.warning(
                    "task %s: the process holding it (worker %s, pid %d on this host) has "
                    "exited; this runtime takes the task over now",
                    task.id,
                    holder,
                    gone,
                )
                self._wake()
                return
        until = task.lease.expires_at.strftime("%H:%M:%S UTC") if task.lease.expires_at else "?"
        then = (
            "this runtime takes it over then"
            if mine
            else "any worker serving this agent takes it over then"
        )
        log.warning(
            "waiting for task %s: worker %s (another process) holds its lease, which ends "
            "at %s unless renewed; if that process is gone, %s",
            task.id,
            holder,
            until,
            then,
        )

    async def load_task(
        self,
        task_id: str,
        context: dict[str, Any] | None = None,
        *,
        callbacks: TaskCallbacks | None = None,
    ) -> Task:
        """The task as stored; `context` is deep-merged over the stored context and saved.

        `callbacks` (runtime/_callbacks.py) hear this task only, while this
        Runtime's worker runs it: its status changes, each entry it commits
        (progress included), and its end; they replace callbacks given for it
        before and are dropped once it ends. Async ones are awaited in order.
        """
        task = await self.store.get_task(task_id)
        if callbacks is not None and not task.status.terminal:
            self._task_callbacks[task_id] = callbacks
            if self.worker is not None:
                self.worker.listen(task_id)
        if not context:
            return task
        merged = deep_merge(task.context, context)
        res = await self.store.commit(Commit(patches=[TaskPatch(task_id, {"context": merged})]))
        return res.tasks[task_id]

    @overload
    async def messages(
        self, task_id: str, view: Literal["model"] = "model"
    ) -> list[ApiMessage]: ...
    @overload
    async def messages(self, task_id: str, view: Literal["ui"]) -> list[UIMessage]: ...
    @overload
    async def messages(
        self, task_id: str, view: Literal["model", "ui"]
    ) -> list[ApiMessage] | list[UIMessage]: ...

    async def messages(
        self, task_id: str, view: Literal["model", "ui"] = "model"
    ) -> list[ApiMessage] | list[UIMessage]:
        """The task's messages as the model sees them (`model_view`) or as a UI
        shows them (`ui_messages`)."""
        if view == "model":
            return list(await self.model_view(task_id))
        return await self.ui_messages(task_id)

    async def model_view(self, task_id: str) -> list[ApiMessage]:
        view = await self.store.model_view(task_id)
        if not view:
            await self.store.get_task(task_id)  # a missing or purged task: TaskNotFound
        return view

    async def ui_messages(self, task_id: str) -> list[UIMessage]:
        entries = await self.store.entries(task_id)
        if not entries:
            await self.store.get_task(task_id)  # a missing or purged task: TaskNotFound
        return ui_view(entries)

    async def steps(self, task_id: str) -> Steps:
        task = await self.store.get_task(task_id)
        return await build_steps(self.store, task)

    async def set_plan(
        self, task_id: str, steps: Sequence[str], *, owner: str | None = None
    ) -> Steps:
        """Set the task's pending steps, as the model's `update_plan` tool does (an
        empty list clears them); `steps` then shows them. With `owner`, another
        owner's task is reported as not found; an ended task's plan is not changed."""
        task = await self.get(task_id, owner=owner)
        await write_plan(self.store, task, steps)
        return await build_steps(self.store, await self.store.get_task(task_id))

    async def tree(self, task_id: str) -> TaskTree:
        node = TaskTree(await self.store.get_task(task_id))
        page = await self.store.list_tasks(TaskQuery(parent_id=task_id, limit=1000))
        for child in sorted(page.tasks, key=lambda t: t.created_at):
            node.children.append(await self.tree(child.id))
        return node

    async def subscribe(self, task_id: str, after_seq: int = 0) -> AsyncIterator[Entry]:
        """Committed entries after `after_seq`, as they are committed; ends when the task ends."""
        while True:
            batch = await self.store.entries(task_id, after_seq=after_seq, limit=500)
            for entry in batch:
                after_seq = entry.seq
                yield entry
            if batch:
                continue
            task = await self.store.get_task(task_id)
            if task.status.terminal and task.last_seq <= after_seq:
                return
            await self.store.wait_for_change(0.5)
