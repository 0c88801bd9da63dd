"""The Runtime: what users call. Submit, wait, pause, resume, abort, answer, watch."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic_core import to_jsonable_python

from duragent.errors import (
    Conflict,
    ControlPending,
    DuplicateRequest,
    InvalidTransition,
    StaleLease,
    StoreUnavailable,
    TaskNotFound,
    UnknownAgent,
    UsageError,
    WaitTimedOut,
)
from duragent.runtime.agent import Agent, agents_by_name
from duragent.runtime.approvals import Decision
from duragent.runtime.callbacks import TaskCallbacks
from duragent.runtime.deadlines import DeadlineSpec, deadline_at, deadline_record
from duragent.runtime.engine import Control, StatusHook, TaskRunner, TraceHook
from duragent.runtime.inbox import MultitaskStrategy, check_strategy
from duragent.runtime.log import api_entry, notice
from duragent.runtime.many import ManyTasks
from duragent.runtime.outage import StoreOutage
from duragent.runtime.pins import with_pins
from duragent.runtime.plans import write_plan
from duragent.runtime.presence import exited
from duragent.runtime.sending import SendsMessages
from duragent.runtime.sessions import Sessions
from duragent.runtime.steering import Edit, History, new_fork, task_history
from duragent.runtime.submit import new_task
from duragent.runtime.views import Steps, build_steps, partial_output, ui_view
from duragent.runtime.waits import person_answers, resolve
from duragent.runtime.worker import Worker, lease_alive, queue_names
from duragent.store import open_store
from duragent.store.commits import Commit, TaskPatch, TaskQuery
from duragent.store.protocol import Store
from duragent.store.queues import Queue, define_queue
from duragent.types import (
    ApiMessage,
    Entry,
    Task,
    TaskStatus,
    UIMessage,
    utcnow,
    with_partial_output,
)
from duragent.webhooks import WebhookDelivery, check_url

log = logging.getLogger("duragent.runtime")


def when(start_at: datetime | timedelta) -> datetime:
    """A start time from a time (timezone-aware) or a delay from now."""
    if isinstance(start_at, timedelta):
        return utcnow() + start_at
    if start_at.tzinfo is None:
        raise UsageError("start_at must be timezone-aware (e.g. datetime.now(UTC)) or a timedelta")
    return start_at


ACTIVE = (TaskStatus.PENDING, TaskStatus.RUNNING, TaskStatus.WAITING)


@dataclass
class Submission:
    """A submitted task. Cancelling `wait` stops waiting; it never stops the task."""

    runtime: Runtime
    task_id: str
    created: bool
    # continue_session while a turn of the session ran: the input was sent into
    # that task (under the session's multitask_strategy), `task_id` names it.
    sent: bool = False

    async def status(self) -> TaskStatus:
        return (await self.runtime.get(self.task_id)).status

    async def wait(self, timeout: float | None = None) -> Task:
        return await self.runtime.wait(self.task_id, timeout=timeout)


@dataclass
class TaskTree:
    task: Task
    children: list[TaskTree] = field(default_factory=list)


def same_request(stored: Task, asked: Task) -> bool:
    """Whether a resubmission with a used request_id asks for the same task."""
    return (
        stored.agent == asked.agent
        and to_jsonable_python(stored.input) == to_jsonable_python(asked.input)
        # A fork and a submission (or two different forks) are different requests.
        and stored.config.get("fork_request") == asked.config.get("fork_request")
    )


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _acted_on(held: Task) -> Callable[[Task], bool]:
    """Whether a control request left on `held` was acted on, or can be here: the task
    stopped running, its lease ended (its worker is gone), or another worker took it."""
    epoch = held.lease.epoch
    return lambda t: (
        t.status is not TaskStatus.RUNNING or not lease_alive(t) or t.lease.epoch != epoch
    )


class Runtime(ManyTasks, SendsMessages, Sessions):
    """`async with Runtime("sqlite:///agent.db", agents=[...]) as rt: ...`

    With `run_worker=True` (the default) an in-process worker runs the tasks of
    the given agents; it starts on the first `submit`, `wait` or `resume()`.
    A task that waits `missing_agent_grace` seconds (default 60) for an agent no
    running worker knows becomes `blocked` with reason `missing_definition`.
    `worker_queues` (queue names, as `Worker(queues=)`) keeps the in-process
    worker to those queues; `queues` defines queues and their limits.
    `on_status_change(task, old, new)` is called on every status change a runner
    of this process makes; a coroutine function is awaited (its calls one after
    another, in the order of the changes; an error it raises is logged).
    """

    def __init__(
        self,
        store: str | Store | None = None,
        agents: Iterable[Agent] = (),
        *,
        run_worker: bool = True,
        concurrency: int = 32,
        lease_ttl: float = 30.0,
        poll_interval: float = 0.5,
        worker_id: str | None = None,
        on_status_change: StatusHook | None = None,
        trace: TraceHook | None = None,
        missing_agent_grace: float = 60.0,
        webhook_delivery: WebhookDelivery | None = None,
        queues: Iterable[Queue] = (),
        worker_queues: Iterable[str] | None = None,
    ) -> None:
        self.agents = agents_by_name(agents)
        self.store: Store = (
            store if store is not None and not isinstance(store, str) else open_store(store)
        )
        self._owns_store = store is None or isinstance(store, str)
        self.run_worker = run_worker
        self.worker: Worker | None = None
        self._worker_args: dict[str, Any] = {
            "concurrency": concurrency,
            "lease_ttl": lease_ttl,
            "poll_interval": poll_interval,
            "worker_id": worker_id,
            "on_status": on_status_change,
            "trace": trace,
            "missing_agent_grace": missing_agent_grace,
            "webhook_delivery": webhook_delivery,
            # Checked now, not when the worker starts on the first submit.
            "queues": None if worker_queues is None else queue_names(worker_queues),
        }
        self._worker_job: asyncio.Task[None] | None = None
        self._queues = list(queues)
        # load_task(id, callbacks=): shared with the worker, which calls and drops them.
        self._task_callbacks: dict[str, TaskCallbacks] = {}
        self._worker_args["callbacks"] = self._task_callbacks

    # --- lifecycle ---

    async def __aenter__(self) -> Runtime:
        await self.store.open()
        for q in self._queues:
            await define_queue(self.store, q)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def start_worker(self) -> None:
        """Start the in-process scheduler (idempotent)."""
        if not self.run_worker or self._worker_job is not None:
            return
        self.worker = Worker(self.store, self.agents.values(), **self._worker_args)
        self._worker_job = asyncio.ensure_future(self.worker.run())

    async def close(self, *, graceful: bool = True) -> None:
        if self.worker is not None and self._worker_job is not None:
            await self.worker.stop(graceful=graceful)
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker_job
            self._worker_job = None
        for agent in self.agents.values():
            await agent.close_model()
        if self._owns_store:
            await self.store.close()

    def _wake(self) -> None:
        if self.worker is not None:
            self.worker.wake()

    # --- tasks ---

    def agent(self, name: str) -> Agent:
        try:
            return self.agents[name]
        except KeyError:
            raise UnknownAgent(name, list(self.agents)) from None

    async def submit(
        self,
        agent: str,
        input: Any,
        *,
        request_id: str | None = None,
        owner: str | None = None,
        session_id: str | None = None,
        context: dict[str, Any] | None = None,
        continue_session: bool = False,
        webhook: str | None = None,
        queue: str | None = None,
        priority: int = 0,
        metadata: dict[str, Any] | None = None,
        start_at: datetime | timedelta | None = None,
        multitask_strategy: MultitaskStrategy | None = None,
        deadline: DeadlineSpec | None = None,
    ) -> Submission:
        """Start a task. The same `request_id` from the same owner returns the same task.

        `queue` (default: the agent's name) and `priority` (higher first) decide
        when it is claimed; `metadata` labels it for filters; `start_at` (a time,
        or a delay) holds it until then. `deadline` (a time, or a delay from now:
        a timedelta or seconds; default: the agent's `deadline`) is a wall-clock
        limit: the task then stops at its next safe point, `failed` with status
        reason `deadline`, even if it waits in the store (see `retry`).

        `continue_session=True` starts the model from the conversation of the
        session's latest finished task (chat continuation: a new task, its own log);
        resuming an interrupted task is `resume`, not this. If a task of the session
        is still pending, running or waiting, the input is a new message for it
        instead (see `send`): `multitask_strategy` (default: the session's, pinned on
        that task; else the agent's) decides what it does, and the Submission
        names that task with `sent=True`. `webhook` (a URL,
        default: the agent's) is called when the task completes, fails, is
        aborted or blocked, or waits for input (see duragent.webhooks).
        """
        definition = self.agent(agent)
        if webhook is not None:
            check_url(webhook)
        strategy = check_strategy(multitask_strategy or definition.multitask_strategy)
        history: builtins.list[Any] | None = None
        if continue_session:
            if session_id is None:
                raise UsageError("continue_session=True needs a session_id")
            live = await self._live_session_task(session_id, owner)
            if live is not None:  # a turn runs: never a silent fork of the session
                sent = await self._send_into_session(
                    live, agent, input, multitask_strategy, request_id
                )
                return Submission(self, live.id, created=False, sent=sent)
            history = await self._session_history(session_id, owner)
        task, first = new_task(
            definition,
            input,
            owner=owner,
            session_id=session_id,
            request_id=request_id,
            context=context,
            webhook=webhook,
            deadline=deadline,
        )
        task.queue = queue or definition.name
        task.priority = priority
        task.metadata = dict(metadata or {})
        task.config["multitask_strategy"] = strategy
        if start_at is not None:
            task.wake_at = when(start_at)
            if task.deadline is not None:  # a start after the deadline: claimed to fail then
                task.wake_at = min(task.wake_at, task.deadline)
        entries = [first]
        if history:
            # Round 0: earlier conversation, visible to the model, never a round to recover.
            entries = [api_entry(task.id, 0, m) for m in history] + entries
            task.config["continues_session"] = len(history)
        stored, created = await self.store.create_task(task, entries)
        if not created and not same_request(stored, task):
            raise DuplicateRequest(request_id or "", stored.id)
        self.start_worker()
        self._wake()
        return Submission(self, stored.id, created)

    async def continue_session(
        self,
        session_id: str,
        input: Any,
        *,
        owner: str | None = None,
        agent: str | None = None,
        request_id: str | None = None,
        multitask_strategy: MultitaskStrategy | None = None,
    ) -> Submission:
        """The next turn of an existing session: `submit(..., continue_session=True)`
        with its latest turn's agent unless `agent` names another. While a turn runs,
        the input is a message into it (`Submission.sent`)."""
        turns = await self._turns(session_id, owner)
        return await self.submit(
            agent or turns[-1].agent,
            input,
            owner=owner,
            session_id=session_id,
            continue_session=True,
            request_id=request_id,
            multitask_strategy=multitask_strategy,
        )

    async def _session_tasks(
        self, session_id: str, owner: str | None, status: Sequence[TaskStatus], limit: int
    ) -> builtins.list[Task]:
        # The session is the owner's: another owner's tasks under the same id are
        # not in it, and neither are an owner's tasks in an ownerless session. No
        # owner and the empty owner are one owner, as in `session_scope`: both kinds
        # of task are looked for.
        owners: list[str | None] = [owner] if owner else [None, ""]
        found: list[Task] = []
        for one in owners:
            query = TaskQuery(
                session_id=session_id,
                owner=one,
                no_owner=one is None,
                status=list(status),
                limit=limit,
            )
            found += (await self.store.list_tasks(query)).tasks
        return found

    async def _session_history(self, session_id: str, owner: str | None) -> builtins.list[Any]:
        found = await self._session_tasks(session_id, owner, [TaskStatus.COMPLETED], 1)
        if not found:
            return []
        latest = max(found, key=lambda t: t.created_at)
        return list(await self.store.model_view(latest.id))

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

    async def list(
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
    ) -> Any:
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

        `callbacks` (runtime/callbacks.py) hear this task only, while this
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

    async def messages(
        self, task_id: str, view: Literal["model", "ui"] = "model"
    ) -> builtins.list[Any]:
        if view == "model":
            return list(await self.model_view(task_id))
        return await self.ui_messages(task_id)

    async def model_view(self, task_id: str) -> builtins.list[ApiMessage]:
        view = await self.store.model_view(task_id)
        if not view:
            await self.store.get_task(task_id)  # a missing or purged task: TaskNotFound
        return view

    async def ui_messages(self, task_id: str) -> builtins.list[UIMessage]:
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

    # --- steering ---

    async def history(self, task_id: str, *, owner: str | None = None) -> History:
        """The task round by round: what the model said, its calls and their results."""
        task = await self.get(task_id, owner=owner)
        return await task_history(self.store, task)

    async def fork(
        self,
        task_id: str,
        at_round: int,
        *,
        edit: Edit | None = None,
        owner: str | None = None,
        request_id: str | None = None,
    ) -> Submission:
        """A new task (same owner and agent) continuing from the end of round `at_round`.

        The source is untouched. Only a complete round can be forked (every call
        answered), so no tool of a copied round ever runs again; `edit` changes
        the copied view (see `Edit`). The same `request_id` returns the same fork.
        The source's deadline is not copied; the agent's default applies, from now.
        """
        source = await self.get(task_id, owner=owner)
        task, log = await new_fork(self.store, source, at_round, edit, request_id)
        known = self.agents.get(source.agent)
        if known is not None and known.deadline is not None:  # the agent's default, from now
            now = utcnow()
            task.config["deadline"] = deadline_record(deadline_at(known.deadline, now), "fork", now)
        stored, created = await self.store.create_fork(task, log)
        if not created and not same_request(stored, task):
            raise DuplicateRequest(
                request_id or "",
                stored.id,
                f"request_id {request_id!r} already started task {stored.id!r}, not this "
                "fork; use a new request_id for a new fork (the same request_id with the "
                "same task, round and edit returns the existing fork)",
            )
        self.start_worker()
        self._wake()
        return Submission(self, stored.id, created)

    # --- control ---

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
                        task_id, max(left, 0.0), _acted_on(task), "its worker to reach a safe point"
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
            name=task.agent, model="scripted:none", plan_tool=False
        )

    async def _descendants(
        self, task_id: str, statuses: Sequence[TaskStatus]
    ) -> builtins.list[Task]:
        out: builtins.list[Task] = []
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
                ]
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

    async def repin(self, task_id: str) -> Task:
        """Pin the task to its agent as this runtime defines it: the provider URL
        its model requests go to and what its tools may touch (runtime/pins.py).

        A worker refuses (blocks) a task whose pin its agent contradicts; this is
        the deliberate override. Refused while a live worker holds the task, and
        for an ended task. Statuses are left as they are: `resume` a blocked task.
        """
        task = await self.store.get_task(task_id)
        definition = self.agent(task.agent)
        if task.status.terminal:
            raise UsageError(f"task {task_id} has ended ({task.status.value}): nothing to re-pin")
        if task.status is TaskStatus.RUNNING and lease_alive(task):
            raise UsageError(
                f"task {task_id} is running in a live worker; re-pin it once it is paused "
                "or its worker is gone (its lease expired)"
            )
        res = await self.store.commit(
            Commit(
                patches=[
                    TaskPatch(
                        task_id,
                        {"config": with_pins(definition, task.config)},
                        expect_status=[task.status],
                        expect_version=task.version,
                    )
                ]
            )
        )
        return res.tasks[task_id]

    async def retry(
        self,
        task_id: str,
        *,
        owner: str | None = None,
        deadline: DeadlineSpec | None = None,
    ) -> Task:
        """Continue a failed task from its last commit (docs/architecture.md §4).

        The completed rounds are kept; a notice records the retry; the next
        worker recovers the round the failure interrupted by the same table as
        after a crash (a call without a result is re-run only if replay-safe).
        With `owner`, another owner's task is reported as not found.

        `deadline` (a time, or a delay from now) gives the task a new deadline.
        Without it, a deadline that has passed is dropped (the task would fail
        again at once) and one still ahead is kept.
        """
        now = utcnow()
        new_deadline = None if deadline is None else deadline_at(deadline, now)
        for _ in range(10):
            task = await self.get(task_id, owner=owner)
            if task.status is not TaskStatus.FAILED:
                raise InvalidTransition(
                    task.status.value, "pending", "only a failed task can be retried"
                )
            why = f" ({task.error})" if task.error else ""
            entry = notice(
                task.id,
                task.iterations + 1,
                f"Retried after the failure{why}; continuing from the last commit.",
            )
            changes: dict[str, Any] = {
                "status": TaskStatus.PENDING,
                "error": None,
                "completed_at": None,
                "control": None,
            }
            if new_deadline is not None:
                config = dict(task.config)
                config["deadline"] = deadline_record(new_deadline, "retry", now)
                changes["config"] = config
            elif task.deadline is not None and task.deadline <= utcnow():
                changes["config"] = {k: v for k, v in task.config.items() if k != "deadline"}
            patch = TaskPatch(
                task_id, changes, expect_status=[TaskStatus.FAILED], expect_version=task.version
            )
            try:
                res = await self.store.commit(Commit(entries=[entry], patches=[patch]))
            except Conflict:
                continue  # retried by someone else at the same moment: look again
            self.start_worker()
            self._wake()
            return res.tasks[task_id]
        raise Conflict(f"task {task_id!r} kept changing while retrying it")

    async def respond(
        self,
        task_id: str,
        *,
        approve: bool | None = None,
        reason: str | None = None,
        answer: str | None = None,
        call_id: str | None = None,
        arguments: dict[str, Any] | None = None,
        decisions: Mapping[str, Decision] | None = None,
    ) -> Task:
        """Answer a task waiting for input: approve or deny a tool call, or answer a question.

        `approve=True, arguments={...}` runs the call with these arguments
        instead of the model's (checked against the tool's schema first:
        `InvalidArguments` and nothing changed if they don't fit); the model is
        told they were edited. `decisions={call_id: Decision(...)}` decides
        several open approvals in one commit.
        """
        for _ in range(10):
            task = await self.store.get_task(task_id)
            answers = await person_answers(
                self.store,
                task,
                self.agents.get(task.agent),
                approve=approve,
                reason=reason,
                answer=answer,
                call_id=call_id,
                arguments=arguments,
                decisions=decisions,
            )
            entries, patch = await resolve(self.store, task, answers)
            try:
                res = await self.store.commit(Commit(entries=entries, patches=[patch]))
            except Conflict:
                continue
            self.start_worker()
            self._wake()
            return res.tasks[task_id]
        raise Conflict(f"task {task_id!r} kept changing while answering it")

    async def delete(self, task_id: str) -> None:
        await self.store.delete_task(task_id)

    # --- sync convenience ---

    def run_sync(self, agent: str, input: Any, *, timeout: float | None = None, **kw: Any) -> Task:
        """Submit and wait, for scripts without an event loop."""

        async def go() -> Task:
            async with self:
                sub = await self.submit(agent, input, **kw)
                return await sub.wait(timeout)

        return asyncio.run(go())
