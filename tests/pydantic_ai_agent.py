"""A child process for the Pydantic AI crash test: a multi-round run of a real
`pydantic_ai.Agent` (its own `FunctionModel`) inside a duragent task.

    python tests/pydantic_ai_agent.py STORE_URL LEDGER KILL_AT
    PYD_LEDGER=... PYD_KILL_ON=LINE duragent worker --agents pydantic_ai_agent:agents

Each round the model calls `charge` (never replayed) and `lookup` (safe) and,
after ROUNDS rounds, answers a `Summary`. Every live model request, tool effect
and recorded step is appended to LEDGER (fsynced) before anything else happens;
with KILL_AT=k the process prints `AT k` after its k-th ledger line and blocks,
so the test can SIGKILL it there (0: never). It prints `DONE <output json>`.
Loaded by `duragent worker`, it reads the ledger from PYD_LEDGER and stops at
the ledger line PYD_KILL_ON instead.
"""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass

from pydantic import BaseModel
from pydantic_ai import Agent as PydanticAgent, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from duragent import Limits, Runtime
from duragent.pydantic_ai import DurableAgent

LEDGER = os.environ.get("PYD_LEDGER", "")
KILL_AT, KILL_ON = 0, os.environ.get("PYD_KILL_ON", "")
ROUNDS = 3
lines = 0


async def ledger(line: str) -> None:
    global lines
    fd = os.open(LEDGER, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    lines += 1
    if lines == KILL_AT or line == KILL_ON:
        print(f"AT {KILL_AT} {line}", flush=True)
        await asyncio.sleep(3600)


@dataclass
class Shop:
    prefix: str


class Summary(BaseModel):
    rounds: int
    lookups: list[str]


async def model_fn(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    done = sum(isinstance(m, ModelResponse) for m in messages)
    await ledger(f"run model:{done + 1}")
    if done < ROUNDS:
        return ModelResponse(
            parts=[
                ToolCallPart("charge", {"i": done}, tool_call_id=f"charge-{done}"),
                ToolCallPart("lookup", {"i": done}, tool_call_id=f"lookup-{done}"),
            ]
        )
    lookups = [
        str(p.content)
        for m in messages
        for p in getattr(m, "parts", ())
        if isinstance(p, ToolReturnPart) and p.tool_name == "lookup"
    ]
    final = info.output_tools[0].name
    return ModelResponse(parts=[ToolCallPart(final, {"rounds": done, "lookups": lookups})])


pyd = PydanticAgent(FunctionModel(model_fn), deps_type=Shop, output_type=Summary)


@pyd.tool_plain
async def charge(i: int) -> str:
    """Charge the card (not safe to repeat)."""
    await ledger(f"run tool:{i + 1}:charge-{i}")
    return f"charged {i}"


@pyd.tool(metadata={"replay": "safe"})
async def lookup(ctx: RunContext[Shop], i: int) -> str:
    """Look a price up (safe to repeat)."""
    await ledger(f"run tool:{i + 1}:lookup-{i}")
    return f"{ctx.deps.prefix}-{i}"


durable = DurableAgent(pyd, name="shop", options={"limits": Limits(max_restarts=100)})
agents = [durable.agent]


async def trace(point: str, **info: object) -> None:
    if point == "step":
        await ledger(f"recorded {info['step']}")


async def main(url: str) -> None:
    rt = Runtime(url, agents=[durable.agent], lease_ttl=1.0, poll_interval=0.1, trace=trace)
    async with rt:
        result = await durable.run(
            rt, "buy things", deps=Shop("p"), request_id="pyd-task", timeout=120
        )
        print(f"DONE {result.output.model_dump_json()}", flush=True)


if __name__ == "__main__":
    LEDGER, KILL_AT = sys.argv[2], int(sys.argv[3])
    asyncio.run(main(sys.argv[1]))
