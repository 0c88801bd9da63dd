"""The Runtime: what users call. Submit, wait, pause, resume, abort, answer, watch.

Its verbs are grouped by what they do: reads (_reading.py), stopping and
resuming (_stopping.py), messages into a live task (_sending.py), sessions
(sessions.py) and many tasks at once (_many.py) are mixed in; creating tasks,
forks, retries and answers are here."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pydantic_core import to_jsonable_python

from duragent.errors import (
    Conflict,
    DuplicateRequest,
    InvalidTransition,
    TaskFailed,
    UnknownAgent,
    UsageError,
)
from duragent.runtime._agent import Agent, agents_by_name
from duragent.runtime._approvals import Decision
from duragent.runtime._bulk import BulkOperations
from duragent.runtime._bulk_run import bulk_agent
from duragent.runtime._callbacks import TaskCallbacks
from duragent.runtime._control import Control
from duragent.runtime._deadlines import DeadlineSpec, deadline_at, deadline_record
from duragent.runtime._engine import StatusHook, TraceHook
from duragent.runtime._hosted import hosted_tool, new_hosted_fork
from duragent.runtime._inbox import MultitaskStrategy, check_strategy
from duragent.runtime._log import api_entry, notice
from duragent.runtime._many import ManyTasks
from duragent.runtime._output import OutputType, typed_output
from duragent.runtime._pins import with_pins
from duragent.runtime._presence import served_versions
from duragent.runtime._reading import ReadsTasks
from duragent.runtime._sending import SendsMessages
from duragent.runtime._sessions import Sessions, full_messages
from duragent.runtime._steering import Edit, History, new_fork, task_history
from duragent.runtime._stopping import StopsTasks
from duragent.runtime._submit import new_task
from duragent.runtime._versions import check_version, migration_commit, unserved_reason
from duragent.runtime._waits import person_answers, resolve
from duragent.runtime._worker import Worker, WorkerOptions, lease_alive
from duragent.store import open_store
from duragent.store._commits import Commit, DocumentWrite, TaskPatch, TaskQuery
from duragent.store._protocol import Store
from duragent.store._queues import Queue, define_queue
from duragent.types import ApiMessage, Task, TaskStatus, utcnow
from duragent.webhooks import WebhookDelivery, check_url


def when(start_at: datetime | timedelta) -> datetime:
    """A start time from a time (timezone-aware) or a delay from now."""
    if isinstance(start_at, timedelta):
        return utcnow() + start_at
    if start_at.tzinfo is None:
        raise UsageError("start_at must be timezone-aware (e.g. datetime.now(UTC)) or a timedelta")
    return start_at


def place(
    task: Task,
    queue: str,
    priority: int,
    metadata: dict[str, Any] | None,
    start_at: datetime | timedelta | None,
) -> None:
    """Where and when a new task is claimed: its queue, its priority there, the
    labels filters find it by, and the time it is held until."""
    task.queue = queue
    task.priority = priority
    task.metadata = dict(metadata or {})
    if start_at is not None:
        task.wake_at = when(start_at)
        if task.deadline is not None:  # a start after the deadline: claimed to fail then
            task.wake_at = min(task.wake_at, task.deadline)


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

    async def result(self, timeout: float | None = None) -> Any:
        """The task's answer once it ends, typed by its agent's `output_type`
        (`Runtime.result`); TaskFailed if it did not complete."""
        return await self.runtime.result(self.task_id, timeout=timeout)


def same_request(stored: Task, asked: Task) -> bool:
    """Whether a resubmission with a used request_id asks for the same task."""
    return (
        stored.agent == asked.agent
        and to_jsonable_python(stored.input) == to_jsonable_python(asked.input)
        # A fork and a submission (or two different forks) are different requests.
        and stored.config.get("fork_request") == asked.config.get("fork_request")
    )


class Runtime(ReadsTasks, StopsTasks, ManyTasks, BulkOperations, SendsMessages, Sessions):
    """`async with Runtime("sqlite:///agent.db", agents=[...]) as rt: ...`

    With `run_worker=True` (the default) an in-process worker runs the tasks of
    the given agents; it starts on the first `submit`, `wait` or `resume()`.
    A task that waits `missing_agent_grace` seconds (default 60) for an agent no
    running worker knows becomes `blocked` with reason `missing_definition`.
    `worker_queues` (queue names, as `WorkerOptions(queues=)`) keeps the in-process
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
        # A PostgreSQL store bounds its waits over the network by the leases (_postgres_bounds.py).
        expect_lease_ttl = getattr(self.store, "expect_lease_ttl", None)
        if expect_lease_ttl is not None:
            expect_lease_ttl(lease_ttl)
        self.run_worker = run_worker
        self.worker: Worker | None = None
        # Checked now, not when the worker starts on the first submit.
        self.worker_options = WorkerOptions(
            concurrency=concurrency,
            lease_ttl=lease_ttl,
            poll_interval=poll_interval,
            worker_id=worker_id,
            missing_agent_grace=missing_agent_grace,
            webhook_delivery=webhook_delivery,
            queues=worker_queues,
        )
        self._on_status_change = on_status_change
        self._trace = trace
        # Bulk operations are tasks of this built-in agent, which every worker runs.
        self.bulk_agent = bulk_agent(self, trace)
        self._worker_job: asyncio.Task[None] | None = None
        self._queues = list(queues)
        # load_task(id, callbacks=): shared with the worker, which calls and drops them.
        self._task_callbacks: dict[str, TaskCallbacks] = {}
        # The versions live workers serve, and when read (see `unserved`).
        self._served: tuple[float, dict[str, set[str] | None]] | None = None

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
        self.worker = Worker(
            self.store,
            [*self.agents.values(), self.bulk_agent],
            self.worker_options,
            on_status=self._on_status_change,
            trace=self._trace,
            callbacks=self._task_callbacks,
        )
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
        history: list[ApiMessage] | None = None
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
        place(task, queue or definition.name, priority, metadata, start_at)
        task.config["multitask_strategy"] = strategy
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
    ) -> list[Task]:
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

    async def _session_history(self, session_id: str, owner: str | None) -> list[ApiMessage]:
        found = await self._session_tasks(session_id, owner, [TaskStatus.COMPLETED], 1)
        if not found:
            return []
        latest = max(found, key=lambda t: t.created_at)
        return await full_messages(self.store, latest.id)

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
        A task whose loop runs inside one tool call (a Pydantic AI agent) is forked
        at a round of that loop, without an edit (runtime/_hosted.py).
        """
        source = await self.get(task_id, owner=owner)
        if hosted_tool(source) is not None:  # forked at a round of its loop
            task, log = await new_hosted_fork(self.store, source, at_round, edit, request_id)
        else:
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

    async def repin(self, task_id: str) -> Task:
        """Pin the task to its agent as this runtime defines it: the provider URL
        its model requests go to and what its tools may touch (runtime/_pins.py).

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

    async def migrate(
        self, task_id: str, to_version: str, *, owner: str | None = None, by: str | None = None
    ) -> Task:
        """Move a task to another version of its agent, on purpose (runtime/_versions.py).

        Recorded in its log (a `migration` status entry: from, to, `by`). A task a
        live worker runs is handed back by that worker at its next safe point (a
        release: running tools finish within their grace, or are answered
        "interrupted"), and a worker of `to_version` goes on with it; any other
        task is claimed next by such a worker. A pending call then runs on the new
        version's tool of that name, under that tool's replay rule; a call to a
        tool the new version lacks blocks the task (`missing_definition`, naming
        the tool; runtime/_recovery.py). Pins: re-pinned to
        this runtime's definition when it is `to_version`, else kept (a worker whose
        definition contradicts them blocks the task `pinned`: `repin` it). Refused
        for an ended task (InvalidTransition); `owner`: only that user's task
        (another's is not found).
        """
        return await self._migrate(task_id, to_version, owner=owner, by=by, documents=())

    async def _migrate(
        self,
        task_id: str,
        to_version: str,
        *,
        owner: str | None,
        by: str | None,
        documents: Sequence[DocumentWrite],
    ) -> Task:
        """`migrate`, with `documents` written in the migration's commit (a bulk
        operation's marker: the migration and its marker land together or not)."""
        check_version(to_version)
        for _ in range(10):
            task = await self.get(task_id, owner=owner)
            if task.status.terminal:
                raise InvalidTransition(
                    task.status.value,
                    "migrated",
                    "an ended task runs on no version: fork it, or submit it again",
                )
            if task.agent_version == to_version:
                return task
            live = task.status is TaskStatus.RUNNING and lease_alive(task)
            commit = migration_commit(task, to_version, by, self.agents.get(task.agent), live)
            commit.documents.extend(documents)
            try:
                res = await self.store.commit(commit)
            except Conflict:
                continue  # it moved meanwhile (a round closed, claimed): look again
            runner = self.worker.runner(task_id) if live and self.worker else None
            if runner is not None:
                runner.request(Control("release"))  # ours: at once, not via the row
            return res.tasks[task_id]
        raise Conflict(f"task {task_id!r} kept changing; could not migrate it")

    async def unserved(self, tasks: Sequence[Task]) -> dict[str, str]:
        """Task id -> why it will not start (`waiting for a@v3: no worker serves it`),
        for the pending tasks among `tasks` whose version no live worker serves.
        The workers' records are read at most once a second (none if no task
        is pinned and pending)."""
        if not any(t.status is TaskStatus.PENDING and t.agent_version for t in tasks):
            return {}
        now = asyncio.get_running_loop().time()
        if self._served is None or now - self._served[0] > 1.0:
            self._served = (now, await served_versions(self.store))
        served = self._served[1]
        return {t.id: why for t in tasks if (why := unserved_reason(t, served)) is not None}

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
        return await self._retry(task_id, owner=owner, deadline=deadline, documents=())

    async def _retry(
        self,
        task_id: str,
        *,
        owner: str | None,
        deadline: DeadlineSpec | None,
        documents: Sequence[DocumentWrite],
    ) -> Task:
        """`retry`, with `documents` written in the same commit (a bulk operation's marker)."""
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
                res = await self.store.commit(
                    Commit(entries=[entry], patches=[patch], documents=list(documents))
                )
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

    async def result(
        self, task_id: str, *, timeout: float | None = None, output_type: OutputType | None = None
    ) -> Any:
        """Wait for the task to end and give back its answer: an instance of
        `output_type` (default: its agent's, when this runtime has the agent) built
        from `task.output`, else `task.output` as stored (the text, or the JSON).
        A task that failed, or was aborted, raises TaskFailed with its reason."""
        task = await self.wait(task_id, timeout=timeout)
        if task.status is not TaskStatus.COMPLETED:
            raise TaskFailed(task.id, task.status.value, task.error)
        if output_type is None and task.agent in self.agents:
            output_type = self.agents[task.agent].output_type
        return task.output if output_type is None else typed_output(output_type, task.output)

    # --- sync convenience ---

    def run_sync(self, agent: str, input: Any, *, timeout: float | None = None, **kw: Any) -> Task:
        """Submit and wait, for scripts without an event loop."""

        async def go() -> Task:
            async with self:
                sub = await self.submit(agent, input, **kw)
                return await sub.wait(timeout)

        return asyncio.run(go())
