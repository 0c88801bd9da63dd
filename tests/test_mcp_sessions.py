"""MCP sessions stay open: one per server per running task (or per worker), reused,
opened again after the server went away, and closed with their task or worker."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp", reason="the mcp extra is part of the dev install")

from duragent import Agent, BuiltinTools, Runtime, ScriptedModel, TaskStatus, ToolCall, tool
from duragent.mcp import MCPServer, Scope, mcp_tools
from duragent.runtime._context import ToolContext
from duragent.types import EntryKind, Task
from support.crashlib import kill_at, spawn

HERE = Path(__file__).parent
pytestmark = pytest.mark.slow


def server_spec(ledger: Path) -> str:
    return f"stdio:{sys.executable} {HERE / 'mcp_server.py'} {ledger}"


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def run_task(
    rt: Runtime, text: str = "go", agent: str = "m"
) -> tuple[Task, list[dict[str, Any]]]:
    """Submit, wait until its run (not only its status) has ended, and its tool results."""
    sub = await rt.submit(agent, text)
    settled = lambda t: t.status.terminal or t.status is TaskStatus.WAITING  # noqa: E731
    task = await rt.wait(sub.task_id, timeout=60, until=settled)
    assert rt.worker is not None
    await rt.worker.wait_task(task.id)
    results = await rt.store.entries(task.id, kinds=[EntryKind.TOOL_RESULT])
    return task, [e.payload for e in results]


def counts(results: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """(count, server pid) of each `count` result, in order."""
    out = []
    for r in results:
        n, pid = r["content"].split()
        out.append((int(n), int(pid)))
    return out


def counting_agent(ledger: Path, calls: int, scope: Scope, name: str = "m") -> Agent:
    tools = mcp_tools(server_spec(ledger), scope=scope, only=["count"])
    rounds: list[Any] = [[ToolCall("count", {})] for _ in range(calls)]
    return Agent(name=name, model=ScriptedModel([*rounds, "Done."]), tools=[tools])


@pytest.mark.parametrize("scope", ["task", "worker"])
async def test_a_stateful_server_counts_to_n_across_the_calls_of_one_task(
    tmp_path: Path, scope: Scope
) -> None:
    n = 5
    async with Runtime("memory://", agents=[counting_agent(tmp_path / "l", n, scope)]) as rt:
        task, results = await run_task(rt)
        assert task.status is TaskStatus.COMPLETED
        seen = counts(results)
        # One process served every call (no process start after the first) and kept its count.
        assert [c for c, _ in seen] == list(range(1, n + 1))
        assert len({pid for _, pid in seen}) == 1


async def test_a_session_per_call_starts_a_server_per_call(tmp_path: Path) -> None:
    async with Runtime("memory://", agents=[counting_agent(tmp_path / "l", 3, "call")]) as rt:
        _, results = await run_task(rt)
    seen = counts(results)
    assert [c for c, _ in seen] == [1, 1, 1]
    assert len({pid for _, pid in seen}) == 3
    assert all(gone(pid) for _, pid in seen)


async def test_no_server_process_outlives_its_task_ended_or_parked(tmp_path: Path) -> None:
    tools = mcp_tools(server_spec(tmp_path / "l"), only=["count"])
    ends = Agent(name="m", model=ScriptedModel([[ToolCall("count", {})], "Done."]), tools=[tools])
    parks = Agent(
        name="p",
        model=ScriptedModel([[ToolCall("count", {})], [ToolCall("ask_user", {"question": "?"})]]),
        tools=[tools],
        builtin_tools=BuiltinTools(ask_user=True, plan=False),
    )
    async with Runtime("memory://", agents=[ends, parks]) as rt:
        task, results = await run_task(rt)
        assert task.status is TaskStatus.COMPLETED
        ((_, pid),) = counts(results)
        assert gone(pid)
        task, results = await run_task(rt, agent="p")
        assert task.status is TaskStatus.WAITING
        ((_, pid),) = counts(results[:1])
        assert gone(pid)


async def test_a_worker_session_is_shared_by_its_tasks_and_closed_when_it_stops(
    tmp_path: Path,
) -> None:
    agent = counting_agent(tmp_path / "l", 2, "worker")
    async with Runtime("memory://", agents=[agent]) as rt:
        _, first = await run_task(rt)
        _, second = await run_task(rt)
        seen = counts(first) + counts(second)
        assert [c for c, _ in seen] == [1, 2, 3, 4]
        (pid,) = {pid for _, pid in seen}
        assert not gone(pid)  # open between the tasks
    assert gone(pid)


async def test_a_server_killed_between_calls_is_opened_again_at_the_next_call(
    tmp_path: Path,
) -> None:
    ledger = tmp_path / "l"
    server = MCPServer(server_spec(ledger))

    @tool
    async def kill_server(pid: int, ctx: ToolContext) -> str:
        """SIGKILL the server, then wait until its session has seen it go."""
        os.kill(pid, signal.SIGKILL)
        held = ctx.held("task")
        assert held is not None
        session: Any = held.peek(server.key)
        while session.usable():  # forced: the next call starts after the loss is known
            await asyncio.sleep(0.01)
        return "killed"

    tools = mcp_tools(server.spec, only=["count"])

    def kill(messages: list[Any]) -> list[ToolCall]:
        pid = int(str(messages[-1].content).split()[1])  # the count's result
        return [ToolCall("kill_server", {"pid": pid})]

    agent = Agent(
        name="m",
        model=ScriptedModel([[ToolCall("count", {})], kill, [ToolCall("count", {})], "Done."]),
        tools=[tools, kill_server],
    )
    async with Runtime("memory://", agents=[agent]) as rt:
        task, results = await run_task(rt)
    assert task.status is TaskStatus.COMPLETED
    before, after = counts([results[0]]), counts([results[2]])
    assert results[2]["outcome"] == "ok"
    assert before[0][0] == 1 and after[0][0] == 1  # a new process: its count starts again
    assert before[0][1] != after[0][1]
    assert gone(after[0][1])


async def test_a_call_the_server_died_in_is_not_sent_again_and_the_next_call_reopens(
    tmp_path: Path,
) -> None:
    ledger = tmp_path / "l"
    tools = mcp_tools(server_spec(ledger), only=["count", "crash"])  # both "never"
    model = ScriptedModel(
        [[ToolCall("count", {})], [ToolCall("crash", {})], [ToolCall("count", {})], "Done."]
    )
    async with Runtime("memory://", agents=[Agent(name="m", model=model, tools=[tools])]) as rt:
        task, results = await run_task(rt)
    assert task.status is TaskStatus.COMPLETED
    assert results[1]["outcome"] == "error"
    assert "went away during the call" in results[1]["content"]
    crashes = [line for line in ledger.read_text().splitlines() if line.startswith("crash")]
    assert len(crashes) == 1  # run once, not again on the new session
    (first,), (second,) = counts([results[0]]), counts([results[2]])
    assert crashes == [f"crash {first[1]}"]
    assert second[0] == 1 and second[1] != first[1]


async def test_a_replay_safe_call_the_server_died_in_is_sent_again_on_a_new_session(
    tmp_path: Path,
) -> None:
    ledger = tmp_path / "l"
    tools = mcp_tools(server_spec(ledger), replay="safe", only=["crash_once"])
    model = ScriptedModel([[ToolCall("crash_once", {})], "Done."])
    async with Runtime("memory://", agents=[Agent(name="m", model=model, tools=[tools])]) as rt:
        task, results = await run_task(rt)
    assert task.status is TaskStatus.COMPLETED
    assert results[0]["outcome"] == "ok" and results[0]["content"] == "survived"
    runs = ledger.read_text().splitlines()
    assert len(runs) == 2 and runs[0].split()[1] != runs[1].split()[1]  # two processes


def dead_or_zombie(pid: int) -> bool:
    """Gone, or exited and waiting for its new parent (init) to reap it."""
    try:
        return "\tZ" in Path(f"/proc/{pid}/status").read_text().split("State:")[1][:4]
    except (FileNotFoundError, IndexError):
        return True


def test_a_server_does_not_outlive_a_sigkilled_worker(tmp_path: Path) -> None:
    line = kill_at(
        spawn("mcp_worker_agent.py", f"sqlite:///{tmp_path}/w.db", str(tmp_path / "l")),
        "AT hold",
    )
    assert line.split()[2] == "open", line
    pid = int(line.split()[-1])
    # The server reads the end of its stdin when its worker dies, and exits.
    deadline = time.monotonic() + 30
    while not dead_or_zombie(pid):
        assert time.monotonic() < deadline, f"the MCP server {pid} outlived its worker"
        time.sleep(0.05)


class _WorkerHeld:
    """What `MCPServer.call` uses of a tool's context: the worker's held sessions."""

    def __init__(self) -> None:
        from duragent.runtime._held import Held

        self.shared = Held()

    def held(self, scope: str) -> Any:
        return self.shared


async def test_a_call_its_caller_gave_up_on_leaves_a_shared_session_to_the_others(
    tmp_path: Path,
) -> None:
    """Two tasks' calls in flight on one worker session: the first caller is
    cancelled (an abort, a drain). The session stays open and the second call
    gets its answer, from the same server process."""
    ledger = tmp_path / "l"
    server = MCPServer(server_spec(ledger), scope="worker")
    ctx: Any = _WorkerHeld()

    def holding(path: Path) -> Any:
        async def use(session: Any) -> Any:
            return await session.call_tool("hold", {"path": str(path)})

        return use

    first = asyncio.create_task(server.call(holding(tmp_path / "never"), ctx))
    second = asyncio.create_task(server.call(holding(tmp_path / "go"), ctx))
    async with asyncio.timeout(30):
        while not ledger.exists() or ledger.read_text().count("hold ") < 2:
            await asyncio.sleep(0.01)  # forced: both calls are in the server
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    (tmp_path / "go").touch()
    async with asyncio.timeout(30):
        answer = await second
    assert "released" in str(answer)
    session: Any = ctx.shared.peek(server.key)
    assert session is not None and session.usable()  # still the one open session
    await ctx.shared.aclose()
