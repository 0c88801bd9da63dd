"""Agents for multi-process tests, loadable as `duragent worker --agents worker_agents:AGENTS`.

Tools append to the ledger file named by $LEDGER (one fsync'd line per
execution) so tests can count side effects. $HOLD=<tool name> makes that tool
print `AT <tool>` and block on its first attempt (for $HOLD_SECONDS, or until
the file $HOLD_UNTIL exists), for a test to kill or stop the process there;
$HOLD_ONCE=1 holds only the first such call of the process (one task surely in
flight, the others run as usual).
$DROP_TOOLS removes tools from the agents (a later deploy that lost a
definition). $AGENT_VERSION declares the agents' version (else each has its
fingerprint, runtime/_versions.py). $TOOL_GRACE sets how long a pause waits for tools.
$CLOCK_SKEW=<seconds> sets this process's wall clock, as duragent reads it,
that far off (a worker on a host whose clock is wrong).
"""

from __future__ import annotations

import asyncio
import os
import sys
from datetime import datetime, timedelta
from typing import Any

import duragent.types
from duragent import Agent, BuiltinTools, Limits, ScriptedModel, Timing, ToolCall, ToolContext, tool
from duragent.types import AssistantMessage, ToolMessage, UserMessage


def skew_clock(seconds: float) -> None:
    """Every duragent module of this process reads `utcnow` `seconds` off: those
    loaded already (their imported name replaced) and those loaded later."""
    real = duragent.types.utcnow

    def skewed() -> datetime:
        return real() + timedelta(seconds=seconds)

    for module in list(sys.modules.values()):
        name = getattr(module, "__name__", "")
        if name.startswith("duragent") and getattr(module, "utcnow", None) is real:
            module.utcnow = skewed  # type: ignore[attr-defined]


if os.environ.get("CLOCK_SKEW"):
    skew_clock(float(os.environ["CLOCK_SKEW"]))


def ledger(line: str) -> None:
    path = os.environ.get("LEDGER")
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line} pid={os.getpid()}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)


_held: list[str] = []  # task ids held so far in this process (for $HOLD_ONCE)


async def hold(name: str, ctx: ToolContext) -> None:
    every = os.environ.get("HOLD_EVERY") == "1"
    if _held and os.environ.get("HOLD_ONCE") == "1":
        return
    if os.environ.get("HOLD") == name and (ctx.attempt == 1 or every):
        _held.append(ctx.task_id)
        print(f"AT {name} {ctx.task_id}", flush=True)
        release = os.environ.get("HOLD_UNTIL")
        if release:  # until the test creates this file
            while not os.path.exists(release):
                await asyncio.sleep(0.02)
            return
        await asyncio.sleep(float(os.environ.get("HOLD_SECONDS", "3600")))


@tool
async def nap(seconds: float, ctx: ToolContext) -> str:
    """Sleep, with a side effect recorded in the ledger."""
    ledger(f"start nap {ctx.idempotency_key}")
    await hold("nap", ctx)
    await asyncio.sleep(seconds)
    ledger(f"end nap {ctx.idempotency_key}")
    return f"napped by pid {os.getpid()}"


@tool(replay="safe")
async def nap_safe(seconds: float, ctx: ToolContext) -> str:
    """Sleep; safe to repeat."""
    ledger(f"start nap_safe {ctx.idempotency_key}")
    await hold("nap_safe", ctx)
    await asyncio.sleep(seconds)
    return f"safe nap by pid {os.getpid()}"


@tool
async def delegate(question: str, ctx: ToolContext) -> Any:
    """Hand a question to the researcher sub-agent and wait for its answer."""
    return ctx.spawn("researcher", question)


@tool
async def wait_a_bit(seconds: float, ctx: ToolContext) -> Any:
    """Sleep durably: the task waits in the store, not in a process."""
    return ctx.sleep(seconds)


def _approve(arguments: dict[str, Any]) -> bool:
    return float(arguments.get("amount", 0)) > 100  # small transfers need no approval


@tool(requires_approval=_approve)
async def transfer(amount: float, to: str, ctx: ToolContext) -> str:
    """Transfer money (big amounts need a person's approval)."""
    ledger(f"transfer {amount} {to} {ctx.idempotency_key}")
    return f"sent {amount} to {to}"


def _last_tool(messages: list[Any]) -> str:
    tools = [m.content for m in messages if isinstance(m, ToolMessage)]
    return tools[-1] if tools else ""


def sleeper_script(messages: list[Any]) -> Any:
    n = sum(isinstance(m, AssistantMessage) for m in messages)
    if n == 0:
        return [ToolCall("nap", {"seconds": 0.3})]
    if n == 1:
        return [ToolCall("nap_safe", {"seconds": 0.2})]
    return f"slept: {_last_tool(messages)}"


def twonaps_script(messages: list[Any]) -> Any:
    """Two never-replay naps, one round each; the second lasts $NAP2_SECONDS."""
    n = sum(isinstance(m, AssistantMessage) for m in messages)
    if n == 0:
        return [ToolCall("nap", {"seconds": 0.1})]
    if n == 1:
        return [ToolCall("nap", {"seconds": float(os.environ.get("NAP2_SECONDS", "2"))})]
    return f"slept twice: {_last_tool(messages)}"


def parent_script(messages: list[Any]) -> Any:
    if not any(isinstance(m, AssistantMessage) for m in messages):
        return [ToolCall("delegate", {"question": "what is 6*7?"})]
    return f"the researcher says: {_last_tool(messages)}"


def researcher_script(messages: list[Any]) -> Any:
    if not any(isinstance(m, AssistantMessage) for m in messages):
        return [ToolCall("nap", {"seconds": 0.2})]
    return "42"


def timer_script(messages: list[Any]) -> Any:
    if not any(isinstance(m, AssistantMessage) for m in messages):
        return [ToolCall("wait_a_bit", {"seconds": float(os.environ.get("TIMER_SECONDS", "2"))})]
    return f"woke up: {_last_tool(messages)}"


def banker_script(messages: list[Any]) -> Any:
    if not any(isinstance(m, AssistantMessage) for m in messages):
        return [
            ToolCall("transfer", {"amount": 500, "to": "bob"}),
            ToolCall("transfer", {"amount": 5, "to": "ann"}),
        ]
    return "results: " + " | ".join(m.content for m in messages if isinstance(m, ToolMessage))


def asker_script(messages: list[Any]) -> Any:
    if not any(isinstance(m, AssistantMessage) for m in messages):
        return [ToolCall("ask_user", {"question": "Which city?"})]
    return f"you chose {_last_tool(messages)}"


def chat_script(messages: list[Any]) -> Any:
    users = [m.content for m in messages if isinstance(m, UserMessage)]
    return f"I have heard {len(users)} messages: {' / '.join(users)}"


def build_agents(version: str | None = None, dropped: set[str] | None = None) -> list[Agent]:
    """The agents, of `version` (default: $AGENT_VERSION, else their fingerprints),
    without the tools `dropped` (default: $DROP_TOOLS)."""
    version = version or os.environ.get("AGENT_VERSION") or None
    if dropped is None:
        dropped = set(filter(None, os.environ.get("DROP_TOOLS", "").split(",")))
    max_restarts = int(os.environ.get("MAX_RESTARTS", "3"))
    grace = float(os.environ.get("TOOL_GRACE", "10"))

    def tools(*ts: Any) -> list[Any]:
        return [t for t in ts if t.name not in dropped]

    return [
        Agent(
            name="sleeper",
            model=ScriptedModel(sleeper_script),
            tools=tools(nap, nap_safe),
            limits=Limits(max_restarts=max_restarts),
            timing=Timing(tool_grace=grace),
            version=version,
        ),
        Agent(
            name="twonaps", model=ScriptedModel(twonaps_script), tools=tools(nap), version=version
        ),
        Agent(
            name="parent",
            model=ScriptedModel(parent_script),
            tools=tools(delegate),
            version=version,
        ),
        Agent(
            name="researcher",
            model=ScriptedModel(researcher_script),
            tools=tools(nap),
            version=version,
        ),
        Agent(
            name="timer",
            model=ScriptedModel(timer_script),
            tools=tools(wait_a_bit),
            version=version,
        ),
        Agent(
            name="banker",
            model=ScriptedModel(banker_script),
            tools=tools(transfer),
            version=version,
        ),
        Agent(
            name="asker",
            model=ScriptedModel(asker_script),
            builtin_tools=BuiltinTools(ask_user=True),
            version=version,
        ),
        Agent(name="chat", model=ScriptedModel(chat_script), version=version),
    ]


AGENTS = build_agents()
