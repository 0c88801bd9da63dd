"""Running one task: the round, recovery, and stopping. Every step is a commit.

A round: model view -> stream the model (progress committed at most every
`progress_interval`) -> commit the assistant message with its tool intents ->
run the tools concurrently, committing each result -> next round. The commit
that brings the last result of a round also closes it (iterations + 1).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from duragent.errors import (
    Conflict,
    ModelError,
    StaleLease,
    StoreError,
    StoreUnavailable,
    TaskNotFound,
)
from duragent.llm.base import ModelRequest, ResponseAssembler, TextDelta
from duragent.llm.messages import WorkingView
from duragent.runtime.agent import Agent
from duragent.runtime.approvals import wake_times
from duragent.runtime.calls import Outcome, describe, render, run_call
from duragent.runtime.context import SleepUntil, SpawnSubtask, WaitForInput
from duragent.runtime.deadlines import deadline_at, exceeded, wake_time
from duragent.runtime.inbox import delivery, due
from duragent.runtime.log import (
    RoundState,
    api_entry,
    notice,
    read_round,
    result_entries,
    rollback,
    ui_entry,
    wait_entry,
    wait_reason,
)
from duragent.runtime.state import Clock, DebouncedState
from duragent.runtime.submit import new_task
from duragent.runtime.waits import child_resolution
from duragent.store.base import Commit, CommitResult, DocumentWrite, Store, TaskPatch
from duragent.types import (
    ApiMessage,
    BlockReason,
    Entry,
    EntryKind,
    NewEntry,
    SystemMessage,
    Task,
    TaskStatus,
    ToolCallData,
    ToolMessage,
    UIError,
    UserMessage,
    utcnow,
)
from duragent.webhooks import outbox_events

log = logging.getLogger("duragent.engine")

StatusHook = Callable[[Task, TaskStatus, TaskStatus], None]
# Called at named points of a round ("progress", "intents", "tool_start",
# "result", "final", "step"), after what precedes them is committed, and around
# a run ("task_start", "task_end"), a round ("round_start") and a model call
# ("model_start", "model_end"). For tests, demos, tracing (duragent.otel) and
# metrics (duragent.metrics); a hook that never returns holds the task there.
TraceHook = Callable[..., Awaitable[None]]


_PAST = {"pause": "paused", "abort": "aborted", "release": "released"}


class _Interrupted(Exception):
    """A control request cut an interruptible stretch short."""


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


class TaskRunner:
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
        self.view = WorkingView()  # plain data; typed messages built when a model call reads them
        self.state = DebouncedState(
            {"context": dict(task.context)},
            self._save_state,
            debounce=agent.state_debounce,
            max_wait=agent.state_max_wait,
            clock=clock,
        )
        self.control: Control | None = None
        self._control_event = asyncio.Event()
        self._abort_event = asyncio.Event()
        self._interrupt_target: asyncio.Task[Any] | None = None
        self._handled_tokens: set[str] = set()  # interrupts already acted on
        self._reread = False  # an interrupt changed the log: rebuild the round from it
        self._interrupting = False
        self._commit_lock = asyncio.Lock()
        self._attempt: ResponseAssembler | None = None  # the model call in progress
        self._round_no = 0  # the round _round_api_seqs belongs to
        self._round_api_seqs: list[int] = []
        self._round_progress: list[int] = []
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
            self._control_event.set()
            if control.action == "abort":
                self._abort_event.set()
            if self._interrupt_target is not None and not self._interrupting:
                self._interrupting = True
                self._interrupt_target.cancel()

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
                documents=list(documents),
                new_tasks=list(new_tasks),
            )
            try:
                result = await self.store.commit(commit)
            except StaleLease as exc:
                raise Abandoned(str(exc)) from exc
            except BaseException:
                if state is not None:
                    self.state.mark_dirty()
                raise
        old = self.task.status
        self.task = result.tasks[self.task.id]
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
        return result

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

    # --- the loop ---

    def _arm_deadline(self) -> asyncio.TimerHandle | None:
        """Stop the task at its deadline, like a pause (at the next safe point), then fail it."""
        at = self.task.deadline
        if at is None or self.detached:
            return None
        stop = Control("deadline", reason=exceeded(self.task))
        delay = (at - utcnow()).total_seconds()
        if delay <= 0:
            self.request(stop)
            return None
        return asyncio.get_running_loop().call_later(delay, self.request, stop)

    async def run(self) -> Task:
        await self.trace_point("task_start", task=self.task)
        deadline = self._arm_deadline()
        try:
            await self._start()
            while self.task.status is TaskStatus.RUNNING:
                if self.control is not None:
                    await self._stop(self.control)  # an interrupt leaves it running
                    continue
                if self._reread:
                    self._reread = False
                    await self._reread_round()
                    continue
                if self.task.iterations >= self.agent.max_iterations:
                    await self._finish(
                        TaskStatus.FAILED,
                        error=f"max_iterations reached: {self.agent.max_iterations} rounds "
                        "without a final answer",
                    )
                    break
                # A safe point: the last round is closed. Messages sent to interrupt go in.
                self.view.extend(await self._take_messages(self.task.iterations + 1))
                await self._round()
            if self.control is not None and self.task.status is TaskStatus.WAITING:
                # Asked to stop just as it parked; at the deadline, its waits get results.
                if self.control.action == "deadline":
                    await self.stop_now(self.control)
                else:
                    await self._stop(self.control)
        except Abandoned as exc:
            log.warning("task %s abandoned: %s", self.task.id, exc)
        except asyncio.CancelledError:
            raise
        except StoreError as exc:
            await self._end_on_store_error(exc)
        except Exception as exc:
            log.exception("task %s failed", self.task.id)
            try:
                await self._finish(TaskStatus.FAILED, error=describe(exc))
            except Abandoned:
                pass
            except StoreError as store_exc:
                await self._end_on_store_error(store_exc)
        finally:
            if deadline is not None:
                deadline.cancel()
            await self.state.close()
        await self.trace_point("task_end", task=self.task)
        return self.task

    async def _end_on_store_error(self, exc: StoreError) -> None:
        """A store error ends the runner, never the task (DESIGN §9).

        What this runner knows in memory may be wrong now (a commit whose
        connection was lost may or may not have landed), so it writes nothing
        more of the task: the next owner rebuilds the round from the log by the
        recovery table. A transient error (connection lost, disk full, busy,
        a conflict) hands the task back to the queue as soon as the store
        takes a write again, so no restart is counted; any other store error
        (data the store refuses, a damaged file) leaves the lease to expire,
        so a task that hits it every time ends blocked(restart_limit) rather
        than crash-looping.
        """
        await self.state.close()  # no background save may race the hand-back
        if not isinstance(exc, StoreUnavailable | Conflict):
            log.error("task %s: store error, leaving it to its lease: %s", self.task.id, exc)
            return
        log.warning("task %s: store error, handing it back: %s", self.task.id, exc)
        delay, deadline = 0.05, time.monotonic() + self.release_patience
        while True:
            try:
                await self.store.release_lease(self.task.id, self.epoch)
                return
            except (StaleLease, TaskNotFound):
                return  # someone else owns it already: nothing to hand back
            except StoreError as again:
                if time.monotonic() + delay > deadline:
                    log.warning(
                        "task %s: could not hand it back (%s); its lease will expire",
                        self.task.id,
                        again,
                    )
                    return
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def trace_point(self, point: str, **info: Any) -> None:
        if self.trace is not None:
            await self.trace(point, task_id=self.task.id, round=self.task.iterations + 1, **info)

    async def stop_now(self, control: Control) -> Task:
        """Pause or abort a task nobody is running, from what its log says."""
        t = self.task
        rs = read_round(await self.store.entries(t.id, after_seq=t.round_seq), t.iterations + 1)
        self._round_no, self._round_progress = rs.round, list(rs.progress_seqs)
        self._round_api_seqs = list(rs.api_seqs)
        entries: list[NewEntry] = []
        if control.action in ("abort", "deadline"):
            for cid in rs.missing:  # every call keeps exactly one result
                text = _cancelled(control, "before it finished")
                entries += result_entries(t.id, rs.round, cid, text, "interrupted")
        await self._stop(control, entries)
        return self.task

    async def _start(self) -> None:
        t = self.task
        entries = await self.store.entries(t.id, after_seq=t.round_seq)
        self._report_claim(entries)
        if t.restarts > self.agent.max_restarts:
            await self._block(
                BlockReason.RESTART_LIMIT,
                f"the task was taken over {t.restarts} times after its worker died or lost its "
                f"lease (max_restarts={self.agent.max_restarts}); fix the cause, then resume it",
            )
            return
        self.view = WorkingView(await self.store.model_view_data(t.id))
        await self._recover(read_round(entries, t.iterations + 1))

    def _report_claim(self, entries: Sequence[Entry]) -> None:
        """The claim that started this runner changed the status in the store, not
        through a commit of ours: report it (pending -> running, say) all the same."""
        if self.on_status is None or self.detached:
            return
        for e in reversed(entries):
            if e.kind is EntryKind.STATUS and e.payload.get("epoch") == self.epoch:
                old = TaskStatus(e.payload["from"])
                if old is not TaskStatus.RUNNING:  # a takeover is no change of status
                    self.on_status(self.task, old, TaskStatus.RUNNING)
                return

    async def _recover(self, rs: RoundState) -> None:
        """Bring an interrupted round to a state the loop can continue from (DESIGN §3)."""
        tid, r = self.task.id, rs.round
        if rs.assistant is None:
            if rs.progress_seqs:  # a partial stream: void it and ask again
                marker = {
                    "scope": "progress",
                    "from_seq": rs.progress_seqs[0],
                    "to_seq": rs.progress_seqs[-1],
                    "reason": "interrupted stream",
                }
                await self.commit(
                    [
                        NewEntry(task_id=tid, kind=EntryKind.ROLLBACK, round=r, payload=marker),
                        notice(tid, r, "The model's answer was interrupted; asking again."),
                    ]
                )
            return
        self._round_no, self._round_api_seqs = r, list(rs.api_seqs)
        for cid in rs.missing:
            name = rs.intents[cid]["name"]
            if name not in self.agent.tool_map and cid not in rs.waits:
                await self._block(
                    BlockReason.MISSING_DEFINITION,
                    f"tool {name!r} (call {cid}) has no result and agent {self.agent.name!r} no "
                    "longer defines it; restore the tool, then resume the task",
                )
                return
        calls = [c for c in rs.assistant.tool_calls or () if c.id in rs.intents]
        await self._run_calls(r, calls, rs)

    async def _reread_round(self) -> None:
        """After an interrupt: the model's view and the open round as the log has them."""
        t = self.task
        self.view = WorkingView(await self.store.model_view_data(t.id))
        await self._recover(
            read_round(await self.store.entries(t.id, after_seq=t.round_seq), t.iterations + 1)
        )

    async def _take_messages(
        self,
        r: int,
        *,
        turn_end: bool = False,
        before: Sequence[NewEntry] = (),
        patch: Mapping[str, Any] | None = None,
    ) -> list[UserMessage]:
        """Commit the inbox messages due at this safe point as user messages of round
        r (after `before`, with `patch`); [] when none is due, and nothing committed.

        Guarded by the row's version: a message sent since this runner last saw the
        row makes it read the row and decide again, so none is missed or taken twice.
        """
        while True:
            items = due(self.task, turn_end=turn_end)
            if not items:
                return []
            entries, config, messages = delivery(self.task, items, r)
            version = self.task.version
            try:
                await self.commit(
                    [*before, *entries],
                    {**(patch or {}), "config": config},
                    expect_version=version,
                )
            except Conflict:
                if not await self._moved(version):
                    raise
                continue
            return messages

    async def _moved(self, version: int) -> bool:
        """After a Conflict: whether this task's row moved past `version` (a message
        came in); if so the runner takes the row as it is now (same lease: if another
        worker took the task, the next commit is refused by fencing)."""
        row = await self.store.get_task(self.task.id)
        if row.version == version:
            return False  # the conflict was someone else's (a parent's row)
        self.task = row
        if row.control:
            self.request(Control.from_row(row.control))
        return True

    async def _round(self) -> None:
        r = self.task.iterations + 1
        self._round_no, self._round_api_seqs, self._round_progress = r, [], []
        await self.trace_point("round_start")
        response = await self._ask_model(r)
        if response is None:  # stopped by a control request while streaming
            await self._stop(self.control or Control("pause"))
            return
        message = response.message()
        usage = (self.task.usage + response.usage).model_dump()
        tid = self.task.id
        if not response.tool_calls:
            await self._end_turn(r, message, response.text, usage)
            await self.trace_point("final")
            return
        intents = [
            NewEntry(
                task_id=tid,
                kind=EntryKind.TOOL_INTENT,
                round=r,
                payload={
                    "call_id": c.id,
                    "name": c.function.name,
                    "replay": self._replay(c.function.name),
                },
            )
            for c in response.tool_calls
        ]
        res = await self.commit(
            [api_entry(tid, r, message), *intents],
            {"usage": usage, "round_seq": self.task.last_seq},
        )
        self._round_api_seqs.append(res.entries[0].seq)
        self.view.append(message)
        await self.trace_point("intents", calls=[c.id for c in response.tool_calls])
        await self._run_calls(r, response.tool_calls, None)

    async def _end_turn(self, r: int, message: ApiMessage, text: str, usage: Any) -> None:
        """An answer without tool calls ends the turn: the task completes, unless
        messages wait in its inbox; then it goes on with them, seeing the answer."""
        final = api_entry(self.task.id, r, message)
        while True:
            version = self.task.version  # what the inbox was read at
            users = await self._take_messages(
                r + 1, turn_end=True, before=[final], patch={"usage": usage, "iterations": r}
            )
            if users:
                self.view.extend([message, *users])
                return
            try:
                await self._finish(
                    TaskStatus.COMPLETED,
                    entries=[final],
                    extra={"output": text, "usage": usage, "iterations": r},
                    expect_version=version,
                )
                return
            except Conflict:
                if not await self._moved(version):
                    raise
                # A message (or a request) came in: look again.

    def _replay(self, name: str) -> str:
        tool = self.agent.tool_map.get(name)
        return tool.replay if tool is not None else "never"

    # --- the model ---

    def _request(self) -> ModelRequest:
        pin = self.task.config.get("request") or {}
        head = [SystemMessage(content=self.agent.instructions)] if self.agent.instructions else []
        return ModelRequest(
            model=pin.get("model", self.agent.model_name),
            messages=self.view.messages(head),
            tools=[t.spec() for t in self.agent.tool_map.values()],
            settings=pin.get("settings", self.agent.model_settings),
        )

    async def _ask_model(self, r: int) -> Any:
        """Stream the model with retries; None if a control request stopped it."""
        attempt = 0
        while True:
            try:
                async with self._interruptible():
                    return await self._stream_once(r)
            except _Interrupted:
                return None
            except ModelError as exc:
                if not exc.retryable:
                    raise
                attempt += 1
                if attempt > self.agent.model_retries:
                    raise ModelError(f"the model failed {attempt} times in a row: {exc}") from exc
                delay = exc.retry_after
                if delay is None:
                    base = self.agent.retry_base_delay * 2 ** (attempt - 1)
                    delay = min(self.agent.retry_max_delay, base) * (0.5 + random.random() / 2)
                entries = [
                    notice(
                        self.task.id,
                        r,
                        f"Model error ({exc}); retry {attempt} of "
                        f"{self.agent.model_retries} in {delay:.1f} s.",
                    )
                ]
                if self._round_progress:
                    entries.insert(0, self._void_progress(r, "retry"))
                # Tokens a failed attempt used are billed all the same: count them.
                spent = self._attempt_usage
                patch = {"usage": (self.task.usage + spent).model_dump()} if spent else None
                await self.commit(entries, patch)
                try:
                    async with self._interruptible():
                        await asyncio.sleep(delay)
                except _Interrupted:
                    return None

    @contextlib.asynccontextmanager
    async def _interruptible(self) -> AsyncIterator[None]:
        """A stretch (a model stream, a retry back-off) that a control request may cut.

        request() cancels this task only while it is suspended inside such a
        stretch, so the cancellation always lands here and is turned into
        _Interrupted; a cancellation from anyone else passes through.
        """
        if self.control is not None:
            raise _Interrupted
        task = asyncio.current_task()
        self._interrupt_target = task
        try:
            yield
        except asyncio.CancelledError:
            if self._interrupting and task is not None:
                self._interrupting = False
                task.uncancel()
                raise _Interrupted from None
            raise
        finally:
            self._interrupt_target = None

    @property
    def _attempt_usage(self) -> Any:
        """Usage the last (failed) model attempt reported, if any."""
        usage = self._attempt.usage if self._attempt is not None else None
        return usage if usage and (usage.input_tokens or usage.output_tokens) else None

    def _void_progress(self, r: int, reason: str) -> NewEntry:
        marker = {
            "scope": "progress",
            "from_seq": self._round_progress[0],
            "to_seq": self._round_progress[-1],
            "reason": reason,
        }
        self._round_progress = []
        return NewEntry(task_id=self.task.id, kind=EntryKind.ROLLBACK, round=r, payload=marker)

    async def _stream_once(self, r: int) -> Any:
        assembler = ResponseAssembler()
        self._attempt = assembler
        pending: list[str] = []
        last = time.monotonic()
        interval = self.agent.progress_interval
        request = self._request()
        await self.trace_point("model_start", model=request.model)
        async for event in self.agent.chat_model.stream(request):
            assembler.add(event)
            if isinstance(event, TextDelta):
                pending.append(event.text)
                now = time.monotonic()
                if now - last >= interval:
                    await self._commit_progress(r, "".join(pending))
                    pending, last = [], now
        response = assembler.response(call_id_prefix=f"call_{r}")
        await self.trace_point("model_end", usage=response.usage, finish=response.finish)
        return response

    async def _commit_progress(self, r: int, text: str) -> None:
        entry = NewEntry(
            task_id=self.task.id, kind=EntryKind.PROGRESS, round=r, payload={"text": text}
        )
        patch = None if self._round_progress else {"round_seq": self.task.last_seq}
        res = await self.commit([entry], patch)
        self._round_progress.append(res.entries[0].seq)
        await self.trace_point("progress", seq=res.entries[0].seq)

    # --- tools ---

    async def _run_calls(
        self, r: int, calls: Sequence[ToolCallData], rs: RoundState | None
    ) -> None:
        """Run every call of round r that has no result yet; commit each result as it comes."""
        done_ids = set(rs.results) if rs else set()
        todo = [c for c in calls if c.id not in done_ids]
        remaining = {c.id for c in todo}
        suspended: dict[str, Outcome] = {}

        committing: dict[str, asyncio.Future[None]] = {}
        # One result commit at a time, so "is this the last result?" is decided
        # from results known to be stored: a failed commit must never let a
        # sibling's commit close the round with this call unanswered.
        one_at_a_time = asyncio.Lock()

        async def finish(out: Outcome) -> None:
            if out.suspend is not None:
                suspended[out.call_id] = out
                return
            async with one_at_a_time:
                # The last result closes the round (a suspended call keeps it open),
                # unless a pause with rollback is waiting to undo this very round.
                rolling_back = self.control is not None and self.control.rollback
                last = remaining <= {out.call_id}
                patch = {"iterations": r} if last and not rolling_back else None
                entries = result_entries(
                    self.task.id, r, out.call_id, out.content or "", out.outcome
                )
                res = await self.commit(entries, patch, documents=out.documents)
                remaining.discard(out.call_id)
            self._round_api_seqs.append(res.entries[0].seq)
            self.view.append(ToolMessage(tool_call_id=out.call_id, content=out.content or ""))
            await self.trace_point("result", call_id=out.call_id, outcome=out.outcome)

        async def one(call: ToolCallData) -> None:
            out = await run_call(self, r, call, rs)  # a stop may cancel the tool...
            # ...but never a result commit once it started: that would leave the
            # call with a result written and an "interrupted" one added.
            committing[call.id] = asyncio.ensure_future(finish(out))
            await asyncio.shield(committing[call.id])

        if not todo:
            if self.task.iterations < r:
                await self.commit(patch={"iterations": r})
            return
        self._round_no = r
        if self.control is not None and self.control.action != "release":
            # Paused, aborted or past its deadline before any tool started: none
            # starts. (A release, a worker shutting down, lets them run within the
            # grace period.)
            waited = rs.waits if rs else {}
            entries = []
            for c in todo:
                when = "before it started"
                if c.id in waited:
                    when = "while it waited"
                elif rs is not None:  # recovering: the call may have run in a lost worker
                    when = "before it finished"
                text = _cancelled(self.control, when)
                entries += result_entries(self.task.id, r, c.id, text, "interrupted")
            await self._stop(self.control, entries)
            return
        jobs = {asyncio.ensure_future(one(c)): c.id for c in todo}
        stopper = asyncio.ensure_future(self._control_event.wait())
        pending_jobs = set(jobs)
        try:
            while pending_jobs:
                done, _ = await asyncio.wait(
                    pending_jobs | {stopper}, return_when=asyncio.FIRST_COMPLETED
                )
                pending_jobs -= done
                for job in done - {stopper}:
                    job.result()  # surface Abandoned / store errors
                if stopper in done and pending_jobs:
                    await self._stop_tools(r, pending_jobs, jobs, committing)
                    return
        except BaseException:
            # The runner ends (lost lease, store error): no tool of it may go on
            # running and committing behind its back; the log decides their fate.
            for job in pending_jobs:
                job.cancel()
            await asyncio.gather(*jobs, *committing.values(), return_exceptions=True)
            raise
        finally:
            stopper.cancel()
            # Leaving early (the runner was cancelled: its lease is lost; or a
            # result commit failed): its tools must not run on unowned.
            for job in pending_jobs:
                job.cancel()
        if suspended:
            await self._park(r, suspended, rs)

    async def _park(self, r: int, suspended: Mapping[str, Outcome], rs: RoundState | None) -> None:
        """Commit the waits of this round and the task's waiting status, together."""
        tid = self.task.id
        entries: list[NewEntry] = []
        new_tasks: list[Task] = []
        documents: list[DocumentWrite] = []
        waits: dict[str, dict[str, Any]] = {}
        recorded = rs.open_waits if rs else {}
        for cid, out in suspended.items():
            documents += out.documents
            if cid in recorded:
                waits[cid] = recorded[cid]
                continue
            s = out.suspend
            if isinstance(s, SleepUntil):
                details: dict[str, Any] = {"wake_at": s.wake_at.isoformat()}
                kind = "timer"
            elif isinstance(s, WaitForInput):
                details, kind = s.details(), ("approval" if s.kind == "approval" else "input")
            elif isinstance(s, SpawnSubtask):
                child, first = self._child(s)
                new_tasks.append(child)
                entries.append(first)
                details, kind = {"child_id": child.id, "agent": s.agent}, "subtask"
            else:  # pragma: no cover - Suspend is closed
                raise TypeError(f"unknown suspension {s!r}")
            entry = wait_entry(tid, r, cid, kind, **details)
            entries.append(entry)
            waits[cid] = entry.payload
        patch = {
            "status": TaskStatus.WAITING,
            "status_reason": wait_reason(waits),
            "wake_at": wake_time(
                self.task, wake_times(waits.values())
            ),  # a timer, an expiry, a deadline
        }
        await self.commit(entries, patch, new_tasks=new_tasks, documents=documents)

    def _child(self, s: SpawnSubtask) -> tuple[Task, NewEntry]:
        parent, agent = self.task, self.agents[s.agent]
        # A sub-task cannot outlive its parent's deadline; its agent's may be earlier.
        deadline = parent.deadline
        if deadline is not None and agent.deadline is not None:
            deadline = min(deadline, deadline_at(agent.deadline))
        by = "parent" if deadline is not None and deadline == parent.deadline else "submit"
        return new_task(
            agent,
            s.input,
            owner=parent.owner,
            session_id=parent.session_id,
            parent_id=parent.id,
            root_id=parent.root_id,
            context=s.context,
            deadline=deadline,
            deadline_by=by,
        )

    async def _stop_tools(
        self,
        r: int,
        pending_jobs: set[asyncio.Task[None]],
        jobs: Mapping[asyncio.Task[None], str],
        committing: Mapping[str, asyncio.Future[None]],
    ) -> None:
        control = self.control or Control("pause")
        if control.action in ("pause", "release", "deadline"):
            # Let running tools finish (and commit their results) within the grace
            # period, unless an abort arrives meanwhile (a second Ctrl-C).
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.agent.tool_grace
            aborting = asyncio.ensure_future(self._abort_event.wait())
            waiting: set[asyncio.Future[Any]] = set(pending_jobs)
            try:
                while waiting and not aborting.done() and loop.time() < deadline:
                    done, _ = await asyncio.wait(
                        waiting | {aborting},
                        timeout=deadline - loop.time(),
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                    for job in done - {aborting}:
                        job.result()
                    waiting -= done
            finally:
                aborting.cancel()
            pending_jobs = {j for j in pending_jobs if not j.done()}
            control = self.control or control
        for job in pending_jobs:
            job.cancel()
        entries = []
        for job in pending_jobs:
            with contextlib.suppress(asyncio.CancelledError):
                await job
            cid = jobs[job]
            if cid in committing:
                await committing[cid]  # its result was already on its way: let it land
                continue
            text = _cancelled(control, "while it ran")
            entries += result_entries(self.task.id, r, cid, text, "interrupted")
        await self._stop(control, entries)

    # --- ending ---

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
            # Parked just as asked: the messages are taken when the wait ends.
            await self.commit([], {"control": None})
            self._resumed(control)
            return
        if control.rollback and self._round_progress:
            entries.append(self._void_progress(r, "paused with rollback"))
        while True:
            # A paused task has no timer (a sleep, an approval's expiry, a deadline):
            # they are re-armed from the log when it runs again; kept, they would hold
            # the resumed task back as a delayed start. An interrupted one runs on.
            patch: dict[str, Any] = {"status": TaskStatus.PAUSED, "control": None, "wake_at": None}
            if control.resume:
                patch = {"control": None}
            todo, version = list(entries), None
            kept: list[str] = []
            if control.rollback and self._round_api_seqs and self.task.iterations < self._round_no:
                kept, version = await self._roll_back_round(r, todo, patch)
            try:
                await self._commit_stop(control, todo, patch, kept, version)
                break
            except Conflict:
                if version is None or self.detached:
                    raise  # a detached stop is retried from the top by Runtime._stop
                # Written meanwhile (a message came in): the void range is planned again.
        if control.resume:
            self._resumed(control)

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
            self._control_event.clear()
        self._reread = True

    async def _roll_back_round(
        self, r: int, entries: list[NewEntry], patch: dict[str, Any]
    ) -> tuple[list[str], int]:
        """Add to `entries` what takes round r out of the model's view (log.rollback);
        returns the calls kept in it, by name, and the row version the plan holds for.

        The void range ends at the seq `entries` will end at, so it is planned from
        the row as stored: others append too (a message sent in), and the commit
        must be refused (Conflict) if one did since."""
        row = await self.store.get_task(self.task.id)
        rs = read_round(await self.store.entries(self.task.id, after_seq=self.task.round_seq), r)
        first, last = min(self._round_api_seqs), row.last_seq
        plan = rollback(self.task.id, rs, first, last, entries, "paused with rollback")
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


def _cancelled(control: Control, when: str) -> str:
    """The result a call stopped by `control` gets (`when`: "while it ran", ...)."""
    if control.action == "deadline":
        return f"Tool call cancelled: the task's deadline passed {when}."
    return f"Tool call cancelled: the task was {_PAST[control.action]} {when}."


__all__ = ["Abandoned", "Control", "TaskRunner"]
