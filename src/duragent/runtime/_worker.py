"""The worker: claims runnable tasks, runs them, keeps their leases alive."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import random
import socket
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from duragent.errors import (
    CommitOutcomeUnknown,
    InvalidOption,
    StoreError,
    TaskNotFound,
    UsageError,
    check_count,
    check_delay,
    check_seconds,
)
from duragent.runtime._agent import Agent, agents_by_name
from duragent.runtime._callbacks import TaskCallbacks
from duragent.runtime._engine import Control, StatusHook, TaskRunner, TraceHook
from duragent.runtime._held import Held
from duragent.runtime._housekeeping import Housekeeper, stop as stop_housekeeping
from duragent.runtime._presence import announce, block_unserved, withdraw
from duragent.runtime._state import Clock
from duragent.runtime._versions import served_by
from duragent.store._commits import TaskQuery
from duragent.store._protocol import Store
from duragent.types import Entry, EntryKind, Task, TaskStatus, utcnow
from duragent.webhooks import WebhookDelivery, WebhookSender

log = logging.getLogger("duragent.worker")

# Seconds a draining worker waits, once its grace period is over and the tools
# still running are cancelled, for its runners to release their tasks; a runner
# still there then (its store is not answering) is cancelled, its task left to
# its lease.
AFTER_GRACE = 5.0


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True, kw_only=True)
class WorkerOptions:
    """How a worker claims and holds tasks (`Worker(store, agents, WorkerOptions(...))`;
    a Runtime builds one from its own arguments). Checked when built: a period a
    loop cannot run on (zero, negative, NaN, infinite) is an InvalidOption."""

    concurrency: int = 32
    """Tasks run at once by this worker."""
    lease_ttl: float = 30.0
    """Seconds a lease lasts without renewal; a task whose worker died is taken
    over by any worker once its lease expires."""
    heartbeat: float | None = None
    """Seconds between lease renewals (all leases in one store call); default a
    third of `lease_ttl`, and always shorter than it."""
    poll_interval: float = 0.5
    """The longest time new work goes unnoticed when no wake-up reaches the worker
    (work submitted in this process, or a store that notifies across processes,
    is noticed at once)."""
    worker_id: str | None = None
    """This worker's name in leases and logs; default host:pid:random."""
    shutdown_grace: float | None = 30.0
    """How long a graceful `stop` (a drain: SIGTERM to `duragent worker`) waits for
    running tasks to reach a safe point and be handed back; past it, their running
    tools are cancelled and they are handed back there (None: as long as they take)."""
    missing_agent_grace: float = 60.0
    """Seconds a task may wait for an agent no live worker serves before it is
    blocked(missing_definition) (_presence.py)."""
    webhook_delivery: WebhookDelivery | None = None
    """How webhook events are delivered; default: WebhookDelivery() polling for
    other processes' events no more often than `poll_interval` (at least 2 s)."""
    queues: Iterable[str] | None = None
    """Claim only tasks of these queues (names, kept as a sorted tuple; None: every
    queue). The limits of a queue are kept in the store (`Runtime.queue`,
    `duragent queue set`)."""
    housekeeping: bool = True
    """Run schedule ticks and queue TTL purges in this worker (_housekeeping.py)."""

    def __post_init__(self) -> None:
        # Each of these is a loop's period: zero, negative or NaN would spin or die.
        for name in ("lease_ttl", "poll_interval", "missing_agent_grace"):
            check_seconds(name, getattr(self, name))
        if self.heartbeat is not None and check_seconds("heartbeat", self.heartbeat) >= (
            self.lease_ttl
        ):
            raise InvalidOption("heartbeat must be shorter than lease_ttl (leases would lapse)")
        check_count("concurrency", self.concurrency, least=1, of="tasks")
        if self.shutdown_grace is not None:
            check_delay("shutdown_grace", self.shutdown_grace)
        if self.queues is not None:
            object.__setattr__(self, "queues", tuple(queue_names(self.queues)))


class Worker:
    """Runs up to `options.concurrency` tasks of the agents it knows (see WorkerOptions).

    Leases are renewed, all in one store call, every heartbeat; a task whose
    worker died is taken over by any worker once its lease expires. New work is
    noticed at once when it is submitted in this process or the store notifies
    across processes, and otherwise within `poll_interval`. A pause or abort
    committed by another process reaches the task's runner at once through
    `watch_controls`. `on_status`, `trace` and `callbacks` are the hooks of the
    process that runs it (a Runtime passes its own).
    """

    def __init__(
        self,
        store: Store,
        agents: Iterable[Agent],
        options: WorkerOptions | None = None,
        *,
        on_status: StatusHook | None = None,
        clock: Clock | None = None,
        trace: TraceHook | None = None,
        callbacks: dict[str, TaskCallbacks] | None = None,
    ) -> None:
        self.options = options = options or WorkerOptions()
        self.store = store
        self.queues = None if options.queues is None else list(options.queues)
        self.agents = agents_by_name(agents)
        # The version of each agent served: only tasks of those (or of none) are claimed.
        self.versions = served_by(self.agents.values())
        self.heartbeat = (
            options.heartbeat if options.heartbeat is not None else options.lease_ttl / 3
        )
        self.id = options.worker_id or default_worker_id()
        self.on_status = on_status
        # Per-task callbacks (Runtime.load_task), by task id; dropped when the task ends.
        self.callbacks = callbacks if callbacks is not None else {}
        # An async status hook's calls, awaited in order (each after the one before).
        self._hook_tail: asyncio.Future[None] | None = None
        self.clock = clock
        self.trace = trace
        self.runners: dict[str, TaskRunner] = {}
        # What tools keep open for all of this worker's tasks (an MCP server with
        # scope="worker"); closed when the worker stops, after its tasks.
        self.held = Held()
        self._jobs: dict[str, asyncio.Task[Task]] = {}
        self._job_of: dict[int, asyncio.Task[Task]] = {}  # id(runner) -> its job
        self._checks: set[asyncio.Future[None]] = set()  # control requests being read
        self._done: dict[str, asyncio.Event] = {}
        self._wake = asyncio.Event()
        self._stopping = False
        self._draining = False  # a graceful stop is under way
        self._hard = asyncio.Event()  # a stop at once (a second signal): cancel the runners
        self._announce_now = asyncio.Event()  # renew the presence record now
        self._stopped = asyncio.Event()
        self.claimed = 0  # tasks this worker has claimed
        self._claim_failures = 0  # claims in a row the store refused
        self._lost_claim = False  # a claim's outcome is unknown: look for it
        self._held: dict[tuple[str, int], None] = {}  # (task, epoch) runners held, recent
        # Task id -> the last seq of it a store's answer told a runner of ours, recent:
        # a claim that finds less lost commits (a failover; `TaskRunner(acked=)`).
        self._acked: dict[str, int] = {}
        # Delivers webhook events from the outbox, this process's and others'.
        # Looking for other processes' events is polling: never more often than
        # the worker itself would poll for work (a long poll_interval means quiet).
        delivery = options.webhook_delivery or WebhookDelivery(
            poll_interval=max(2.0, options.poll_interval)
        )
        self.webhooks = WebhookSender(store, self.id, claim_ttl=options.lease_ttl, options=delivery)
        # Schedule ticks and queue TTLs (_housekeeping.py).
        # It sleeps until the next known tick; a schedule made in another process is
        # seen within max(1 s, poll_interval), the same promise as for other work.
        self.housekeeper = Housekeeper(
            store,
            self.agents,
            interval=max(1.0, options.poll_interval),
            on_fired=self.wake,
        )

    # --- control ---

    def wake(self) -> None:
        """Look for work now (something was just submitted or resumed here)."""
        self._wake.set()

    def runner(self, task_id: str) -> TaskRunner | None:
        return self.runners.get(task_id)

    async def wait_task(self, task_id: str) -> None:
        """Until this worker has stopped running `task_id` (if it is running it)."""
        job = self._jobs.get(task_id)
        if job is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.shield(job)

    @property
    def draining(self) -> bool:
        """A graceful stop is under way: no claims; running tasks hand themselves back."""
        return self._draining

    async def stop(self, *, graceful: bool = True) -> None:
        """Stop claiming, then end every running task's turn here.

        Graceful (a drain): each running task is asked to hand itself back at its
        next safe point (status pending, its lease released: any worker claims it
        at once); running tools get the agent's `Timing.tool_grace` to finish, and
        a task whose tools asked to wait parks on those waits instead. Past
        `shutdown_grace`, tools still running are cancelled (answered "cancelled:
        the task was released while it ran") and the task is released there; a
        runner that cannot do even that within AFTER_GRACE more seconds (its store
        is not answering) is cancelled, its task left to its lease (a takeover).
        Leases are renewed and the presence record says `draining` meanwhile.

        Not graceful, or called so while a drain runs (a second signal): every
        runner is cancelled at once, its task left to its lease (another worker
        takes it over once the lease expires, recovering from the log)."""
        self._stopping = True
        self._wake.set()
        if graceful and not self._draining and not self._hard.is_set():
            self._draining = True
            self._announce_now.set()  # the presence record says `draining` now
            for runner in list(self.runners.values()):
                runner.request(Control("release"))
            await self._drain()
        elif not graceful:
            self._hard.set()
            for job in list(self._jobs.values()):
                job.cancel()
        for job in list(self._jobs.values()):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await job
        await self._stopped.wait()
        await self.held.aclose()
        await self._hooks_done()

    async def _drain(self) -> None:
        """The graceful part of `stop`: its grace period, then AFTER_GRACE, then cancel."""
        if await self._jobs_end(self.options.shutdown_grace):
            return
        late = list(self.runners.values())
        log.warning(
            "draining: %d tasks not at a safe point after %s s; cancelling their tools "
            "and releasing them",
            len(late),
            self.options.shutdown_grace,
        )
        for runner in late:
            runner.hurry()
        if await self._jobs_end(AFTER_GRACE):
            return
        for runner in list(self.runners.values()):
            self._abandon(runner, "not released in time; left to its lease")

    async def _jobs_end(self, timeout: float | None) -> bool:
        """Until every runner has ended (True), `timeout` passes or a hard stop comes."""
        loop = asyncio.get_running_loop()
        until = None if timeout is None else loop.time() + timeout
        hard = asyncio.ensure_future(self._hard.wait())
        try:
            while self._jobs and not hard.done():
                left = None if until is None else until - loop.time()
                if left is not None and left <= 0:
                    return False
                await asyncio.wait(
                    [*self._jobs.values(), hard], timeout=left, return_when=asyncio.FIRST_COMPLETED
                )
                await asyncio.sleep(0)  # the ended jobs' callbacks (_finished) run first
            return True
        finally:
            hard.cancel()

    # --- the loop ---

    async def run(self) -> None:
        beat = asyncio.ensure_future(self._heartbeat())
        unwatch: Callable[[], None] | None = None
        presence = asyncio.ensure_future(self._presence())
        sender = asyncio.ensure_future(self.webhooks.run())
        house = None
        try:
            # Control requests (pause/abort from another process) are heard at
            # once, not at the next heartbeat. Inside the try: should it fail,
            # the tasks started above are still stopped.
            unwatch = self.store.watch_controls(self._control_noted)
            if self.options.housekeeping:
                house = asyncio.ensure_future(self.housekeeper.run())
            while not self._stopping:
                # Listen before looking: a commit landing between the claim
                # query and the wait must still wake us (else: a lost wake-up
                # and a full poll interval of idling with work queued).
                changed = await self._watch_store()
                try:
                    await self._claim_some()
                    await self._idle(changed)
                finally:
                    if changed is not None:
                        changed.cancel()
            # Stopping: no more schedule ticks from here (a draining worker would
            # otherwise fire tasks pinned to its own version as it goes). Leases
            # are renewed, controls heard and the presence record kept (saying
            # `draining`) until every runner has ended (see `stop`).
            await stop_housekeeping(house)
            while self._jobs:
                await asyncio.wait(list(self._jobs.values()))
                await asyncio.sleep(0)
        finally:
            if unwatch is not None:
                unwatch()
            await stop_housekeeping(house)
            beat.cancel()
            for check in list(self._checks):
                check.cancel()
            presence.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat
            with contextlib.suppress(asyncio.CancelledError):
                await presence
            with contextlib.suppress(StoreError):
                await withdraw(self.store, self.id)
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
            if not self._jobs:  # else stop() closes it once they end
                await self.held.aclose()
            self._stopped.set()

    async def _adopt_lost_claims(self) -> None:
        """A claim whose COMMIT lost its connection may have taken a task: read which
        running tasks hold a lease of ours that no runner of ours ever held, and run
        them (their epoch is ours; found by reading, never guessed). Otherwise such a
        task would sit until its lease expired, and its takeover count as a restart."""
        cursor: str | None = None
        found: list[Task] = []
        while True:
            page = await self.store.list_tasks(
                TaskQuery(status=TaskStatus.RUNNING, limit=500, cursor=cursor)
            )
            found += [
                t
                for t in page.tasks
                if t.lease.owner == self.id
                and t.id not in self._jobs
                and (t.id, t.lease.epoch) not in self._held
            ]
            cursor = page.next_cursor
            if cursor is None:
                break
        self._lost_claim = False
        for task in found:
            if len(self._jobs) >= self.options.concurrency or task.agent not in self.agents:
                continue
            log.warning("task %s: adopting a claim whose answer was lost", task.id)
            self._start(task)

    async def _claim_some(self) -> None:
        if self._lost_claim:
            try:
                await self._adopt_lost_claims()
            except StoreError as exc:
                log.warning("looking for lost claims failed: %s", exc)
        # Up to every free slot in one store call (one transaction, not one per task).
        while len(self._jobs) < self.options.concurrency and not self._stopping:
            free = self.options.concurrency - len(self._jobs)
            try:
                tasks = await self.store.claim_tasks(
                    self.id,
                    free,
                    agents=list(self.agents),
                    ttl=self.options.lease_ttl,
                    queues=self.queues,
                    versions=self.versions,
                )
            except StoreError as exc:
                # The store is failing (down, disk full): look again later, backing
                # off up to a few seconds rather than hammering it every poll.
                if isinstance(exc, CommitOutcomeUnknown):
                    self._lost_claim = True
                self._claim_failures += 1
                if self._claim_failures == 1:  # once, not at every attempt
                    log.warning("claim failed: %s; trying again with back-off", exc)
                return
            if self._claim_failures:
                log.warning("claims work again (after %d failed)", self._claim_failures)
            self._claim_failures = 0
            for task in tasks:
                self.claimed += 1
                self._start(task)
            if len(tasks) < free:
                return

    async def _watch_store(self) -> asyncio.Future[None] | None:
        """Start waiting for other processes' commits, if the store can tell us.

        Not while every slot is taken: then only a slot freeing up (`wake`)
        matters, and waking at every commit in the cluster would be wasted work.
        """
        if len(self._jobs) >= self.options.concurrency:
            return None
        if not self.store.notifies_across_processes:
            return None

        # A store that can tell commits creating work apart wakes us only for those.
        wait = self.store.wait_for_work

        async def changed() -> None:
            with contextlib.suppress(StoreError):  # then it is only a shorter wait
                await wait(self.options.poll_interval)

        watch = asyncio.ensure_future(changed())
        await asyncio.sleep(0)  # let it start: from here on, no commit goes unheard
        return watch

    async def _idle(self, changed: asyncio.Future[None] | None) -> None:
        timeout = self.options.poll_interval
        if self._claim_failures:
            backoff = min(0.05 * 2**self._claim_failures, 1.0)
            # Jitter: workers that lost the same server do not come back in step.
            timeout = max(timeout, backoff * random.uniform(0.5, 1.0))
            changed = None  # a failing store's wake-ups say nothing: wait out the back-off
        if len(self._jobs) < self.options.concurrency:
            with contextlib.suppress(StoreError):
                due = await self.store.next_wake_at(list(self.agents), self.queues)
                if due is not None:
                    timeout = max(0.0, min(timeout, (due - utcnow()).total_seconds() + 0.01))
        woken = asyncio.ensure_future(self._wake.wait())
        waits: list[asyncio.Future[Any]] = [woken] if changed is None else [woken, changed]
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            woken.cancel()
        self._wake.clear()

    def _start(self, task: Task) -> None:
        self._held[(task.id, task.lease.epoch)] = None
        if len(self._held) > 10_000:
            del self._held[next(iter(self._held))]
        old = self.runners.get(task.id)
        known = self._acked.get(task.id)
        if old is not None:
            # We claimed it again (our lease had lapsed), so the old runner's
            # epoch is lost: stop it now rather than at its next refused commit.
            self._abandon(old, "claimed again under a newer lease")
            known = max(known or 0, old.commits.acked)
        agent = self.agents[task.agent]
        runner = TaskRunner(
            self.store,
            agent,
            task,
            agents=self.agents,
            on_status=self._status_changed,
            clock=self.clock,
            trace=self.trace,
            # Only a task with callbacks pays for hearing its commits (see `listen`).
            on_entries=self._entries_committed if task.id in self.callbacks else None,
            # The claim added one entry to the log this worker knew of.
            acked=0 if known is None else known + 1,
            worker_held=self.held,
        )
        self.runners[task.id] = runner
        self._done[task.id] = asyncio.Event()
        if self._stopping:  # claimed as the stop came: handed back at once
            runner.request(Control("release"))
        job = asyncio.ensure_future(runner.run())
        self._jobs[task.id] = job
        self._job_of[id(runner)] = job
        job.add_done_callback(lambda _: self._finished(runner))
        if self._hard.is_set():
            job.cancel()

    def _status_changed(self, task: Task, old: TaskStatus, new: TaskStatus) -> None:
        self.webhooks.wake()  # the commit may have written a webhook event
        if new.terminal:
            self.housekeeper.finished(task)  # its queue's ttl runs from now
        if self.on_status is not None:
            self._hooked(self.on_status, task.id, task, old, new)
        mine = self.callbacks.get(task.id)
        if mine is None:
            return
        if mine.on_status is not None:
            self._hooked(mine.on_status, task.id, task, old, new)
        if new.terminal:
            del self.callbacks[task.id]
            if mine.on_end is not None:
                self._hooked(mine.on_end, task.id, task)

    def listen(self, task_id: str) -> None:
        """Callbacks were just given for `task_id`: its runner, if running, reports to them."""
        runner = self.runners.get(task_id)
        if runner is not None:
            runner.on_entries = self._entries_committed

    def _entries_committed(self, task: Task, entries: list[Entry]) -> None:
        mine = self.callbacks.get(task.id)
        if mine is None or mine.on_entry is None:
            return
        for entry in entries:
            # Not its parent's (committed with it); status changes are on_status's.
            if entry.task_id == task.id and entry.kind is not EntryKind.STATUS:
                self._hooked(mine.on_entry, task.id, entry)

    def _hooked(self, hook: Callable[..., Any], task_id: str, *args: Any) -> None:
        """Call a hook; what a coroutine function returns is awaited after the calls
        before it (runners report from inside their commits, which cannot wait)."""
        try:
            called = hook(*args)
        except Exception:
            log.exception("task %s: a callback failed", task_id)
            return
        if inspect.isawaitable(called):
            self._hook_tail = asyncio.ensure_future(_await_hook(self._hook_tail, called, task_id))

    async def _hooks_done(self) -> None:
        """Await the status hook's calls still running (at stop)."""
        while (tail := self._hook_tail) is not None:
            await tail
            if tail is self._hook_tail:
                self._hook_tail = None

    def _finished(self, runner: TaskRunner) -> None:
        task_id = runner.task.id
        self._job_of.pop(id(runner), None)
        self._acked[task_id] = max(self._acked.pop(task_id, 0), runner.commits.acked)
        if len(self._acked) > 10_000:
            del self._acked[next(iter(self._acked))]
        if self.runners.get(task_id) is not runner:
            return  # an older runner of a task this worker runs again: leave the new one be
        self.runners.pop(task_id, None)
        self._jobs.pop(task_id, None)
        done = self._done.pop(task_id, None)
        if done is not None:
            done.set()
        self._wake.set()  # a slot is free

    def _abandon(self, runner: TaskRunner, why: str) -> None:
        """Cancel this runner (only this one: a newer runner of the same task stays)."""
        log.warning("task %s (epoch %s): %s, abandoning it", runner.task.id, runner.epoch, why)
        job = self._job_of.get(id(runner))
        if job is not None:
            job.cancel()

    async def _presence(self) -> None:
        """Record the agents served here (_presence.py); now and then, block tasks
        that waited `missing_agent_grace` for an agent no live worker serves.

        The record is renewed every few seconds (not at every heartbeat: it is one
        more write) and lasts three renewals, so a missed one or two change nothing."""
        every = min(max(self.heartbeat, 5.0), max(self.options.missing_agent_grace / 4, 0.05))
        swept = 0.0
        loop = asyncio.get_running_loop()
        while True:
            try:
                self._announce_now.clear()
                await announce(
                    self.store,
                    self.id,
                    self.agents,
                    3 * every,
                    every,
                    draining=self._draining,
                    versions=self.versions,
                )
                if loop.time() - swept >= self.options.missing_agent_grace / 4:
                    swept = loop.time()
                    await block_unserved(self.store, self.agents, self.options.missing_agent_grace)
            except StoreError as exc:
                log.warning("recording this worker's agents failed: %s", exc)
            except Exception:  # a bad presence row must not stop the next renewal
                log.exception("recording this worker's agents failed")
            # Not asyncio.wait_for: on 3.11 it can swallow a cancellation that
            # comes as the event is set (a stop), and this loop would never end.
            woken = asyncio.ensure_future(self._announce_now.wait())
            try:
                await asyncio.wait([woken], timeout=every)
            finally:
                woken.cancel()

    # --- leases and control ---

    async def _heartbeat(self) -> None:
        """Renew every lease this worker holds, in one store call, on a fixed beat.

        The beat is kept from the start of one renewal to the start of the
        next, so a slow renewal does not push the following ones later and
        later (drift past the lease). Task work never runs in this coroutine.
        """
        loop = asyncio.get_running_loop()
        due = loop.time() + self.heartbeat
        while True:
            await asyncio.sleep(max(0.0, due - loop.time()))
            due = max(due + self.heartbeat, loop.time())
            try:
                await self._renew_all()
            except Exception:  # every lease of this worker depends on this loop
                log.exception("lease renewal failed")

    async def _renew_all(self) -> None:
        held = dict(self.runners)
        if not held:
            return
        leases = {task_id: runner.epoch for task_id, runner in held.items()}
        try:
            renewal = await self.store.renew_leases(self.id, leases, self.options.lease_ttl)
        except StoreError as exc:
            log.warning("lease renewal of %d tasks failed: %s", len(leases), exc)
            return
        for task_id in renewal.lost:
            # Another worker owns it now (we were stopped past our lease): stop
            # without writing; fencing would refuse our writes anyway.
            if task_id in held:
                self._abandon(held[task_id], "lease lost")
        for task_id, row in renewal.kept.items():
            if row.control and task_id in held:  # a request whose notice we missed
                try:
                    self._apply_control(held[task_id], row)
                except Exception:  # one bad control request, not the other tasks
                    log.exception("task %s: control request unreadable", task_id)

    def _control_noted(self, task_id: str | None) -> None:
        """A control request was committed on `task_id` (None: on any, maybe)."""
        ids = list(self.runners) if task_id is None else [task_id]
        for tid in ids:
            runner = self.runners.get(tid)
            if runner is not None:
                check = asyncio.ensure_future(self._check_control(runner))
                self._checks.add(check)
                check.add_done_callback(self._checks.discard)

    async def _check_control(self, runner: TaskRunner) -> None:
        try:
            row = await self.store.get_task(runner.task.id)
        except (StoreError, TaskNotFound) as exc:
            log.warning("task %s: control request unread: %s", runner.task.id, exc)
            return
        self._apply_control(runner, row)

    def _apply_control(self, runner: TaskRunner, row: Task) -> None:
        if row.control and row.lease.epoch == runner.epoch:
            runner.request(Control.from_row(row.control))


def queue_names(queues: Iterable[str]) -> list[str]:
    """The queues a worker claims from, checked: names, not Queue definitions."""
    names = list(queues) if not isinstance(queues, str) else [queues]
    for name in names:
        if not isinstance(name, str) or not name:
            raise UsageError(
                f"WorkerOptions(queues=) takes queue names, not {name!r}; limits are set "
                "with Runtime(queues=[Queue(...)]) or rt.queue(name, ...)"
            )
    return sorted(set(names))


def lease_alive(task: Task, now: datetime | None = None) -> bool:
    expires = task.lease.expires_at
    return (
        task.status is TaskStatus.RUNNING
        and task.lease.owner is not None
        and expires is not None
        and expires > (now or utcnow())
    )


async def _await_hook(
    before: asyncio.Future[None] | None, call: Awaitable[None], task_id: str
) -> None:
    """One async status hook call, after the one before it; its error is logged, not raised
    (a hook's failure is no task's)."""
    if before is not None:
        await before
    try:
        await call
    except Exception:
        log.exception("task %s: the status hook failed", task_id)
