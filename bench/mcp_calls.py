"""What an MCP tool call costs when its session stays open, against a session per call.

    python -m bench.mcp_calls [--runs 3] [--calls 20]

Each run is one task of `--calls` rounds, each round one call to the `add`
tool of a small stdio MCP server (this file, run with `serve`; the official
SDK), in a fresh Runtime on memory://, once per scope: "task" (the session
opened at the first call is kept for the others), "worker" (the same, shared
by the worker's tasks) and "call" (a new session, so a new server process,
per call: how every call went before sessions stayed open). A call's time is
the tool's invoke as the runtime awaits it: session (and process) start if
any, the request and its answer. The scopes alternate within each run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import statistics
import sys
import time
from typing import Any

SCOPES = ("task", "worker", "call")


def serve() -> None:
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("bench")

    @server.tool()
    def add(a: int, b: int) -> str:
        """Add two numbers."""
        return str(a + b)

    server.run()


async def one_task(scope: str, calls: int) -> list[float]:
    """The seconds each call of one task took, in order."""
    from duragent import Agent, Runtime, ScriptedModel, TaskStatus, ToolCall
    from duragent.mcp import mcp_tools

    spec = f"stdio:{shlex.quote(sys.executable)} -m bench.mcp_calls serve"
    (add,) = mcp_tools(spec, scope=scope, only=["add"])  # type: ignore[arg-type]
    times: list[float] = []
    invoke = add.invoke

    async def timed(arguments: dict[str, Any], ctx: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return await invoke(arguments, ctx)
        finally:
            times.append(time.perf_counter() - t0)

    add.invoke = timed  # type: ignore[method-assign]
    rounds: list[Any] = [[ToolCall("add", {"a": i, "b": 1})] for i in range(calls)]
    agent = Agent(name="b", model=ScriptedModel([*rounds, "Done."]), tools=[add])
    async with Runtime("memory://", agents=[agent]) as rt:
        task = await (await rt.submit("b", "go")).wait(120)
        assert task.status is TaskStatus.COMPLETED, task.error
    assert len(times) == calls
    return times


def ms(values: list[float]) -> str:
    v = [x * 1000 for x in values]
    return f"{statistics.median(v):.2f} ({min(v):.2f}–{max(v):.2f})"


async def main(runs: int, calls: int) -> None:
    from importlib.metadata import version

    load = os.getloadavg()
    first: dict[str, list[float]] = {s: [] for s in SCOPES}
    later: dict[str, list[float]] = {s: [] for s in SCOPES}  # median of each run's later calls
    later_all: dict[str, list[float]] = {s: [] for s in SCOPES}
    for _ in range(runs):
        for scope in SCOPES:
            times = await one_task(scope, calls)
            first[scope].append(times[0])
            later[scope].append(statistics.median(times[1:]))
            later_all[scope] += times[1:]
    print(f"{runs} runs × {calls} calls per scope; ms, median (min–max)")
    py = sys.version.split()[0]
    print(f"mcp {version('mcp')}, Python {py}, {os.cpu_count()} cores;", end=" ")
    print(f"load average at start {load[0]:.2f}, at end {os.getloadavg()[0]:.2f}\n")
    print("| scope | first call | later calls (median of runs) | later calls, every call |")
    print("| --- | ---: | ---: | ---: |")
    for scope in SCOPES:
        print(f"| {scope} | {ms(first[scope])} | {ms(later[scope])} | {ms(later_all[scope])} |")
    base = statistics.median(later["call"])
    for scope in ("task", "worker"):
        ratio = base / statistics.median(later[scope])
        print(f"\nlater calls, `call` vs `{scope}` (same run): {ratio:.0f}× slower")


if __name__ == "__main__":
    if sys.argv[1:] == ["serve"]:
        serve()
        sys.exit()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.calls))
