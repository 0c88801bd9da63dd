"""`duragent bulk ACTION [filters]` in a real process: a dry-run count, a confirmation,
then the operation run with its progress shown; each matching task acted on once.
And `duragent worker` runs bulk operations started elsewhere."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer

from duragent import Runtime, TaskFilter, TaskStatus
from duragent.cli._bulk import run_here, when
from support.bulk import failed_tasks, failing_agent, retries_of
from support.workerlib import WorkerProc, workers

__all__ = ["workers"]  # the fixture this module uses from support.workerlib


def duragent(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "duragent", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )


async def setup(url: str) -> tuple[list[str], list[str]]:
    async with Runtime(url, agents=[failing_agent()], worker_queues=["flaky"]) as rt:
        red = await failed_tasks(rt, 3, "alice", team="red")
        blue = await failed_tasks(rt, 1, "alice", team="blue")
    return red, blue


async def retries(url: str, ids: list[str]) -> list[int]:
    async with Runtime(url, run_worker=False) as rt:
        return [await retries_of(rt.store, t) for t in ids]


@pytest.mark.slow
def test_bulk_command_counts_asks_then_retries_each_task_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/bulk.db"
    red, blue = asyncio.run(setup(url))
    filters = ["--store", url, "--meta", "team=red", "--updated-after", "1h"]

    done = duragent("bulk", "retry", *filters, "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "retry would touch 3 tasks (dry run: nothing changed)" in done.stdout
    done = duragent("bulk", "retry", *filters, stdin="n\n")  # asked, and refused
    assert done.returncode == 1 and "retry 3 tasks? [y/N]" in done.stdout
    assert asyncio.run(retries(url, red + blue)) == [0, 0, 0, 0]

    done = duragent("bulk", "retry", *filters, "--yes", "--page-size", "2")
    assert done.returncode == 0, done.stderr
    assert "retry: 3/3 (3 done, 0 skipped, 0 failed) done" in done.stdout
    assert asyncio.run(retries(url, red + blue)) == [1, 1, 1, 0]

    async def statuses() -> set[TaskStatus]:
        async with Runtime(url, run_worker=False) as rt:
            return {(await rt.get(t)).status for t in red}

    assert asyncio.run(statuses()) == {TaskStatus.PENDING}  # retried; no flaky worker here
    done = duragent("bulk", "restart", "--store", url)
    assert done.returncode == 2 and "is not one of: retry, abort, pause, resume, purge" in (
        done.stderr
    )
    done = duragent("bulk", "retry", "--store", url, "--created-after", "yesterday")
    assert done.returncode == 2 and "is not a time with a zone" in done.stderr


@pytest.mark.slow
async def test_duragent_worker_runs_bulk_operations(
    tmp_path: Path, workers: list[WorkerProc]
) -> None:
    url = f"sqlite:///{tmp_path}/bulk.db"
    red, blue = await setup(url)
    async with Runtime(url, run_worker=False) as rt:  # starts it; runs nothing
        op = await rt.bulk("retry", TaskFilter(metadata={"team": "blue"}), owner="ops")
    workers.append(WorkerProc(url))
    async with Runtime(url, run_worker=False) as rt:
        await rt.wait(op.id, timeout=60)
        assert (await rt.bulk_operation(op.id)).status == "done"
        assert [await retries_of(rt.store, t) for t in red + blue] == [0, 0, 0, 1]


def test_bulk_command_refuses_an_age_reaching_before_year_one() -> None:
    """An age too large for a date is a usage error, not a traceback."""
    with pytest.raises(typer.BadParameter, match="--created-after '9999999d' is not a time"):
        when("9999999d", "--created-after")


@pytest.mark.slow
async def test_bulk_command_returns_when_the_operation_ends_between_its_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`duragent bulk` waits for the operation's next change after reading it: an
    operation that ends just after that read (its last commit before the wait) must
    not be waited for forever."""
    url = f"sqlite:///{tmp_path}/bulk.db"
    await setup(url)
    async with Runtime(url, run_worker=False) as rt:
        op = await rt.bulk("retry", TaskFilter(metadata={"team": "blue"}), owner="ops")
    real_get = Runtime.get
    delayed: list[str] = []

    async def get_after_the_end(self: Runtime, task_id: str, **kw: Any) -> Any:
        if task_id == op.id and not delayed:  # the command's first read of it
            delayed.append(task_id)
            await self.wait(task_id, timeout=60)  # it ends meanwhile
        return await real_get(self, task_id, **kw)

    monkeypatch.setattr(Runtime, "get", get_after_the_end)
    done = await asyncio.wait_for(run_here(url, op.id, show=False), timeout=30)
    assert (done.status, done.done) == ("done", 1)


def test_bulk_command_with_json_asks_on_stderr(tmp_path: Path) -> None:
    """With --json, stdout carries JSON only: the confirmation is asked on stderr."""
    url = f"sqlite:///{tmp_path}/bulk.db"

    async def create() -> None:
        async with Runtime(url, run_worker=False):
            pass

    asyncio.run(create())
    done = duragent("bulk", "retry", "--store", url, "--json", stdin="n\n")
    assert done.returncode == 1
    # (click reads the answer with input(" "): a space, which JSON readers skip)
    assert done.stdout.strip() == "" and "retry 0 tasks? [y/N]" in done.stderr
