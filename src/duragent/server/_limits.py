"""What one client may ask of the service: body sizes, streams, wrong tokens, time.

Every limit has a `duragent serve` option of the same name; the defaults keep a
hostile or broken client from taking memory, file descriptors or the log away
from everyone else, and stay out of the way of ordinary use.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fastapi.exceptions import RequestValidationError

from duragent._storable import MAX_JSON_DEPTH
from duragent.errors import InvalidOption, UsageError

KB = 1024
MB = 1024 * KB


@dataclass(frozen=True)
class ServerLimits:
    max_body: int = 1 * MB
    """Bytes of one request body; more is answered 413 before the rest is read."""
    max_input: int = 512 * KB
    """Bytes of a task's `input` as JSON text; more is answered 422."""
    max_context: int = 64 * KB
    """Bytes of a task's `context` as JSON text; more is answered 422."""
    max_metadata: int = 4 * KB
    """Bytes of a task's or schedule's `metadata` as JSON text; more is answered 422
    (metadata is in every row of a task list)."""
    max_page: int = 2 * MB
    """Bytes of one page of a task list, roughly; past it the page ends early, with a
    next_cursor for the rest."""
    max_schedules: int = 100
    """Schedules one user may have; one more is answered 409."""
    max_schedule_ticks_per_minute: int = 60
    """Ticks per minute one user's schedules may fire together (each submits a task):
    sum of 60/every, a cron schedule counting 1."""
    max_depth: int = MAX_JSON_DEPTH
    """Levels of nesting in any JSON body; deeper is answered 422."""
    streams_per_user: int = 32
    """Event streams (`/events`) one user may hold open at once; one more is answered 429."""
    auth_failures_per_minute: int = 30
    """Wrong tokens one client address may send in a minute before it is answered 429."""

    def __post_init__(self) -> None:
        for name in (
            "max_body",
            "max_input",
            "max_context",
            "max_metadata",
            "max_page",
            "max_schedules",
            "max_schedule_ticks_per_minute",
            "max_depth",
            "streams_per_user",
            "auth_failures_per_minute",
        ):
            if getattr(self, name) < 1:
                raise InvalidOption(f"ServerLimits.{name} must be at least 1")


class LimitReached(UsageError):
    """A user asked for more than their share (schedules, ticks): 409, saying which limit."""


def human_bytes(n: int) -> str:
    if n >= MB and n % MB == 0:
        return f"{n // MB} MB"
    if n >= KB and n % KB == 0:
        return f"{n // KB} KB"
    return f"{n} bytes"


MAX_SEQ = 2**63 - 1
"""The largest seq (Last-Event-ID, `after`) a store can compare with: a signed 64-bit integer."""


def json_size(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))


def check_task_sizes(
    input: Any,
    context: dict[str, Any] | None,
    limits: ServerLimits,
    metadata: dict[str, Any] | None = None,
) -> None:
    """422 naming the field when a task's input, context or metadata is larger than
    the limits."""
    errors = []
    for name, value, limit, option in (
        ("input", input, limits.max_input, "--max-input"),
        ("context", context, limits.max_context, "--max-context"),
        ("metadata", metadata, limits.max_metadata, "--max-metadata"),
    ):
        if value is None:
            continue
        size = json_size(value)
        if size > limit:
            errors.append(
                {
                    "loc": ("body", name),
                    "msg": f"is {size} bytes as JSON; this server takes at most "
                    f"{human_bytes(limit)} (serve {option})",
                    "type": "too_large",
                }
            )
    if errors:
        raise RequestValidationError(errors)
