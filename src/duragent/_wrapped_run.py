"""What the framework integrations share: a task whose one tool call runs the framework's loop.

`duragent.pydantic_ai` and `duragent.openai_agents` each make a duragent
`Agent` whose model (`driver`) calls one `replay="resume"` tool with the
prompt, and answers the run's output once that tool returns an envelope
(`{"output": ...}` or `{"error": ...}`, as JSON).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from duragent.errors import InvalidOption, ModelError, TaskFailed
from duragent.llm._scripted import ToolCall, Turn
from duragent.runtime._context import ToolContext
from duragent.runtime._runtime import Runtime
from duragent.types import EntryKind, Task, ToolMessage, UserMessage


async def carry_over_steps(ctx: ToolContext, *, keep_failed: bool = True) -> dict[str, Any]:
    """Give this call the steps of the task's earlier run calls (a pause cut them off),
    and those a fork copied from its source (runtime/_hosted.py); return each
    approval question's step (`ask:...`) with the decision that came after it.

    A crash re-runs the same call, which finds its own steps; a pause ends the
    call with a "cancelled" result and the driver makes a new one, whose run
    must replay what the cut-off call recorded, as the same call would have.
    `keep_failed=False`: a step that failed is asked again (where a failed step
    failed the task, a retry runs it again), not replayed as its failure.
    """
    record = ctx._steps.record
    if not keep_failed:
        for name in [n for n, done in record.done.items() if "error" in done]:
            del record.done[name]
    entries = await ctx._host.store.entries(ctx.task_id, kinds=[EntryKind.CHECKPOINT])
    decisions: dict[str, Any] = {}
    asked = None
    for entry in entries:
        payload = entry.payload
        kind = payload.get("type")
        if kind == "step" and str(payload.get("step")).startswith("ask:"):
            asked = payload["step"]
        elif kind == "decision" and asked is not None:
            decisions[asked] = {"approved": payload["approved"], "reason": payload.get("reason")}
            asked = None
        if payload.get("call_id") == ctx.call_id and entry.round == ctx.round:
            continue  # this call's own (a fork's copies are in round 0, whatever their call)
        if kind == "step" and (keep_failed or "error" not in payload):
            record.done.setdefault(payload["step"], payload)  # type: ignore[arg-type]
            record.started.discard(payload["step"])
        elif kind == "step_started" and payload["step"] not in record.done:
            record.started.add(payload["step"])
    return decisions


async def recorded_steps(rt: Runtime, task_id: str) -> list[str]:
    """The steps a task recorded, in order (`model:1`, `tool:1:<id>`, ...)."""
    entries = await rt.store.entries(task_id, kinds=[EntryKind.CHECKPOINT])
    names = [e.payload["step"] for e in entries if e.payload.get("type") == "step"]
    return list(dict.fromkeys(names))


async def envelope(rt: Runtime, task: Task, framework: str) -> dict[str, Any]:
    """The run tool's envelope of a finished task (raises TaskFailed if it failed)."""
    if task.status.value != "completed":
        raise TaskFailed(task.id, task.status.value, task.status_reason or task.error)
    for message in reversed(await rt.messages(task.id)):
        if isinstance(message, ToolMessage):
            return json.loads(message.content)  # type: ignore[no-any-return]
    raise InvalidOption(f"task {task.id} has no {framework} run in its history")


def driver(run_tool: str, framework: str) -> Callable[[list[Any]], Turn]:
    """The task's model: call the run tool with the prompt, then answer its output."""

    def drive(messages: list[Any]) -> Turn:
        result = next((m for m in reversed(messages) if isinstance(m, ToolMessage)), None)
        if result is None:
            return Turn(tool_calls=[ToolCall(run_tool, {"prompt": _prompt(messages)})])
        try:
            envelope = json.loads(result.content)
        except ValueError:
            envelope = None
        if not isinstance(envelope, dict) or not ({"output", "error"} & set(envelope)):
            if result.content.startswith(("Tool call cancelled", "Tool call interrupted")):
                # Cut off (a pause, a stop): run again, replaying the steps it recorded.
                return Turn(tool_calls=[ToolCall(run_tool, {"prompt": _prompt(messages)})])
            raise ModelError(f"the {framework} run did not finish: {result.content}")
        if "error" in envelope:
            raise ModelError(f"the {framework} run failed: {envelope['error']}")
        output = envelope["output"]
        return Turn(text=output if isinstance(output, str) else json.dumps(output))

    return drive


def _prompt(messages: list[Any]) -> str:
    return next((m.content for m in messages if isinstance(m, UserMessage)), "")
