"""`duragent ls/show/pause/resume/abort/export/migrate` on real SQLite files and real workers."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from duragent import Runtime
from duragent.cli import app
from duragent.store import open_store
from duragent.store._commits import Commit, DocumentWrite
from duragent.store._sqlite_schema import SCHEMA_VERSION
from duragent.types import Task, TaskStatus, task_scope
from server_agents import agents
from support.server_live import CLI, child_env, duragent, stop

runner = CliRunner()


def cli(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args), env={"COLUMNS": "200"})
    return result.exit_code, result.output


async def _submit(url: str, agent: str, **kw: object) -> str:
    """Create a task without running it (no worker in this process)."""
    async with Runtime(url, agents(), run_worker=False) as rt:
        sub = await rt.submit(agent, "go", owner="alice", **kw)  # type: ignore[arg-type]
        return sub.task_id


async def _run_to_end(url: str, agent: str) -> str:
    async with Runtime(url, agents(), poll_interval=0.05) as rt:
        sub = await rt.submit(agent, "go", owner="alice")
        task = await sub.wait(timeout=30)
        assert task.status is TaskStatus.COMPLETED
        return task.id


async def _wait(url: str, task_id: str, done: object, timeout: float = 30) -> Task:
    store = open_store(url)
    await store.open()
    try:
        async with asyncio.timeout(timeout):
            while True:
                task = await store.get_task(task_id)
                if done(task):  # type: ignore[operator]
                    return task
                await store.wait_for_change(0.1)
    finally:
        await store.close()


def wait(url: str, task_id: str, done: object) -> Task:
    return asyncio.run(_wait(url, task_id, done))


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/cli.db"


@pytest.fixture
def worker(url: str, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    proc = duragent(
        "worker",
        "--store",
        url,
        "--agents",
        "server_agents:agents",
        "--poll-interval",
        "0.1",
        "--lease-ttl",
        "3",
        "--missing-agent-grace",
        "0.5",
        log=tmp_path / "worker.log",
    )
    yield proc
    stop(proc)


def test_ls_lists_and_filters(url: str) -> None:
    done = asyncio.run(_run_to_end(url, "quick"))
    pending = asyncio.run(_submit(url, "approver"))
    code, out = cli("ls", "--store", url)
    assert code == 0, out
    assert done in out and pending in out
    assert "completed" in out and "pending" in out and "alice" in out
    assert "Hello from quick." in out
    code, out = cli("ls", "--store", url, "--status", "pending")
    assert code == 0 and pending in out and done not in out
    code, out = cli("ls", "--store", url, "--agent", "nobody")
    assert code == 0 and "no tasks" in out


@pytest.mark.slow
def test_show_prints_the_timeline(url: str) -> None:
    tid = asyncio.run(_run_to_end(url, "streamer"))
    code, out = cli("show", tid, "--store", url)
    assert code == 0, out
    assert tid in out and "completed" in out and "streamer" in out
    for expected in (
        "user: go",
        "intent lookup (call_0_0, replay=safe)",
        "result call_0_0 [ok]: durability: surviving crashes",
        "assistant: The lookup confirms it.",
        "status running → completed",
        "streamed 'Let me think about durable execution",
    ):
        assert expected in out, expected
    code, out = cli("show", "t_missing", "--store", url)
    assert code == 1 and "no task with id 't_missing'" in out


@pytest.mark.slow
def test_show_follow_streams_a_running_task(url: str, tmp_path: Path) -> None:
    tid = asyncio.run(_submit(url, "streamer"))
    follow = subprocess.Popen(
        [sys.executable, "-c", CLI, "show", tid, "--store", url, "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=child_env(COLUMNS="200"),
    )
    assert follow.stdout is not None
    # The header and the (short) timeline are printed before the task starts...
    header = []
    for line in follow.stdout:
        header.append(line)
        if "└" in line or "┘" in line:  # the end of the timeline table
            break
    assert "pending" in "".join(header)
    # ...then a worker starts it, and what follows arrives live.
    proc = duragent(
        "worker", "--store", url, "--agents", "server_agents:agents", log=tmp_path / "w.log"
    )
    try:
        rest, _ = follow.communicate(timeout=60)
    finally:
        stop(proc)
    assert follow.returncode == 0, rest
    assert "Let me think about durable execution step by step." in rest
    assert "intent lookup" in rest and "tool_result" in rest
    assert f"task {tid} is completed" in rest
    assert "That is the whole idea." in rest


@pytest.mark.slow
def test_pause_resume_abort_a_task_another_process_runs(
    url: str, worker: subprocess.Popen[bytes]
) -> None:
    tid = asyncio.run(_submit(url, "slow"))
    wait(url, tid, lambda t: t.status is TaskStatus.RUNNING and t.last_seq >= 4)
    code, out = cli("pause", tid, "--store", url, "--rollback")
    assert code == 0, out
    assert f"task {tid} is paused" in out
    code, out = cli("resume", tid, "--store", url)
    assert code == 0 and "pending" in out
    # The worker process picks it up again.
    wait(url, tid, lambda t: t.status is TaskStatus.RUNNING)
    code, out = cli("abort", tid, "--store", url, "--reason", "operator said so")
    assert code == 0 and f"task {tid} is aborted" in out
    code, out = cli("show", tid, "--store", url)
    assert "operator said so" in out and "(incomplete round rolled back)" in out
    code, out = cli("resume", tid, "--store", url)
    assert code == 1 and "cannot go from 'aborted'" in out
    code, out = cli("pause", tid, "--store", url)
    assert code == 1 and "'aborted'" in out


async def _submit_input(url: str, agent: str, text: str) -> str:
    async with Runtime(url, agents(), run_worker=False) as rt:
        return (await rt.submit(agent, text, owner="alice")).task_id


@pytest.mark.slow
def test_retry_a_failed_task_another_process_runs(
    url: str, worker: subprocess.Popen[bytes]
) -> None:
    tid = asyncio.run(_submit_input(url, "flaky", "fail-cli"))
    failed = wait(url, tid, lambda t: t.status.terminal)
    assert failed.status is TaskStatus.FAILED
    code, out = cli("retry", tid, "--store", url)
    assert code == 0, out
    assert f"task {tid} is pending" in out
    done = wait(url, tid, lambda t: t.status.terminal)  # the worker process continues it
    assert done.status is TaskStatus.COMPLETED and done.iterations == 2
    code, out = cli("show", tid, "--store", url)
    assert "Retried after the failure" in out
    code, out = cli("retry", tid, "--store", url)
    assert code == 1 and "only a failed task can be retried" in out


@pytest.mark.slow
def test_a_task_for_an_agent_no_worker_knows_shows_blocked(
    url: str, worker: subprocess.Popen[bytes]
) -> None:
    from duragent import Agent
    from duragent.runtime._submit import new_task

    async def orphan() -> str:
        store = open_store(url)
        await store.open()
        try:
            task, first = new_task(Agent(name="ghost", model="scripted:none"), "boo")
            return (await store.create_task(task, [first]))[0].id
        finally:
            await store.close()

    tid = asyncio.run(orphan())
    blocked = wait(url, tid, lambda t: t.status is TaskStatus.BLOCKED)
    assert blocked.status_reason == "missing_definition"
    code, out = cli("show", tid, "--store", url)
    assert code == 0 and "blocked (missing_definition)" in out
    assert "no running worker knows agent 'ghost'" in out


async def _with_document(url: str, tid: str) -> None:
    store = open_store(url)
    await store.open()
    try:
        await store.commit(Commit(documents=[DocumentWrite(task_scope(tid), "notes", {"n": 1})]))
    finally:
        await store.close()


def test_export_writes_the_whole_task(url: str, tmp_path: Path) -> None:
    tid = asyncio.run(_run_to_end(url, "parent"))
    asyncio.run(_with_document(url, tid))
    code, out = cli("export", tid, "--store", url)
    assert code == 0, out
    data = json.loads(out)
    assert data["task"]["id"] == tid and data["task"]["status"] == "completed"
    seqs = [e["seq"] for e in data["entries"]]
    assert seqs == list(range(1, data["task"]["last_seq"] + 1))
    assert [(d["key"], d["value"]) for d in data["documents"]] == [("notes", {"n": 1})]
    (child,) = data["children"]
    assert child["task"]["parent_id"] == tid and child["task"]["output"] == "Hello from quick."
    assert child["entries"] and child["children"] == []
    target = tmp_path / "export.json"
    code, _ = cli("export", tid, "--store", url, "--output", str(target))
    assert code == 0 and json.loads(target.read_text()) == data


def test_migrate_reports_schema_versions(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    url = f"sqlite:///{path}"
    code, out = cli("migrate", "--store", url)
    assert code == 0, out
    assert f"before: 0, after: {SCHEMA_VERSION} (new store)" in out
    code, out = cli("migrate", "--store", url)
    assert f"before: {SCHEMA_VERSION}, after: {SCHEMA_VERSION} (up to date)" in out
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    code, out = cli("migrate", "--store", url)
    assert code == 1 and "schema version 99" in out and "upgrade duragent" in out
    code, out = cli("migrate", "--store", "nonsense")
    assert code == 2 and "no scheme" in out


def test_migrate_moves_a_task_to_another_version_and_show_and_ls_say_none_serves_it(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/v.db"
    tid = asyncio.run(_submit(url, "quick"))
    code, out = cli("migrate", tid, "--to", "v4", "--store", url)
    assert code == 0, out
    assert f"task {tid} is pending on quick@v4" in out
    code, out = cli("show", tid, "--store", url)
    assert code == 0 and "waiting for quick@v4: no worker serves it" in out
    assert "migration" in out and "→ v4 by cli" in out
    code, out = cli("ls", "--store", url)
    assert code == 0 and "waiting for quick@v4: no worker serves it" in out
    code, out = cli("ls", "--store", url, "--json")
    assert json.loads(out)[0]["unserved"] == "waiting for quick@v4: no worker serves it"
    code, out = cli("migrate", tid, "--store", url)
    assert code == 1 and "duragent migrate TASK --to v4" in out
    code, out = cli("migrate", tid, "--to", "v 4", "--store", url)
    assert code != 0 and "agent version" in out
