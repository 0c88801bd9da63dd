"""The seed rows of issue 38 over REST (httpx + ASGI on a real SQLite runtime) and
through the `duragent` CLI in a child process, on a real SQLite file."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from duragent import Runtime
from duragent.server import TokenStore, create_app
from duragent.store._commits import Commit
from duragent.store._sqlite_schema import KIND_CODES
from duragent.types import EntryKind, NewEntry, TaskStatus
from server_agents import agents
from support.api import TOKENS, assert_problem, auth, client, runtime, start, wait_for
from support.seed_rows import FutureKind, streaming
from support.server_live import CLI, child_env

__all__ = ["client", "runtime"]  # the fixtures this module uses from support.api


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`duragent ARGS` in a child process."""
    return subprocess.run(
        [sys.executable, "-c", CLI, *args],
        env=child_env(COLUMNS="200"),
        capture_output=True,
        text=True,
        timeout=60,
    )


def cli_json(*args: str) -> Any:
    done = cli(*args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


# --- the plan -------------------------------------------------------------------


async def test_put_plan_sets_the_pending_steps_of_my_task_only(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    tid = await start(client, "approver")
    await wait_for(runtime, tid, TaskStatus.WAITING)
    r = await client.put(
        f"/v1/tasks/{tid}/plan", json={"steps": ["ask bob", "send it"]}, headers=auth("alice")
    )
    assert r.status_code == 200, r.text
    assert r.json()["pending"] == ["ask bob", "send it"]
    steps = await client.get(f"/v1/tasks/{tid}/steps", headers=auth("alice"))
    assert steps.json()["pending"] == ["ask bob", "send it"]
    r = await client.put(f"/v1/tasks/{tid}/plan", json={"steps": ["x"]}, headers=auth("bob"))
    assert_problem(r, 404, "Task not found")
    bads: list[dict[str, Any]] = [
        {"steps": [""]},
        {"steps": "one"},
        {"steps": [1]},
        {"steps": [], "x": 1},
        {},
    ]
    for bad in bads:
        r = await client.put(f"/v1/tasks/{tid}/plan", json=bad, headers=auth("alice"))
        assert_problem(r, 422, "Validation error")
    assert (await runtime.steps(tid)).pending == ["ask bob", "send it"]


@pytest.mark.slow
async def test_duragent_plan_sets_and_clears_the_steps(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/cli.db"
    async with Runtime(url, agents(), run_worker=False) as rt:
        tid = (await rt.submit("quick", "go")).task_id
    got = cli_json("plan", tid, "--step", "first", "--step", "second", "--store", url)
    assert got == {"task_id": tid, "pending": ["first", "second"]}
    assert cli_json("steps", tid, "--store", url)["pending"] == ["first", "second"]
    shown = cli("plan", tid, "--step", "only", "--store", url)
    assert shown.returncode == 0 and "1 pending step" in shown.stdout and "1. only" in shown.stdout
    assert cli_json("plan", tid, "--clear", "--store", url)["pending"] == []
    nothing = cli("plan", tid, "--store", url)
    assert nothing.returncode != 0 and nothing.stderr.count("\n") == 1
    assert "--step" in nothing.stderr
    empty = cli("plan", tid, "--step", " ", "--store", url)
    assert empty.returncode != 0 and "step 1" in empty.stderr


# --- the answer so far -------------------------------------------------------------


@pytest.mark.slow
async def test_rest_and_cli_show_a_running_tasks_answer_so_far(tmp_path: Path) -> None:
    agent, held, release, trace = streaming(2)
    url = f"sqlite:///{tmp_path}/partial.db"
    async with Runtime(url, [agent], trace=trace) as rt:
        app = create_app(rt, TokenStore.from_mapping(TOKENS))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as c:
            tid = (await rt.submit("s", "go", owner="alice")).task_id
            await asyncio.wait_for(held.wait(), 30)
            r = await c.get(f"/v1/tasks/{tid}", headers=auth("alice"))
            assert r.json()["status"] == "running"
            assert r.json()["partial_output"] == "abcdefgh"
            shown = await asyncio.to_thread(cli_json, "show", tid, "--store", url)
            assert shown["task"]["partial_output"] == "abcdefgh"
            text = await asyncio.to_thread(cli, "show", tid, "--store", url)
            assert text.returncode == 0 and "so far" in text.stdout and "abcdefgh" in text.stdout
            release.set()
            await rt.wait(tid, timeout=30)
            r = await c.get(f"/v1/tasks/{tid}", headers=auth("alice"))
            assert r.json()["partial_output"] is None and r.json()["output"] == "abcdefghijkl"


# --- sessions ------------------------------------------------------------------------


async def test_sessions_over_rest_are_the_callers_own(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    first = await start(client, "quick", session_id="s1")
    await wait_for(runtime, first, TaskStatus.COMPLETED)
    r = await client.post(
        "/v1/sessions/s1/messages", json={"input": "and now?"}, headers=auth("alice")
    )
    assert r.status_code == 201, r.text
    second = r.json()["id"]
    assert r.json()["session_id"] == "s1" and r.json()["agent"] == "quick"
    await wait_for(runtime, second, TaskStatus.COMPLETED)
    listed = (await client.get("/v1/sessions", headers=auth("alice"))).json()["sessions"]
    assert [(s["session_id"], s["turns"], s["latest_task_id"]) for s in listed] == [
        ("s1", 2, second)
    ]
    got = (await client.get("/v1/sessions/s1", headers=auth("alice"))).json()
    assert [t["id"] for t in got["tasks"]] == [first, second]
    users = [m["content"] for m in got["transcript"] if m["role"] == "user"]
    assert users == ["go", "and now?"]
    assert (await client.get("/v1/sessions", headers=auth("bob"))).json()["sessions"] == []
    for method, path, body in (
        ("GET", "/v1/sessions/s1", None),
        ("POST", "/v1/sessions/s1/messages", {"input": "bob was here"}),
        ("GET", "/v1/sessions/missing", None),
    ):
        r = await client.request(method, path, json=body, headers=auth("bob"))
        assert_problem(r, 404, "Session not found")
    bad = await client.post(
        "/v1/sessions/s1/messages", json={"input": "x", "extra": 1}, headers=auth("alice")
    )
    assert_problem(bad, 422, "Validation error")
    assert len((await runtime.session("s1", owner="alice")).tasks) == 2


@pytest.mark.slow
async def test_duragent_sessions_and_session_show_an_owners_conversations(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/sessions.db"
    async with Runtime(url, agents()) as rt:
        first = await rt.submit("quick", "hello", owner="alice", session_id="s1")
        await first.wait(30)
        second = await rt.continue_session("s1", "and now?", owner="alice")
        await second.wait(30)
    listed = cli_json("sessions", "--owner", "alice", "--store", url)
    assert [(s["session_id"], s["turns"]) for s in listed] == [("s1", 2)]
    got = cli_json("session", "s1", "--owner", "alice", "--store", url)
    assert [t["id"] for t in got["tasks"]] == [first.task_id, second.task_id]
    assert [m["content"] for m in got["transcript"] if m["role"] == "user"] == [
        "hello",
        "and now?",
    ]
    shown = cli("session", "s1", "--owner", "alice", "--store", url)
    assert shown.returncode == 0 and "2 turns" in shown.stdout and "user: and now?" in shown.stdout
    assert cli_json("sessions", "--owner", "bob", "--store", url) == []
    missing = cli("session", "s1", "--owner", "bob", "--store", url)
    assert missing.returncode != 0 and missing.stderr.strip() == "error: no session 's1'"


# --- an entry a later version wrote ---------------------------------------------------


@pytest.mark.slow
async def test_a_task_a_later_version_wrote_is_blocked_and_named_over_rest_and_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path}/future.db"
    async with Runtime(url, agents(), run_worker=False) as writer:
        tid = (await writer.submit("quick", "go", owner="alice")).task_id
        codes: dict[Any, int] = KIND_CODES
        monkeypatch.setitem(codes, FutureKind.HOLOGRAM, 99)
        entry = NewEntry(task_id=tid, kind=EntryKind.PROGRESS, payload={}, round=1)
        entry.kind = FutureKind.HOLOGRAM  # type: ignore[assignment]
        await writer.store.commit(Commit(entries=[entry]))
        monkeypatch.delitem(codes, FutureKind.HOLOGRAM)
    async with Runtime(url, agents()) as rt:
        await rt.resume()
        await wait_for(rt, tid, TaskStatus.BLOCKED)
        app = create_app(rt, TokenStore.from_mapping(TOKENS))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as c:
            got = (await c.get(f"/v1/tasks/{tid}", headers=auth("alice"))).json()
            assert got["status_reason"] == "incompatible_store"
            r = await c.get(f"/v1/tasks/{tid}/entries", headers=auth("alice"))
            detail = assert_problem(r, 409, "Entry written by a newer version")["detail"]
            assert "entry 2 (kind 'code 99')" in detail
    shown = cli("show", tid, "--store", url)
    assert shown.returncode == 1 and shown.stderr.count("\n") == 1
    assert "cannot be read by this version" in shown.stderr
