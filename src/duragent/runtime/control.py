"""How a task runner is controlled and how it stops.

A runner's state and its commits (every commit sees a pause or abort another
process wrote on the task's row), the requests that stop it from outside
(pause, abort, release, deadline, and an interrupt: a pause that goes on with
the messages sent), and the ending of a task: paused, aborted, failed,
completed or blocked. The round is in runtime/round.py, recovery after a
restart in runtime/recovery.py, the loop that drives them in runtime/engine.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from duragent.errors import Conflict, StaleLease
from duragent.llm.base import ResponseAssembler
from duragent.llm.messages import WorkingView
from duragent.payloads import rollback_marker
from duragent.runtime.agent import Agent
from duragent.runtime.callbacks import EntriesHook
from duragent.runtime.calls import render
from duragent.runtime.inbox import cut_plan
from duragent.runtime.log import notice, read_round, result_entries, rollback, ui_entry
from duragent.runtime.state import Clock, DebouncedState, SaveFn
from duragent.runtime.waits import child_resolution, open_round
from duragent.store.commits import Commit, CommitResult, DocumentWrite, PendingCommit, TaskPatch
from duragent.store.protocol import Store
from duragent.store.rules import apply_patch
from duragent.types import BlockReason, EntryKind, NewEntry, Task, TaskStatus, UIError, utcnow
from duragent.webhooks import outbox_events

log = logging.getLogger("duragent.engine")

# A task's status changed: (task, old, new). A coroutine function may be given;
# the worker awaits what it returns, one call after another (runtime/worker.py).
StatusHook = Callable[[Task, TaskStatus, TaskStatus], Awaitable[None] | None]
# Called at named points of a round ("progress", "intents", "tool_start",
# "result", "final", "step"), after what precedes them is committed, and around
# a run ("task_start", "task_end"), a round ("round_start") and a model call
# ("model_start", "model_end"). One exception: the result that closes a round
# may still be syncing (ControlledRunner.commit_behind); its "result" point
# carries `landed`, an awaitable done once it is durable. For tests, demos,
# tracing (duragent.otel) and metrics (duragent.metrics); a hook that never
# returns holds the task there.
TraceHook = Callable[..., Awaitable[None]]


_PAST = {"pause": "paused", "abort": "aborted", "release": "released"}


class Interrupted(Exception):
    """A control request cut an interruptible stretch short."""


@dataclass
class Parking:
    """The commit that parks a task on the waits of round `round` (calls `calls`)."""

    round: int
    calls: list[str]
    entries: list[NewEntry]
    patch: dict[str, Any]
    new_tasks: list[Task]
    documents: list[DocumentWrite]


class Abandoned(Exception):
    """This worker lost the task's lease: stop at once and write nothing more."""


@dataclass
class Control:
    """A request to stop: pause (status paused), abort (terminal), release
    (hand the task back to the queue, e.g. on worker shutdown), or deadline
    (the task's deadline passed: failed, status reason `deadline`)."""

    action: Literal["pause", "abort", "release", "deadline"]
    rollback: bool = False
    reason: str | None = None
    # A pause that goes on at once with the messages sent to interrupt (runtime/inbox.py);
    # `token` (the message id) makes a request heard twice act once.
    resume: bool = False
    token: str | None = None

    @classmethod
    def from_row(cls, control: Mapping[str, Any]) -> Control:
        """The request a task row's `control` field holds (written by Runtime._stop)."""
        reason, token = control.get("reason"), control.get("token")
        return cls(
            "abort" if control.get("action") == "abort" else "pause",
            bool(control.get("rollback")),
            None if reason is None else str(reason),
            resume=bool(control.get("resume")),
            token=None if token is None else str(token),
        )


class ControlledRunner:
    """The state of one task's runner, its commits, and its stopping (see TaskRunner)."""

    def __init__(
        self,
        store: Store,
        agent: Agent,
        task: Task,
        *,
        agents: Mapping[str, Agent] | None = None,
        on_status: StatusHook | None = None,
        clock: Clock | None = None,
        detached: bool = False,
        trace: TraceHook | None = None,
        on_entries: EntriesHook | None = None,
    ) -> None:
        self.store = store
        self.agent = agent
        self.agents = dict(agents or {agent.name: agent})
        self.task = task
        self.epoch = task.lease.epoch
        # Detached: acting on a task no worker holds (pause/abort of a waiting
        # task); commits are guarded by the row's version instead of a lease.
        self.detached = detached
        self.trace = trace
        self.on_status = on_status
        self.on_entries = on_entries  # per-task callbacks (runtime/callbacks.py), via the worker
        self._reported: PendingCommit | None = None  # the queued commit last told to on_entries
        self.view = WorkingView()  # plain data; typed messages built when a model call reads them
        self.state = DebouncedState(
            {"context": dict(task.context)},
            _saver(weakref.ref(self)),
            debounce=agent.state_debounce,
            max_wait=agent.state_max_wait,
            clock=clock,
        )
        self.control: Control | None = None
        self._control_listeners: list[Callable[[], None]] = []  # see _first_done
        self._abort_event = asyncio.Event()
        self._interrupt_target: asyncio.Task[Any] | None = None
        self._handled_tokens: set[str] = set()  # interrupts already acted on
        self._reread = False  # an interrupt changed the log: rebuild the round from it
        self._interrupting = False
        self._commit_lock = asyncio.Lock()
        self._behind: PendingCommit | None = None  # a round's closing commit, still syncing
        self._unless_behind = (task, task)  # the row before it, and as taken after it
        self._attempt: ResponseAssembler | None = None  # the model call in progress
        self._round_no = 0  # the round _round_api_seqs belongs to
        self._round_api_seqs: list[int] = []
        self._round_progress: list[int] = []
        # When each call of the open round was made (its intent's commit time):
        # what a call's waits count from, so a re-run after a crash asks the same.
        self._called_at: dict[str, datetime] = {}
        # The commit of a round's waits, while it has not landed (see RoundRunner._park).
        self._unparked: Parking | None = None
        self._tool_progress_at: dict[str, float] = {}
        # How long a runner ended by a store error keeps trying to hand its
        # task back before leaving it to the lease (renewed meanwhile).
        self.release_patience = 30.0

    # --- control from outside ---

    def request(self, control: Control) -> None:
        if control.token is not None and control.token in self._handled_tokens:
            return
        # An interrupt (a pause that goes on) gives way to a plain pause or an abort.
        yields = self.control is not None and self.control.resume and not control.resume
        if self.control is None or control.action == "abort" or yields:
            self.control = control
            for listener in list(self._control_listeners):
                listener()
            if control.action == "abort":
                self._abort_event.set()
            if self._interrupt_target is not None and not self._interrupting:
                self._interrupting = True
                self._interrupt_target.cancel()

    @contextlib.asynccontextmanager
    async def _interruptible(self) -> AsyncIterator[None]:
        """A stretch (a model stream, a retry back-off) that a control request may cut.

        request() cancels this task only while it is suspended inside such a
        stretch, so the cancellation always lands here and is turned into
        Interrupted; a cancellation from anyone else passes through.
        """
        if self.control is not None:
            raise Interrupted
        task = asyncio.current_task()
        self._interrupt_target = task
        try:
            yield
        except asyncio.CancelledError:
            if self._interrupting and task is not None:
                self._interrupting = False
                task.uncancel()
                raise Interrupted from None
            raise
        finally:
            self._interrupt_target = None

    async def _first_done(self, jobs: Iterable[asyncio.Future[Any]], *, or_control: bool) -> None:
        """Wait until one of `jobs` is done or, with `or_control`, a control request
        is here (one that came before counts, after the jobs' next step).

        What asyncio.wait(FIRST_COMPLETED) with a task waiting on the control
        event does, without the two tasks, the sets and the cancellation a round
        would pay for it on every tool call.
        """
        loop = asyncio.get_running_loop()
        wake: asyncio.Future[None] = loop.create_future()

        def poke(_: object = None) -> None:
            if not wake.done():
                wake.set_result(None)

        jobs = list(jobs)
        for job in jobs:
            job.add_done_callback(poke)
        if or_control:
            self._control_listeners.append(poke)
            if self.control is not None:
                loop.call_soon(poke)
        try:
            await wake
        finally:
            for job in jobs:
                job.remove_done_callback(poke)
            if or_control:
                self._control_listeners.remove(poke)

    # --- commits ---

    async def commit(
        self,
        entries: Iterable[NewEntry] = (),
        patch: dict[str, Any] | None = None,
        *,
        documents: Iterable[DocumentWrite] = (),
        new_tasks: Iterable[Task] = (),
        patches: Iterable[TaskPatch] = (),
        expect_version: int | None = None,
    ) -> CommitResult:
        async with self._commit_lock:  # one task's commits land in the order it made them
            if self._behind is not None and (expect_version is not None or self.detached):
                await self._caught_up()  # the version to expect is the row after it
            commit, state = self._make_commit(
                entries, patch, documents, new_tasks, patches, expect_version
            )
            try:
                result = await self.store.commit(commit)
            except StaleLease as exc:
                raise Abandoned(str(exc)) from exc
            except BaseException:
                if state is not None:
                    self.state.mark_dirty()
                raise
            finally:
                self._settled_behind(commit.after)
        row = result.tasks[self.task.id]
        if self.on_entries is not None:
            # In the order they landed: the commit queued behind first (its own
            # done-callback may run only later), then this one's, before the
            # status change they lead to.
            self._report_behind(commit.after)
            if result.entries:
                self.on_entries(row, result.entries)
        self._took(row)
        return result

    def _report_behind(self, pending: PendingCommit | None) -> None:
        """Tell the per-task callbacks of the entries of a queued commit that landed, once."""
        if pending is None or pending is self._reported or self.on_entries is None:
            return
        future = pending.future
        if future is None or not future.done() or future.cancelled() or future.exception():
            return
        self._reported = pending
        landed = future.result()
        if landed.entries:
            self.on_entries(landed.tasks[self.task.id], landed.entries)

    def _make_commit(
        self,
        entries: Iterable[NewEntry],
        patch: dict[str, Any] | None,
        documents: Iterable[DocumentWrite] = (),
        new_tasks: Iterable[Task] = (),
        patches: Iterable[TaskPatch] = (),
        expect_version: int | None = None,
    ) -> tuple[Commit, Any]:
        """The Commit of this runner's task, and the debounced state taken into it."""
        changes = dict(patch or {})
        state = self.state.take()  # the debounced state rides along with every commit
        if state is not None:
            changes.setdefault("context", state["context"])
        # A status change worth announcing writes its webhook event in this commit.
        documents = [*documents, *outbox_events(self.task, changes)]
        own = [TaskPatch(self.task.id, changes, expect_version=expect_version)]
        if not changes and expect_version is None:
            own = []
        if self.detached:
            own = [TaskPatch(self.task.id, changes, expect_version=self.task.version)]
        commit = Commit(
            fence={} if self.detached else {self.task.id: self.epoch},
            entries=list(entries),
            patches=own + list(patches),
            documents=documents,
            new_tasks=list(new_tasks),
            after=self._behind,  # never lands without the commit queued before it
        )
        return commit, state

    def commit_behind(
        self, entries: Iterable[NewEntry], patch: dict[str, Any]
    ) -> PendingCommit | None:
        """Queue a commit without waiting for it to be durable, and go on.

        For the commit that closes a round: the next model call starts while it
        syncs, and when the model answers at once its commit joins the same
        transaction. Nothing is lost or observed early: the runner's next commit
        names this one (`Commit.after`), so the store lands it only after this
        one and refuses it if this one failed; a tool, which runs only after
        that next commit, never runs on a round whose result is not stored. The
        row is taken as this commit will leave it; its version decides nothing
        until the commit lands (a commit that expects a version waits for it).

        None, and nothing queued, when the store cannot queue commits or a
        commit is in flight (its answer would land over the row taken here).
        """
        commit_soon = self.store.commit_soon
        if commit_soon is None or self.detached or self._commit_lock.locked():
            return None
        commit, state = self._make_commit(entries, patch)
        pending: PendingCommit = commit_soon(commit)
        self._behind = pending
        [own] = commit.patches
        predicted, status_entry = apply_patch(self.task, own, utcnow())  # a copy of its own
        added = len(commit.entries) + (status_entry is not None)
        predicted.__dict__["last_seq"] = predicted.last_seq + added
        self._unless_behind = (self.task, predicted)
        self.task = predicted
        assert pending.future is not None
        pending.future.add_done_callback(lambda f: self._behind_landed(pending, f, state))
        return pending

    def _behind_landed(
        self, pending: PendingCommit, future: asyncio.Future[CommitResult], state: Any
    ) -> None:
        if future.cancelled():
            return  # not the store's doing: it runs the commit all the same
        if future.exception() is not None:
            # The commit that follows it fails with the same error, and says so.
            if state is not None:
                self.state.mark_dirty()
            self._unpredict()
            return
        landed = future.result()
        self._report_behind(pending)
        if self._behind is not pending:
            return  # a later commit was queued or made since: its row is the one to take
        self._behind = None
        row = landed.tasks[self.task.id]
        if row.version >= self.task.version:  # a message may have moved it further
            self._took(row)

    async def _caught_up(self) -> None:
        """Wait for the commit queued behind; its failure is this runner's failure."""
        pending = self._behind
        if pending is None:
            return
        try:
            await pending
        except StaleLease as exc:
            raise Abandoned(str(exc)) from exc
        finally:
            self._settled_behind(pending)

    def _settled_behind(self, pending: PendingCommit | None) -> None:
        """Once the commit queued behind has landed, or its failure reached the runner
        (through a commit that followed it), later commits need not follow it: they
        are the runner's answer to that failure (ending the task as failed, say)."""
        if pending is not None and self._behind is pending:
            assert pending.future is not None
            if pending.future.done() and not pending.future.cancelled():
                self._behind = None
                if pending.future.exception() is not None:
                    self._unpredict()

    def _unpredict(self) -> None:
        """A queued commit failed: the row is again the one before it, as stored
        (unless a commit since brought a newer one)."""
        base, predicted = self._unless_behind
        if self.task is predicted:
            self.task = base

    def _took(self, row: Task) -> None:
        """Take the row a commit left: a control request or a status change on it."""
        old = self.task.status
        self.task = row
        control = self.task.control
        if control and (
            self.control is None
            or self.control.action != control.get("action")
            or self.control.resume != bool(control.get("resume"))
        ):
            # A pause/abort committed by another process: every commit sees it,
            # so no tool starts after the commit that precedes it (the intents).
            self.request(Control.from_row(control))
        if self.task.status != old and self.on_status is not None:
            self.on_status(self.task, old, self.task.status)

    async def _save_state(self, snapshot: dict[str, Any]) -> None:
        try:
            await self.commit(patch={"context": snapshot["context"]})
        except Abandoned:
            log.info("task %s: lease lost while saving state", self.task.id)

    async def tool_progress(self, call_id: str, text: str) -> None:
        now = time.monotonic()
        if now - self._tool_progress_at.get(call_id, 0.0) < self.agent.progress_interval:
            return
        self._tool_progress_at[call_id] = now
        rnd = self.task.iterations + 1
        payload = {"call_id": call_id, "text": text}
        await self.commit(
            [NewEntry(task_id=self.task.id, kind=EntryKind.PROGRESS, round=rnd, payload=payload)]
        )

    def called_at(self, call_id: str) -> datetime:
        """When call `call_id` of the open round was made (its intent committed)."""
        return self._called_at.get(call_id) or utcnow()

    async def trace_point(self, point: str, **info: Any) -> None:
        if self.trace is not None:
            await self.trace(point, task_id=self.task.id, round=self.task.iterations + 1, **info)

    def _void_progress(self, r: int, reason: str) -> NewEntry:
        marker = rollback_marker(
            "progress", self._round_progress[0], self._round_progress[-1], reason
        )
        self._round_progress = []
        return NewEntry(task_id=self.task.id, kind=EntryKind.ROLLBACK, round=r, payload=marker)

    # --- ending ---

    async def stop_now(self, control: Control) -> Task:
        """Pause or abort a task nobody is running, from what its log says."""
        t = self.task
        rs = await open_round(self.store, t)
        self._round_no, self._round_progress = rs.round, list(rs.progress_seqs)
        self._round_api_seqs = list(rs.api_seqs)
        entries: list[NewEntry] = []
        if control.action in ("abort", "deadline"):
            for cid in rs.missing:  # every call keeps exactly one result
                text = cancelled(control, "before it finished")
                entries += result_entries(t.id, rs.round, cid, text, "interrupted")
        await self._stop(control, entries)
        return self.task

    async def _stop(self, control: Control, entries: list[NewEntry] | None = None) -> None:
        tid, r = self.task.id, self.task.iterations + 1
        entries = list(entries or [])
        if control.action == "release":
            entries.append(notice(tid, r, "The worker stopped; the task goes back to the queue."))
            await self.commit(entries, {"status": TaskStatus.PENDING, "control": None})
            return
        if control.action == "abort":
            entries.append(notice(tid, r, control.reason or "Aborted."))
            await self._finish(
                TaskStatus.ABORTED, entries=entries, error=control.reason or "aborted"
            )
            return
        if control.action == "deadline":
            error = control.reason or "deadline exceeded"
            extra = {"status_reason": "deadline"}
            await self._finish(TaskStatus.FAILED, entries=entries, error=error, extra=extra)
            return
        if control.resume and self.task.status is not TaskStatus.RUNNING:
            # Parked just as asked: the wait is cut short as a message sent to a
            # waiting task cuts it (runtime/inbox.py), unless it is for a sub-task.
            await self._cut_parked_wait(control)
            self._resumed(control)
            return
        if control.rollback and self._round_progress:
            entries.append(self._void_progress(r, "paused with rollback"))
        while True:
            # A paused task has no timer (a sleep, an approval's expiry, a deadline):
            # they are re-armed from the log when it runs again; kept, they would hold
            # the resumed task back as a delayed start. A pending task's wake_at is
            # its delayed start (start_at): kept. An interrupted one runs on.
            patch: dict[str, Any] = {"status": TaskStatus.PAUSED, "control": None}
            if self.task.status is not TaskStatus.PENDING:
                patch["wake_at"] = None
            todo, version = list(entries), None
            if control.resume:
                # The runner goes on: a pause or abort another process wrote on the
                # row meanwhile must survive this commit (it is heard right after),
                # so the row is guarded by its version and the request is cleared
                # only if it is still this interrupt's own.
                self.task = await self.store.get_task(tid)
                mine = self.task.control is None or self.task.control.get("token") == control.token
                patch = {"control": None} if mine else {}
                version = self.task.version
            kept: list[str] = []
            if control.rollback and self._round_api_seqs and self.task.iterations < self._round_no:
                kept, planned = await self._roll_back_round(r, todo, patch, control)
                if version is not None and planned != version:
                    continue  # the row moved since it was read: read and plan again
                version = planned
            try:
                await self._commit_stop(control, todo, patch, kept, version)
                break
            except Conflict:
                if version is None or self.detached:
                    raise  # a detached stop is retried from the top by Runtime._stop
                # Written meanwhile (a message came in, a control request): plan
                # again (the void range too), from the row as it is now.
        if control.resume:
            self._resumed(control)

    async def _cut_parked_wait(self, control: Control) -> None:
        for _ in range(5):
            entries: list[NewEntry] = []
            row = self.task.control
            mine = row is None or row.get("token") == control.token  # else asked since: kept
            patch: dict[str, Any] = {"control": None} if mine else {}
            version = None
            if self.task.status is TaskStatus.WAITING:
                rs = await open_round(self.store, self.task)
                cut = cut_plan(self.task, rs, control.rollback, [])
                if cut is not None:
                    entries, changes = cut
                    patch.update(changes)
                    version = self.task.version  # a rollback's void range ends at last_seq
            try:
                await self.commit(entries, patch, expect_version=version)
                return
            except Conflict:
                self.task = await self.store.get_task(self.task.id)  # a message came in
        raise Conflict(f"task {self.task.id!r} kept changing while its wait was cut short")

    async def _commit_stop(
        self,
        control: Control,
        entries: list[NewEntry],
        patch: dict[str, Any],
        kept: list[str],
        version: int | None,
    ) -> None:
        tid, r = self.task.id, self.task.iterations + 1
        text = "Paused."
        if control.rollback:
            text = "Paused (incomplete round rolled back)."
        if control.resume:
            text = "Interrupted by a new message" + (
                " (incomplete round rolled back)." if control.rollback else "."
            )
        if kept:
            text += f" Kept, as they are never replayed, the results of: {', '.join(kept)}."
        entries.append(notice(tid, r, text))
        await self.commit(entries, patch, expect_version=version)

    def _resumed(self, control: Control) -> None:
        """An interrupt is done: the runner goes on (an abort asked meanwhile stays)."""
        if control.token is not None:
            self._handled_tokens.add(control.token)
        if self.control is control:
            self.control = None
        self._reread = True

    async def _roll_back_round(
        self, r: int, entries: list[NewEntry], patch: dict[str, Any], control: Control
    ) -> tuple[list[str], int]:
        """Add to `entries` what takes round r out of the model's view (log.rollback);
        returns the calls kept in it, by name, and the row version the plan holds for.

        The void range ends at the seq `entries` will end at, so it is planned from
        the row as stored: others append too (a message sent in), and the commit
        must be refused (Conflict) if one did since."""
        row = await self.store.get_task(self.task.id)
        rs = read_round(await self.store.entries(self.task.id, after_seq=self.task.round_seq), r)
        first, last = min(self._round_api_seqs), row.last_seq
        # A rollback with resume is a new message's (Runtime.send(..., rollback)).
        new_message = control.resume
        cause = "a new message came in" if new_message else "the task was paused"
        reason = "a new message" if new_message else "paused with rollback"
        plan = rollback(self.task.id, rs, first, last, entries, reason, cause=cause)
        entries += plan.entries
        if plan.closes_round:
            patch["iterations"] = r
        return [f"{c.function.name} ({c.id})" for c in plan.kept], row.version

    async def _finish(
        self,
        status: TaskStatus,
        *,
        error: str | None = None,
        entries: list[NewEntry] | None = None,
        extra: dict[str, Any] | None = None,
        expect_version: int | None = None,
    ) -> None:
        entries = list(entries or [])
        r = self.task.iterations + 1
        if status is TaskStatus.FAILED and error:
            entries.append(
                ui_entry(self.task.id, r, UIError(message="The task failed.", detail=error))
            )
        patch = {"status": status, "error": error, "control": None, **(extra or {})}
        if self.task.parent_id is None:
            await self.commit(entries, patch, expect_version=expect_version)
            return
        # A sub-task's end and its parent's tool result land in one commit.
        if status is TaskStatus.COMPLETED:
            content, outcome = render((extra or {}).get("output", self.task.output)), "ok"
        else:
            content, outcome = f"Sub-task {status.value}: {error or 'no reason given'}", "error"
        for attempt in range(5):
            parent_entries, parent_patches = await child_resolution(
                self.store, self.task, content, outcome
            )
            try:
                await self.commit(
                    [*entries, *parent_entries],
                    patch,
                    patches=parent_patches,
                    expect_version=expect_version,
                )
                return
            except Conflict:
                if attempt == 4:
                    raise
                if expect_version is not None:
                    row = await self.store.get_task(self.task.id)
                    if row.version != expect_version:
                        raise  # ours moved (a message came in): the caller decides again

    async def _block(self, reason: BlockReason, message: str) -> None:
        r = self.task.iterations + 1
        await self.commit(
            [ui_entry(self.task.id, r, UIError(message="The task is blocked.", detail=message))],
            {"status": TaskStatus.BLOCKED, "status_reason": reason.value, "error": message},
        )


def _saver(runner: weakref.ref[ControlledRunner]) -> SaveFn:
    """The runner's state saver, holding the runner weakly. Its bound
    `_save_state` would close a reference cycle (runner -> state -> runner),
    and a finished runner, with its whole view of the history, would then
    live on until the collector's next full collection instead of going
    when its last reference does. A runner nobody holds any more has closed
    its state (engine.py), so there is nothing left to save."""

    async def save(snapshot: dict[str, Any]) -> None:
        alive = runner()
        if alive is not None:
            await alive._save_state(snapshot)

    return save


def cancelled(control: Control, when: str) -> str:
    """The result a call stopped by `control` gets (`when`: "while it ran", ...)."""
    if control.action == "deadline":
        return f"Tool call cancelled: the task's deadline passed {when}."
    return f"Tool call cancelled: the task was {_PAST[control.action]} {when}."
