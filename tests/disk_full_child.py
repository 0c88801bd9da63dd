"""A process whose SQLite store runs out of room mid-task, then gets it back.

    python disk_full_child.py DB_PATH blip|outage

When round 2's first tool starts, the process's file-size limit (RLIMIT_FSIZE)
drops to one byte: every write to the database or its WAL fails with EFBIG,
which SQLite reports as a disk I/O / disk-full error, exactly as on a full
disk. SIGXFSZ is caught, so the write fails instead of killing the process.
`blip`: the limit is lifted as soon as the first write has failed (one
commit is lost). `outage`: it is lifted 1.5 s after the first failure (every
write in between fails), and not before a second write has failed, however
slowly the retry came. Prints one JSON line: how the task ended.
"""

from __future__ import annotations

import asyncio
import json
import resource
import signal
import sys
import threading
from typing import Any

from duragent import Agent, Runtime, ScriptedModel, ToolCall, ToolContext, tool
from duragent.llm._scripted import Turn

_SOFT, _HARD = resource.getrlimit(resource.RLIMIT_FSIZE)
failed_writes: list[int] = []
ran: list[str] = []


def lift() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (_SOFT, _HARD))


def main() -> None:
    path, mode = sys.argv[1], sys.argv[2]

    over = threading.Event()  # the outage has lasted long enough

    def end_outage() -> None:
        over.set()
        if len(failed_writes) > 1:
            lift()

    def on_xfsz(signum: int, frame: Any) -> None:
        failed_writes.append(signum)
        if mode == "blip":
            if len(failed_writes) == 1:
                lift()
        elif len(failed_writes) == 1:
            threading.Timer(1.5, end_outage).start()
        elif over.is_set():
            lift()

    signal.signal(signal.SIGXFSZ, on_xfsz)

    @tool
    async def write_note(text: str, ctx: ToolContext) -> str:
        """Write a note (never replayed)."""
        ran.append(f"write_note:{text}")
        ctx.update_state(notes=int(ctx.context.get("notes", 0)) + 1)
        return f"noted {text}"

    @tool(replay="safe")
    async def read_value(key: str) -> str:
        """Read a value."""
        ran.append(f"read_value:{key}")
        return f"{key}=1"

    def script(messages: list[Any]) -> Any:
        done = sum(1 for m in messages if getattr(m, "role", "") == "assistant")
        if done < 3:
            return Turn(
                text=f"step {done + 1}",
                tool_calls=[
                    ToolCall("write_note", {"text": f"s{done + 1}"}),
                    ToolCall("read_value", {"key": f"k{done + 1}"}),
                ],
            )
        return "all done"

    async def trace(point: str, **info: Any) -> None:
        if point == "tool_start" and info["round"] == 2 and not failed_writes:
            resource.setrlimit(resource.RLIMIT_FSIZE, (1, _HARD))

    agent = Agent(name="a", model=ScriptedModel(script), tools=[write_note, read_value])

    async def go() -> dict[str, Any]:
        async with Runtime(
            f"sqlite:///{path}", agents=[agent], lease_ttl=30.0, poll_interval=0.05, trace=trace
        ) as rt:
            sub = await rt.submit("a", "go")
            task = await sub.wait(60)
            return {
                "status": task.status.value,
                "error": task.error,
                "restarts": task.restarts,
                "failed_writes": len(failed_writes),
                "ran": ran,
                "results": [
                    m.content
                    for m in await rt.messages(task.id)
                    if getattr(m, "role", "") == "tool"
                ],
            }

    print(json.dumps(asyncio.run(go())), flush=True)


if __name__ == "__main__":
    main()
