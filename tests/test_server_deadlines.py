"""Deadlines over REST: the submit body's `deadline`, the task JSON, retry with a new one."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from duragent import Runtime
from duragent.types import TaskStatus
from support.api import assert_problem, auth, client, runtime, start, wait_for

__all__ = ["client", "runtime"]  # the fixtures this module uses from test_server_api


@pytest.mark.slow
async def test_a_deadline_in_seconds_fails_a_waiting_task_and_shows_in_its_json(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    h = auth("alice")
    r = await client.post(
        "/v1/tasks", json={"agent": "approver", "input": "go", "deadline": 0.5}, headers=h
    )
    assert r.status_code == 201, r.text
    created = r.json()
    deadline = datetime.fromisoformat(created["deadline"])
    assert deadline - datetime.fromisoformat(created["created_at"]) < timedelta(seconds=5)
    tid = created["id"]
    await wait_for(runtime, tid, TaskStatus.FAILED)
    task = (await client.get(f"/v1/tasks/{tid}", headers=h)).json()
    assert task["status"] == "failed" and task["status_reason"] == "deadline"
    assert task["error"].startswith(f"deadline exceeded: {deadline.isoformat()}")
    assert datetime.fromisoformat(task["deadline"]) == deadline

    # Retry with a new deadline: it is shown; without one, the passed deadline is dropped.
    r = await client.post(f"/v1/tasks/{tid}/retry", json={"deadline": 3600}, headers=h)
    assert r.status_code == 200, r.text
    assert datetime.fromisoformat(r.json()["deadline"]) > datetime.now(UTC)
    await runtime.abort(tid)
    other = await start(client, "approver", deadline=0.3)
    await wait_for(runtime, other, TaskStatus.FAILED)
    r = await client.post(f"/v1/tasks/{other}/retry", headers=h)
    assert r.status_code == 200 and r.json()["deadline"] is None


async def test_a_deadline_as_a_time_is_kept_in_utc(client: httpx.AsyncClient) -> None:
    tid = await start(client, "approver", deadline="2030-01-01T10:00:00+02:00")
    task = (await client.get(f"/v1/tasks/{tid}", headers=auth("alice"))).json()
    assert datetime.fromisoformat(task["deadline"]) == datetime(2030, 1, 1, 8, tzinfo=UTC)
    assert task["deadline"].endswith("Z") or task["deadline"].endswith("+00:00")
    quick = await start(client, "quick")
    assert (await client.get(f"/v1/tasks/{quick}", headers=auth("alice"))).json()[
        "deadline"
    ] is None


@pytest.mark.slow
@pytest.mark.parametrize(
    "bad",
    [
        "30",  # a number of seconds is a JSON number, not text
        "30s",
        True,
        0,
        -1,
        1e12,  # past ten years
        "2030-01-01T10:00:00",  # no zone
        "9999-12-31T23:59:59-23:00",  # past any calendar in UTC
        {"seconds": 30},
    ],
)
async def test_an_invalid_deadline_is_422(client: httpx.AsyncClient, bad: object) -> None:
    h = auth("alice")
    r = await client.post(
        "/v1/tasks", json={"agent": "quick", "input": "x", "deadline": bad}, headers=h
    )
    assert_problem(r, 422, "Validation error")


@pytest.mark.slow
async def test_retry_refuses_an_invalid_deadline(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    tid = await start(client, "approver", deadline=0.3)
    await wait_for(runtime, tid, TaskStatus.FAILED)
    r = await client.post(f"/v1/tasks/{tid}/retry", json={"deadline": -5}, headers=auth("alice"))
    assert_problem(r, 422, "Validation error")
    assert (await runtime.get(tid)).status is TaskStatus.FAILED


@pytest.mark.slow
async def test_openapi_documents_the_deadline(client: httpx.AsyncClient) -> None:
    spec = client._transport.app.openapi()  # type: ignore[attr-defined]
    schemas = spec["components"]["schemas"]
    field = schemas["TaskCreate"]["properties"]["deadline"]
    kinds = [k for one in field["anyOf"] for k in one.get("anyOf", [one])]
    assert {"type": "null"} in kinds and "wall-clock limit" in json.dumps(field)
    assert {"type": "string", "format": "date-time"} in kinds
    assert any(k.get("type") == "number" and k.get("exclusiveMinimum") == 0 for k in kinds)
    assert "deadline" in schemas["TaskOut"]["properties"]
    assert "deadline" in schemas["RetryRequest"]["properties"]
