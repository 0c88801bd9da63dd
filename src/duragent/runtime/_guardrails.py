"""Guardrails: checks of a task's input and of its final answer, each verdict committed.

`Agent(input_guardrails=[...], output_guardrails=[...])` takes plain functions,
sync or async, of one argument (the task's input; the final answer, typed when
the agent has an `output_type`) that return a `GuardrailResult` (None: passed).
They run in order and stop at the first that trips. Each verdict is a
`guardrail` checkpoint, committed before anything acts on it, naming the entry it
checked (`checked_seq`); a runner that finds a verdict in the log uses it and never
runs that guardrail again on that entry (runtime/_final.py).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from duragent._payloads import GuardrailCheckpoint, Stage, checkpoint_of, stored
from duragent._storable import check_storable
from duragent.errors import InvalidOption
from duragent.types import Entry, EntryKind, NewEntry

GuardrailAction = Literal["fail", "correct"]


@dataclass(frozen=True, kw_only=True)
class GuardrailResult:
    """A guardrail's verdict. `tripwire=True` stops the answer: `action="fail"` fails
    the task with `message` as its reason; `"correct"` sends `message` to the model
    (as a user message) and lets it go on. `info` (JSON) is kept with the verdict."""

    tripwire: bool = False
    message: str = ""
    action: GuardrailAction = "fail"
    info: Any = None

    def __post_init__(self) -> None:
        if self.action not in ("fail", "correct"):
            raise InvalidOption(
                f'GuardrailResult.action is "fail" or "correct", not {self.action!r}'
            )
        if self.tripwire and self.action == "correct" and not self.message:
            raise InvalidOption("a GuardrailResult that corrects the model needs a message")


Guardrail = Callable[[Any], "GuardrailResult | Awaitable[GuardrailResult | None] | None"]


def named_guardrails(guardrails: Sequence[Guardrail], stage: Stage) -> dict[str, Guardrail]:
    """The guardrails by name (their function's), in order; two of one name are refused,
    since a verdict in the log names its guardrail."""
    named: dict[str, Guardrail] = {}
    for g in guardrails:
        if not callable(g):
            raise InvalidOption(f"Agent.{stage}_guardrails holds functions, not {g!r}")
        name = str(getattr(g, "__name__", type(g).__name__))
        if name in named:
            raise InvalidOption(f"Agent.{stage}_guardrails has two guardrails named {name!r}")
        named[name] = g
    return named


async def run_guardrail(name: str, fn: Guardrail, value: Any) -> GuardrailResult:
    """One guardrail's verdict on `value`; one that raises or answers something else
    trips (the task fails), since an unchecked answer must not pass."""
    try:
        if inspect.iscoroutinefunction(fn):
            result = await fn(value)
        else:
            result = await asyncio.to_thread(fn, value)  # a sync one never blocks the loop
            if inspect.isawaitable(result):
                result = await result
    except Exception as exc:
        return GuardrailResult(
            tripwire=True, message=f"guardrail {name} raised {type(exc).__name__}: {exc}"
        )
    if result is None:
        return GuardrailResult()
    if not isinstance(result, GuardrailResult):
        return GuardrailResult(
            tripwire=True, message=f"guardrail {name} returned {result!r}, not a GuardrailResult"
        )
    try:
        check_storable(result.info, f"guardrail {name}'s info")
    except Exception as exc:
        return GuardrailResult(tripwire=True, message=str(exc))
    return result


def verdict_entry(
    task_id: str, rnd: int, stage: Stage, name: str, checked_seq: int, result: GuardrailResult
) -> NewEntry:
    payload = GuardrailCheckpoint(
        type="guardrail",
        stage=stage,
        name=name,
        checked_seq=checked_seq,
        tripwire=result.tripwire,
        message=result.message,
        action=result.action,
    )
    if result.info is not None:
        payload["info"] = result.info
    return NewEntry(task_id=task_id, kind=EntryKind.CHECKPOINT, round=rnd, payload=stored(payload))


def committed_verdicts(
    entries: Iterable[Entry], stage: Stage, checked_seq: int
) -> dict[str, GuardrailCheckpoint]:
    """The verdicts in `entries` on entry `checked_seq`, by guardrail name."""
    out: dict[str, GuardrailCheckpoint] = {}
    for e in entries:
        if e.kind is not EntryKind.CHECKPOINT:
            continue
        c = checkpoint_of(e)
        if c["type"] == "guardrail" and c["stage"] == stage and c["checked_seq"] == checked_seq:
            out[c["name"]] = c
    return out


def as_result(verdict: GuardrailCheckpoint) -> GuardrailResult:
    return GuardrailResult(
        tripwire=verdict["tripwire"],
        message=verdict["message"],
        action=verdict["action"],
        info=verdict.get("info"),
    )


def tripped_text(stage: Stage, name: str, result: GuardrailResult) -> str:
    """The task's error when a guardrail fails it."""
    what = "input" if stage == "input" else "output"
    return f"{what} guardrail {name} tripped: {result.message or 'no reason given'}"
