"""The rules every backend applies, written once: fencing, task patches and
their status entries, what is claimable and in which order, a claim, a lease
renewed or released. `store/_tx.py` applies them inside a backend's transaction."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from duragent._model_internals import updated, validated_set
from duragent.errors import Conflict, InvalidOption, LostCommits, StaleLease
from duragent.store._commits import TaskPatch
from duragent.types import (
    PATCHABLE,
    EntryKind,
    NewEntry,
    Task,
    TaskStatus,
    Usage,
    check_transition,
)


def check_fence(task: Task, epoch: int, owner: str | None = None) -> None:
    """The lease is still the one held at `epoch`, and not held by a worker other
    than `owner` (given): after an asynchronous failover lost a claim, another
    worker's claim can repeat an epoch on the promoted server, and only the
    owner tells the two apart. A lease given back (no owner) is judged by its
    epoch alone, as before."""
    if task.lease.epoch != epoch:
        raise StaleLease(task.id, epoch, task.lease.epoch)
    if owner is not None and task.lease.owner not in (None, owner):
        raise StaleLease(task.id, epoch, task.lease.epoch, holder=task.lease.owner)


def check_seen(task: Task, seq: int) -> None:
    """A task's log only grows: one that ends before `seq`, which the writer was
    told is committed, lost commits (a failover to a replica that lacked them)."""
    if task.last_seq < seq:
        raise LostCommits(task.id, task.last_seq, seq)


def apply_patch(task: Task, patch: TaskPatch, now: datetime) -> tuple[Task, NewEntry | None]:
    """Return the patched task and, when the status changed, the status entry to log."""
    if patch.expect_status is not None and task.status not in patch.expect_status:
        raise Conflict(
            f"task {task.id!r} is {task.status.value}, expected "
            + " or ".join(TaskStatus(s).value for s in patch.expect_status)
        )
    if patch.expect_version is not None and task.version != patch.expect_version:
        raise Conflict(
            f"task {task.id!r} is at version {task.version}, expected {patch.expect_version}"
        )
    unknown = set(patch.set) - PATCHABLE
    if unknown:
        raise InvalidOption(f"these task fields cannot be patched: {sorted(unknown)}")
    changes = dict(patch.set)
    status_entry = None
    if "status" in changes:
        new_status = TaskStatus(changes["status"])
        reason = changes.get("status_reason")
        if new_status != task.status or reason != task.status_reason:
            check_transition(task.status, new_status, reason)
            status_entry = status_change_entry(task, new_status, reason, changes.get("error"))
            changes.setdefault("status_reason", None)
            if new_status is TaskStatus.PAUSED:
                changes.setdefault("paused_at", now)
            if new_status.terminal:
                changes.setdefault("completed_at", now)
                changes.setdefault("control", None)
    changes["updated_at"] = now
    changes["version"] = task.version + 1
    # Values already of their field's type are taken as they are (the common
    # case, checked cheaply here); any other is validated as its field's type,
    # so a patch of "waiting" or a usage dict is stored as TaskStatus / Usage,
    # exactly like a fresh task.
    plain = {k: v for k, v in changes.items() if _is_typed(k, v)}
    patched = updated(task, plain)
    for name, value in changes.items():
        if name not in plain:
            validated_set(patched, name, value)
    return patched, status_entry


def _is_typed(name: str, value: Any) -> bool:
    """True when `value` is already what validating it as task field `name` gives."""
    kind = _FIELD_KINDS.get(name)
    if kind is None:
        return False
    if value is None:
        return name in _NULLABLE
    if kind is datetime:
        return type(value) is datetime and value.tzinfo is not None
    if kind is dict:
        return type(value) is dict and all(type(k) is str for k in value)
    if kind is object:
        return True  # JSON: anything
    return type(value) is kind


_FIELD_KINDS: dict[str, type] = {
    "status": TaskStatus,
    "status_reason": str,
    "error": str,
    "iterations": int,
    "restarts": int,
    "round_seq": int,
    "version": int,
    "updated_at": datetime,
    "paused_at": datetime,
    "completed_at": datetime,
    "wake_at": datetime,
    "config": dict,
    "context": dict,
    "control": dict,
    "output": object,
    "input": object,
    "usage": Usage,
}
_NULLABLE = frozenset(
    {"status_reason", "error", "paused_at", "completed_at", "wake_at", "control", "output", "input"}
)


def status_change_entry(
    task: Task, new: TaskStatus, reason: str | None, error: str | None = None, **extra: Any
) -> NewEntry:
    payload: dict[str, Any] = {"from": task.status.value, "to": new.value, **extra}
    if reason is not None:
        payload["reason"] = reason
    if error is not None:
        payload["error"] = error
    return NewEntry(task_id=task.id, kind=EntryKind.STATUS, payload=payload)


def claimable(task: Task, now: datetime) -> bool:
    """Runnable = pending, running with an expired lease, or waiting with its wake-up due
    (a `ctx.sleep`, an approval's time limit or a deadline: `wake_at` is the first of them)."""
    if task.status is TaskStatus.PENDING:
        return task.wake_at is None or task.wake_at <= now  # a delayed start waits
    if task.status is TaskStatus.RUNNING:
        return task.lease.expires_at is None or task.lease.expires_at <= now
    return task.status is TaskStatus.WAITING and task.wake_at is not None and task.wake_at <= now


def claim_order(task: Task) -> tuple[int, float, str]:
    """The order claims take runnable tasks in: higher priority first, then oldest."""
    return (-task.priority, task.created_at.timestamp(), task.id)


def claim(task: Task, worker_id: str, ttl: float, now: datetime) -> tuple[Task, NewEntry]:
    """The task as a new owner holds it, and the status entry recording the claim.

    Raises InvalidTransition for a task that may not run (paused, blocked or
    ended): a takeover is running -> running, a claim pending or waiting -> running.
    """
    check_transition(task.status, TaskStatus.RUNNING)
    takeover = task.status is TaskStatus.RUNNING
    restarts = task.restarts + (1 if takeover else 0)
    lease = updated(
        task.lease,
        {
            "owner": worker_id,
            "expires_at": now + timedelta(seconds=ttl),
            "epoch": task.lease.epoch + 1,
        },
    )
    entry = status_change_entry(
        task,
        TaskStatus.RUNNING,
        None,
        worker=worker_id,
        epoch=lease.epoch,
        takeover=takeover,
    )
    changes: dict[str, Any] = {
        "status": TaskStatus.RUNNING,
        "status_reason": None,
        "wake_at": None,
        "restarts": restarts,
        "lease": lease,
        "updated_at": now,
        "version": task.version + 1,
    }
    if task.control and task.control.get("action") == "release":
        # A release asks the holder at the time to hand the task back (a
        # migration's, runtime/_versions.py): a new claim is past it.
        changes["control"] = None
    return updated(task, changes), entry


def renewed(task: Task, worker_id: str, epoch: int, ttl: float, now: datetime) -> Task:
    check_fence(task, epoch)
    if task.lease.owner != worker_id:
        raise StaleLease(task.id, epoch, task.lease.epoch)
    lease = updated(task.lease, {"expires_at": now + timedelta(seconds=ttl)})
    return updated(task, {"lease": lease})


def released(task: Task, epoch: int, now: datetime) -> tuple[Task, NewEntry | None]:
    """Drop the lease; a task still `running` goes back to `pending` for the next worker."""
    check_fence(task, epoch)
    update: dict[str, Any] = {"lease": updated(task.lease, {"owner": None})}
    entry = None
    if task.status is TaskStatus.RUNNING:
        check_transition(task.status, TaskStatus.PENDING)
        entry = status_change_entry(task, TaskStatus.PENDING, None, released=True)
        update.update(status=TaskStatus.PENDING, updated_at=now, version=task.version + 1)
    return updated(task, update), entry


def check_new_child(task: Task) -> None:
    if task.status is not TaskStatus.PENDING:
        raise InvalidOption(f"new task {task.id!r} must start pending, not {task.status.value}")
