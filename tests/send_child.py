"""A worker process for the send crash test: runs the `chat` agent until SIGKILLed.

    python send_child.py STORE_URL LEDGER KILL_AT TASK_ID

Each user message `m<i>` makes the model call `record(i)` (never replayed),
which appends `i` to LEDGER; its result is answered "ok". When the model is
asked with KILL_AT equal to `asked <last user message>`, or the tool runs with
KILL_AT equal to `tool <i>`, the process prints KILL_AT and holds there so the
test can kill it. Prints `DONE <status>` if the task ends first.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

from duragent import Agent, BuiltinTools, Runtime, ScriptedModel, ToolCall, tool
from duragent.types import ToolMessage, UserMessage


def make_agent(ledger: Path, kill_at: str = "none") -> Agent:
    @tool
    async def record(i: int) -> str:
        """Record that message i was handled."""
        fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{i}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        if kill_at == f"tool {i}":
            print(kill_at, flush=True)
            await asyncio.Event().wait()
        return f"recorded {i}"

    def script(messages: list[Any]) -> Any:
        last = messages[-1]
        if isinstance(last, ToolMessage):
            return f"ok: {last.content}"
        users = [m.content for m in messages if isinstance(m, UserMessage)]
        if kill_at == f"asked {users[-1]}":
            print(kill_at, flush=True)
            time.sleep(3600)  # held inside the model call, the message's pickup committed
        return [ToolCall("record", {"i": int(users[-1][1:])})]

    return Agent(
        name="chat",
        model=ScriptedModel(script),
        tools=[record],
        builtin_tools=BuiltinTools(plan=False),
    )


async def main(url: str, ledger: str, kill_at: str, task_id: str) -> None:
    agent = make_agent(Path(ledger), kill_at)
    async with Runtime(url, agents=[agent], lease_ttl=1.0, poll_interval=0.05) as rt:
        print("ready", flush=True)
        task = await rt.wait(task_id, timeout=60)
        print(f"DONE {task.status.value}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
