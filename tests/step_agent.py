"""A child process for durable-step crash tests: one tool with three steps.

    python tests/step_agent.py STORE_URL LEDGER KILL_POINT REPLAY [CHARGE_SAFE]

The tool `order` runs the steps reserve -> charge -> ship through ctx.step.
KILL_POINT is "after_reserve" (the reserve step is recorded), "in_charge" (the
charge step's side effect began, its result is not recorded) or "none". When
the point is reached the process prints `AT <point>` and blocks so the test can
SIGKILL it. REPLAY is the tool's replay policy; CHARGE_SAFE "1" marks the
charge step safe. Every side effect is appended to LEDGER first (fsynced).
"""

from __future__ import annotations

import asyncio
import os
import sys

from duragent import Agent, Runtime, ScriptedModel, ToolCall, ToolContext, tool

URL, LEDGER, POINT, REPLAY = sys.argv[1:5]
CHARGE_SAFE = len(sys.argv) > 5 and sys.argv[5] == "1"


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


async def trace(point: str, **info: object) -> None:
    if point == "step" and info.get("step") == "reserve":
        await hold("after_reserve")


def reserve(item: str) -> dict[str, str]:
    ledger(f"reserve {item}")
    return {"reservation": f"r-{item}"}


async def charge(amount: int) -> str:
    ledger(f"charge {amount}")
    await hold("in_charge")
    return f"ch-{amount}"


async def order(item: str, ctx: ToolContext) -> str:
    ledger(f"tool attempt={ctx.attempt}")
    r = await ctx.step("reserve", reserve, item)
    c = await ctx.step("charge", charge, 42, safe=True if CHARGE_SAFE else None)

    def ship() -> str:
        ledger("ship")
        return "shipped"

    s = await ctx.step("ship", ship)
    return f"{r['reservation']} {c} {s}"


order_tool = tool(name="order", replay=REPLAY)(order)  # type: ignore[call-overload]
model = ScriptedModel([[ToolCall("order", {"item": "book"})], "Ordered."])
agent = Agent(name="shop", model=model, tools=[order_tool])


async def main() -> None:
    rt = Runtime(URL, agents=[agent], lease_ttl=1.0, poll_interval=0.1, trace=trace)
    async with rt:
        sub = await rt.submit("shop", "buy a book", request_id="step-task")
        task = await sub.wait(timeout=60)
        print(f"DONE {task.status.value} {task.id}", flush=True)


asyncio.run(main())
