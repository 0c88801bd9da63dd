"""`duragent counts/purge/erase-owner/queue/schedule` and `ls` filters on a real SQLite file."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from duragent import Runtime, TaskStatus
from duragent.cli import app
from duragent.store import open_store
from duragent.store._queues import list_queues
from server_agents import agents

runner = CliRunner()


def cli(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args), env={"COLUMNS": "200"})
    return result.exit_code, result.output


async def _finished(url: str, owner: str, **kw: object) -> str:
    async with Runtime(url, agents(), poll_interval=0.05) as rt:
        sub = await rt.submit("quick", "go", owner=owner, **kw)  # type: ignore[arg-type]
        task = await sub.wait(timeout=30)
        assert task.status is TaskStatus.COMPLETED
        return task.id


@pytest.mark.slow
def test_ls_filters_counts_and_purge(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/c.db"
    a = asyncio.run(_finished(url, "alice", queue="reports", metadata={"team": "red"}))
    b = asyncio.run(_finished(url, "bob"))
    code, out = cli("ls", "--store", url, "--queue", "reports")
    assert code == 0 and a in out and b not in out
    code, out = cli("ls", "--store", url, "--meta", "team=red", "--since", "1h")
    assert code == 0 and a in out and b not in out
    code, out = cli("ls", "--store", url, "--meta", "nonsense")
    assert code == 2 and "key=value" in out
    code, out = cli("counts", "--store", url)
    assert code == 0 and "reports" in out and "quick" in out and "completed" in out
    code, out = cli("purge", "--store", url, "--older-than", "1h")
    assert code == 0 and "deleted 0 tasks" in out
    code, out = cli("purge", "--store", url, "--older-than", "0s", "--owner", "alice")
    assert code == 0 and "deleted 1 tasks" in out
    code, out = cli("purge", "--store", url, "--older-than", "0s", "--status", "running")
    assert code == 2 and "finished tasks only" in out
    code, out = cli("erase-owner", "bob", "--store", url, "--yes")
    assert code == 0 and "deleted 1 tasks of bob" in out
    code, out = cli("ls", "--store", url)
    assert code == 0 and "no tasks" in out


@pytest.mark.slow
def test_queue_and_schedule_commands(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/c.db"
    code, out = cli("queue", "set", "mail", "--store", url, "--concurrency", "3", "--rate", "10/60")
    assert code == 0 and '"concurrency": 3' in out, out
    code, out = cli("queue", "ls", "--store", url)
    assert code == 0 and "mail" in out and "10/60s" in out
    code, out = cli("queue", "set", "mail", "--store", url, "--rate", "ten")
    assert code == 2
    code, out = cli(
        "schedule", "add", "nightly", "--store", url, "--agent", "quick", "--input", "go",
        "--cron", "0 3 * * *", "--owner", "alice", "--agents", "server_agents:agents",
    )  # fmt: skip
    assert code == 0 and "next tick" in out, out
    code, out = cli(
        "schedule", "add", "bad", "--store", url, "--agent", "quick", "--input", "go",
        "--cron", "every day", "--agents", "server_agents:agents",
    )  # fmt: skip
    assert code == 2 and "5 fields" in out
    code, out = cli("schedule", "ls", "--store", url)
    assert code == 0 and "nightly" in out and "0 3 * * *" in out and "active" in out
    code, out = cli("schedule", "pause", "nightly", "--store", url, "--owner", "alice")
    assert code == 0 and "paused" in out
    code, out = cli("schedule", "resume", "nightly", "--store", url, "--owner", "alice")
    assert code == 0 and "active" in out
    code, out = cli("schedule", "rm", "nightly", "--store", url)
    assert code == 1 and "no schedule named" in out  # it is alice's
    code, out = cli("schedule", "rm", "nightly", "--store", url, "--owner", "alice")
    assert code == 0
    store = open_store(url)
    asyncio.run(store.open())
    try:
        from duragent.runtime._schedules import list_schedules

        assert asyncio.run(list_schedules(store)) == []
    finally:
        asyncio.run(store.close())


def duragent(*args: str) -> subprocess.CompletedProcess[str]:
    """`python -m duragent ARGS` as its own process."""
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "duragent", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=Path(__file__).parent,
    )


@pytest.mark.slow
def test_queue_set_ls_rm_as_a_real_process(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/q.db"
    asyncio.run(_finished(url, "alice", queue="mail"))
    got = duragent(
        "queue", "set", "mail", "--store", url, "--concurrency", "3", "--per-owner", "1",
        "--rate", "10/60", "--ttl", "30d",
    )  # fmt: skip
    assert got.returncode == 0 and '"concurrency": 3' in got.stdout, got.stderr
    got = duragent("queue", "ls", "--store", url)
    assert got.returncode == 0, got.stderr
    (row,) = [line for line in got.stdout.splitlines() if "mail" in line]
    assert "10/60s" in row and "30d" in row and "completed 1" in row
    assert duragent("queue", "set", "mail", "--store", url, "--concurrency", "0").returncode == 2
    assert duragent("queue", "set", "mail", "--store", url, "--rate", "ten").returncode == 2
    assert duragent("queue", "set", "mail", "--store", url, "--ttl", "soon").returncode == 2
    store = open_store(url)
    asyncio.run(store.open())
    try:
        (q,) = asyncio.run(list_queues(store))
        assert (q.concurrency, q.per_owner, q.rate) == (
            3,
            1,
            (10, 60.0),
        )  # the bad ones changed nothing
    finally:
        asyncio.run(store.close())
    got = duragent("queue", "rm", "mail", "--store", url)
    assert got.returncode == 0 and "limits removed" in got.stdout, got.stderr
    got = duragent("queue", "rm", "mail", "--store", url)
    assert got.returncode == 1 and "no queue named 'mail'" in got.stdout + got.stderr
    got = duragent("queue", "ls", "--store", url)  # its tasks stay, now unlimited
    (row,) = [line for line in got.stdout.splitlines() if "mail" in line]
    assert "completed 1" in row and "10/60s" not in row
