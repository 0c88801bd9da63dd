"""Approvals a person decides: with edited arguments, before a time limit, several at once.

A decision is a `decision` checkpoint committed with the task's next status
(runtime/_waits.py). An approval with edited arguments records them in that
checkpoint; the worker runs the call with them, and the call's result tells
the model the arguments were changed, so the assistant message the model sees
stays as it was and each call is still answered exactly once. An approval with
a time limit records when it expires in its wait entry and sets the task's
`wake_at`, the durable timer a worker claims the task on (like `ctx.sleep`);
the claiming worker then denies the call with a reason the model sees.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from duragent._payloads import WaitCheckpoint
from duragent.errors import Conflict, InvalidArguments, ToolArgumentError, UsageError
from duragent.runtime._tools import Tool
from duragent.types import JSON, utcnow


class Decision(BaseModel):
    """A person's decision on one approval: allow (optionally with other arguments) or deny."""

    model_config = ConfigDict(extra="forbid")

    approve: bool = Field(description="Allow or deny the call.")
    reason: str | None = Field(default=None, max_length=2000, description="Why; the model sees it.")
    arguments: dict[str, JSON] | None = Field(
        default=None,
        description="Run the call with these arguments instead of the model's (approve only; "
        "checked against the tool's schema).",
    )

    @model_validator(mode="after")
    def _arguments_need_approval(self) -> Decision:
        if self.arguments is not None and not self.approve:
            raise ValueError("arguments go with approve=true only: a denied call does not run")
        return self


def say_duration(seconds: float) -> str:
    """600 -> '10 minutes', 3600 -> '1 hour', 1.5 -> '1.5 seconds'."""
    for unit, size in (("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            n = int(seconds // size)
            return f"{n} {unit}{'s' if n != 1 else ''}"
    return f"{seconds:g} second{'s' if seconds != 1 else ''}"


def expired(wait: WaitCheckpoint, now: datetime | None = None) -> bool:
    """An approval whose time limit has passed."""
    at = wait.get("expires_at")
    return at is not None and datetime.fromisoformat(at) <= (now or utcnow())


def expired_text(wait: WaitCheckpoint) -> str:
    limit = wait.get("timeout")
    within = f" within {say_duration(float(limit))}" if limit else " in time"
    return f"The call was denied: no decision{within} (the approval expired)."


def edited_note(arguments: dict[str, Any]) -> str:
    shown = json.dumps(arguments, ensure_ascii=False, sort_keys=True)
    return (
        f"Note: a person edited this call's arguments before approving it; it ran with {shown}.\n"
    )


def wake_times(waits: Iterable[WaitCheckpoint]) -> list[datetime]:
    """When a worker must claim a task parked on these waits: its timers and expiries
    (`deadlines.wake_time` adds the task's deadline and takes the first)."""
    times = [w.get("wake_at") for w in waits if w["wait"] == "timer"]
    times += [w.get("expires_at") for w in waits if w["wait"] == "approval"]
    return [datetime.fromisoformat(t) for t in times if t]


def decision_payload(
    call_id: str,
    wait: WaitCheckpoint,
    decision: Decision,
    *,
    tool: Tool | None,
    tool_name: str,
    arguments: dict[str, Any],
) -> dict[str, Any]:
    """The decision checkpoint's fields for one approval, checked; nothing is written.

    `arguments` are the model's; an edit equal to them is a plain approval.
    """
    if expired(wait):
        raise Conflict(
            f"the approval of call {call_id!r} expired at {wait['expires_at']}: the call is "
            "denied, and the task goes on as soon as a worker takes it"
        )
    out: dict[str, Any] = {"approved": decision.approve, "reason": decision.reason}
    if decision.arguments is None or decision.arguments == arguments:
        return out
    if tool is None:
        raise UsageError(
            f"cannot check edited arguments for tool {tool_name!r}: this runtime has no "
            "definition of it; pass the task's agent to Runtime(agents=...) "
            "(duragent approve --agents module:attr)"
        )
    try:
        tool.validate(decision.arguments)
    except ToolArgumentError as exc:
        raise InvalidArguments(f"call {call_id!r}: {exc}") from None
    out["arguments"] = decision.arguments
    return out


__all__ = ["Decision"]
