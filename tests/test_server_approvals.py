"""REST: approvals with edited arguments, several decided at once, their time limits, per owner."""

from __future__ import annotations

from typing import Any

import httpx

from duragent import Runtime
from duragent.types import TaskStatus
from support.api import assert_problem, auth, client, runtime, start, wait_for

__all__ = ["client", "runtime"]  # the fixtures this module uses from support.api


async def open_mail(
    client: httpx.AsyncClient, runtime: Runtime
) -> tuple[str, list[dict[str, Any]]]:
    tid = await start(client, "mailer")
    await wait_for(runtime, tid, TaskStatus.WAITING)
    body = (await client.get(f"/v1/tasks/{tid}", headers=auth("alice"))).json()
    return tid, body["waiting_for"]


async def test_waits_show_the_tool_its_arguments_and_when_they_expire(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    tid, waits = await open_mail(client, runtime)
    assert [(w["wait"], w["tool"], w["arguments"]) for w in waits] == [
        ("approval", "send_email", {"to": "bob@example.com", "body": "hi"}),
        ("approval", "send_email", {"to": "ann@example.com", "body": "hello"}),
    ]
    task = await runtime.get(tid)
    assert task.wake_at is not None
    assert {w["expires_at"] for w in waits} >= {task.wake_at.isoformat().replace("+00:00", "Z")}


async def test_edit_and_approve_and_deny_in_one_request(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    tid, (bob, ann) = await open_mail(client, runtime)
    decisions = {
        bob["call_id"]: {"approve": True, "arguments": {"to": "bob@example.com", "body": "hey"}},
        ann["call_id"]: {"approve": False, "reason": "not today"},
    }
    r = await client.post(
        f"/v1/tasks/{tid}/respond", json={"decisions": decisions}, headers=auth("alice")
    )
    assert r.status_code == 200, r.text
    assert r.json()["waiting_for"] == []
    done = await wait_for(runtime, tid, TaskStatus.COMPLETED)
    assert "it ran with" in done.output and "sent 'hey' to bob@example.com" in done.output
    assert "The user denied this call: not today" in done.output
    ui = (await client.get(f"/v1/tasks/{tid}/messages?view=ui", headers=auth("alice"))).json()
    cards = {m["call_id"]: m for m in ui["messages"] if m["type"] == "tool"}
    assert cards[bob["call_id"]]["arguments"] == {"to": "bob@example.com", "body": "hey"}
    assert cards[bob["call_id"]]["original_arguments"] == {"to": "bob@example.com", "body": "hi"}
    assert cards[ann["call_id"]]["original_arguments"] is None


async def test_one_edited_approval(client: httpx.AsyncClient, runtime: Runtime) -> None:
    tid, (bob, ann) = await open_mail(client, runtime)
    r = await client.post(
        f"/v1/tasks/{tid}/respond",
        json={"approve": True, "call_id": ann["call_id"], "arguments": {"to": "x@y", "body": "b"}},
        headers=auth("alice"),
    )
    assert r.status_code == 200, r.text
    assert [w["call_id"] for w in r.json()["waiting_for"]] == [bob["call_id"]]


async def test_an_invalid_edit_is_422_and_changes_nothing(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    tid, (bob, ann) = await open_mail(client, runtime)
    before = await runtime.get(tid)
    bad = {"approve": True, "call_id": bob["call_id"], "arguments": {"to": 5}}
    r = await client.post(f"/v1/tasks/{tid}/respond", json=bad, headers=auth("alice"))
    detail = assert_problem(r, 422, "Invalid tool arguments")["detail"]
    assert "to: Input should be a valid string" in detail and "body: Field required" in detail
    batch = {
        "decisions": {
            bob["call_id"]: {"approve": True},
            ann["call_id"]: {"approve": True, "arguments": {"too": "x", "body": "b"}},
        }
    }
    r = await client.post(f"/v1/tasks/{tid}/respond", json=batch, headers=auth("alice"))
    assert_problem(r, 422, "Invalid tool arguments")
    # A malformed decision is refused by the request schema, also with 422.
    wrong = {"decisions": {bob["call_id"]: {"approve": False, "arguments": {}}}}
    r = await client.post(f"/v1/tasks/{tid}/respond", json=wrong, headers=auth("alice"))
    assert_problem(r, 422, "Validation error")
    after = await runtime.get(tid)
    assert (after.status, after.version, after.last_seq) == (
        TaskStatus.WAITING,
        before.version,
        before.last_seq,
    )


async def test_another_owners_task_is_404_and_untouched(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    tid, (bob, _ann) = await open_mail(client, runtime)
    before = await runtime.get(tid)
    for body in (
        {"decisions": {bob["call_id"]: {"approve": True}}},
        {"approve": True, "call_id": bob["call_id"], "arguments": {"to": "m@e", "body": "x"}},
    ):
        r = await client.post(f"/v1/tasks/{tid}/respond", json=body, headers=auth("bob"))
        assert_problem(r, 404, "Task not found")
    after = await runtime.get(tid)
    assert (after.version, after.last_seq) == (before.version, before.last_seq)


async def test_openapi_documents_edits_batches_and_expiry(client: httpx.AsyncClient) -> None:
    spec = (await client.get("/openapi.json", headers=auth("alice"))).json()
    schemas = spec["components"]["schemas"]
    respond = schemas["RespondRequest"]["properties"]
    assert {"arguments", "decisions"} <= set(respond)
    assert set(schemas["Decision"]["properties"]) == {"approve", "reason", "arguments"}
    assert {"tool", "arguments", "expires_at"} <= set(schemas["OpenWait"]["properties"])
    assert "approval_timeout" in schemas["ToolOut"]["properties"]
    op = spec["paths"]["/v1/tasks/{task_id}/respond"]["post"]
    assert "422" in op["responses"] and "edited" in op["summary"]
