"""A child process for custom-event crash tests: one tool that emits two events.

    python tests/emit_agent.py STORE_URL KILL_POINT REPLAY

The tool `work` emits `phase` {"step": 1}, then `done` {"step": 2}, then
returns. KILL_POINT "after_emit" prints `AT after_emit` once the first event is
committed and blocks, so the test can SIGKILL the process; "none" runs to the
end. REPLAY is the tool's replay policy. The task has a webhook (to a port
nothing listens on: its events wait in the outbox, where the test counts them).
"""

from __future__ import annotations

import asyncio
import sys

from duragent import Agent, Runtime, ScriptedModel, ToolCall, ToolContext, tool

URL, POINT, REPLAY = sys.argv[1:4]


async def trace(point: str, **info: object) -> None:
    if point == "tool_event" and info.get("n") == 1 and POINT == "after_emit":
        print("AT after_emit", flush=True)
        await asyncio.sleep(3600)


async def work(ctx: ToolContext) -> str:
    await ctx.emit("phase", {"step": 1})
    await ctx.emit("done", {"step": 2})
    return f"worked (attempt {ctx.attempt})"


work_tool = tool(name="work", replay=REPLAY)(work)  # type: ignore[call-overload]
model = ScriptedModel([[ToolCall("work", {})], "Worked."])
agent = Agent(name="emitter", model=model, tools=[work_tool])


async def main() -> None:
    rt = Runtime(URL, agents=[agent], lease_ttl=1.0, poll_interval=0.1, trace=trace)
    async with rt:
        sub = await rt.submit(
            "emitter", "go", request_id="emit-task", webhook="http://127.0.0.1:9/hook"
        )
        task = await sub.wait(timeout=60)
        print(f"DONE {task.status.value} {task.id}", flush=True)


asyncio.run(main())
