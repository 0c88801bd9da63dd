"""Group commit: the commits of a process that wait at one moment share one transaction.

The SQLite and PostgreSQL writers are both one of these. `GroupCommit` owns
what they have in common: the queue of jobs, batches of up to `max_batch`, one
batch at a time, whose turn it is to run the next (store/_turns.py), the writer
thread, and the settlement of each job's future (on the loop it came from, one
wake-up per loop) and of its `PendingCommit` link. A writer supplies how a
batch runs in one transaction on its thread (`run_batch`, blocking) and, if it
can, how a batch runs on the event loop its commits came from (`run_here`:
SQLite inline, PostgreSQL a flight), which ends in `landed_here`.

What a failure does to a batch is the writer's (a refused job undone alone, a
lost connection retried): `run_batch` returns each job's outcome. A batch whose
run raises fails all its jobs with that error; no caller is left waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from duragent.errors import StoreError
from duragent.store._commits import PendingCommit, mark_failed
from duragent.store._turns import Turn, watch

Outcome = tuple[bool, Any]  # (ok, result or exception)
TxT = TypeVar("TxT")
NotesT = TypeVar("NotesT")


@dataclass(slots=True)
class Job(Generic[TxT]):
    """One write waiting for its transaction: `fn(tx)` runs inside it."""

    fn: Callable[[TxT], Any]
    future: asyncio.Future[Any]
    loop: asyncio.AbstractEventLoop
    link: PendingCommit | None = None  # a commit_soon's, told of its failure at once
    # The asyncio task that asked: commits of several tasks waiting together
    # say other work is under way on the loop (see _sqlite_writer.py `run_here`).
    origin: asyncio.Task[Any] | None = None


class GroupCommit(Generic[TxT, NotesT]):
    """The queue a writer drives; `submit` from any event loop.

    `NotesT` is what a batch announces once settled (`announce`), None when it
    announces nothing.
    """

    def __init__(self, *, where: str, max_batch: int, thread_name: str) -> None:
        self.where = where  # the store, as "<where> is closed" names it
        self.max_batch = max_batch
        self.batches = 0  # transactions run or attempted: jobs_done / batches = group size
        self.jobs_done = 0
        self._lock = threading.Lock()
        self._pending: list[Job[TxT]] = []
        self._busy = False  # a batch runs or is about to (one at a time)
        self._stopped = False  # no new work: the store is closing
        self._turn = Turn()  # the loop whose `_step` runs the next batch (store/_turns.py)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=thread_name)

    # --- what a writer supplies ---

    def run_batch(
        self, batch: list[Job[TxT]], failed: BaseException | None
    ) -> tuple[list[Outcome], NotesT | None]:
        """On the writer thread: run `batch` in one transaction; each job's outcome
        and what the batch announces. `failed`: how its attempt on the loop
        failed, if `run_here` handed it over."""
        raise NotImplementedError

    def run_here(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Run the next batch on `loop` if it can, ending in `landed_here` (or
        `to_thread` with the batch and its failure); False: the thread runs it."""
        return False

    def announce(self, loop: asyncio.AbstractEventLoop, notes: NotesT | None, ok: bool) -> None:
        """On `loop`, after its callers were answered: wake whoever waits for the
        batch's changes (`ok`: any of its jobs committed)."""

    def flying(self) -> bool:
        """A batch is under way on a loop with its answer unread (not to be taken over)."""
        return False

    def back_to_loop(self) -> bool:
        """After a batch on the thread: whether the jobs waiting, all of one loop,
        go back to that loop to run there."""
        return False

    def queued(self, loop: asyncio.AbstractEventLoop) -> None:
        """On `loop`: a job was queued there while a batch runs (a writer with
        more than one batch in flight may send it now)."""

    def next_handed(self) -> tuple[list[Job[TxT]], BaseException] | None:
        """On the writer thread, before it takes a batch off the queue: one that
        failed on a loop and was left for the thread, with its failure."""
        return None

    def handed_waiting(self) -> bool:
        """Under the lock: a batch `next_handed` would give is waiting."""
        return False

    # --- the queue ---

    def submit(self, fn: Callable[[TxT], Any], link: PendingCommit | None) -> asyncio.Future[Any]:
        """Queue `fn` for the next transaction; the future answers once it committed."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        with self._lock:
            if self._stopped:  # under the lock `stop` and `idle` use
                raise StoreError(f"{self.where} is closed")
            self._pending.append(Job(fn, future, loop, link, asyncio.current_task(loop)))
            start = not self._busy
            self._busy = True
            if start:
                turn = self._turn.give(loop)
            elsewhere = self._turn.loop not in (None, loop)
        if start:
            # call_soon, not now: every coroutine already runnable in this tick
            # gets to add its commit to the same transaction.
            loop.call_soon(self._step, loop, turn)
        elif elsewhere:  # that loop may have stopped with the turn, or stop later
            watch(loop, future, self.rescue)
        else:
            self.queued(loop)
        return future

    def take(self, loop: asyncio.AbstractEventLoop | None = None) -> list[Job[TxT]] | None:
        """The next batch, taken off the queue; [] when none waits (the writer is
        then idle). With `loop`: None, and nothing taken, unless every job of
        the batch is that loop's."""
        with self._lock:
            batch = self._pending[: self.max_batch]
            if not batch:
                self._busy = False
                self._turn.take()
                return batch
            if loop is not None and any(job.loop is not loop for job in batch):
                return None
            del self._pending[: len(batch)]
            return batch

    def put_back(self, batch: list[Job[TxT]]) -> None:
        """A batch taken and not run: first again."""
        with self._lock:
            self._pending[:0] = batch

    def stop(self) -> None:
        """Take no new work: `submit` refuses from now on; what was queued lands."""
        with self._lock:
            self._stopped = True

    def idle(self) -> bool:
        """No batch runs or waits (decided under the lock `submit` queues with)."""
        with self._lock:
            return not self._busy

    async def finish(self) -> None:
        """Stop, land the commits already asked for, then end the writer thread."""
        self.stop()
        while not self.idle():
            self.rescue()
            await asyncio.sleep(0.001)
        await asyncio.to_thread(self._executor.shutdown)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True)

    def rescue(self) -> None:
        """Hand to the writer thread a turn held by an event loop that is not
        running (store/_turns.py): else every later commit, and closing the
        store, waits for ever. If that loop runs again, its step finds the turn
        gone and does nothing."""
        with self._lock:
            if not self._busy or self.flying() or not self._turn.stranded():
                return
            self._turn.take()
        self._executor.submit(self._drain)

    def to_thread(self, handed: tuple[list[Job[TxT]], BaseException] | None = None) -> None:
        """The writer thread takes the turn (`_drain`), first with `handed`, a
        batch that failed on the loop and its failure."""
        with self._lock:
            self._turn.take()
        self._executor.submit(self._drain, handed)

    def submit_to_thread(self, fn: Callable[[], None]) -> None:
        self._executor.submit(fn)

    def _step(self, loop: asyncio.AbstractEventLoop, turn: int) -> None:
        """The loop's turn: run the next batch here if the writer can, else on the thread."""
        with self._lock:
            if not self._turn.holds(turn):
                return  # taken from this loop meanwhile (`rescue`)
        if not self.run_here(loop):
            self.to_thread()

    def landed_here(
        self,
        loop: asyncio.AbstractEventLoop,
        batch: list[Job[TxT]],
        outcomes: list[Outcome],
        notes: NotesT | None,
    ) -> None:
        """A batch run from `loop` is over: answer its callers, then the next batch.
        If `loop` closed meanwhile (the thread read the answer), nobody waits
        there: the thread runs the next."""
        self.ended(batch, outcomes)
        if loop.is_closed():
            self.to_thread()
            return
        try:
            self._settle(loop, list(zip(batch, outcomes, strict=True)), notes)
        finally:
            # After the callers just answered, which may add their next commits.
            self._next_here(loop)

    def _next_here(self, loop: asyncio.AbstractEventLoop) -> None:
        """The next batch, if any waits, on `loop`'s next turn."""
        with self._lock:
            if not self._pending:
                self._busy = False
                self._turn.take()
                return
            turn = self._turn.give(loop)
        loop.call_soon(self._step, loop, turn)

    def ended(self, batch: list[Job[TxT]], outcomes: list[Outcome]) -> None:
        """A batch's outcomes are known: tell its commits' links (before the next
        batch runs) and count it."""
        mark_failed([job.link for job in batch], outcomes)
        self.batches += 1
        self.jobs_done += len(batch)

    def refused(self, job: Job[TxT], outcome: Outcome) -> None:
        """Tell a failed job's link at once, before a job after it in its batch runs."""
        mark_failed([job.link], [outcome])

    def _settle(
        self,
        loop: asyncio.AbstractEventLoop,
        settled: list[tuple[Job[TxT], Outcome]],
        notes: NotesT | None,
    ) -> None:
        ok_any = False
        for job, (ok, value) in settled:
            ok_any = ok_any or ok
            future = job.future
            if future.done():
                continue
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)
        self.announce(loop, notes, ok_any)

    def _drain(self, handed: tuple[list[Job[TxT]], BaseException] | None = None) -> None:
        """The writer thread: run batches until none is left, the first the one
        `handed` over by the loop with its failure. The fsync of each COMMIT
        happens here with the GIL released, so the event loops keep running
        (and queueing the next batch) meanwhile; a caller is answered only after
        its batch is durable."""
        while True:
            failed: BaseException | None = None
            if handed is None:
                handed = self.next_handed()
            if handed is not None:
                (batch, failed), handed = handed, None
            else:
                with self._lock:
                    batch = self._pending[: self.max_batch]
                    del self._pending[: self.max_batch]
                    if not batch:
                        self._busy = False
                        return
            notes: NotesT | None = None
            try:
                outcomes, notes = self.run_batch(batch, failed)
            except BaseException as exc:  # never leave a caller waiting
                outcomes = [(False, exc)] * len(batch)
            self.ended(batch, outcomes)
            by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Job[TxT], Outcome]]] = {}
            for job, outcome in zip(batch, outcomes, strict=True):
                by_loop.setdefault(job.loop, []).append((job, outcome))
            for loop, settled in by_loop.items():
                # One wake-up per loop: each call_soon_threadsafe writes to its self-pipe.
                with contextlib.suppress(RuntimeError):  # closed: nobody waits there now
                    loop.call_soon_threadsafe(self._settle, loop, settled, notes)
            if self._handed_back():
                return

    def _handed_back(self) -> bool:
        """After a batch on the thread: whether the thread is done, the jobs still
        waiting handed back to their loop (`back_to_loop`) or none left."""
        with self._lock:
            if self.handed_waiting():
                return False
            if not self._pending:
                self._busy = False
                return True
            if not self.back_to_loop():
                return False
            first = self._pending[0].loop
            if any(job.loop is not first for job in self._pending):
                return False
            turn = self._turn.give(first)  # a loop that stops with it is rescued
            try:
                first.call_soon_threadsafe(self._step, first, turn)
            except RuntimeError:  # closed: run them here
                self._turn.take()
                return False
            return True
