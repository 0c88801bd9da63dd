"""A child process for handoff crash tests: a triage agent hands the task to billing.

    python tests/handoff_agent.py STORE_URL LEDGER KILL_POINT

Round 1: triage runs `lookup` (never-replay); round 2: triage takes
`transfer_to_billing`; round 3 (billing's first): billing runs `refund`
(never-replay); round 4: billing answers with what its tools returned. Each tool
run is a line in LEDGER. KILL_POINT prints `AT <point>` and blocks, so the test
can SIGKILL the process there:
- "before_handoff": the handoff call's intent is committed, its result is not;
- "after_handoff": the handoff's result and entry are durable;
- "target_model": billing's first model call starts (its round not committed);
- "target_result": billing's `refund` result is durable;
- "none": runs to the end and prints `DONE <status> <output>`.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from duragent import Agent, BuiltinTools, Runtime, ScriptedModel, ToolCall, tool
from duragent.types import ToolMessage

URL, LEDGER, POINT = sys.argv[1:4]
WHERE = {  # kill point -> (trace point, round)
    "before_handoff": ("intents", 2),
    "after_handoff": ("result", 2),
    "target_model": ("model_start", 3),
    "target_result": ("result", 3),
}


def ledger(line: str) -> None:
    fd = os.open(LEDGER, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


async def trace(point: str, **info: Any) -> None:
    if WHERE.get(POINT) != (point, info.get("round")):
        return
    if "landed" in info:
        await info["landed"]  # durable before the kill
    print(f"AT {POINT}", flush=True)
    await asyncio.sleep(3600)


@tool
def lookup(order: str) -> str:
    """Find an order."""
    ledger(f"lookup {order}")
    return f"order {order}: paid 30 EUR"


@tool
def refund(order: str) -> str:
    """Refund an order."""
    ledger(f"refund {order}")
    return f"refunded order {order}"


def answer(messages: list[Any]) -> str:
    said = [m.content for m in messages if isinstance(m, ToolMessage)]
    return "Billing: " + " | ".join(said)


plain = BuiltinTools(plan=False)
billing = Agent(
    name="billing",
    model=ScriptedModel(["-", "-", [ToolCall("refund", {"order": "42"})], answer]),
    instructions="You are billing.",
    tools=[refund],
    builtin_tools=plain,
    handoff_description="Refunds and invoices.",
)
triage = Agent(
    name="triage",
    model=ScriptedModel(
        [[ToolCall("lookup", {"order": "42"})], [ToolCall("transfer_to_billing", {})]]
    ),
    instructions="You triage.",
    tools=[lookup],
    builtin_tools=plain,
    handoffs=[billing],
)


async def main() -> None:
    rt = Runtime(URL, agents=[triage], lease_ttl=1.0, poll_interval=0.1, trace=trace)
    async with rt:
        sub = await rt.submit("triage", "refund order 42", request_id="handoff-task")
        task = await sub.wait(timeout=60)
        print(f"DONE {task.status.value} {task.output}", flush=True)


asyncio.run(main())
