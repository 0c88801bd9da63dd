"""A round's tool calls: run together, each result committed as it comes.

The last result closes the round (queued behind the next model call where the
store can); a control request stops the calls still running (within the tools'
grace period, unless it is an abort); calls that asked to wait (a timer, a
question, a sub-task) park the task on their waits, in one commit.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Generator, Mapping, Sequence
from typing import Any, Protocol

from duragent._payloads import WaitCheckpoint, WaitKind, wait_of
from duragent.llm._messages import WorkingView
from duragent.runtime._approvals import wake_times
from duragent.runtime._calls import CallHost, Outcome, run_call
from duragent.runtime._commits import Commits
from duragent.runtime._context import SleepUntil, SpawnSubtask, WaitForInput
from duragent.runtime._control import Control, Controls, cancelled
from duragent.runtime._deadlines import deadline_at, wake_time
from duragent.runtime._ending import Ending
from duragent.runtime._handoffs import MULTIPLE, handoff_entry, transfer_result
from duragent.runtime._log import RoundState, result_entries, wait_entry, wait_reason
from duragent.runtime._open_round import OpenRound, Parking
from duragent.runtime._submit import new_task
from duragent.store._commits import DocumentWrite
from duragent.types import NewEntry, Task, TaskStatus, ToolCallData, ToolMessage


class RoundHost(CallHost, Protocol):
    """What a round's calls use of their runner's rounds (`Rounds`, runtime/_round.py)."""

    @property
    def commits(self) -> Commits: ...

    @property
    def controls(self) -> Controls: ...

    @property
    def ending(self) -> Ending: ...

    @property
    def view(self) -> WorkingView: ...

    def hand_off(self, r: int, target: str) -> None: ...


class _Durable:
    """A trace point's `landed` when the result's commit was awaited already."""

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield


_LANDED = _Durable()


class RoundCalls:
    """The calls of round `rnd` that have no result yet, made for one run of them:
    which are still to answer (`remaining`), which asked to wait (`suspended`),
    whose result is being committed (`committing`) and the round's last result,
    left to close the round (`closing`)."""

    def __init__(
        self,
        host: RoundHost,
        rnd: OpenRound,
        calls: Sequence[ToolCallData],
        rs: RoundState | None,
    ) -> None:
        self.host = host
        self.rnd = rnd
        self.r = rnd.number
        self.rs = rs  # the round as the log has it, when recovering
        done_ids = set(rs.results) if rs else set()
        self.todo = [c for c in calls if c.id not in done_ids]
        self.remaining = {c.id for c in self.todo}
        self.suspended: dict[str, Outcome] = {}
        self.committing: dict[str, asyncio.Future[None]] = {}
        # One result commit at a time, so "is this the last result?" is decided
        # from results known to be stored: a failed commit must never let a
        # sibling's commit close the round with this call unanswered.
        self.one_at_a_time = asyncio.Lock()
        self.closing: list[Outcome] = []  # the last result, committed by the runner's task
        # The round's handoff taken: its first transfer call (runtime/_handoffs.py).
        transfers = host.agent.transfers
        self.taken = next((c.id for c in calls if c.function.name in transfers), None)

    async def run(self) -> None:
        host, r = self.host, self.r
        if not self.todo:
            if host.commits.task.iterations < r:
                await host.commits.commit(patch={"iterations": r})
            return
        control = host.controls.current
        if control is not None and control.action != "release":
            # Paused, aborted or past its deadline before any tool started: none
            # starts. (A release, a worker shutting down, lets them run within the
            # grace period.)
            await self._cancel_all(control)
            return
        jobs = {asyncio.ensure_future(self._one(c)): c.id for c in self.todo}
        if not await self._until_done(jobs):
            return  # stopped
        if self.suspended:
            await self.park(self.suspended)
        elif self.closing:
            await self._close_round(self.closing[0])

    async def _cancel_all(self, control: Control) -> None:
        """Answer every call "cancelled" and stop: none started."""
        rs = self.rs
        waited = rs.waits if rs else {}
        entries = []
        for c in self.todo:
            when = "before it started"
            if c.id in waited:
                when = "while it waited"
            elif rs is not None:  # recovering: the call may have run in a lost worker
                when = "before it finished"
            text = cancelled(control, when)
            entries += result_entries(self.host.commits.task.id, self.r, c.id, text, "interrupted")
        await self.host.ending.stop(control, entries, self.rnd)

    async def _until_done(self, jobs: Mapping[asyncio.Task[None], str]) -> bool:
        """Wait for every call; False if a control request stopped them first."""
        controls = self.host.controls
        pending_jobs = set(jobs)
        try:
            while pending_jobs:
                # Once the last result is in, the jobs left are only returning:
                # a stop now is for _close_round and the loop to see.
                watch_stop = not self.closing
                await controls.first_done(pending_jobs, or_control=watch_stop)
                done = {job for job in pending_jobs if job.done()}
                pending_jobs -= done
                for job in done:
                    job.result()  # surface Abandoned / store errors
                stopped = watch_stop and controls.current is not None
                if stopped and pending_jobs and not self.closing:
                    await self._stop_tools(pending_jobs, jobs)
                    return False
        except BaseException:
            # The runner ends (lost lease, store error): no tool of it may go on
            # running and committing behind its back; the log decides their fate.
            for job in pending_jobs:
                job.cancel()
            await asyncio.gather(*jobs, *self.committing.values(), return_exceptions=True)
            if self.closing:
                # The last tool is done, its result not yet handed to the store: a
                # result commit that started is never cut short (see `_one`), nor is this.
                entries = self._outcome_entries(self.closing.pop())
                with contextlib.suppress(Exception):
                    await asyncio.shield(self.host.commits.commit(entries, {"iterations": self.r}))
            raise
        finally:
            # Leaving early (the runner was cancelled: its lease is lost; or a
            # result commit failed): its tools must not run on unowned.
            for job in pending_jobs:
                job.cancel()
        return True

    async def _one(self, call: ToolCallData) -> None:
        target = self.host.agent.transfers.get(call.function.name)
        if target is not None:
            out = self._handoff(call, target.name)
        else:
            out = await run_call(self.host, self.r, call, self.rs)  # a stop may cancel the tool...
        if out.suspend is None and not self.one_at_a_time.locked() and self._closes(out):
            return  # the round's last result: _close_round commits it
        # ...but never a result commit once it started: that would leave the
        # call with a result written and an "interrupted" one added.
        self.committing[call.id] = asyncio.ensure_future(self._finish(out))
        await asyncio.shield(self.committing[call.id])

    def _closes(self, out: Outcome) -> bool:
        """The last result closes the round (a suspended call keeps it open):
        left to the runner's own task (_close_round), which goes on to the next
        model call at once, with no wake-up in between; not while a control
        request waits (a pause with rollback may undo this very round)."""
        remaining = self.remaining
        if remaining <= {out.call_id} and self.host.controls.current is None and not out.documents:
            self.closing.append(out)
            remaining.discard(out.call_id)
            return True
        return False

    async def _finish(self, out: Outcome) -> None:
        host = self.host
        if out.suspend is not None:
            self.suspended[out.call_id] = out
            await host.trace_point("suspended", call_id=out.call_id)
            return
        async with self.one_at_a_time:
            if self._closes(out):
                return
            control = host.controls.current
            rolling_back = control is not None and control.rollback
            last = self.remaining <= {out.call_id}
            patch = {"iterations": self.r} if last and not rolling_back else None
            entries = self._outcome_entries(out)
            res = await host.commits.commit(entries, patch, documents=out.documents)
            self.remaining.discard(out.call_id)
        self.rnd.api_seqs.append(res.entries[0].seq)
        host.view.append(ToolMessage(tool_call_id=out.call_id, content=out.content or ""))
        await host.trace_point("result", call_id=out.call_id, outcome=out.outcome)

    def _handoff(self, call: ToolCallData, target: str) -> Outcome:
        """A transfer call: no tool runs. The round's first is taken (its target runs
        the next rounds), any other answered as the Agents SDK answers it."""
        if call.id != self.taken:
            return Outcome(call.id, MULTIPLE)
        self.host.hand_off(self.r, target)
        return Outcome(call.id, transfer_result(target), handoff=target)

    def _outcome_entries(self, out: Outcome) -> list[NewEntry]:
        """The entries of a call's result (a handoff's entry right after it)."""
        tid = self.host.commits.task.id
        entries = result_entries(tid, self.r, out.call_id, out.content or "", out.outcome)
        if out.handoff is not None:
            source = self.host.agent.name
            entries.append(handoff_entry(tid, self.r, out.call_id, source, out.handoff))
        return entries

    async def _close_round(self, out: Outcome) -> None:
        """Commit the last result of the round, closing it: queued behind the next
        model call where the store can (Commits.commit_behind)."""
        host, r = self.host, self.r
        entries = self._outcome_entries(out)
        control = host.controls.current
        rolling_back = control is not None and control.rollback
        pending = None if rolling_back else host.commits.commit_behind(entries, {"iterations": r})
        if pending is None:
            res = await host.commits.commit(entries, None if rolling_back else {"iterations": r})
            self.rnd.api_seqs.append(res.entries[0].seq)
        host.view.append(ToolMessage(tool_call_id=out.call_id, content=out.content or ""))
        # `landed` completes once the result is durable: a hook that must not act
        # before (a crash test's kill point) awaits it.
        landed = pending if pending is not None else _LANDED
        await host.trace_point("result", call_id=out.call_id, outcome=out.outcome, landed=landed)

    # --- waits ---

    async def park(self, suspended: Mapping[str, Outcome], before: Sequence[NewEntry] = ()) -> None:
        """Commit the waits of this round and the task's waiting status, together
        (after `before`: results of calls a stop cut short)."""
        host = self.host
        tid, r = host.commits.task.id, self.r
        entries: list[NewEntry] = list(before)
        new_tasks: list[Task] = []
        documents: list[DocumentWrite] = []
        waits: dict[str, WaitCheckpoint] = {}
        recorded = self.rs.open_waits if self.rs else {}
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
                host.commits.task, wake_times(waits.values())
            ),  # a timer, an expiry, a deadline
        }
        await host.trace_point("park", waits=waits)
        # Kept until it lands: a store error that cuts this commit short hands the
        # task back only after committing it again (Rounds.repark), so the tools' waits
        # are not lost with it (a never-replay tool that asked to wait is not run
        # again, and without its wait would be answered "interrupted").
        self.rnd.parking = Parking(r, list(waits), entries, patch, new_tasks, documents)
        await host.commits.commit(entries, patch, new_tasks=new_tasks, documents=documents)
        self.rnd.parking = None
        await host.trace_point("parked", waits=waits)

    def _child(self, s: SpawnSubtask) -> tuple[Task, NewEntry]:
        parent, agent = self.host.commits.task, self.host.agents[s.agent]
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

    # --- a stop while tools run ---

    async def _stop_tools(
        self, pending_jobs: set[asyncio.Task[None]], jobs: Mapping[asyncio.Task[None], str]
    ) -> None:
        host = self.host
        control = host.controls.current or Control("pause")
        if control.action in ("pause", "release", "deadline"):
            # Let running tools finish (and commit their results) within the grace
            # period, unless an abort arrives meanwhile (a second Ctrl-C).
            await self._grace(pending_jobs)
            pending_jobs = {j for j in pending_jobs if not j.done()}
            control = host.controls.current or control
        for job in pending_jobs:
            job.cancel()
        entries = []
        for job in pending_jobs:
            with contextlib.suppress(asyncio.CancelledError):
                await job
            cid = jobs[job]
            if cid in self.committing:
                await self.committing[cid]  # its result was already on its way: let it land
                continue
            text = cancelled(control, "while it ran")
            entries += result_entries(host.commits.task.id, self.r, cid, text, "interrupted")
        if control.action == "release" and self.suspended:
            # The worker only hands the task back, and calls asked to wait: park
            # the task on their waits instead (with the results above), as if no
            # stop had come. Handed back without them, a never-replay tool that
            # asked to wait would not be run again, and be answered "interrupted".
            await self.park(self.suspended, before=entries)
            return
        entries += self._unparked_results(control)
        await host.ending.stop(control, entries, self.rnd)

    async def _grace(self, pending_jobs: set[asyncio.Task[None]]) -> None:
        """Wait for the running tools, for at most the agent's `tool_grace`, or until an
        abort or a draining worker's grace period ends (`Controls.hurry`)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.host.agent.timing.tool_grace
        hurried = asyncio.ensure_future(self.host.controls.hurry.wait())
        waiting: set[asyncio.Future[Any]] = set(pending_jobs)
        try:
            while waiting and not hurried.done() and loop.time() < deadline:
                done, _ = await asyncio.wait(
                    waiting | {hurried},
                    timeout=deadline - loop.time(),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                for job in done - {hurried}:
                    job.result()
                waiting -= done
        finally:
            hurried.cancel()

    def _unparked_results(self, control: Control) -> list[NewEntry]:
        """The results of calls that asked to wait while the task was stopping.

        A call that asked to wait (a sleep, a question, a sub-task) during the
        grace period is not parked: the task stops instead. Its wait never began
        (no sub-task was created); it gets a result that says so, unless:
        - the log holds its wait (recovery asked it again): it stays open;
        - it asked for its approval and the task is paused: it never ran, and
          asks again when resumed (a task aborted or past its deadline ends
          with every call answered).
        """
        recorded = set(self.rs.waits) if self.rs else set()
        entries: list[NewEntry] = []
        for cid, out in self.suspended.items():
            if cid in recorded:
                continue
            approval = isinstance(out.suspend, WaitForInput) and out.suspend.kind == "approval"
            if approval and control.action == "pause":
                continue
            text = cancelled(control, "before its wait began")
            entries += result_entries(self.host.commits.task.id, self.r, cid, text, "interrupted")
        return entries
