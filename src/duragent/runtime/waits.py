"""Answering a parked task: a person's input, an approval, a finished sub-task.

Whoever answers commits the call's result (or the approval decision) and the
task's next status in one commit, guarded by the task's version so two
answers can never both land.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from duragent.errors import Conflict, UsageError
from duragent.runtime.deadlines import wake_time
from duragent.runtime.log import decision_entry, read_round, result_entries, wait_reason
from duragent.store.base import Store, TaskPatch
from duragent.types import NewEntry, Task, TaskStatus


async def open_waits(store: Store, task: Task) -> dict[str, dict[str, Any]]:
    rs = read_round(await store.entries(task.id, after_seq=task.round_seq), task.iterations + 1)
    return rs.open_waits


async def resolution(
    store: Store,
    task: Task,
    call_id: str,
    *,
    content: str | None = None,
    outcome: str = "ok",
    decision: tuple[bool, str | None] | None = None,
) -> tuple[list[NewEntry], TaskPatch]:
    """The entries and task patch that answer one open wait of `task`."""
    if task.status not in (TaskStatus.WAITING, TaskStatus.PAUSED):
        raise Conflict(f"task {task.id!r} is {task.status.value}, not waiting for an answer")
    r = task.iterations + 1
    rs = read_round(await store.entries(task.id, after_seq=task.round_seq), r)
    if call_id not in rs.open_waits:
        raise UsageError(f"task {task.id!r} has no open wait for call {call_id!r}")
    entries: list[NewEntry] = []
    if decision is not None:
        entries.append(decision_entry(task.id, r, call_id, decision[0], decision[1]))
    if content is not None:
        entries += result_entries(task.id, r, call_id, content, outcome)
    guard = {"expect_status": [task.status], "expect_version": task.version}
    if task.status is TaskStatus.PAUSED:
        # Record the answer; the task stays paused and sees it when resumed.
        return entries, TaskPatch(task.id, {}, **guard)  # type: ignore[arg-type]
    left = {c: w for c, w in rs.open_waits.items() if c != call_id}
    if left:
        timers = [
            datetime.fromisoformat(w["wake_at"]) for w in left.values() if w["wait"] == "timer"
        ]
        changes: dict[str, Any] = {
            "status": TaskStatus.WAITING,
            "status_reason": wait_reason(left),
            "wake_at": wake_time(task, timers),  # a deadline wakes it too
        }
    else:
        missing = [c for c in rs.missing if not (c == call_id and content is not None)]
        changes = {"status": TaskStatus.PENDING, "wake_at": None}
        if not missing:
            changes["iterations"] = r  # that was the round's last result
    return entries, TaskPatch(task.id, changes, **guard)  # type: ignore[arg-type]


async def child_resolution(
    store: Store, child: Task, content: str, outcome: str
) -> tuple[list[NewEntry], list[TaskPatch]]:
    """What a finishing sub-task commits to its parent (nothing if the parent moved on)."""
    if child.parent_id is None:
        return [], []
    parent = await store.get_task(child.parent_id)
    if parent.status.terminal:
        return [], []
    for call_id, wait in (await open_waits(store, parent)).items():
        if wait["wait"] == "subtask" and wait.get("child_id") == child.id:
            entries, patch = await resolution(
                store, parent, call_id, content=content, outcome=outcome
            )
            return entries, [patch]
    return [], []
