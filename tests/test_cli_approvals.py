"""`duragent approvals`, `approve` (--args, several at once) and `deny` on real SQLite files."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from typer.testing import CliRunner

from duragent import Runtime
from duragent.cli import app
from duragent.runtime._waits import open_waits
from duragent.types import TaskStatus
from server_agents import agents

runner = CliRunner()


def cli(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args), env={"COLUMNS": "200"})
    return result.exit_code, result.output


async def _parked(url: str) -> tuple[str, list[str]]:
    async with Runtime(url, agents(), poll_interval=0.05) as rt:
        sub = await rt.submit("mailer", "mail them", owner="alice")
        task = await rt.wait(sub.task_id, timeout=30, until=lambda t: t.status.value == "waiting")
        return task.id, sorted(await open_waits(rt.store, task))


async def _finish(url: str, tid: str) -> str:
    async with Runtime(url, agents(), poll_interval=0.05) as rt:
        task = await rt.wait(tid, timeout=30)
        assert task.status is TaskStatus.COMPLETED
        return str(task.output)


@pytest.mark.slow
def test_list_edit_approve_and_deny_from_the_terminal(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/cli.db"
    tid, (bob, ann) = asyncio.run(_parked(url))
    code, out = cli("approvals", tid, "--store", url)
    assert code == 0, out
    assert bob in out and ann in out and "send_email" in out and "bob@example.com" in out

    # Several open: the command says which to pick.
    code, out = cli("approve", tid, "--store", url)
    assert code == 1 and "waits for 2 answers; pass call_id=" in out
    edit = '{"to": "bob@example.com", "body": "see you"}'
    # An edit is checked against the tool's schema, which only the agent's definition has.
    code, out = cli("approve", tid, "--call", bob, "--args", edit, "--store", url)
    assert code == 1 and "cannot check edited arguments for tool 'send_email'" in out
    code, out = cli(
        "approve", tid, "--call", bob, "--args", '{"to": 1}', "--agents", "server_agents:agents",
        "--store", url,
    )  # fmt: skip
    assert code == 1 and "invalid arguments for send_email" in out and "body: Field required" in out
    code, out = cli("approve", tid, "--args", "[1]", "--store", url)
    assert code == 1 and "--args must be a JSON object" in out

    code, out = cli(
        "approve", tid, "--call", bob, "--args", edit, "--agents", "server_agents:agents",
        "--store", url,
    )  # fmt: skip
    assert code == 0, out
    assert f"approved with edited arguments {bob}" in out and "waiting" in out
    code, out = cli("deny", tid, "--all", "--reason", "not ann", "--store", url)
    assert code == 0, out
    assert f"denied {ann}" in out and "pending" in out
    output = asyncio.run(_finish(url, tid))
    assert "it ran with" in output and "sent 'see you' to bob@example.com" in output
    code, out = cli("show", tid, "--store", url)
    assert code == 0, out
    assert f"approved {bob} with edited arguments" in out and f"denied {ann}: not ann" in out
    assert "The user denied this call: not ann" in output


@pytest.mark.slow
def test_approve_all_decides_every_open_approval_at_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/cli.db"
    tid, (bob, ann) = asyncio.run(_parked(url))
    code, out = cli("approve", tid, "--all", "--store", url)
    assert code == 0, out
    assert f"approved {bob}, {ann}" in out and "pending" in out
    output = asyncio.run(_finish(url, tid))
    assert "sent 'hi' to bob@example.com" in output and "sent 'hello' to ann@example.com" in output
    code, out = cli("approvals", tid, "--store", url)
    assert code == 0 and "has no open approval" in out
