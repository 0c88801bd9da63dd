"""What a new user meets at the terminal (issue 37, items 15, 17 and 18): one-line
errors that say what to do, waits that say what they wait for, --json and --version.

Every command runs as a real process on a real SQLite file.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from duragent import Runtime
from duragent.store import open_store
from duragent.types import TaskStatus
from server_agents import agents
from support.server_live import CLI, child_env


def run(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CLI, *args],
        capture_output=True,
        text=True,
        env=child_env(COLUMNS="200", **(env or {})),
        cwd=cwd,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def one_line_error(result: subprocess.CompletedProcess[str], notes: int = 0) -> str:
    """The error a failed command printed: one line on stderr (after `notes` lines
    saying what it waited for), no traceback."""
    assert result.returncode != 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 + notes, result.stderr
    assert lines[-1].startswith("error: "), result.stderr
    return lines[-1]


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/conv.db"


async def _held_by_a_dead_worker(url: str, ttl: float) -> str:
    """A running task whose worker is gone: its lease runs `ttl` s, nobody renews it."""
    async with Runtime(url, agents(), run_worker=False) as rt:
        task_id = (await rt.submit("slow", "go")).task_id
    store = open_store(url)
    await store.open()
    try:
        claimed = await store.claim_task("dead-host:4242", task_id=task_id, ttl=ttl)
        assert claimed is not None and claimed.status is TaskStatus.RUNNING
    finally:
        await store.close()
    return task_id


async def _status(url: str, task_id: str) -> TaskStatus:
    store = open_store(url)
    await store.open()
    try:
        return (await store.get_task(task_id)).status
    finally:
        await store.close()


# --- item 15: controls of a task whose worker died ------------------------------


@pytest.mark.parametrize(("action", "status"), [("pause", "paused"), ("abort", "aborted")])
def test_a_control_of_a_task_whose_worker_died_says_what_it_waits_for_and_applies(
    url: str, action: str, status: str
) -> None:
    task_id = asyncio.run(_held_by_a_dead_worker(url, ttl=2.0))
    result = run(action, task_id, "--store", url)
    assert result.returncode == 0, result.stderr
    assert "waiting up to 60 s for the task's worker to reach a safe point" in result.stderr
    assert "dead-host:4242" in result.stderr  # whose lease it waits for
    assert f"is {status}" in result.stdout
    assert asyncio.run(_status(url, task_id)).value == status


@pytest.mark.parametrize("action", ["pause", "abort"])
def test_a_control_that_times_out_is_one_line_saying_it_is_recorded(url: str, action: str) -> None:
    task_id = asyncio.run(_held_by_a_dead_worker(url, ttl=600.0))
    result = run(action, task_id, "--store", url, "--timeout", "0.5")
    error = one_line_error(result, notes=1)
    assert f"the {action} of task '{task_id}' is recorded" in error
    assert "when a worker next takes the task" in error
    # The request stays on the row: the next worker to take the task acts on it.
    assert asyncio.run(_status(url, task_id)) is TaskStatus.RUNNING
