"""A child process that holds an MCP session open and is then SIGKILLed.

    python tests/mcp_worker_agent.py STORE_URL LEDGER

Round 1 calls the test server's `count` (its result names the server's pid);
round 2 calls `hold`, which prints `AT hold open <server pid>` and blocks, with the
session still open, so the test can SIGKILL this process.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from duragent import Agent, Runtime, ScriptedModel, ToolCall, tool
from duragent.mcp import mcp_tools

URL, LEDGER = sys.argv[1:3]
SERVER = f"stdio:{sys.executable} {Path(__file__).parent / 'mcp_server.py'} {LEDGER}"


@tool
async def hold(pid: int) -> str:
    """Block, with the MCP session open."""
    try:
        os.kill(pid, 0)
        state = "open"  # the session's server still runs (task scope)
    except ProcessLookupError:
        state = "gone"
    print(f"AT hold {state} {pid}", flush=True)
    await asyncio.sleep(3600)
    return "never"


def hold_call(messages: list[object]) -> list[ToolCall]:
    pid = int(str(getattr(messages[-1], "content", "")).split()[1])
    return [ToolCall("hold", {"pid": pid})]


model = ScriptedModel([[ToolCall("count", {})], hold_call, "Done."])
agent = Agent(name="m", model=model, tools=[mcp_tools(SERVER, only=["count"]), hold])


async def main() -> None:
    async with Runtime(URL, agents=[agent]) as rt:
        await (await rt.submit("m", "go")).wait(3600)


asyncio.run(main())
