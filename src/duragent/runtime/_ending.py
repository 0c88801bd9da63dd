"""How a task runner's task stops and ends: paused, aborted, failed at its
deadline, handed back, completed or blocked.

A stop at a safe point, a stop while tools run, and a stop of a task nobody
runs (`stop_now`) all end here; a pause with rollback takes the open round out
of the model's view (runtime/_log.py `rollback`), an interrupt (a pause that
goes on, runtime/_inbox.py) leaves the task running. A sub-task's end and its
parent's tool result land in one commit.
"""

from __future__ import annotations

from typing import Any

from duragent.errors import Conflict
from duragent.runtime._calls import tool_result_text
from duragent.runtime._commits import Commits
from duragent.runtime._control import Control, Controls, cancelled
from duragent.runtime._inbox import cut_plan
from duragent.runtime._log import notice, read_round, result_entries, rollback, ui_entry
from duragent.runtime._open_round import OpenRound
from duragent.runtime._waits import child_resolution, open_round
from duragent.types import BlockReason, FailReason, NewEntry, Task, TaskStatus, UIError


class Ending:
    """The ways one runner's task stops or ends, each written as commits of its
    runner (`commits`); an interrupt, once stopped, is told to `controls`."""

    def __init__(self, commits: Commits, controls: Controls) -> None:
        self.commits = commits
        self.controls = controls
        self.store = commits.store
        self.commit = commits.commit

    @property
    def task(self) -> Task:
        return self.commits.task

    async def stop_now(self, control: Control) -> Task:
        """Pause or abort a task nobody is running, from what its log says."""
        t = self.task
        rs = await open_round(self.store, t)
        rnd = OpenRound.from_log(rs, list(rs.progress_seqs))
        entries: list[NewEntry] = []
        if control.action in ("abort", "deadline"):
            for cid in rs.missing:  # every call keeps exactly one result
                text = cancelled(control, "before it finished")
                entries += result_entries(t.id, rs.round, cid, text, "interrupted")
        await self.stop(control, entries, rnd)
        return self.task

    async def stop(
        self,
        control: Control,
        entries: list[NewEntry] | None = None,
        rnd: OpenRound | None = None,
    ) -> None:
        """Stop the task as `control` asks (after `entries`); `rnd`, the round it has open."""
        tid, r = self.task.id, self.task.iterations + 1
        entries = list(entries or [])
        if control.action == "release":
            entries.append(notice(tid, r, "The worker stopped; the task goes back to the queue."))
            await self.commit(entries, {"status": TaskStatus.PENDING, "control": None})
            return
        if control.action == "abort":
            entries.append(notice(tid, r, control.reason or "Aborted."))
            await self.finish(
                TaskStatus.ABORTED, entries=entries, error=control.reason or "aborted"
            )
            return
        if control.action == "deadline":
            error = control.reason or "deadline exceeded"
            extra = {"status_reason": FailReason.DEADLINE.value}
            await self.finish(TaskStatus.FAILED, entries=entries, error=error, extra=extra)
            return
        if control.resume and self.task.status is not TaskStatus.RUNNING:
            # Parked just as asked: the wait is cut short as a message sent to a
            # waiting task cuts it (runtime/_inbox.py), unless it is for a sub-task.
            await self._cut_parked_wait(control)
            self.controls.resumed(control)
            return
        if control.rollback and rnd is not None and rnd.progress:
            entries.append(rnd.void_progress(tid, r, "paused with rollback"))
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
                self.commits.task = await self.store.get_task(tid)
                mine = self.task.control is None or self.task.control.get("token") == control.token
                patch = {"control": None} if mine else {}
                version = self.task.version
            kept: list[str] = []
            if (
                control.rollback
                and rnd is not None
                and rnd.api_seqs
                and self.task.iterations < rnd.number
            ):
                kept, planned = await self._roll_back_round(r, rnd, todo, patch, control)
                if version is not None and planned != version:
                    continue  # the row moved since it was read: read and plan again
                version = planned
            try:
                await self._commit_stop(control, todo, patch, kept, version)
                break
            except Conflict:
                if version is None or self.commits.detached:
                    raise  # a detached stop is retried from the top by Runtime._stop
                # Written meanwhile (a message came in, a control request): plan
                # again (the void range too), from the row as it is now.
        if control.resume:
            self.controls.resumed(control)

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
                self.commits.task = await self.store.get_task(self.task.id)  # a message came in
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

    async def _roll_back_round(
        self,
        r: int,
        rnd: OpenRound,
        entries: list[NewEntry],
        patch: dict[str, Any],
        control: Control,
    ) -> tuple[list[str], int]:
        """Add to `entries` what takes round r out of the model's view (log.rollback);
        returns the calls kept in it, by name, and the row version the plan holds for.

        The void range ends at the seq `entries` will end at, so it is planned from
        the row as stored: others append too (a message sent in), and the commit
        must be refused (Conflict) if one did since."""
        row = await self.store.get_task(self.task.id)
        rs = read_round(await self.store.entries(self.task.id, after_seq=self.task.round_seq), r)
        first, last = min(rnd.api_seqs), row.last_seq
        # A rollback with resume is a new message's (Runtime.send(..., rollback)).
        new_message = control.resume
        cause = "a new message came in" if new_message else "the task was paused"
        reason = "a new message" if new_message else "paused with rollback"
        plan = rollback(self.task.id, rs, first, last, entries, reason, cause=cause)
        entries += plan.entries
        if plan.closes_round:
            patch["iterations"] = r
        return [f"{c.function.name} ({c.id})" for c in plan.kept], row.version

    async def finish(
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
            content, outcome = tool_result_text((extra or {}).get("output", self.task.output)), "ok"
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

    async def block(self, reason: BlockReason, message: str) -> None:
        r = self.task.iterations + 1
        await self.commit(
            [ui_entry(self.task.id, r, UIError(message="The task is blocked.", detail=message))],
            {"status": TaskStatus.BLOCKED, "status_reason": reason.value, "error": message},
        )
