"""Agents for bench.latency's worker processes (`--agents bench.latency_agents:AGENTS`).

- `quick` answers at once: what is timed is the worker noticing the task.
- `holder` calls a tool that blocks until cancelled: the task sits in a tool,
  where an abort from another process must reach it.
- `busy` runs 40 rounds of a tool that burns 1 ms of CPU and sleeps 50 ms,
  committing tool progress: steady task work beside the lease renewals.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from duragent import Agent, BuiltinTools, Limits, ScriptedModel, ToolCall, ToolContext, Turn, tool
from duragent.types import AssistantMessage


@tool
async def block(ctx: ToolContext) -> str:
    """Wait until cancelled."""
    await asyncio.sleep(3600)
    return "never"


@tool(name="step")
async def step(n: int, ctx: ToolContext) -> str:
    """A step: some CPU, some waiting, progress committed."""
    deadline = time.perf_counter() + 0.001
    while time.perf_counter() < deadline:
        pass
    await ctx.report(f"step {n} half way")
    await asyncio.sleep(0.05)
    return f"step {n} done"


def _rounds(messages: list[Any]) -> int:
    return sum(isinstance(m, AssistantMessage) for m in messages)


def holder_script(messages: list[Any]) -> Any:
    return [ToolCall("block", {})] if _rounds(messages) == 0 else "unblocked"


def busy_script(messages: list[Any]) -> Any:
    r = _rounds(messages)
    if r >= 40:
        return "all steps done"
    return Turn(text=f"Step {r + 1}.", tool_calls=[ToolCall("step", {"n": r + 1})])


AGENTS = [
    Agent(
        name="quick", model=ScriptedModel(lambda m: "done"), builtin_tools=BuiltinTools(plan=False)
    ),
    Agent(
        name="holder",
        model=ScriptedModel(holder_script),
        tools=[block],
        builtin_tools=BuiltinTools(plan=False),
    ),
    Agent(
        name="busy",
        model=ScriptedModel(busy_script),
        tools=[step],
        builtin_tools=BuiltinTools(plan=False),
        limits=Limits(max_iterations=100),
    ),
]
