"""Durable steps inside a tool: `await ctx.step("charge", fn, *args)`.

Each step's result is committed (an entry of the call's round, fenced by the
task's lease) as soon as the step returns. When a tool call is run again after
a crash (`replay="safe"` or `replay="resume"`), a step already recorded is not
run again: its recorded result is returned. A step that had started and was
not recorded follows the same rule as a tool call: run again only if it is
safe, otherwise the call ends with an "interrupted in step X" result.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from duragent._payloads import StepCheckpoint
from duragent.errors import InvalidOption, InvalidType, StepFailed
from duragent.runtime._host import StepHost
from duragent.runtime._log import step_entry, step_started_entry


@dataclass
class StepRecord:
    """What the log says about the steps of one call before this run of it."""

    done: dict[str, StepCheckpoint] = field(default_factory=dict)
    started: set[str] = field(default_factory=set)


class StepInterrupted(BaseException):
    """A step that is not safe to repeat was cut off by a crash; the call must stop.

    A BaseException, like cancellation, so a tool's `except Exception` cannot
    swallow it and carry on into the steps after it.
    """

    def __init__(self, step: str, completed: list[str]) -> None:
        super().__init__(step)
        self.step = step
        self.completed = completed

    def message(self) -> str:
        done = ", ".join(repr(s) for s in self.completed) or "none"
        return (
            f"Tool call interrupted in step {self.step!r}: the process running it stopped after "
            "the step began and before its result was saved. It may or may not have taken "
            "effect; it was not re-run because it is not marked safe. Steps completed before "
            f"it: {done}."
        )


def as_json(step: str, value: Any) -> Any:
    """The value as stored, so a first run returns exactly what a replay returns."""
    if hasattr(value, "model_dump"):
        value = value.model_dump(mode="json")
    try:
        return json.loads(json.dumps(value, ensure_ascii=False))
    except (TypeError, ValueError) as exc:
        raise InvalidType(
            f"step {step!r} returned a {type(value).__name__}, which cannot be stored as JSON; "
            "return JSON data (dict, list, str, number, bool or None) or a pydantic model"
        ) from exc


@dataclass
class CallSteps:
    """The steps of one run of one tool call (what `ToolContext.step` runs)."""

    host: StepHost
    task_id: str
    round: int
    call_id: str
    replay: str  # the tool's replay policy: "never", "safe" or "resume"
    record: StepRecord = field(default_factory=StepRecord)
    names: list[str] = field(default_factory=list)  # the steps of this run, in order

    async def run(
        self,
        name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        safe: bool | None,
    ) -> Any:
        host, record = self.host, self.record
        if not isinstance(name, str) or not name:
            raise InvalidOption("a step needs a non-empty name")
        if name in self.names:
            raise InvalidOption(
                f"step {name!r} ran twice in call {self.call_id}; steps are keyed by call and "
                "name, so give each step of a call its own name (e.g. f'charge-{i}')"
            )
        self.names.append(name)
        done = record.done.get(name)
        if done is not None:
            if "error" in done:
                raise StepFailed(name, done["error"])
            return done.get("value")
        # A step is as safe as its tool unless it says otherwise.
        repeatable = safe if safe is not None else self.replay == "safe"
        tid, r, cid = self.task_id, self.round, self.call_id
        if name in record.started and not repeatable:
            raise StepInterrupted(name, [s for s in self.names[:-1] if s in record.done])
        if not repeatable:
            # Intent before effect: a crash from here on is seen as "started, not recorded".
            await host.commit([step_started_entry(tid, r, cid, name)])
        try:
            if inspect.iscoroutinefunction(fn):
                value = await fn(*args, **kwargs)
            else:
                value = await asyncio.to_thread(fn, *args, **kwargs)
                if inspect.isawaitable(value):
                    value = await value
            stored = as_json(name, value)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            await host.commit([step_entry(tid, r, cid, name, error=error)])
            # The same exception type on the first run as on a replay of the record.
            raise StepFailed(name, error) from exc
        await host.commit([step_entry(tid, r, cid, name, value=stored)])
        await host.trace_point("step", call_id=cid, step=name)
        return stored
