"""SIGKILL around an edited approval, and an approval's time limit across a worker restart.

A real worker process parks the task on an approval; the test decides it
(with edited arguments) from its own process, and kills the worker before or
while the call runs. The call runs with the edited arguments, once (a
never-replay call is never run twice; a replay-safe one re-runs with the
edit, never with the model's arguments).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from approval_child import mailer
from conftest import drop_schema, pg_schema_url
from duragent import Runtime, TaskStatus, ToolMessage
from duragent.types import AssistantMessage, EntryKind
from support.crashlib import finish, kill_at, read_until, spawn

EDIT = {"to": "carol", "body": "hello"}


@pytest.fixture(params=["sqlite", "postgres", "postgres-psycopg"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/a.db"
        return
    schema = f"test_{uuid.uuid4().hex[:12]}"
    yield pg_schema_url(request.param, schema)
    drop_schema(schema)


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("DURAGENT_TEST_HOLD", "DURAGENT_TEST_REPLAY", "DURAGENT_TEST_APPROVAL_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


async def submit(url: str, ledger: Path) -> str:
    async with Runtime(url, agents=[mailer(ledger)], run_worker=False) as rt:
        return (await rt.submit("mailer", "write to bob")).task_id


async def decide(url: str, ledger: Path, task_id: str) -> None:
    async with Runtime(url, agents=[mailer(ledger)], run_worker=False) as rt:
        await rt.respond(task_id, approve=True, arguments=EDIT)


def ran(ledger: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in ledger.read_text().splitlines()] if ledger.exists() else []


async def outcome(url: str, ledger: Path, task_id: str) -> tuple[Any, ToolMessage, str]:
    async with Runtime(url, agents=[mailer(ledger)], run_worker=False) as rt:
        task = await rt.get(task_id)
        view = await rt.model_view(task_id)
        entries = await rt.store.entries(task_id)
    calls = [c.id for m in view if isinstance(m, AssistantMessage) for c in m.tool_calls or ()]
    results = [m for m in view if isinstance(m, ToolMessage)]
    assert [m.tool_call_id for m in results] == calls  # each call answered exactly once
    (result,) = results
    (kind,) = [
        e.payload["outcome"]
        for e in entries
        if e.kind is EntryKind.TOOL_RESULT and e.payload["tool_call_id"] == result.tool_call_id
    ]
    return task, result, kind


@pytest.mark.slow
async def test_sigkill_before_an_edited_call_runs(
    url: str, tmp_path: Path, env: pytest.MonkeyPatch
) -> None:
    ledger = tmp_path / "ledger"
    tid = await submit(url, ledger)
    parker = spawn("approval_child.py", url, tid, str(ledger), "park")
    kill_at(parker, "parked")  # the worker dies with the task parked
    await decide(url, ledger, tid)  # the decision is committed; no worker is alive
    out = finish(spawn("approval_child.py", url, tid, str(ledger), "finish"))
    assert "done completed" in out
    assert ran(ledger) == [EDIT]
    task, result, kind = await outcome(url, ledger, tid)
    assert kind == "ok" and result.content.endswith("sent to carol")
    assert "a person edited this call's arguments" in result.content
    assert task.output == result.content


@pytest.mark.slow
@pytest.mark.parametrize("replay", ["never", "safe"])
async def test_sigkill_while_an_edited_call_runs(
    url: str, tmp_path: Path, env: pytest.MonkeyPatch, replay: str
) -> None:
    ledger = tmp_path / "ledger"
    env.setenv("DURAGENT_TEST_REPLAY", replay)
    tid = await submit(url, ledger)
    env.setenv("DURAGENT_TEST_HOLD", "1")
    worker = spawn("approval_child.py", url, tid, str(ledger), "park")
    assert worker.stdout is not None
    try:
        read_until(worker.stdout, "parked", 60)
        await decide(url, ledger, tid)  # the live worker picks it up and starts the call
    except BaseException:
        worker.kill()
        raise
    kill_at(worker, "running")  # killed inside the call, after its side effect
    env.delenv("DURAGENT_TEST_HOLD")
    out = finish(spawn("approval_child.py", url, tid, str(ledger), "finish"))
    assert "done completed" in out
    task, result, kind = await outcome(url, ledger, tid)
    assert "a person edited this call's arguments" in result.content
    if replay == "never":
        # Never run twice: the model is told it was interrupted (and what it ran with).
        assert ran(ledger) == [EDIT]
        assert kind == "interrupted" and "Tool call interrupted" in result.content
    else:
        # Re-run after the crash, with the edited arguments, never the model's.
        assert ran(ledger) == [EDIT, EDIT]
        assert kind == "ok" and result.content.endswith("sent to carol")
    assert task.status is TaskStatus.COMPLETED


@pytest.mark.slow
async def test_an_approval_times_out_across_a_worker_restart(
    url: str, tmp_path: Path, env: pytest.MonkeyPatch
) -> None:
    ledger = tmp_path / "ledger"
    # Long enough that the first worker is surely killed before it expires.
    env.setenv("DURAGENT_TEST_APPROVAL_TIMEOUT", "4")
    tid = await submit(url, ledger)
    kill_at(spawn("approval_child.py", url, tid, str(ledger), "park"), "parked")
    async with Runtime(url, agents=[mailer(ledger)], run_worker=False) as rt:
        parked = await rt.get(tid)
    assert parked.status is TaskStatus.WAITING and parked.wake_at is not None
    # A new worker, knowing nothing of the first, fires the durable timer.
    out = finish(spawn("approval_child.py", url, tid, str(ledger), "finish"))
    assert "done completed" in out
    task, result, kind = await outcome(url, ledger, tid)
    assert kind == "denied" and ran(ledger) == []
    assert result.content == (
        "The call was denied: no decision within 4 seconds (the approval expired)."
    )
    assert task.updated_at >= parked.wake_at
