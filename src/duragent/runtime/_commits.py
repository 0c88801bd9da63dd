"""A task runner's commits: the task's row as the runner last took it, and the
pipeline every change of the task goes through.

Every commit of the runner is fenced by its lease (or, detached, guarded by the
row's version), carries the debounced state (runtime/_state.py) and the webhook
events of a status change, and lands in the order it was made; the row it
leaves is taken at once, so a pause or abort another process wrote on the row
is heard by the commit that follows it. A round's closing commit may be queued
without waiting for it to be durable (`commit_behind`).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from duragent._model_internals import set_field
from duragent.errors import StaleLease
from duragent.runtime._callbacks import EntriesHook
from duragent.runtime._control import Abandoned, Controls
from duragent.runtime._state import Clock, DebouncedState, SaveFn
from duragent.store._commits import Commit, CommitResult, DocumentWrite, PendingCommit, TaskPatch
from duragent.store._protocol import Store
from duragent.store._rules import apply_patch
from duragent.types import NewEntry, Task, TaskStatus, utcnow
from duragent.webhooks import outbox_events

log = logging.getLogger("duragent.engine")

# A task's status changed: (task, old, new). A coroutine function may be given;
# the worker awaits what it returns, one call after another (runtime/_worker.py).
StatusHook = Callable[[Task, TaskStatus, TaskStatus], Awaitable[None] | None]


class Commits:
    """One task's commits, in the order its runner makes them. Owns the task's row
    as last taken (`task`), the lease epoch that fences the commits, the debounced
    state each commit carries, the commit queued behind (`commit_behind`), and the
    reporting of what landed (`on_entries`) and of status changes (`on_status`)."""

    def __init__(
        self,
        store: Store,
        task: Task,
        controls: Controls,
        *,
        state_debounce: float,
        state_max_wait: float,
        detached: bool = False,
        clock: Clock | None = None,
        on_status: StatusHook | None = None,
        on_entries: EntriesHook | None = None,
        acked: int = 0,
    ) -> None:
        self.store = store
        self.task = task
        self.epoch = task.lease.epoch
        self.owner = task.lease.owner  # the worker whose lease fences the commits
        # The last seq of the task a store's answer said is stored (the claim's, a
        # commit's; `acked` if the worker knew of more): every commit asks the store
        # to hold at least that much of the log (`Commit.seen`), so a store that lost
        # acknowledged commits (a failover) refuses it with LostCommits. `lost` once
        # it did: the commit that blocks the task is written on the shorter log.
        self.acked = max(task.last_seq, acked)
        self.lost = False
        # Detached: acting on a task no worker holds (pause/abort of a waiting
        # task); commits are guarded by the row's version instead of a lease.
        self.detached = detached
        self.controls = controls  # a request on a row a commit leaves is heard there
        self.on_status = on_status
        self.on_entries = on_entries  # per-task callbacks (runtime/_callbacks.py), via the worker
        self._reported: PendingCommit | None = None  # the queued commit last told to on_entries
        self.state = DebouncedState(
            {"context": dict(task.context)},
            _saver(weakref.ref(self)),
            debounce=state_debounce,
            max_wait=state_max_wait,
            clock=clock,
        )
        self._lock = asyncio.Lock()
        self._behind: PendingCommit | None = None  # a round's closing commit, still syncing
        self._unless_behind = (task, task)  # the row before it, and as taken after it

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
        async with self._lock:  # one task's commits land in the order it made them
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
        self.acked = max(self.acked, row.last_seq)
        if self.on_entries is not None:
            # In the order they landed: the commit queued behind first (its own
            # done-callback may run only later), then this one's, before the
            # status change they lead to.
            self._report_behind(commit.after)
            if result.entries:
                self.on_entries(row, result.entries)
        self.took(row)
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
            owner=None if self.detached else self.owner,
            seen={} if self.detached or self.lost else {self.task.id: self.acked},
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
        if commit_soon is None or self.detached or self._lock.locked():
            return None
        commit, state = self._make_commit(entries, patch)
        pending: PendingCommit = commit_soon(commit)
        self._behind = pending
        [own] = commit.patches
        predicted, status_entry = apply_patch(self.task, own, utcnow())  # a copy of its own
        added = len(commit.entries) + (status_entry is not None)
        set_field(predicted, "last_seq", predicted.last_seq + added)
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
        self.acked = max(self.acked, landed.tasks[self.task.id].last_seq)
        self._report_behind(pending)
        if self._behind is not pending:
            return  # a later commit was queued or made since: its row is the one to take
        self._behind = None
        row = landed.tasks[self.task.id]
        if row.version >= self.task.version:  # a message may have moved it further
            self.took(row)

    async def caught_up(self) -> None:
        """Wait until every commit asked for so far has landed (the one queued behind)."""
        async with self._lock:
            await self._caught_up()

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

    def took(self, row: Task) -> None:
        """Take the row a commit left: a control request or a status change on it."""
        old = self.task.status
        self.task = row
        if row.control:
            self.controls.hear_row(row.control)
        if row.status != old and self.on_status is not None:
            self.on_status(row, old, row.status)

    async def save_state(self, snapshot: dict[str, Any]) -> None:
        try:
            await self.commit(patch={"context": snapshot["context"]})
        except Abandoned:
            log.info("task %s: lease lost while saving state", self.task.id)


def _saver(commits: weakref.ref[Commits]) -> SaveFn:
    """The runner's state saver, holding its commits weakly. Their bound
    `save_state` would close a reference cycle (commits -> state -> commits),
    and a finished runner's commits would then live on until the collector's
    next full collection instead of going when their last reference does. A
    runner nobody holds any more has closed its state (_engine.py), so there is
    nothing left to save."""

    async def save(snapshot: dict[str, Any]) -> None:
        alive = commits()
        if alive is not None:
            await alive.save_state(snapshot)

    return save
