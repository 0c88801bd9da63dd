"""REST: a task's history, forks and messages into it (`/v1/tasks/{id}/history`, `/fork`,
`/messages`), per owner."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from duragent import Runtime
from duragent.types import TaskStatus
from support.api import assert_problem, auth, client, runtime, start, wait_for

__all__ = ["client", "runtime"]  # the fixtures this module uses from support.api


async def approved_task(client: httpx.AsyncClient, runtime: Runtime) -> str:
    tid = await start(client, "approver")
    await wait_for(runtime, tid, TaskStatus.WAITING)
    r = await client.post(f"/v1/tasks/{tid}/respond", json={"approve": True}, headers=auth("alice"))
    assert r.status_code == 200, r.text
    await wait_for(runtime, tid, TaskStatus.COMPLETED)
    return tid


@pytest.mark.slow
async def test_history_lists_rounds_and_fork_starts_a_linked_task(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    tid = await approved_task(client, runtime)
    r = await client.get(f"/v1/tasks/{tid}/history", headers=auth("alice"))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["iterations"] == 2 and body["forked_from"] is None
    rounds = body["rounds"]
    assert [x["round"] for x in rounds] == [1, 2]
    call = rounds[0]["calls"][0]
    assert call["name"] == "send_email" and call["outcome"] == "ok"
    assert call["result"] == "sent to bob@example.com"
    assert rounds[1]["assistant"] == "Email done."

    edit = {"append_user": "send another"}
    r = await client.post(
        f"/v1/tasks/{tid}/fork",
        json={"at_round": 1, "edit": edit, "request_id": "f1"},
        headers=auth("alice"),
    )
    assert r.status_code == 201, r.text
    fork = r.json()
    assert fork["id"] != tid and fork["forked_from"] == {"task_id": tid, "round": 1}
    again = await client.post(
        f"/v1/tasks/{tid}/fork",
        json={"at_round": 1, "edit": edit, "request_id": "f1"},
        headers=auth("alice"),
    )
    assert again.status_code == 200 and again.json()["id"] == fork["id"]
    done = await wait_for(runtime, fork["id"], TaskStatus.COMPLETED)
    # The approved email of round 1 was copied, not sent again (no new approval asked).
    assert done.output == "Email done." and done.owner == "alice"
    r = await client.get(f"/v1/tasks/{fork['id']}", headers=auth("alice"))
    assert r.json()["forked_from"] == {"task_id": tid, "round": 1}
    view = (await client.get(f"/v1/tasks/{fork['id']}/messages", headers=auth("alice"))).json()
    roles = [m["role"] for m in view["messages"]]
    assert roles == ["user", "assistant", "tool", "user", "assistant"]


async def test_fork_of_an_open_round_or_bad_body_is_a_clear_problem(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    tid = await start(client, "approver")
    await wait_for(runtime, tid, TaskStatus.WAITING)
    r = await client.post(f"/v1/tasks/{tid}/fork", json={"at_round": 1}, headers=auth("alice"))
    body = assert_problem(r, 400, "Bad request")
    assert "round 1" in body["detail"] and "not complete" in body["detail"]
    r = await client.post(
        f"/v1/tasks/{tid}/fork",
        json={"at_round": 1, "edit": {"rename": "x"}},
        headers=auth("alice"),
    )
    assert r.status_code == 422
    r = await client.post(f"/v1/tasks/{tid}/fork", json={"at_round": 0}, headers=auth("alice"))
    assert r.status_code == 422
    assert len((await runtime.list_tasks(owner="alice")).tasks) == 1


async def test_another_users_history_and_fork_are_404(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    tid = await approved_task(client, runtime)
    r = await client.get(f"/v1/tasks/{tid}/history", headers=auth("bob"))
    assert_problem(r, 404, "Task not found")
    r = await client.post(f"/v1/tasks/{tid}/fork", json={"at_round": 1}, headers=auth("bob"))
    assert_problem(r, 404, "Task not found")
    assert (await runtime.list_tasks(owner="bob")).tasks == []


@pytest.mark.slow
async def test_openapi_describes_history_and_fork(client: httpx.AsyncClient) -> None:
    spec = (await client.get("/openapi.json")).json()
    assert "get" in spec["paths"]["/v1/tasks/{task_id}/history"]
    fork = spec["paths"]["/v1/tasks/{task_id}/fork"]["post"]
    assert {"201", "200", "400", "404"} <= set(fork["responses"])
    assert "Edit" in spec["components"]["schemas"]


@pytest.fixture
def gates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DURAGENT_TEST_GATES", str(tmp_path))
    return tmp_path


async def held_task(client: httpx.AsyncClient, runtime: Runtime, gate: str, **body: Any) -> str:
    """A `holder` task inside its tool call until the gate file is written."""
    tid = await start(client, "holder", input=gate, **body)
    await runtime.wait(
        tid, timeout=30, until=lambda t: t.status is TaskStatus.RUNNING and t.last_seq >= 4
    )
    return tid


async def test_a_message_into_a_running_task_is_taken_after_its_turn(
    client: httpx.AsyncClient, runtime: Runtime, gates: Path
) -> None:
    tid = await held_task(client, runtime, "g1")
    r = await client.post(
        f"/v1/tasks/{tid}/messages", json={"text": "and one more"}, headers=auth("alice")
    )
    assert r.status_code == 202, r.text
    assert r.json()["id"] == tid and r.json()["status"] == "running"
    (gates / "g1").touch()
    await wait_for(runtime, tid, TaskStatus.COMPLETED)
    view = (await client.get(f"/v1/tasks/{tid}/messages", headers=auth("alice"))).json()
    said = [(m["role"], m.get("content")) for m in view["messages"]]
    assert said[-2:] == [("user", "and one more"), ("assistant", "Through the gate.")]
    assert [m for m in said if m == ("user", "and one more")] == [("user", "and one more")]
    # A finished task takes no message: 409, with what to do instead, in REST terms.
    r = await client.post(f"/v1/tasks/{tid}/messages", json={"text": "more"}, headers=auth("alice"))
    body = assert_problem(r, 409, "Invalid status transition")
    assert body["type"] == "/problems/task-finished"
    assert f"POST /v1/tasks/{tid}/fork" in body["detail"]
    assert "/v1/sessions/" in body["detail"] and "continue_session=true" in body["detail"]
    assert "submit(" not in body["detail"] and "Edit(" not in body["detail"]


async def test_reject_is_409_and_continue_session_sends_into_the_live_task(
    client: httpx.AsyncClient, runtime: Runtime, gates: Path
) -> None:
    tid = await held_task(client, runtime, "g2", session_id="s", multitask_strategy="reject")
    r = await client.post(f"/v1/tasks/{tid}/messages", json={"text": "hi"}, headers=auth("alice"))
    body = assert_problem(r, 409, "Task is busy")
    assert "reject" in body["detail"] and body["type"] == "/problems/task-busy"
    again = {"agent": "holder", "input": "g2", "session_id": "s", "continue_session": True}
    r = await client.post("/v1/tasks", json=again, headers=auth("alice"))
    assert_problem(r, 409, "Task is busy")
    r = await client.post(
        "/v1/tasks", json={**again, "multitask_strategy": "enqueue"}, headers=auth("alice")
    )
    assert r.status_code == 202, r.text
    assert r.json()["id"] == tid
    (gates / "g2").touch()
    done = await wait_for(runtime, tid, TaskStatus.COMPLETED)
    users = [m for m in await runtime.model_view(done.id) if m.role == "user"]
    assert [m.content for m in users] == ["g2", "g2"]
    assert len((await runtime.list_tasks(owner="alice")).tasks) == 1  # no silent fork


async def test_bad_messages_are_422_and_another_users_task_is_404(
    client: httpx.AsyncClient, runtime: Runtime, gates: Path
) -> None:
    tid = await held_task(client, runtime, "g3")
    before = await runtime.get(tid)
    for bad in (
        {},
        {"text": ""},
        {"text": "   "},
        {"text": "x" * 100_001},
        {"text": "hi", "multitask_strategy": "shout"},
        {"text": "hi", "extra": 1},
        {"text": 5},
    ):
        r = await client.post(f"/v1/tasks/{tid}/messages", json=bad, headers=auth("alice"))
        assert r.status_code == 422, (bad, r.text)
    r = await client.post(f"/v1/tasks/{tid}/messages", json={"text": "hi"}, headers=auth("bob"))
    assert_problem(r, 404, "Task not found")
    after = await runtime.get(tid)
    assert (after.version, after.last_seq) == (before.version, before.last_seq)
    (gates / "g3").touch()
    await wait_for(runtime, tid, TaskStatus.COMPLETED)


async def test_a_message_retried_with_its_request_id_is_sent_once(
    client: httpx.AsyncClient, runtime: Runtime, gates: Path
) -> None:
    tid = await held_task(client, runtime, "g4")
    url = f"/v1/tasks/{tid}/messages"
    body = {"text": "and one more", "request_id": "k1"}
    first = await client.post(url, json=body, headers=auth("alice"))
    assert first.status_code == 202, first.text
    again = await client.post(url, json=body, headers=auth("alice"))
    assert again.status_code == 202, again.text
    assert again.json()["id"] == tid and again.json()["last_seq"] == first.json()["last_seq"]
    r = await client.post(url, json={**body, "text": "another"}, headers=auth("alice"))
    assert "another message" in assert_problem(r, 409, "Request id already used")["detail"]
    # Another user's retry of it finds no task.
    assert_problem(await client.post(url, json=body, headers=auth("bob")), 404, "Task not found")
    (gates / "g4").touch()
    done = await wait_for(runtime, tid, TaskStatus.COMPLETED)
    # A retry after the task took the message and ended: 202 with the task, nothing sent.
    late = await client.post(url, json=body, headers=auth("alice"))
    assert late.status_code == 202, late.text
    assert late.json()["status"] == "completed" and late.json()["last_seq"] == done.last_seq
    users = [m.content for m in await runtime.model_view(tid) if m.role == "user"]
    assert users == ["g4", "and one more"]
    for bad in ({"text": "hi", "request_id": ""}, {"text": "hi", "request_id": "x" * 201}):
        r = await client.post(url, json=bad, headers=auth("alice"))
        assert r.status_code == 422, (bad, r.text)


async def test_openapi_describes_messages_into_a_task(client: httpx.AsyncClient) -> None:
    spec = (await client.get("/openapi.json")).json()
    post = spec["paths"]["/v1/tasks/{task_id}/messages"]["post"]
    assert {"202", "404", "409", "422"} <= set(post["responses"])
    assert "MessageRequest" in spec["components"]["schemas"]
    assert "request_id" in spec["components"]["schemas"]["MessageRequest"]["properties"]
    create = spec["paths"]["/v1/tasks"]["post"]
    assert "202" in create["responses"]


@pytest.mark.slow
async def test_history_shows_a_handoff_and_the_agent_of_each_round(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    tid = await start(client, "triage")
    done = await wait_for(runtime, tid, TaskStatus.COMPLETED)
    assert done.output == "Refunded order 42."
    r = await client.get(f"/v1/tasks/{tid}/history", headers=auth("alice"))
    assert r.status_code == 200, r.text
    rounds = r.json()["rounds"]
    assert [x["agent"] for x in rounds] == ["triage", "billing"]
    assert rounds[0]["handoff"] == {
        "call_id": rounds[0]["calls"][0]["call_id"],
        "from_agent": "triage",
        "to_agent": "billing",
    }
    assert rounds[1]["handoff"] is None
    r = await client.get(f"/v1/tasks/{tid}/entries", headers=auth("alice"))
    assert r.status_code == 200, r.text
    kinds = [e["kind"] for e in r.json()["entries"]]
    assert "handoff" in kinds


async def test_migrate_moves_a_task_and_one_no_worker_serves_says_so(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    tid = await start(client, "approver")
    await wait_for(runtime, tid, TaskStatus.WAITING)
    first = (await client.get(f"/v1/tasks/{tid}", headers=auth("alice"))).json()
    assert first["agent_version"] == runtime.agent("approver").version
    assert first["unserved"] is None
    r = await client.post(
        f"/v1/tasks/{tid}/migrate", json={"to_version": "v9"}, headers=auth("alice")
    )
    assert r.status_code == 200, r.text
    assert r.json()["agent_version"] == "v9"
    r = await client.post(f"/v1/tasks/{tid}/respond", json={"approve": True}, headers=auth("alice"))
    assert r.status_code == 200, r.text
    # Runnable, but on a version no worker serves: it says so instead of a silent pending.
    await wait_for(runtime, tid, TaskStatus.PENDING)
    why = "waiting for approver@v9: no worker serves it"
    assert (await client.get(f"/v1/tasks/{tid}", headers=auth("alice"))).json()["unserved"] == why
    listed = (await client.get("/v1/tasks", headers=auth("alice"))).json()["tasks"]
    assert [t["unserved"] for t in listed if t["id"] == tid] == [why]
    history = (await client.get(f"/v1/tasks/{tid}/entries", headers=auth("alice"))).json()
    assert any(
        e["payload"].get("migration") == {"from": first["agent_version"], "to": "v9", "by": "alice"}
        for e in history["entries"]
    )
    bad = await client.post(
        f"/v1/tasks/{tid}/migrate", json={"to_version": "v 9"}, headers=auth("alice")
    )
    assert_problem(bad, 422, "Validation error")
    back = {"to_version": first["agent_version"]}
    r = await client.post(f"/v1/tasks/{tid}/migrate", json=back, headers=auth("alice"))
    assert r.status_code == 200, r.text
    await wait_for(runtime, tid, TaskStatus.COMPLETED)
    r = await client.post(
        f"/v1/tasks/{tid}/migrate", json={"to_version": "v9"}, headers=auth("alice")
    )
    assert_problem(r, 409, "Invalid status transition")
