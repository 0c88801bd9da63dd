"""A child process for compaction crash tests: a long task through a small window.

    python tests/compaction_agent.py STORE_URL LEDGER KILL_POINT

The task calls `fetch` (replay="never") once a round for 30 rounds; every call is
appended to LEDGER (fsynced) before it returns. The window is small, so the
task compacts every few rounds. At the second compaction the process stops at
KILL_POINT, prints `AT <point>` and blocks, for the test to SIGKILL it:
"start" (decided, nothing asked yet), "in_summary" (the summariser answering),
"summarised" (the summary in memory, not committed) or "committed" (the
compaction committed, the runner not yet reading its view back). "none" runs
to the end and prints `DONE <status> <task id>`.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from collections.abc import AsyncIterator
from typing import Any

from duragent import Agent, ContextPolicy, Limits, Runtime, ScriptedModel, ToolCall, tool
from duragent.llm._base import ModelRequest, StreamEvent

URL, LEDGER, POINT = sys.argv[1:4]
ROUNDS = 30
seen: dict[str, int] = {}


def ledger(line: str) -> None:
    fd = os.open(LEDGER, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


async def hold(point: str) -> None:
    seen[point] = seen.get(point, 0) + 1
    if point == POINT and seen[point] == 2:  # the second compaction
        print(f"AT {point}", flush=True)
        await asyncio.sleep(3600)


async def trace(point: str, **info: object) -> None:
    names = {"compaction_start": "start", "compaction_summarised": "summarised"}
    if point in names:
        await hold(names[point])
    elif point == "compacted":
        await hold("committed")


def last_step(messages: list[Any]) -> int:
    done = 0
    for m in messages:
        if m.role == "user":
            done = max([done, *(int(n) for n in re.findall(r"last step (\d+)", m.content))])
        for c in getattr(m, "tool_calls", None) or ():
            done = max(done, json.loads(c.function.arguments)["n"])
    return done


def answer(messages: list[Any]) -> Any:
    done = last_step(messages)
    return f"All {ROUNDS} done." if done >= ROUNDS else [ToolCall("fetch", {"n": done + 1})]


class Summariser:
    name = "summariser"

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        await hold("in_summary")
        steps = [
            int(n)
            for n in re.findall(r'"n": ?(\d+)|last step (\d+)', request.messages[1].content)
            for n in n
            if n
        ]
        async for event in ScriptedModel(
            [f"Pages fetched; last step {max(steps, default=0)}."]
        ).stream(ModelRequest(model="s", messages=[])):
            yield event


@tool(replay="never")
def fetch(n: int) -> str:
    """Fetch page n (a side effect: it is written to the ledger)."""
    ledger(f"fetch {n}")
    return f"page {n}: " + "x" * 3_000


agent = Agent(
    name="reader",
    model=ScriptedModel(answer),
    tools=[fetch],
    limits=Limits(max_iterations=500),
    context=ContextPolicy(window=5_000, keep_rounds=1, elide_over=100_000, summarizer=Summariser()),
)


async def main() -> None:
    rt = Runtime(URL, agents=[agent], lease_ttl=1.0, poll_interval=0.1, trace=trace)
    async with rt:
        sub = await rt.submit("reader", "Fetch the pages.", request_id="long-task")
        task = await sub.wait(timeout=120)
        print(f"DONE {task.status.value} {task.id}", flush=True)


asyncio.run(main())
