"""A child process for crash tests: runs one task, and can be SIGKILLed at a named point.

    python tests/crash_agent.py STORE_URL LEDGER KILL_POINT TOOL [REQUEST_ID]

KILL_POINT is a trace point ("progress", "intents", "tool_start", "result"), or
"tool_running" (inside the tool, after its side effect began), or "none".
When the point is reached the process prints `AT <point>` and blocks there so
the test can kill it. TOOL is "safe" or "unsafe". Exits 0 once the task ends.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from duragent import Agent, Runtime, ScriptedModel, Timing, ToolCall, ToolContext, Turn, tool

URL, LEDGER, POINT, KIND = sys.argv[1:5]
REQUEST_ID = sys.argv[5] if len(sys.argv) > 5 else "crash-task"


def ledger(line: str) -> None:
    fd = os.open(LEDGER, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


async def hold(point: str) -> None:
    if point == POINT:
        print(f"AT {point}", flush=True)
        await asyncio.sleep(3600)


async def trace(point: str, **info: Any) -> None:
    if point == "tool_start" and info.get("attempt", 1) != 1:
        return
    if point == POINT and "landed" in info:
        await info["landed"]  # a kill at "result" comes once the result is durable
    await hold(point)


async def work(n: int, ctx: ToolContext) -> str:
    ledger(f"start {ctx.idempotency_key}")
    await hold("tool_running")
    ledger(f"end {ctx.idempotency_key}")
    return f"did {n}"


work_tool = tool(name="work", replay="safe" if KIND == "safe" else "never")(work)

model = ScriptedModel(
    [
        Turn(text="Let me start working on this. " * 3, tool_calls=[ToolCall("work", {"n": 1})]),
        Turn(text="Now the second part. ", tool_calls=[ToolCall("work", {"n": 2})]),
        "All work done.",
    ],
    chunk_delay=0.02,
    chunk_size=6,
)
agent = Agent(name="worker", model=model, tools=[work_tool], timing=Timing(progress_interval=0.01))


async def main() -> None:
    rt = Runtime(URL, agents=[agent], lease_ttl=1.0, poll_interval=0.1, trace=trace)
    async with rt:
        sub = await rt.submit("worker", "do the work", request_id=REQUEST_ID)
        task = await sub.wait(timeout=60)
        print(f"DONE {task.status.value} {task.id}", flush=True)


asyncio.run(main())
