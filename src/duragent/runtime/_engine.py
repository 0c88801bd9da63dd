"""Running one task: the loop that drives rounds, recovery and stopping.

A TaskRunner is made of parts, each owning one thing: its commits (the task's
row and the commit pipeline, runtime/_commits.py), the control requests it
hears (runtime/_control.py), the ways its task stops and ends
(runtime/_ending.py), its rounds (the model, then the tools: runtime/_round.py,
runtime/_round_calls.py) and its recovery after a claim (runtime/_recovery.py).
This file holds the loop that runs them and what a store error does.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping

from duragent.errors import (
    Conflict,
    IncompatibleEntry,
    LostCommits,
    StaleLease,
    StoreError,
    StoreUnavailable,
    TaskNotFound,
)
from duragent.llm._messages import WorkingView
from duragent.runtime._agent import Agent
from duragent.runtime._callbacks import EntriesHook
from duragent.runtime._calls import exception_text
from duragent.runtime._commits import Commits, StatusHook
from duragent.runtime._context import FailTask
from duragent.runtime._control import Abandoned, Control, Controls
from duragent.runtime._deadlines import exceeded
from duragent.runtime._ending import Ending
from duragent.runtime._held import Held
from duragent.runtime._recovery import Recovery
from duragent.runtime._round import Rounds, TraceHook
from duragent.runtime._state import Clock, DebouncedState
from duragent.store._protocol import Store
from duragent.types import BlockReason, Task, TaskStatus, utcnow

log = logging.getLogger("duragent.engine")


class TaskRunner:
    """Runs one claimed task round by round until it ends, parks or is stopped.
    Owns its parts (see the module's docstring) and the loop that drives them."""

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
        acked: int = 0,
        worker_held: Held | None = None,
    ) -> None:
        """`acked`: the last seq of the task this worker was told is stored, if it
        knows of more than `task` holds (its earlier runner's commits): a store
        behind it lost them, and the task is blocked, not run (`Commits.acked`)."""
        self.store = store
        self.agent = agent
        self.controls = Controls()
        self.commits = Commits(
            store,
            task,
            self.controls,
            state_debounce=agent.timing.state_debounce,
            state_max_wait=agent.timing.state_max_wait,
            detached=detached,
            clock=clock,
            on_status=on_status,
            on_entries=on_entries,
            acked=acked,
        )
        self.ending = Ending(self.commits, self.controls)
        agents = dict(agents or {agent.name: agent})
        self.rounds = Rounds(agent, agents, self.commits, self.controls, self.ending, trace)
        self.rounds.worker_held = worker_held  # what tools share across the worker's tasks
        self.recovery = Recovery(self.rounds, self.ending)
        # How long a runner ended by a store error keeps trying to hand its
        # task back before leaving it to the lease (renewed meanwhile).
        self.release_patience = 30.0

    @property
    def task(self) -> Task:
        """The task's row as this runner last took it."""
        return self.commits.task

    @property
    def epoch(self) -> int:
        return self.commits.epoch

    @property
    def detached(self) -> bool:
        return self.commits.detached

    @property
    def control(self) -> Control | None:
        """The control request the runner is to act on, if any."""
        return self.controls.current

    @property
    def state(self) -> DebouncedState:
        return self.commits.state

    @property
    def view(self) -> WorkingView:
        return self.rounds.view

    @property
    def on_entries(self) -> EntriesHook | None:
        return self.commits.on_entries

    @on_entries.setter
    def on_entries(self, hook: EntriesHook | None) -> None:
        self.commits.on_entries = hook  # callbacks given while it runs (Worker.listen)

    def request(self, control: Control) -> None:
        """Ask the runner to stop (see Control); it acts at its next safe point."""
        self.controls.request(control)

    def hurry(self) -> None:
        """Stop waiting for running tools: a stop requested before (a release) cancels
        them now and answers them "cancelled" (a draining worker's grace is over)."""
        self.controls.hurry.set()

    async def stop_now(self, control: Control) -> Task:
        """Pause or abort a task nobody is running, from what its log says."""
        return await self.ending.stop_now(control)

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
        rounds = self.rounds
        await rounds.trace_point("task_start", task=self.task)
        deadline = self._arm_deadline()
        try:
            await self.recovery.start()
            await self._loop()
        except Abandoned as exc:
            log.warning("task %s abandoned: %s", self.task.id, exc)
        except asyncio.CancelledError:
            raise
        except LostCommits as exc:
            await self._block_lost(exc)
        except IncompatibleEntry as exc:
            # A later version wrote this task's log: blocked, not failed (nothing
            # went wrong in it), and only this task; the worker runs the others.
            log.error("task %s blocked: %s", self.task.id, exc)
            try:
                await self.ending.block(BlockReason.INCOMPATIBLE_STORE, str(exc))
            except Abandoned:
                pass
            except StoreError as store_exc:
                await self._end_on_store_error(store_exc)
        except StoreError as exc:
            await self._end_on_store_error(exc)
        except Exception as exc:
            # One line; the traceback for whoever debugs (the task's error keeps the cause).
            error = str(exc) if isinstance(exc, FailTask) else exception_text(exc)
            log.error("task %s failed: %s", self.task.id, " ".join(error.split()))
            log.debug("task %s failed", self.task.id, exc_info=True)
            try:
                await self.ending.finish(TaskStatus.FAILED, error=error)
            except Abandoned:
                pass
            except StoreError as store_exc:
                await self._end_on_store_error(store_exc)
        finally:
            if deadline is not None:
                deadline.cancel()
            await self.state.close()
            # What its tools kept open (MCP sessions) closes as the run ends,
            # whether the task ended, parked or was handed back.
            await self.rounds.held.aclose()
        await rounds.trace_point("task_end", task=self.task)
        return self.task

    async def _loop(self) -> None:
        """Round after round while the task runs; a control request is acted on at
        the top, a safe point (the last round is closed)."""
        controls, rounds, ending, commits = self.controls, self.rounds, self.ending, self.commits
        while commits.task.status is TaskStatus.RUNNING:
            if controls.current is not None:
                # An interrupt leaves it running.
                await ending.stop(controls.current, rnd=rounds.round)
                continue
            if controls.reread:
                controls.reread = False
                await self.recovery.reread_round()
                continue
            if commits.task.iterations >= self.agent.limits.max_iterations:
                await ending.finish(
                    TaskStatus.FAILED,
                    error=f"max_iterations reached: {self.agent.limits.max_iterations} rounds "
                    "without a final answer",
                )
                return
            # A safe point: the last round is closed. Messages sent to interrupt go in.
            rounds.view.extend(await rounds.take_messages(commits.task.iterations + 1))
            await rounds.play()
        control = controls.current
        stopping = control is not None and control.action != "release"
        if stopping and commits.task.status is TaskStatus.WAITING:
            # Asked to stop just as it parked; at the deadline, its waits get results.
            # (A worker that only hands its tasks back leaves a parked one parked.)
            assert control is not None
            if control.action == "deadline":
                await ending.stop_now(control)
            else:
                await ending.stop(control, rnd=rounds.round)

    async def _block_lost(self, exc: LostCommits) -> None:
        """The store lost commits this runner was told had landed (a failover with
        asynchronous replication): what ran in the lost part, never-replay tools
        among it, is not in the log, so running on from the log could run them
        again. The task is blocked(lost_commits) for a person to look at."""
        log.error("task %s blocked: %s", self.task.id, exc)
        self.commits.lost = True
        try:
            await self.ending.block(
                BlockReason.LOST_COMMITS,
                f"{exc}. Tools may have run in the lost part of the log, so the task is "
                "not run again from it; check what its tools did, then resume it",
            )
        except Abandoned:
            pass
        except StoreError as store_exc:  # not handed back: the log it would run from is short
            log.error(
                "task %s: could not block it (%s); its lease will expire", self.task.id, store_exc
            )

    async def _end_on_store_error(self, exc: StoreError) -> None:
        """A store error ends the runner, never the task (docs/architecture.md §4).

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
                # Waits its tools asked for whose commit the error cut short are
                # committed first (once the log says they did not land): a wait is
                # never lost to a passing store error.
                if await self.rounds.repark():
                    log.info("task %s: its waits committed on a retry", self.task.id)
                    return
                stored = await self.store.get_task(self.task.id)
                if stored.last_seq < self.commits.acked:  # not handed back on a shorter log
                    self.commits.task = stored
                    await self._block_lost(
                        LostCommits(self.task.id, stored.last_seq, self.commits.acked)
                    )
                    return
                await self.store.release_lease(self.task.id, self.epoch)
                return
            except (StaleLease, TaskNotFound, Abandoned):
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


__all__ = ["Abandoned", "Control", "StatusHook", "TaskRunner", "TraceHook"]
