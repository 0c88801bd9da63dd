"""The worker process the torture harness kills and restarts.

    python -m bench.torture_child STORE_URL LEDGER TASKS

Submits TASKS tasks (idempotent: the same request ids on every restart) and
runs them to the end. Each task follows a multi-round script, deterministic
per task (so a restarted model answers the same), with one to three tool calls
per round run in parallel. Tools append `start`/`end` lines to LEDGER with an
fsync, like a side effect a crash cannot take back. Prints READY once the
runtime is open, WORKING at the first step it commits, DONE when all have ended.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
from typing import Any

from duragent import (
    Agent,
    BuiltinTools,
    Limits,
    Runtime,
    ScriptedModel,
    Timing,
    ToolCall,
    ToolContext,
    Turn,
    tool,
)
from duragent.types import AssistantMessage, UserMessage


def task_input(i: int) -> str:
    return f"torture task {i}"


def task_output(i: int) -> str:
    return f"torture task {i} finished"


def plan(i: int) -> list[list[str]]:
    """The tool kinds ("safe"/"unsafe") called in each round of task i."""
    rounds = 3 + i % 3
    return [
        ["safe" if (i + r + j) % 2 else "unsafe" for j in range(1 + (i + r) % 3)]
        for r in range(rounds)
    ]


def script(messages: list[Any]) -> Any:
    user = next(m for m in messages if isinstance(m, UserMessage))
    i = int(user.content.rsplit(" ", 1)[1])
    done = sum(1 for m in messages if isinstance(m, AssistantMessage))
    rounds = plan(i)
    if done >= len(rounds):
        return task_output(i)
    calls = [
        ToolCall(f"{kind}_op", {"task": i, "step": done + 1, "part": j})
        for j, kind in enumerate(rounds[done])
    ]
    return Turn(
        text=f"Round {done + 1} of task {i}: calling {len(calls)} tools now.", tool_calls=calls
    )


def ledger_line(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


async def effect(kind: str, ctx: ToolContext) -> str:
    ledger_line(LEDGER, f"start {kind} {ctx.idempotency_key}")
    await asyncio.sleep(random.uniform(0, 0.02))
    await ctx.report(f"{kind} half way")
    await asyncio.sleep(random.uniform(0, 0.02))
    ledger_line(LEDGER, f"end {kind} {ctx.idempotency_key}")
    return f"{kind} done: {ctx.idempotency_key}"


@tool(name="safe_op", replay="safe")
async def safe_op(task: int, step: int, part: int, ctx: ToolContext) -> str:
    """A side effect that may run again after a crash (idempotent)."""
    return await effect("safe", ctx)


@tool(name="unsafe_op")
async def unsafe_op(task: int, step: int, part: int, ctx: ToolContext) -> str:
    """A side effect that must never run twice."""
    return await effect("unsafe", ctx)


agent = Agent(
    name="torture",
    model=ScriptedModel(script, chunk_delay=0.002, chunk_size=12),
    tools=[safe_op, unsafe_op],
    # The harness kills on purpose: never block on the restart limit.
    limits=Limits(max_iterations=20, max_restarts=1000),
    timing=Timing(progress_interval=0.003),
    builtin_tools=BuiltinTools(plan=False),
)


async def main(url: str, tasks: int) -> None:
    working = False

    async def trace(point: str, **info: Any) -> None:
        nonlocal working
        if not working:
            working = True
            print("WORKING", flush=True)

    async with Runtime(
        url,
        agents=[agent],
        concurrency=tasks,
        lease_ttl=1.0,
        poll_interval=0.05,
        trace=trace,
    ) as rt:
        print("READY", flush=True)
        subs = [
            await rt.submit("torture", task_input(i), request_id=f"torture-{i}")
            for i in range(tasks)
        ]
        await rt.resume()  # tasks of an earlier run are taken over once their lease expires
        ended = await asyncio.gather(*(s.wait(timeout=300) for s in subs))
        print("DONE " + " ".join(t.status.value for t in ended), flush=True)


if __name__ == "__main__":
    URL, LEDGER, TASKS = sys.argv[1], sys.argv[2], int(sys.argv[3])
    asyncio.run(main(URL, TASKS))
