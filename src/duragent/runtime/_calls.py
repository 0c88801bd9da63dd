"""One tool call: run it, or decide from the log what became of it after a restart."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from duragent._payloads import WaitCheckpoint
from duragent.errors import ToolArgumentError
from duragent.llm._base import parse_arguments
from duragent.runtime._agent import Agent
from duragent.runtime._approvals import edited_note, expired, expired_text
from duragent.runtime._context import (
    FailTask,
    SleepUntil,
    SpawnSubtask,
    Suspend,
    ToolContext,
    WaitForInput,
)
from duragent.runtime._host import TaskHost
from duragent.runtime._log import INTERRUPTED, RoundState, started_entry
from duragent.runtime._steps import StepInterrupted, StepRecord
from duragent.runtime._tools import Tool
from duragent.store._commits import DocumentWrite
from duragent.types import ToolCallData, utcnow

# Replay policies under which a call cut off by a crash is run again: "safe" (the
# whole tool is harmless to repeat) and "resume" (its effects are in ctx.step
# steps, which are skipped once recorded).
RERUN = frozenset({"safe", "resume"})


class CallHost(TaskHost, Protocol):
    """What `run_call` uses of its task's runner (`Rounds`, runtime/_round.py):
    the task's agent, for its tools, and the agents a sub-task may be spawned for."""

    @property
    def agent(self) -> Agent: ...

    @property
    def agents(self) -> Mapping[str, Agent]: ...

    def called_at(self, call_id: str) -> datetime: ...


@dataclass
class Outcome:
    """What became of a tool call: a result to commit, or a durable wait."""

    call_id: str
    content: str | None = None
    outcome: str = "ok"
    suspend: Suspend | None = None
    documents: Sequence[DocumentWrite] = ()
    handoff: str | None = None  # a handoff taken: the agent it hands the task to


async def run_call(host: CallHost, r: int, call: ToolCallData, rs: RoundState | None) -> Outcome:
    """Run one tool call of round r (or decide it from the log when recovering).

    A call a person approved with edited arguments runs with those, on its
    first run and on any re-run; its result tells the model so.
    """
    decided = rs.decisions.get(call.id) if rs is not None else None
    edited = decided.get("arguments") if decided is not None else None
    out = await _run_call(host, r, call, rs, edited)
    if edited is not None and out.content is not None:
        out.content = edited_note(edited) + out.content
    return out


def approval_request(
    tool: Tool, call: ToolCallData, arguments: dict[str, Any], called_at: datetime | None = None
) -> WaitForInput:
    """The wait that asks a person to approve `call`, with its time limit if the tool has one.

    The limit counts from when the call was made (`called_at`), so an approval
    asked again after a crash (its wait never committed) expires when the first
    asking would have.
    """
    limit = tool.approval_timeout
    start = called_at or utcnow()
    return WaitForInput(
        f"Approve {call.function.name}({call.function.arguments})?",
        "approval",
        tool=call.function.name,
        arguments=arguments,
        timeout=limit,
        expires_at=None if limit is None else start + timedelta(seconds=limit),
    )


async def _run_call(
    host: CallHost,
    r: int,
    call: ToolCallData,
    rs: RoundState | None,
    edited: dict[str, Any] | None,
) -> Outcome:
    cid, name = call.id, call.function.name
    tool = host.agent.tool_map.get(name)
    if tool is None:
        known = ", ".join(sorted(host.agent.tool_map)) or "(none)"
        return Outcome(cid, f"Error: unknown tool {name!r}. Available tools: {known}.", "error")
    try:
        arguments = parse_arguments(call.function.arguments) if edited is None else edited
        tool.validate(arguments)
    except (ValueError, ToolArgumentError) as exc:
        return Outcome(cid, f"Error: {exc}", "error")
    attempt = 1
    if rs is not None and cid in rs.intents:
        decided = await _resumed_call(host, r, call, tool, arguments, rs)
        if isinstance(decided, Outcome):
            return decided
        attempt = decided
    elif tool.needs_approval(arguments):
        return Outcome(cid, suspend=approval_request(tool, call, arguments, host.called_at(cid)))
    return await _invoke(host, r, call, tool, arguments, rs, attempt)


async def _resumed_call(
    host: CallHost,
    r: int,
    call: ToolCallData,
    tool: Tool,
    arguments: dict[str, Any],
    rs: RoundState,
) -> Outcome | int:
    """A call the log already holds an intent for: what became of it (an outcome
    from the log), or the attempt to run it as (an approved call, a safe re-run)."""
    cid = call.id
    wait = rs.waits.get(cid)
    if wait is not None and wait.get("rerun") and cid in rs.decisions:
        return 2  # it asked for the approval itself: it runs again and reads the decision
    if wait is not None and cid not in rs.started:
        resolved = resumed_wait(cid, wait, rs)
        if resolved is not None:
            return resolved
        # Approved: record that it starts, so a crash while it runs is
        # treated like any interrupted call, never silently re-run.
        await host.commit([started_entry(host.task.id, r, cid)])
        return 1
    if wait is None and tool.needs_approval(arguments):
        # Its approval was never asked: the round stopped (a pause, an
        # interrupting message) or crashed before its wait was written, and a
        # call that needs approval never starts before one. Ask now.
        return Outcome(cid, suspend=approval_request(tool, call, arguments, host.called_at(cid)))
    # The call was running when its worker stopped: re-run only if both
    # the stored intent and the current definition say it is safe.
    if tool.asks_only or (rs.intents[cid].get("replay") in RERUN and tool.replay in RERUN):
        return 2  # (a tool that only asks to wait asks again: same question)
    partial = "".join(rs.tool_partial.get(cid, []))
    text = INTERRUPTED + (f" Partial output: {partial}" if partial else "")
    return Outcome(cid, text, "interrupted")


async def _invoke(
    host: CallHost,
    r: int,
    call: ToolCallData,
    tool: Tool,
    arguments: dict[str, Any],
    rs: RoundState | None,
    attempt: int,
) -> Outcome:
    """Run the tool (attempt 1, or 2 for a safe re-run) and say its outcome."""
    cid, name = call.id, call.function.name
    steps = None
    if rs is not None and (cid in rs.steps or cid in rs.steps_started):
        steps = StepRecord(rs.steps.get(cid, {}), rs.steps_started.get(cid, set()))
    ctx = ToolContext(
        host,
        cid,
        r,
        attempt,
        replay=tool.replay,
        steps=steps,
        called_at=host.called_at(cid),
        emitted=committed_events(rs, cid),
    )
    await host.trace_point(
        "tool_start", call_id=cid, tool=name, attempt=attempt, replay=tool.replay
    )
    try:
        value = await tool.invoke(arguments, ctx)
    except asyncio.CancelledError:
        raise
    except StepInterrupted as exc:
        return Outcome(cid, exc.message(), "interrupted", documents=ctx.staged_documents())
    except FailTask:
        raise  # the runner fails the task; the call stays unanswered for a retry
    except TimeoutError as exc:
        # The tool's own limit (asyncio.wait_for raises a bare TimeoutError) is
        # said as such, so the model can try a smaller job; a TimeoutError the
        # tool raised itself, with a message, is reported like any error.
        limit = tool.timeout
        said = (
            timed_out(limit)
            if limit is not None and not str(exc)
            else f"Error: {exception_text(exc)}"
        )
        return Outcome(cid, said, "error", documents=ctx.staged_documents())
    except Exception as exc:
        return Outcome(
            cid, f"Error: {exception_text(exc)}", "error", documents=ctx.staged_documents()
        )
    # The built-in agents (`duragent.bulk`) run no one's sub-tasks.
    mine = sorted(a for a in host.agents if not a.startswith("duragent."))
    if isinstance(value, SpawnSubtask) and value.agent not in mine:
        known = ", ".join(mine)
        return Outcome(
            cid,
            f"Error: no agent named {value.agent!r} to run a sub-task; known: {known}",
            "error",
        )
    if isinstance(value, Suspend):
        return Outcome(cid, suspend=value, documents=ctx.staged_documents())
    return Outcome(cid, tool_result_text(value), "ok", documents=ctx.staged_documents())


def resumed_wait(cid: str, wait: WaitCheckpoint, rs: RoundState) -> Outcome | None:
    """A parked call seen again on claim: its outcome, or None to run it now."""
    kind = wait["wait"]
    if kind == "timer":
        if parse_dt(wait["wake_at"]) <= utcnow():
            return Outcome(cid, f"Slept until {wait['wake_at']}.", "ok")
        return Outcome(cid, suspend=SleepUntil(parse_dt(wait["wake_at"])))
    if kind == "approval":
        decision = rs.decisions.get(cid)
        if decision is None:
            if expired(wait):  # the durable timer of approval_timeout fired
                return Outcome(cid, expired_text(wait), "denied")
            # Still open: park again on the recorded wait (its expiry included).
            return Outcome(cid, suspend=WaitForInput(wait.get("question", ""), "approval"))
        if decision["approved"]:
            return None  # approved: run it (its first run)
        reason = decision.get("reason") or "no reason given"
        return Outcome(cid, f"The user denied this call: {reason}", "denied")
    # input / subtask are resolved by whoever answers; still open means still waiting
    return Outcome(cid, suspend=suspension_for(wait))


def tool_result_text(value: Any) -> str:
    """What a tool's (or a sub-task's) return value says in its result message:
    a string as it is, a pydantic model or anything else as JSON."""
    if isinstance(value, str):
        return value
    if hasattr(value, "model_dump_json"):
        return str(value.model_dump_json())
    return json.dumps(value, default=str, ensure_ascii=False)


def timed_out(limit: float) -> str:
    return f"Error: Tool call timed out after {limit:g} s (the tool's time limit)."


def exception_text(exc: BaseException) -> str:
    """`TypeName: message` (or the bare type name), as a failed call or task reports it."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def parse_dt(text: str) -> datetime:
    return datetime.fromisoformat(text)


def suspension_for(wait: WaitCheckpoint) -> Suspend:
    """The suspension a call still waiting (for input or a sub-task) stays in on resume."""
    if wait["wait"] == "subtask":
        return SpawnSubtask(wait.get("agent", ""), None)
    return WaitForInput(wait.get("question", ""))


def committed_events(rs: RoundState | None, call_id: str) -> frozenset[int]:
    """The numbers (`n`, the k-th emit of the call) of the events the log holds
    for a call: a re-run skips exactly those, also when an earlier one of its
    emits never landed (it failed, or a later one landed first)."""
    if rs is None:
        return frozenset()
    return frozenset(int(e.get("n") or 0) for e in rs.events.get(call_id, ()))
