"""The REST API against a real Runtime on a real SQLite file (httpx + ASGI, no server)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest

from duragent import Runtime
from duragent.server import TokenStore
from duragent.types import TaskStatus
from support.api import TOKENS, assert_problem, auth, client, runtime, start, wait_for

__all__ = ["client", "runtime"]  # the fixtures this module uses from support.api


async def test_health_needs_no_token(client: httpx.AsyncClient) -> None:
    r = await client.get("/v1/health")
    assert r.status_code == 200
    assert r.json() == {"status": "ok", "store": "sqlite", "worker": True}


async def test_missing_or_bad_token_is_401_problem(client: httpx.AsyncClient) -> None:
    r = await client.get("/v1/tasks")
    body = assert_problem(r, 401, "Unauthorized")
    assert r.headers["www-authenticate"].startswith("Bearer")
    assert "Bearer" in body["detail"]
    r = await client.get("/v1/tasks", headers={"Authorization": "Bearer nope"})
    assert_problem(r, 401, "Unauthorized")
    r = await client.get("/v1/tasks", headers={"Authorization": f"Basic {TOKENS['alice']}"})
    assert_problem(r, 401, "Unauthorized")
    r = await client.get("/v1/me", headers=auth("bob"))
    assert r.json() == {"user": "bob", "admin": False}


# --- tasks -------------------------------------------------------------------


@pytest.mark.slow
async def test_start_task_runs_to_completion_and_reports_everything(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    r = await client.post(
        "/v1/tasks",
        json={"agent": "quick", "input": "hi", "request_id": "r-1", "context": {"a": {"b": 1}}},
        headers=auth("alice"),
    )
    assert r.status_code == 201
    created = r.json()
    assert created["status"] in ("pending", "running", "completed")
    assert created["input"] == "hi" and created["context"] == {"a": {"b": 1}}
    await wait_for(runtime, created["id"], TaskStatus.COMPLETED)
    r = await client.get(f"/v1/tasks/{created['id']}", headers=auth("alice"))
    task = r.json()
    assert task["status"] == "completed"
    assert task["output"] == "Hello from quick."
    assert task["current_step"] is None and task["iterations"] == 1
    assert task["usage"]["output_tokens"] > 0
    assert task["completed_at"] is not None and task["error"] is None
    assert task["parent_id"] is None and task["last_seq"] > 0
    # The same request_id from the same user: the same task, 200 not 201.
    again = await client.post(
        "/v1/tasks",
        json={"agent": "quick", "input": "hi", "request_id": "r-1"},
        headers=auth("alice"),
    )
    assert again.status_code == 200 and again.json()["id"] == created["id"]
    # ...but from another user it is a new task.
    other = await client.post(
        "/v1/tasks",
        json={"agent": "quick", "input": "hi", "request_id": "r-1"},
        headers=auth("bob"),
    )
    assert other.status_code == 201 and other.json()["id"] != created["id"]


@pytest.mark.slow
async def test_running_task_shows_current_step(client: httpx.AsyncClient, runtime: Runtime) -> None:
    tid = await start(client, "slow")
    await runtime.wait(tid, timeout=30, until=lambda t: t.last_seq >= 4)
    task = (await client.get(f"/v1/tasks/{tid}", headers=auth("alice"))).json()
    assert task["status"] == "running"
    assert task["current_step"] == task["iterations"] + 1 == 1
    await client.post(f"/v1/tasks/{tid}/abort", json={"reason": "done here"}, headers=auth("alice"))


async def test_unknown_agent_and_invalid_body(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/tasks", json={"agent": "nobody", "input": 1}, headers=auth("alice"))
    body = assert_problem(r, 400, "Unknown agent")
    assert "quick" in body["detail"]
    r = await client.post("/v1/tasks", json={"input": "x"}, headers=auth("alice"))
    body = assert_problem(r, 422, "Validation error")
    assert body["errors"][0]["loc"] == ["body", "agent"]
    r = await client.post(
        "/v1/tasks",
        content=b"{not json",
        headers={**auth("alice"), "content-type": "application/json"},
    )
    assert_problem(r, 422, "Validation error")
    r = await client.post(
        "/v1/tasks",
        json={"agent": "quick", "input": "x", "continue_session": True},
        headers=auth("alice"),
    )
    assert "session_id" in assert_problem(r, 422, "Validation error")["detail"]
    r = await client.post(
        "/v1/tasks",
        json={"agent": "quick", "input": "x", "continue_session": "0"},
        headers=auth("alice"),
    )
    assert_problem(r, 422, "Validation error")  # strict: a string is not a boolean


async def test_list_filters_and_pages(client: httpx.AsyncClient, runtime: Runtime) -> None:
    ids = [await start(client, "quick", session_id="s1") for _ in range(3)]
    ids.append(await start(client, "approver", session_id="s2"))
    for tid in ids[:3]:
        await wait_for(runtime, tid, TaskStatus.COMPLETED)
    await wait_for(runtime, ids[3], TaskStatus.WAITING)
    await start(client, "quick", user="bob")
    h = auth("alice")
    everything = (await client.get("/v1/tasks", headers=h)).json()
    assert {t["id"] for t in everything["tasks"]} == set(ids)
    assert everything["next_cursor"] is None
    waiting = (await client.get("/v1/tasks?status=waiting", headers=h)).json()["tasks"]
    assert [t["id"] for t in waiting] == [ids[3]]
    both = (await client.get("/v1/tasks?status=waiting&status=completed", headers=h)).json()
    assert len(both["tasks"]) == 4
    by_agent = (await client.get("/v1/tasks?agent=approver", headers=h)).json()["tasks"]
    assert [t["id"] for t in by_agent] == [ids[3]]
    in_s1 = (await client.get("/v1/tasks?session_id=s1", headers=h)).json()["tasks"]
    assert {t["id"] for t in in_s1} == set(ids[:3])
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        page = (await client.get("/v1/tasks", params=params, headers=h)).json()
        seen += [t["id"] for t in page["tasks"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(ids) and len(seen) == 4
    r = await client.get("/v1/tasks?cursor=garbage", headers=h)
    assert "cursor" in assert_problem(r, 422, "Validation error")["detail"]
    assert_problem(await client.get("/v1/tasks?status=nope", headers=h), 422, "Validation error")


async def test_messages_steps_entries_and_tree(client: httpx.AsyncClient, runtime: Runtime) -> None:
    tid = await start(client, "parent")
    await wait_for(runtime, tid, TaskStatus.COMPLETED)
    h = auth("alice")
    model = (await client.get(f"/v1/tasks/{tid}/messages?view=model", headers=h)).json()
    assert model["view"] == "model"
    assert [m["role"] for m in model["messages"]] == ["user", "assistant", "tool", "assistant"]
    ui = (await client.get(f"/v1/tasks/{tid}/messages?view=ui", headers=h)).json()
    cards = [m for m in ui["messages"] if m["type"] == "tool"]
    assert cards[0]["name"] == "delegate" and cards[0]["state"] == "ok"
    assert cards[0]["result"] == "Hello from quick."
    steps = (await client.get(f"/v1/tasks/{tid}/steps", headers=h)).json()
    assert steps["iterations"] == 2 and steps["output"] == "Delegated."
    assert steps["completed"][0]["actions"][0]["tool"] == "delegate"
    assert steps["completed"][0]["actions"][0]["observation"] == "Hello from quick."
    tree = (await client.get(f"/v1/tasks/{tid}/tree", headers=h)).json()
    assert tree["task"]["id"] == tid
    (child,) = tree["children"]
    assert child["task"]["agent"] == "quick" and child["task"]["parent_id"] == tid
    assert child["task"]["status"] == "completed"
    # The child belongs to alice too, and is readable on its own.
    assert (await client.get(f"/v1/tasks/{child['task']['id']}", headers=h)).status_code == 200
    entries = (await client.get(f"/v1/tasks/{tid}/entries", headers=h)).json()
    seqs = [e["seq"] for e in entries["entries"]]
    assert seqs == list(range(1, entries["last_seq"] + 1))
    tail = (await client.get(f"/v1/tasks/{tid}/entries?after=3&limit=2", headers=h)).json()
    assert [e["seq"] for e in tail["entries"]] == [4, 5]


@pytest.mark.slow
async def test_pause_resume_abort_and_invalid_transitions(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    h = auth("alice")
    tid = await start(client, "slow")
    await runtime.wait(tid, timeout=30, until=lambda t: t.last_seq >= 4)
    r = await client.post(f"/v1/tasks/{tid}/pause", json={"rollback": True}, headers=h)
    assert r.status_code == 200 and r.json()["status"] == "paused"
    assert r.json()["paused_at"] is not None
    again = await client.post(f"/v1/tasks/{tid}/pause", headers=h)  # pausing is idempotent
    assert again.status_code == 200 and again.json()["status"] == "paused"
    r = await client.post(f"/v1/tasks/{tid}/resume", headers=h)
    assert r.status_code == 200 and r.json()["status"] in ("pending", "running")
    await wait_for(runtime, tid, TaskStatus.RUNNING)
    r = await client.post(f"/v1/tasks/{tid}/abort", json={"reason": "enough"}, headers=h)
    assert r.status_code == 200
    assert r.json()["status"] == "aborted" and r.json()["error"] == "enough"
    r = await client.post(f"/v1/tasks/{tid}/resume", headers=h)
    body = assert_problem(r, 409, "Invalid status transition")
    assert "'aborted'" in body["detail"]
    r = await client.post(f"/v1/tasks/{tid}/pause", headers=h)
    assert "'aborted'" in assert_problem(r, 409, "Invalid status transition")["detail"]
    r = await client.post(f"/v1/tasks/{tid}/pause", json={"rollback": "maybe"}, headers=h)
    assert_problem(r, 422, "Validation error")


@pytest.mark.slow
async def test_retry_a_failed_task_continues_it(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    h = auth("alice")
    r = await client.post("/v1/tasks", json={"agent": "flaky", "input": "fail-api"}, headers=h)
    tid = r.json()["id"]
    failed = await wait_for(runtime, tid, TaskStatus.FAILED)
    assert "scripted failure" in (failed.error or "")
    r = await client.post(f"/v1/tasks/{tid}/retry", headers=h)
    assert r.status_code == 200, r.text
    assert r.json()["status"] in ("pending", "running", "completed") and r.json()["error"] is None
    done = await wait_for(runtime, tid, TaskStatus.COMPLETED)
    assert done.output == "Done after a retry." and done.iterations == 2
    body = assert_problem(
        await client.post(f"/v1/tasks/{tid}/retry", headers=h), 409, "Invalid status transition"
    )
    assert "only a failed task can be retried" in body["detail"]


async def test_a_request_id_reused_with_another_input_is_409(client: httpx.AsyncClient) -> None:
    h = auth("alice")
    body = {"agent": "quick", "input": "one", "request_id": "r-dup"}
    first = await client.post("/v1/tasks", json=body, headers=h)
    again = await client.post("/v1/tasks", json=body, headers=h)
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    r = await client.post("/v1/tasks", json={**body, "input": "two"}, headers=h)
    problem = assert_problem(r, 409, "Request id already used")
    assert "'r-dup'" in problem["detail"] and first.json()["id"] in problem["detail"]


async def test_approve_and_deny_tool_calls(client: httpx.AsyncClient, runtime: Runtime) -> None:
    h = auth("alice")
    approved, denied = await start(client, "approver"), await start(client, "approver")
    for tid in (approved, denied):
        await wait_for(runtime, tid, TaskStatus.WAITING)
        task = (await client.get(f"/v1/tasks/{tid}", headers=h)).json()
        assert task["status_reason"] == "input"
        (wait,) = task["waiting_for"]
        assert wait["wait"] == "approval" and "send_email" in wait["question"]
    r = await client.post(f"/v1/tasks/{approved}/respond", json={"answer": "x"}, headers=h)
    assert "approve" in assert_problem(r, 400, "Bad request")["detail"]
    r = await client.post(f"/v1/tasks/{approved}/respond", json={"approve": True}, headers=h)
    assert r.status_code == 200
    r = await client.post(
        f"/v1/tasks/{denied}/respond", json={"approve": False, "reason": "not now"}, headers=h
    )
    assert r.status_code == 200
    await wait_for(runtime, approved, TaskStatus.COMPLETED)
    await wait_for(runtime, denied, TaskStatus.COMPLETED)
    results = {}
    for tid in (approved, denied):
        ui = (await client.get(f"/v1/tasks/{tid}/messages?view=ui", headers=h)).json()
        results[tid] = next(m for m in ui["messages"] if m["type"] == "tool")
    assert (
        results[approved]["state"] == "ok"
        and results[approved]["result"] == "sent to bob@example.com"
    )
    assert results[denied]["state"] == "error" and "not now" in results[denied]["result"]
    r = await client.post(f"/v1/tasks/{approved}/respond", json={"approve": True}, headers=h)
    assert "not waiting" in assert_problem(r, 400, "Bad request")["detail"]


async def test_answer_a_question(client: httpx.AsyncClient, runtime: Runtime) -> None:
    h = auth("alice")
    tid = await start(client, "asker")
    await wait_for(runtime, tid, TaskStatus.WAITING)
    (wait,) = (await client.get(f"/v1/tasks/{tid}", headers=h)).json()["waiting_for"]
    assert wait == {
        "call_id": wait["call_id"],
        "wait": "input",
        "question": "Which city?",
        "child_id": None,
        "wake_at": None,
        "tool": None,
        "arguments": None,
        "expires_at": None,
        "editable": True,
    }
    r = await client.post(
        f"/v1/tasks/{tid}/respond", json={"answer": "Lisbon", "call_id": wait["call_id"]}, headers=h
    )
    assert r.status_code == 200
    done = await wait_for(runtime, tid, TaskStatus.COMPLETED)
    model = await runtime.messages(done.id)
    assert any(getattr(m, "content", None) == "Lisbon" for m in model)


async def test_agents_lists_tools_and_replay_policies(client: httpx.AsyncClient) -> None:
    r = await client.get("/v1/agents", headers=auth("bob"))
    found = {a["name"]: a for a in r.json()["agents"]}
    assert set(found) == {
        "quick",
        "streamer",
        "slow",
        "approver",
        "asker",
        "parent",
        "notebook",
        "flaky",
        "holder",
        "mailer",
        "importer",
        "reader",
        "structured",
        "triage",
        "billing",  # served as triage's handoff target
    }
    (lookup,) = found["streamer"]["tools"]
    assert lookup["name"] == "lookup" and lookup["replay"] == "safe"
    assert lookup["requires_approval"] is False and lookup["approval"] == "never"
    assert lookup["parameters"]["properties"] == {"topic": {"type": "string"}}
    assert "encyclopedia" in lookup["description"]
    (email,) = found["approver"]["tools"]
    assert email["replay"] == "never" and email["requires_approval"] is True
    assert email["approval"] == "always"
    assert email["approval_timeout"] is None
    assert found["mailer"]["tools"][0]["approval_timeout"] == 600
    assert found["quick"]["model"] == "scripted"


# --- isolation between users -------------------------------------------------


def task_routes(app_openapi: dict[str, Any]) -> list[tuple[str, str]]:
    """Every (method, path) of the API that takes a task id."""
    return sorted(
        (method.upper(), path)
        for path, ops in app_openapi["paths"].items()
        if "{task_id}" in path
        for method in ops
    )


BODIES = {
    "pause": {"rollback": True},
    "abort": {"reason": "bob was here"},
    "respond": {"approve": True},
    "fork": {"at_round": 1},
    "messages": {"text": "bob was here"},
    "plan": {"steps": ["bob was here"]},
    "migrate": {"to_version": "bobs"},
}


async def call(client: httpx.AsyncClient, method: str, path: str, headers: dict[str, str]) -> Any:
    kw: dict[str, Any] = {"headers": headers}
    if method in ("POST", "PUT"):
        kw["json"] = BODIES.get(path.rsplit("/", 1)[-1], {})
    return await client.request(method, path, **kw)


async def test_another_users_task_is_404_exactly_like_a_missing_one(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    routes = task_routes(client._transport.app.openapi())  # type: ignore[attr-defined]
    names = {p.rsplit("/", 1)[-1] for _, p in routes}
    # A new route taking a task id must be added to this matrix (and the page).
    expected = {"{task_id}", "messages", "entries", "steps", "tree", "events", "history", "wait"}
    controls = {"pause", "resume", "abort", "respond", "retry", "fork", "plan", "stream-token"}
    controls |= {"migrate"}
    assert names == expected | controls
    alice_task = await start(client, "approver")
    await wait_for(runtime, alice_task, TaskStatus.WAITING)
    before = await runtime.get(alice_task)
    missing = "t_" + "0" * 32
    for method, template in routes:
        real = template.replace("{task_id}", alice_task)
        fake = template.replace("{task_id}", missing)
        as_bob = await call(client, method, real, auth("bob"))
        as_nobody = await call(client, method, fake, auth("bob"))
        assert as_bob.status_code == 404, (method, template, as_bob.text)
        assert as_nobody.status_code == 404
        assert as_bob.headers["content-type"] == as_nobody.headers["content-type"]
        assert as_bob.text.replace(alice_task, "ID") == as_nobody.text.replace(missing, "ID")
        assert_problem(as_bob, 404, "Task not found")
        assert_problem(await call(client, method, real, {}), 401, "Unauthorized")
    # Bob's pause, abort and approval changed nothing: not a byte was committed.
    after = await runtime.get(alice_task)
    assert (after.status, after.version, after.last_seq) == (
        TaskStatus.WAITING,
        before.version,
        before.last_seq,
    )
    assert (await client.get(f"/v1/tasks/{alice_task}", headers=auth("alice"))).status_code == 200
    bobs = (await client.get("/v1/tasks", headers=auth("bob"))).json()["tasks"]
    assert alice_task not in {t["id"] for t in bobs}


@pytest.mark.slow
async def test_every_route_but_health_needs_a_token(client: httpx.AsyncClient) -> None:
    spec = client._transport.app.openapi()  # type: ignore[attr-defined]
    checked = 0
    for path, ops in spec["paths"].items():
        for method in ops:
            url = path.replace("{task_id}", "t_x")
            r = await client.request(method.upper(), url)
            if path == "/v1/health":
                assert r.status_code == 200
                assert ops[method]["security"] == []
            elif path.endswith("/events"):  # or a stream token (tests/test_server_stream_tokens.py)
                assert_problem(r, 401, "Unauthorized")
                assert ops[method]["security"] == [{"HTTPBearer": []}, {"StreamToken": []}]
            else:
                assert_problem(r, 401, "Unauthorized")
                assert ops[method].get("security") == [{"HTTPBearer": []}]
            checked += 1
    assert checked >= 15


async def test_tokens_never_reach_the_logs(
    client: httpx.AsyncClient, runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    tid = await start(client, "quick")
    await wait_for(runtime, tid, TaskStatus.COMPLETED)
    await client.get("/v1/tasks", headers={"Authorization": "Bearer wrong-token-123"})
    text = "\n".join(r.getMessage() for r in caplog.records)
    for token in (*TOKENS.values(), "wrong-token-123"):
        assert token not in text


# --- the token store ---------------------------------------------------------


def test_tokens_from_file_env_and_json(tmp_path: Path) -> None:
    lines = tmp_path / "tokens.txt"
    lines.write_text("# users\nalice: tok-a-0123456789ab\n\nbob:tok-b-0123456789ab\n")
    store = TokenStore.from_file(lines)
    assert (
        store.user_for("tok-a-0123456789ab") == "alice"
        and store.user_for("tok-b-0123456789ab") == "bob"
    )
    assert store.user_for("tok-c-0123456789ab") is None and store.user_for("") is None
    as_json = tmp_path / "tokens.json"
    as_json.write_text(json.dumps({"carol": "tok-c-0123456789ab"}))
    assert TokenStore.from_file(as_json).user_for("tok-c-0123456789ab") == "carol"
    env = TokenStore.from_env("alice:tok1-0123456789abc, bob:tok2-0123456789abc")
    assert env.users == ["alice", "bob"] and env.user_for("tok2-0123456789abc") == "bob"
    # Only digests are kept.
    assert "tok-a-0123456789ab" not in repr(vars(store))


def test_bad_token_files_are_refused_without_echoing_tokens(tmp_path: Path) -> None:
    from duragent.errors import UsageError

    bad = tmp_path / "bad.txt"
    bad.write_text("alice-secret-without-colon\n")
    with pytest.raises(UsageError) as info:
        TokenStore.from_file(bad)
    assert "line 1" in str(info.value) and "alice-secret" not in str(info.value)
    with pytest.raises(UsageError, match="another user"):
        TokenStore.from_env("alice:same-0123456789ab,bob:same-0123456789ab")
    empty = tmp_path / "empty.txt"
    empty.write_text("# nobody yet\n")
    with pytest.raises(UsageError, match="no API tokens"):
        TokenStore.load(empty)
    with pytest.raises(UsageError, match="cannot read"):
        TokenStore.from_file(tmp_path / "missing.txt")


async def test_unknown_query_parameters_are_refused(client: httpx.AsyncClient) -> None:
    r = await client.get("/v1/tasks?stauts=running", headers=auth("alice"))
    body = assert_problem(r, 422, "Validation error")
    assert body["errors"][0]["loc"] == ["query", "stauts"]
    assert "status" in body["detail"]
    assert (await client.get("/v1/tasks?status=running", headers=auth("alice"))).status_code == 200
    assert (await client.get("/v1/health?x=1")).status_code == 422
