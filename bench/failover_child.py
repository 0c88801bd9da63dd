"""A worker process for the failover benchmark.

    python -m bench.failover_child STORE_URL owner|standby LEASE_TTL|default

`owner` submits one long task and runs it (prints RUNNING once a tool has run);
`standby` runs a worker with the same agent and prints READY. The benchmark
SIGKILLs the owner and times how long the standby takes to commit its takeover.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from duragent import Agent, BuiltinTools, Limits, Runtime, ScriptedModel, ToolCall, Turn, tool

URL, ROLE, TTL = sys.argv[1], sys.argv[2], sys.argv[3]
started = asyncio.Event()


@tool(name="work")
async def work(n: int) -> str:
    """A 20 ms step."""
    await asyncio.sleep(0.02)
    started.set()
    return f"step {n} done"


def script(messages: list[Any]) -> Any:
    r = sum(1 for m in messages if getattr(m, "role", None) == "assistant") + 1
    return Turn(text=f"Step {r}.", tool_calls=[ToolCall("work", {"n": r})])


agent = Agent(
    name="long",
    model=ScriptedModel(script, chunk_size=10_000),
    tools=[work],
    limits=Limits(max_iterations=1_000_000),
    builtin_tools=BuiltinTools(plan=False),
)


async def main() -> None:
    options: dict[str, Any] = {} if TTL == "default" else {"lease_ttl": float(TTL)}
    async with Runtime(URL, agents=[agent], **options) as rt:
        if ROLE == "owner":
            await rt.submit("long", "work until stopped", request_id="failover")
            await started.wait()
            print("RUNNING", flush=True)
        else:
            await rt.resume()  # start the scheduler: it takes over tasks whose lease expired
            print("READY", flush=True)
        await asyncio.sleep(3600)


asyncio.run(main())
