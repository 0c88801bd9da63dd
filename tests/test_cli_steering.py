"""`duragent history` and `duragent fork` on real SQLite files."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from duragent import Runtime
from duragent.cli import app
from duragent.types import TaskStatus
from server_agents import agents

runner = CliRunner()


def cli(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args), env={"COLUMNS": "200"})
    return result.exit_code, result.output


async def _run_to_end(url: str, agent: str, text: str = "go") -> str:
    async with Runtime(url, agents(), poll_interval=0.05) as rt:
        task = await (await rt.submit(agent, text, owner="alice")).wait(timeout=30)
        assert task.status is TaskStatus.COMPLETED
        return task.id


@pytest.mark.slow
def test_history_then_fork_with_an_edit(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/cli.db"
    tid = asyncio.run(_run_to_end(url, "parent"))
    code, out = cli("history", tid, "--store", url)
    assert code == 0, out
    assert "2 complete rounds" in out and "delegate(" in out and "[ok]" in out
    assert "Delegated." in out and "fork with: duragent fork" in out

    code, out = cli("fork", tid, "--at", "1", "--append-user", "and again", "--store", url)
    assert code == 0, out
    assert f"from {tid} at round 1" in out and "pending" in out
    fork_id = out.split("task ", 1)[1].split()[0]

    async def look() -> None:
        async with Runtime(url, agents(), run_worker=False) as rt:
            forked = await rt.get(fork_id)
            assert forked.config["forked_from"] == {"task_id": tid, "round": 1}
            assert forked.owner == "alice" and forked.status is TaskStatus.PENDING
            view = await rt.model_view(fork_id)
            assert view[-1].role == "user" and view[-1].content == "and again"

    asyncio.run(look())
    code, out = cli("history", fork_id, "--store", url)
    assert code == 0 and f"forked from {tid} at round 1" in out


def test_fork_errors_are_one_line(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/cli.db"
    tid = asyncio.run(_run_to_end(url, "quick"))
    code, out = cli("fork", tid, "--at", "5", "--store", url)
    assert code == 1 and out.startswith("error: ") and "round 5 does not exist" in out
    assert len(out.strip().splitlines()) == 1
    code, out = cli("fork", tid, "--at", "1", "--append-user", "", "--store", url)
    assert code == 1 and "invalid edit" in out
    code, out = cli("history", "t_missing", "--store", url)
    assert code == 1 and "no task with id" in out


def test_history_output_is_sanitized(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/cli.db"
    tid = asyncio.run(_run_to_end(url, "quick", "\x1b]0;owned\x07[bold red]hi[/bold red]\x1b[2J"))
    code, out = cli("history", tid, "--store", url)
    assert code == 0, out
    assert "\x1b" not in out and "\x07" not in out
    assert "[bold red]hi[/bold red]" in out  # shown as written, not as markup


def test_send_a_message_into_a_waiting_task_then_it_is_taken_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/cli.db"

    async def waiting() -> str:
        async with Runtime(url, agents(), poll_interval=0.05) as rt:
            sub = await rt.submit("approver", "go", owner="alice")
            await rt.wait(sub.task_id, timeout=30, until=lambda t: t.status is TaskStatus.WAITING)
            return sub.task_id

    tid = asyncio.run(waiting())
    code, out = cli("send", tid, "cc carol too", "--store", url)
    assert code == 0, out
    assert f"sent to task {tid} (waiting" in out and "after the current turn's answer" in out
    code, out = cli("send", tid, "x", "--strategy", "shout", "--store", url)
    assert code == 1 and "unknown multitask_strategy 'shout'" in out
    code, out = cli("send", tid, "x", "--strategy", "reject", "--store", url)
    assert code == 1 and "is waiting (a turn runs)" in out

    async def approve() -> list[str]:
        async with Runtime(url, agents(), poll_interval=0.05) as rt:
            await rt.respond(tid, approve=True)
            task = await rt.wait(tid, timeout=30)
            assert task.status is TaskStatus.COMPLETED
            return [m.content for m in await rt.model_view(tid) if m.role == "user"]

    assert asyncio.run(approve()) == ["go", "cc carol too"]
    code, out = cli("send", tid, "more", "--store", url)
    assert (
        code == 1
        and out.startswith("error: ")
        and f"duragent fork {tid} --at 3 --append-user more" in out
    )
    assert len(out.strip().splitlines()) == 1


def test_send_with_a_request_id_sends_once_also_after_the_task_took_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/cli.db"

    async def waiting() -> str:
        async with Runtime(url, agents(), poll_interval=0.05) as rt:
            sub = await rt.submit("approver", "go", owner="alice")
            await rt.wait(sub.task_id, timeout=30, until=lambda t: t.status is TaskStatus.WAITING)
            return sub.task_id

    tid = asyncio.run(waiting())
    send = ("send", tid, "cc carol too", "--request-id", "r1", "--store", url)
    for _ in range(2):
        code, out = cli(*send)
        assert code == 0, out
        assert f"sent to task {tid} (waiting" in out and "after the current turn's answer" in out
    code, out = cli("send", tid, "cc dave", "--request-id", "r1", "--store", url)
    assert code == 1 and "request_id 'r1' already sent task" in out

    async def approve() -> list[str]:
        async with Runtime(url, agents(), poll_interval=0.05) as rt:
            await rt.respond(tid, approve=True)
            task = await rt.wait(tid, timeout=30)
            assert task.status is TaskStatus.COMPLETED
            return [m.content for m in await rt.model_view(tid) if m.role == "user"]

    assert asyncio.run(approve()) == ["go", "cc carol too"]
    code, out = cli(*send)
    assert code == 0, out
    assert f"task {tid} (completed" in out and "already took the message" in out
    assert "not sent again" in out


@pytest.mark.slow
def test_show_and_history_print_the_handoff(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/cli.db"
    tid = asyncio.run(_run_to_end(url, "triage"))
    code, out = cli("show", tid, "--store", url)
    assert code == 0, out
    assert "handoff triage → billing" in out
    code, out = cli("history", tid, "--store", url)
    assert code == 0, out
    assert "→ billing" in out and "billing" in out.split("→ billing")[1]
    code, out = cli("export", tid, "--store", url)
    assert code == 0, out
    (handoff,) = [e for e in json.loads(out)["entries"] if e["kind"] == "handoff"]
    assert handoff["payload"]["from"] == "triage" and handoff["payload"]["to"] == "billing"
