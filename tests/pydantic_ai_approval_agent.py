"""A child process for the Pydantic AI approval crash test: a run whose `pay` tool
needs approval (`requires_approval=True`, never replayed), asked twice.

    python tests/pydantic_ai_approval_agent.py STORE_URL LEDGER KILL_AT

The model asks for `pay(20)`, then `pay(30)`, then says what the tools told it.
The process runs the task and answers its approvals itself (20 approved, 30
denied). Every live model request, payment, recorded step and answer is
appended to LEDGER (fsynced) first; with KILL_AT=k the process prints `AT k`
after its k-th ledger line and blocks, for the test to SIGKILL it there. It
prints `DONE <output>`.
"""

from __future__ import annotations

import asyncio
import os
import sys

from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from duragent import Limits, Runtime, TaskStatus
from duragent.pydantic_ai import DurableAgent
from duragent.runtime._waits import open_waits

LEDGER, KILL_AT, lines = "", 0, 0


async def ledger(line: str) -> None:
    global lines
    fd = os.open(LEDGER, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    lines += 1
    if lines == KILL_AT:
        print(f"AT {KILL_AT} {line}", flush=True)
        await asyncio.sleep(3600)


async def model_fn(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    n = sum(isinstance(m, ModelResponse) for m in messages) + 1
    await ledger(f"run model:{n}")
    if n <= 2:
        amount = 10 * (n + 1)
        return ModelResponse(parts=[ToolCallPart("pay", {"amount": amount}, tool_call_id=f"p{n}")])
    said = [
        str(p.content)
        for m in messages
        for p in getattr(m, "parts", ())
        if isinstance(p, ToolReturnPart)
    ]
    return ModelResponse(parts=[TextPart(" | ".join(said))])


pyd = PydanticAgent(FunctionModel(model_fn))


@pyd.tool_plain(requires_approval=True)
async def pay(amount: int) -> str:
    """Pay (needs a person's approval; not safe to repeat)."""
    await ledger(f"run pay {amount}")
    return f"paid {amount}"


durable = DurableAgent(pyd, name="payer", options={"limits": Limits(max_restarts=100)})


async def trace(point: str, **info: object) -> None:
    if point == "step":
        await ledger(f"recorded {info['step']}")


async def main(url: str) -> None:
    rt = Runtime(url, agents=[durable.agent], lease_ttl=1.0, poll_interval=0.1, trace=trace)
    stopped = {TaskStatus.WAITING, TaskStatus.COMPLETED, TaskStatus.FAILED}
    async with rt:
        sub = await rt.submit("payer", "pay twice", request_id="pay-task")
        while True:
            task = await rt.wait(sub.task_id, timeout=120, until=lambda t: t.status in stopped)
            if task.status is not TaskStatus.WAITING:
                break
            amount = await open_amount(rt, sub.task_id)
            await ledger(f"answer {amount}")
            await rt.respond(sub.task_id, approve=amount == 20, reason="over budget")
        print(f"DONE {task.status.value} {task.output}", flush=True)


async def open_amount(rt: Runtime, task_id: str) -> int:
    (wait,) = (await open_waits(rt.store, await rt.get(task_id))).values()
    return int(wait["arguments"]["amount"])


if __name__ == "__main__":
    LEDGER, KILL_AT = sys.argv[2], int(sys.argv[3])
    asyncio.run(main(sys.argv[1]))
