"""The round: the model's answer, then its tool calls. Every step is a commit.

A round: model view -> stream the model (progress committed at most every
`progress_interval`) -> commit the assistant message with its tool intents ->
run the tools concurrently, committing each result -> next round. The commit
that brings the last result of a round also closes it (iterations + 1). An
answer without tool calls ends the turn, unless messages wait in the inbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Generator, Mapping, Sequence
from typing import Any

from duragent.errors import Conflict, ModelError
from duragent.llm.base import ModelRequest, ResponseAssembler, TextDelta
from duragent.payloads import IntentPayload, WaitCheckpoint, WaitKind, stored, wait_of
from duragent.runtime.approvals import wake_times
from duragent.runtime.calls import Outcome, run_call
from duragent.runtime.context import SleepUntil, SpawnSubtask, WaitForInput
from duragent.runtime.control import Control, ControlledRunner, Interrupted, Parking, cancelled
from duragent.runtime.deadlines import deadline_at, wake_time
from duragent.runtime.inbox import delivery, due
from duragent.runtime.log import (
    RoundState,
    api_entry,
    notice,
    result_entries,
    wait_entry,
    wait_reason,
)
from duragent.runtime.submit import new_task
from duragent.runtime.waits import open_round
from duragent.store.commits import DocumentWrite
from duragent.types import (
    ApiMessage,
    EntryKind,
    NewEntry,
    SystemMessage,
    Task,
    TaskStatus,
    ToolCallData,
    ToolMessage,
    Usage,
    UserMessage,
)


class _Durable:
    """A trace point's `landed` when the result's commit was awaited already."""

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield


_LANDED = _Durable()


class RoundRunner(ControlledRunner):
    """A runner's rounds: messages taken at a safe point, the model, the tools."""

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
        usage = self.task.usage + response.usage
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
                payload=stored(
                    IntentPayload(
                        call_id=c.id, name=c.function.name, replay=self._replay(c.function.name)
                    )
                ),
            )
            for c in response.tool_calls
        ]
        res = await self.commit(
            [api_entry(tid, r, message), *intents],
            {"usage": usage, "round_seq": self.task.last_seq},
        )
        self._round_api_seqs.append(res.entries[0].seq)
        made = zip(response.tool_calls, res.entries[1:], strict=True)
        self._called_at = {c.id: e.created_at for c, e in made}
        self.view.append(message)
        await self.trace_point("intents", calls=[c.id for c in response.tool_calls])
        await self._run_calls(r, response.tool_calls, None)

    async def _end_turn(self, r: int, message: ApiMessage, text: str, usage: Usage) -> None:
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
            except Interrupted:
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
                patch = {"usage": self.task.usage + spent} if spent else None
                await self.commit(entries, patch)
                try:
                    async with self._interruptible():
                        await asyncio.sleep(delay)
                except Interrupted:
                    return None

    @property
    def _attempt_usage(self) -> Any:
        """Usage the last (failed) model attempt reported, if any."""
        usage = self._attempt.usage if self._attempt is not None else None
        return usage if usage and (usage.input_tokens or usage.output_tokens) else None

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
        closing: list[Outcome] = []  # the last result, committed below by this task

        def closes(out: Outcome) -> bool:
            """The last result closes the round (a suspended call keeps it open):
            left to the runner's own task (_close_round), which goes on to the next
            model call at once, with no wake-up in between; not while a control
            request waits (a pause with rollback may undo this very round)."""
            if remaining <= {out.call_id} and self.control is None and not out.documents:
                closing.append(out)
                remaining.discard(out.call_id)
                return True
            return False

        async def finish(out: Outcome) -> None:
            if out.suspend is not None:
                suspended[out.call_id] = out
                await self.trace_point("suspended", call_id=out.call_id)
                return
            async with one_at_a_time:
                if closes(out):
                    return
                rolling_back = self.control is not None and self.control.rollback
                last = remaining <= {out.call_id}
                patch = {"iterations": r} if last and not rolling_back else None
                entries = self._outcome_entries(r, out)
                res = await self.commit(entries, patch, documents=out.documents)
                remaining.discard(out.call_id)
            self._round_api_seqs.append(res.entries[0].seq)
            self.view.append(ToolMessage(tool_call_id=out.call_id, content=out.content or ""))
            await self.trace_point("result", call_id=out.call_id, outcome=out.outcome)

        async def one(call: ToolCallData) -> None:
            out = await run_call(self, r, call, rs)  # a stop may cancel the tool...
            if out.suspend is None and not one_at_a_time.locked() and closes(out):
                return  # the round's last result: _close_round commits it
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
                text = cancelled(self.control, when)
                entries += result_entries(self.task.id, r, c.id, text, "interrupted")
            await self._stop(self.control, entries)
            return
        jobs = {asyncio.ensure_future(one(c)): c.id for c in todo}
        pending_jobs = set(jobs)
        try:
            while pending_jobs:
                # Once the last result is in, the jobs left are only returning:
                # a stop now is for _close_round and the loop to see.
                watch_stop = not closing
                await self._first_done(pending_jobs, or_control=watch_stop)
                done = {job for job in pending_jobs if job.done()}
                pending_jobs -= done
                for job in done:
                    job.result()  # surface Abandoned / store errors
                stopped = watch_stop and self.control is not None
                if stopped and pending_jobs and not closing:
                    await self._stop_tools(r, pending_jobs, jobs, committing, suspended, rs)
                    return
        except BaseException:
            # The runner ends (lost lease, store error): no tool of it may go on
            # running and committing behind its back; the log decides their fate.
            for job in pending_jobs:
                job.cancel()
            await asyncio.gather(*jobs, *committing.values(), return_exceptions=True)
            if closing:
                # The last tool is done, its result not yet handed to the store: a
                # result commit that started is never cut short (see `one`), nor is this.
                entries = self._outcome_entries(r, closing.pop())
                with contextlib.suppress(Exception):
                    await asyncio.shield(self.commit(entries, {"iterations": r}))
            raise
        finally:
            # Leaving early (the runner was cancelled: its lease is lost; or a
            # result commit failed): its tools must not run on unowned.
            for job in pending_jobs:
                job.cancel()
        if suspended:
            await self._park(r, suspended, rs)
        elif closing:
            await self._close_round(r, closing[0])

    def _outcome_entries(self, r: int, out: Outcome) -> list[NewEntry]:
        """The entries of a call's result in round r."""
        return result_entries(self.task.id, r, out.call_id, out.content or "", out.outcome)

    async def _close_round(self, r: int, out: Outcome) -> None:
        """Commit the last result of round r, closing it: queued behind the next
        model call where the store can (ControlledRunner.commit_behind)."""
        entries = self._outcome_entries(r, out)
        rolling_back = self.control is not None and self.control.rollback
        pending = None if rolling_back else self.commit_behind(entries, {"iterations": r})
        if pending is None:
            res = await self.commit(entries, None if rolling_back else {"iterations": r})
            self._round_api_seqs.append(res.entries[0].seq)
        self.view.append(ToolMessage(tool_call_id=out.call_id, content=out.content or ""))
        # `landed` completes once the result is durable: a hook that must not act
        # before (a crash test's kill point) awaits it.
        landed = pending if pending is not None else _LANDED
        await self.trace_point("result", call_id=out.call_id, outcome=out.outcome, landed=landed)

    async def _park(
        self,
        r: int,
        suspended: Mapping[str, Outcome],
        rs: RoundState | None,
        before: Sequence[NewEntry] = (),
    ) -> None:
        """Commit the waits of this round and the task's waiting status, together
        (after `before`: results of calls a stop cut short)."""
        tid = self.task.id
        entries: list[NewEntry] = list(before)
        new_tasks: list[Task] = []
        documents: list[DocumentWrite] = []
        waits: dict[str, WaitCheckpoint] = {}
        recorded = rs.open_waits if rs else {}
        for cid, out in suspended.items():
            documents += out.documents
            if cid in recorded:
                waits[cid] = recorded[cid]
                continue
            s = out.suspend
            if isinstance(s, SleepUntil):
                details: dict[str, Any] = {"wake_at": s.wake_at.isoformat()}
                kind: WaitKind = "timer"
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
            waits[cid] = wait_of(entry)
        patch = {
            "status": TaskStatus.WAITING,
            "status_reason": wait_reason(waits),
            "wake_at": wake_time(
                self.task, wake_times(waits.values())
            ),  # a timer, an expiry, a deadline
        }
        await self.trace_point("park", waits=waits)
        # Kept until it lands: a store error that cuts this commit short hands the
        # task back only after committing it again (`repark`), so the tools' waits
        # are not lost with it (a never-replay tool that asked to wait is not run
        # again, and without its wait would be answered "interrupted").
        self._unparked = Parking(r, list(waits), entries, patch, new_tasks, documents)
        await self.commit(entries, patch, new_tasks=new_tasks, documents=documents)
        self._unparked = None
        await self.trace_point("parked", waits=waits)

    async def repark(self) -> bool:
        """After a store error cut the commit of this round's waits: commit it now,
        unless it landed after all (its waits are in the log); True when the task is
        parked. Read from the store first: a commit whose answer was lost may have
        landed, and is never applied twice."""
        parking = self._unparked
        if parking is None:
            return False
        row = await self.store.get_task(self.task.id)
        rs = await open_round(self.store, row)
        if rs.round != parking.round or any(c in rs.results for c in parking.calls):
            self._unparked = None  # the log went on without it: recovery decides
            return False
        if not any(c in rs.waits for c in parking.calls):
            self.task = row
            p = parking
            await self.commit(p.entries, p.patch, new_tasks=p.new_tasks, documents=p.documents)
        self._unparked = None
        return True

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
        suspended: Mapping[str, Outcome],
        rs: RoundState | None,
    ) -> None:
        recorded = set(rs.waits) if rs else set()
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
            text = cancelled(control, "while it ran")
            entries += result_entries(self.task.id, r, cid, text, "interrupted")
        if control.action == "release" and suspended:
            # The worker only hands the task back, and calls asked to wait: park
            # the task on their waits instead (with the results above), as if no
            # stop had come. Handed back without them, a never-replay tool that
            # asked to wait would not be run again, and be answered "interrupted".
            await self._park(r, suspended, rs, before=entries)
            return
        # A call that asked to wait (a sleep, a question, a sub-task) during the
        # grace period is not parked: the task stops instead. Its wait never began
        # (no sub-task was created); it gets a result that says so, unless:
        # - the log holds its wait (recovery asked it again): it stays open;
        # - it asked for its approval and the task is paused: it never ran, and
        #   asks again when resumed (a task aborted or past its deadline ends
        #   with every call answered).
        for cid, out in suspended.items():
            if cid in recorded:
                continue
            approval = isinstance(out.suspend, WaitForInput) and out.suspend.kind == "approval"
            if approval and control.action == "pause":
                continue
            text = cancelled(control, "before its wait began")
            entries += result_entries(self.task.id, r, cid, text, "interrupted")
        await self._stop(control, entries)
