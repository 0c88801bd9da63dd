"""Deadlines: a wall-clock limit a task carries in its config (durable, no column of its own).

`config["deadline"]` is `{"at": ISO time, "set_at": ISO time, "by": "submit" | "retry" |
"parent"}`: a sub-task inherits its parent's deadline (or keeps its agent's, if earlier).
A runner that holds the task stops it at the deadline (engine: a `deadline`
control, at the next safe point); a task parked in the store (timer, input,
sub-task) or held back by `start_at` has `wake_at` no later than its deadline,
so a worker claims it then, even after every process restarted, and fails it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from duragent.errors import UsageError
from duragent.types import Task, utcnow

# What submit(deadline=...) takes: a time (timezone-aware), or a delay from now.
DeadlineSpec = datetime | timedelta | float | int

# Far enough for any task, near enough that every store and calendar holds the time.
MAX_DELAY = timedelta(days=10 * 365)


def deadline_at(value: DeadlineSpec, now: datetime | None = None) -> datetime:
    """The time a deadline given as a time or a delay (a timedelta, or seconds) falls on."""
    now = now or utcnow()
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise UsageError(
                "deadline must be timezone-aware (e.g. datetime.now(UTC) + ...), a timedelta "
                "or a number of seconds"
            )
        try:
            return value.astimezone(UTC)
        except (OverflowError, ValueError):
            raise UsageError(f"deadline {value.isoformat()} is past any calendar") from None
    if isinstance(value, bool) or not isinstance(value, timedelta | int | float):
        raise UsageError(
            f"deadline is a datetime, a timedelta or a number of seconds, not {value!r}"
        )
    if isinstance(value, timedelta):
        delay = value
        positive = delay > timedelta(0)
    else:
        if not math.isfinite(value):
            raise UsageError(f"deadline must be a finite number of seconds, not {value!r}")
        delay = timedelta(seconds=min(float(value), MAX_DELAY.total_seconds() + 1))
        positive = value > 0  # 1e-9 s is a deadline, due at once
    if not positive:
        raise UsageError(f"a deadline given as a delay must be positive, not {value!r}")
    if delay > MAX_DELAY:
        raise UsageError("a deadline may be at most 10 years away")
    return now + delay


def deadline_record(at: datetime, by: str, now: datetime | None = None) -> dict[str, Any]:
    """What config["deadline"] holds."""
    return {"at": at.isoformat(), "set_at": (now or utcnow()).isoformat(), "by": by}


def task_deadline(task: Task) -> datetime | None:
    return task.deadline


def exceeded(task: Task) -> str:
    """The error a task that ran out of time ends with."""
    record = task.config.get("deadline") or {}
    at = task_deadline(task)
    if at is None:  # pragma: no cover - only called for a task with a deadline
        return "deadline exceeded"
    set_at = record.get("set_at")
    after = ""
    if record.get("by") == "parent":
        after = " (the parent task's deadline)"
    elif set_at:
        seconds = (at - datetime.fromisoformat(str(set_at))).total_seconds()
        after = f" ({round(seconds, 3):g} s after {record.get('by') or 'submit'})"
    return f"deadline exceeded: {at.isoformat()}{after}"


def wake_time(task: Task, timers: Iterable[datetime]) -> datetime | None:
    """When a parked task must be claimed again: its first timer or its deadline."""
    times = list(timers)
    at = task_deadline(task)
    if at is not None:
        times.append(at)
    return min(times, default=None)


__all__ = ["DeadlineSpec", "deadline_at", "deadline_record", "exceeded", "task_deadline"]
