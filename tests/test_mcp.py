"""MCP tool servers as duragent tools, over stdio and streamable HTTP (real servers)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("mcp", reason="the mcp extra is part of the dev install")

from duragent import Agent, Runtime, ScriptedModel, TaskStatus, ToolCall
from duragent.errors import MCPServerError, UsageError
from duragent.mcp import mcp_tools
from duragent.types import EntryKind

HERE = Path(__file__).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    ledger, port = tmp_path / "ledger.txt", free_port()
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "mcp_server.py"), str(ledger), str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:  # until it listens
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise AssertionError("the MCP test server did not start") from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp", ledger
    finally:
        proc.kill()
        proc.wait(10)


def stdio(ledger: Path) -> str:
    return f"stdio:{sys.executable} {HERE / 'mcp_server.py'} {ledger}"


async def run_calls(server: str, ledger: Path) -> None:
    tools = mcp_tools(server, replay={"add": "safe"}, prefix="calc_")
    model = ScriptedModel(
        [
            [
                ToolCall("calc_add", {"a": 2, "b": 3}),
                ToolCall("calc_charge", {"amount": 5}),
                ToolCall("calc_explode", {}),
                ToolCall("calc_send", {"text": "hi"}),
            ],
            "Done.",
        ]
    )
    agent = Agent(name="m", model=model, tools=[tools])
    async with Runtime("memory://", agents=[agent]) as rt:
        task = await (await rt.submit("m", "go")).wait(60)
        assert task.status is TaskStatus.COMPLETED
        intents = await rt.store.entries(task.id, kinds=[EntryKind.TOOL_INTENT])
        results = await rt.store.entries(task.id, kinds=[EntryKind.TOOL_RESULT])
    policies = {e.payload["name"]: e.payload["replay"] for e in intents}
    assert policies == {
        "calc_add": "safe",
        "calc_charge": "never",
        "calc_explode": "never",
        "calc_send": "never",
    }
    by_call = {e.payload["tool_call_id"]: e.payload for e in results}
    assert by_call["call_0_0"]["content"] == "5" and by_call["call_0_0"]["outcome"] == "ok"
    assert by_call["call_0_1"]["content"] == "charged 5"
    assert by_call["call_0_2"]["outcome"] == "error"
    assert "reported an error" in by_call["call_0_2"]["content"]
    # The server got the call's idempotency key, filled in by duragent.
    # and in the request's _meta, for servers that read it there.
    assert sorted(ledger.read_text().splitlines()) == [
        f"charge 5 {task.id}:1:call_0_1",
        f"send hi {task.id}:1:call_0_3",
    ]


@pytest.mark.slow
async def test_stdio_server_tools_run_with_their_replay_policy(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.txt"
    await run_calls(stdio(ledger), ledger)


@pytest.mark.slow
async def test_streamable_http_server_tools_run(http_server: tuple[str, Path]) -> None:
    url, ledger = http_server
    await run_calls(url, ledger)


@pytest.mark.slow
def test_the_model_never_sees_the_idempotency_argument(tmp_path: Path) -> None:
    (charge,) = mcp_tools(stdio(tmp_path / "l.txt"), only=["charge"])
    assert charge.parameters["required"] == ["amount"]
    assert "idempotency_key" not in charge.parameters["properties"]
    assert charge.replay == "never"


@pytest.mark.slow
def test_bad_servers_and_names_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="stdio:command args"):
        mcp_tools("ftp://x")
    with pytest.raises(UsageError, match="no tool named \\['nope'\\]"):
        mcp_tools(stdio(tmp_path / "l.txt"), replay={"nope": "safe"})
    with pytest.raises(UsageError, match="replay must be"):
        mcp_tools(stdio(tmp_path / "l.txt"), replay="sometimes")  # type: ignore[arg-type]
    with pytest.raises(MCPServerError, match="failed"):
        mcp_tools(f"http://127.0.0.1:{free_port()}/mcp", timeout=10)
