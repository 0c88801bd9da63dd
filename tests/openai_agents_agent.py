"""A child process for the OpenAI Agents SDK crash test: a multi-round run of a
real `agents.Agent` (the SDK's `OpenAIChatCompletionsModel`, against the test's
local OpenAI-compatible server at OAI_BASE_URL) inside a duragent task.

    OAI_BASE_URL=... python tests/openai_agents_agent.py STORE_URL LEDGER KILL_AT
    OAI_BASE_URL=... OAI_LEDGER=... OAI_KILL_ON=LINE \
        duragent worker --agents openai_agents_agent:agents

The triage agent (an input guardrail on it) hands off to `shop`, whose model calls `charge` (never
replayed) and `lookup` (safe) each round and then answers a `Summary` (the
server, `script` below, decides). Every model call this process makes, tool
effect and recorded step is appended to LEDGER (fsynced) before anything else
happens; with KILL_AT=k the process prints `AT k` after its k-th ledger line
and blocks, so the test can SIGKILL it there (0: never). It prints `DONE
<output json>`. Loaded by `duragent worker`, it reads the ledger from
OAI_LEDGER and stops at the ledger line OAI_KILL_ON instead.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from dataclasses import dataclass
from typing import Any

import httpx2
from agents import (
    Agent as SdkAgent,
    GuardrailFunctionOutput,
    Model,
    ModelResponse,
    OpenAIChatCompletionsModel,
    RunContextWrapper,
    function_tool,
    input_guardrail,
    set_tracing_disabled,
)
from openai import AsyncOpenAI, DefaultAsyncHttpxClient
from pydantic import BaseModel

from duragent import Limits, Runtime
from duragent.openai_agents import DurableAgent
from support.llm_servers import ToolCall

LEDGER = os.environ.get("OAI_LEDGER", "")
KILL_AT, KILL_ON = 0, os.environ.get("OAI_KILL_ON", "")
ROUNDS = 3
lines = 0
set_tracing_disabled(True)


def append(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


async def ledger(line: str) -> None:
    global lines
    append(LEDGER, line)
    lines += 1
    if lines == KILL_AT or line == KILL_ON:
        print(f"AT {KILL_AT} {line}", flush=True)
        await asyncio.sleep(3600)


def script(body: dict[str, Any]) -> Any:
    """The server's answer to a request holding `done` assistant messages (in the test)."""
    messages = body["messages"]
    done = sum(m["role"] == "assistant" for m in messages)
    if done == 0:
        return [ToolCall("transfer_to_shop", {})]
    if done <= ROUNDS:
        i = done - 1
        return [ToolCall("charge", {"i": i}), ToolCall("lookup", {"i": i})]
    lookups = [
        m["content"] for m in messages if m["role"] == "tool" and m["tool_call_id"].endswith("_1")
    ]
    return json.dumps({"rounds": ROUNDS, "lookups": lookups})


@dataclass
class Shop:
    prefix: str


class Summary(BaseModel):
    rounds: int
    lookups: list[str]


class LedgerModel(Model):
    """The SDK's model, each call this process makes written to the ledger first."""

    def __init__(self, wrapped: Model) -> None:
        self.wrapped = wrapped

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        await ledger("ask model")
        return await self.wrapped.get_response(*args, **kwargs)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        return self.wrapped.stream_response(*args, **kwargs)


def model() -> Model:
    http = DefaultAsyncHttpxClient(limits=httpx2.Limits(max_keepalive_connections=0))
    base_url = os.environ.get("OAI_BASE_URL", "http://127.0.0.1:9/v1")
    client = AsyncOpenAI(base_url=base_url, api_key="sk-test", http_client=http)
    return LedgerModel(OpenAIChatCompletionsModel("gpt-test", client))


@function_tool
async def charge(i: int) -> str:
    """Charge the card (not safe to repeat)."""
    await ledger(f"run charge {i}")
    return f"charged {i}"


@function_tool
async def lookup(wrapper: RunContextWrapper[Shop], i: int) -> str:
    """Look a price up (safe to repeat)."""
    await ledger(f"run lookup {i}")
    return f"{wrapper.context.prefix}-{i}"


@input_guardrail
async def polite(
    wrapper: RunContextWrapper[Shop], agent: Any, given: Any
) -> GuardrailFunctionOutput:
    """An input guardrail (a model call of its own, say): its verdict is a step."""
    await ledger("run guard")
    return GuardrailFunctionOutput(output_info=None, tripwire_triggered="rude" in str(given))


shop = SdkAgent(name="shop", model=model(), tools=[charge, lookup], output_type=Summary)
triage = SdkAgent(name="triage", model=model(), handoffs=[shop], input_guardrails=[polite])
durable = DurableAgent(
    triage,
    name="shop",
    safe_tools={"lookup"},
    context_type=Shop,
    options={"limits": Limits(max_restarts=100)},
)
agents = [durable.agent]


async def trace(point: str, **info: object) -> None:
    if point == "step":
        await ledger(f"recorded {info['step']}")


async def main(url: str) -> None:
    rt = Runtime(url, agents=[durable.agent], lease_ttl=1.0, poll_interval=0.1, trace=trace)
    async with rt:
        result = await durable.run(
            rt, "buy things", context=Shop("p"), request_id="oai-task", timeout=120
        )
        print(f"DONE {result.final_output.model_dump_json()}", flush=True)


if __name__ == "__main__":
    LEDGER, KILL_AT = sys.argv[2], int(sys.argv[3])
    asyncio.run(main(sys.argv[1]))
