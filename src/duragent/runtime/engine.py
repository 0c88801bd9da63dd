"""Running one task: the loop that drives rounds, recovery and stopping.

TaskRunner is built in layers, one file each: runtime/control.py (its state,
commits, control requests and the ending of a task), runtime/round.py (the
round: model, then tools), runtime/recovery.py (bringing an interrupted round
back after a claim); this file holds the loop that runs them.
"""

from __future__ import annotations

import asyncio
import logging
import time

from duragent.errors import (
    Conflict,
    IncompatibleEntry,
    StaleLease,
    StoreError,
    StoreUnavailable,
    TaskNotFound,
)
from duragent.runtime.calls import describe
from duragent.runtime.control import Abandoned, Control, StatusHook, TraceHook
from duragent.runtime.deadlines import exceeded
from duragent.runtime.recovery import RecoveringRunner
from duragent.types import BlockReason, Task, TaskStatus, utcnow

log = logging.getLogger("duragent.engine")


class TaskRunner(RecoveringRunner):
    """Runs one claimed task round by round until it ends, parks or is stopped."""

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
                if self.task.iterations >= self.agent.limits.max_iterations:
                    await self._finish(
                        TaskStatus.FAILED,
                        error=f"max_iterations reached: {self.agent.limits.max_iterations} rounds "
                        "without a final answer",
                    )
                    break
                # A safe point: the last round is closed. Messages sent to interrupt go in.
                self.view.extend(await self._take_messages(self.task.iterations + 1))
                await self._round()
            stopping = self.control is not None and self.control.action != "release"
            if stopping and self.task.status is TaskStatus.WAITING:
                # Asked to stop just as it parked; at the deadline, its waits get results.
                # (A worker that only hands its tasks back leaves a parked one parked.)
                assert self.control is not None
                if self.control.action == "deadline":
                    await self.stop_now(self.control)
                else:
                    await self._stop(self.control)
        except Abandoned as exc:
            log.warning("task %s abandoned: %s", self.task.id, exc)
        except asyncio.CancelledError:
            raise
        except IncompatibleEntry as exc:
            # A later version wrote this task's log: blocked, not failed (nothing
            # went wrong in it), and only this task; the worker runs the others.
            log.error("task %s blocked: %s", self.task.id, exc)
            try:
                await self._block(BlockReason.INCOMPATIBLE_STORE, str(exc))
            except Abandoned:
                pass
            except StoreError as store_exc:
                await self._end_on_store_error(store_exc)
        except StoreError as exc:
            await self._end_on_store_error(exc)
        except Exception as exc:
            # One line; the traceback for whoever debugs (the task's error keeps the cause).
            log.error("task %s failed: %s", self.task.id, " ".join(describe(exc).split()))
            log.debug("task %s failed", self.task.id, exc_info=True)
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
                if await self.repark():
                    log.info("task %s: its waits committed on a retry", self.task.id)
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
