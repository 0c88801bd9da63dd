"""A child process for the Pydantic AI crash test: a multi-round run of a real
`pydantic_ai.Agent` (its own `FunctionModel`) inside a duragent task.

    python tests/pydantic_ai_agent.py STORE_URL LEDGER KILL_AT [stream]
    PYD_LEDGER=... PYD_KILL_ON=LINE duragent worker --agents pydantic_ai_agent:agents

Each round the model calls `charge` (never replayed) and `lookup` (safe) and,
after ROUNDS rounds, answers a `Summary`. Every live model request, tool effect
and recorded step is appended to LEDGER (fsynced) before anything else happens;
with KILL_AT=k the process prints `AT k` after its k-th ledger line and blocks,
so the test can SIGKILL it there (0: never). It prints `DONE <output json>`.
With `stream` the run is `run_stream`: each response is streamed in two text
pieces (a ledger line `chunk model:N` before each) and the child prints
`TEXT <json>`, the text `stream_text` gave it, before DONE.
Loaded by `duragent worker`, it reads the ledger from PYD_LEDGER and stops at
the ledger line PYD_KILL_ON instead.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass

from pydantic import BaseModel
from pydantic_ai import Agent as PydanticAgent, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel

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


async def model_fn(
    messages: list[ModelMessage], info: AgentInfo, live: bool = True
) -> ModelResponse:
    done = sum(isinstance(m, ModelResponse) for m in messages)
    if live:
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


async def stream_fn(
    messages: list[ModelMessage], info: AgentInfo
) -> AsyncIterator[str | DeltaToolCalls]:
    """The same answers as model_fn, streamed: two text pieces, then the tool calls."""
    done = sum(isinstance(m, ModelResponse) for m in messages)
    await ledger(f"run model:{done + 1}")
    for piece in (f"round {done + 1}", " says hi. "):
        await ledger(f"chunk model:{done + 1}")
        yield piece
    answer = await model_fn(messages, info, live=False)
    yield {
        i: DeltaToolCall(p.tool_name, json.dumps(p.args), tool_call_id=p.tool_call_id)
        for i, p in enumerate(answer.parts)
        if isinstance(p, ToolCallPart)
    }


pyd = PydanticAgent(
    FunctionModel(model_fn, stream_function=stream_fn), deps_type=Shop, output_type=Summary
)


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


async def main(url: str, stream: bool) -> None:
    rt = Runtime(url, agents=[durable.agent], lease_ttl=1.0, poll_interval=0.1, trace=trace)
    async with rt:
        if stream:
            async with durable.run_stream(
                rt, "buy things", deps=Shop("p"), request_id="pyd-task"
            ) as run:
                text = "".join([t async for t in run.stream_text(delta=True)])
                print(f"TEXT {json.dumps(text)}", flush=True)
                output = await run.get_output(timeout=120)
        else:
            result = await durable.run(
                rt, "buy things", deps=Shop("p"), request_id="pyd-task", timeout=120
            )
            output = result.output
        print(f"DONE {output.model_dump_json()}", flush=True)


if __name__ == "__main__":
    LEDGER, KILL_AT = sys.argv[2], int(sys.argv[3])
    asyncio.run(main(sys.argv[1], sys.argv[4:] == ["stream"]))
