"""REST for many tasks: submit to a queue with priority, metadata and a start time;
filter and count my tasks; my schedules under /v1/schedules (another user's are
not found)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx

from duragent import Runtime
from duragent.types import TaskStatus
from support.api import assert_problem, auth, client, runtime, start, wait_for  # noqa: F401


async def test_queue_priority_metadata_start_at_and_filters(
    client: httpx.AsyncClient,  # noqa: F811
    runtime: Runtime,  # noqa: F811
) -> None:
    a = await start(client, "quick", queue="fast", priority=3, metadata={"team": "red"})
    b = await start(client, "quick", metadata={"team": "blue"})
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    held = await start(client, "quick", start_at=later)
    await start(client, "quick", user="bob", metadata={"team": "red"})
    for tid in (a, b):
        await wait_for(runtime, tid, TaskStatus.COMPLETED)
    r = await client.get("/v1/tasks", params={"meta": "team:red"}, headers=auth("alice"))
    assert [t["id"] for t in r.json()["tasks"]] == [a]
    assert r.json()["tasks"][0]["queue"] == "fast" and r.json()["tasks"][0]["priority"] == 3
    r = await client.get("/v1/tasks", params={"queue": "quick"}, headers=auth("alice"))
    assert {t["id"] for t in r.json()["tasks"]} == {b, held}
    r = await client.get(
        "/v1/tasks", params={"created_before": "2000-01-01T00:00:00Z"}, headers=auth("alice")
    )
    assert r.json()["tasks"] == []
    r = await client.get("/v1/tasks", params={"meta": "nocolon"}, headers=auth("alice"))
    assert_problem(r, 422, "Validation error")  # the schema says key:value
    r = await client.get("/v1/counts", headers=auth("alice"))
    assert r.json() == {
        "counts": {"fast": {"completed": 1}, "quick": {"completed": 1, "pending": 1}},
        "total": 3,
    }
    r = await client.post(
        "/v1/tasks",
        json={"agent": "quick", "input": "x", "start_at": "2030-01-01T00:00:00"},
        headers=auth("alice"),
    )
    assert_problem(r, 400, "Bad request")  # no time zone


async def test_schedules_are_per_user(client: httpx.AsyncClient) -> None:  # noqa: F811
    body = {"name": "daily", "agent": "quick", "input": "report", "cron": "0 9 * * *"}
    r = await client.post("/v1/schedules", json=body, headers=auth("alice"))
    assert r.status_code == 201, r.text
    assert r.json()["next_at"].startswith(r.json()["next_at"][:10]) and not r.json()["paused"]
    r = await client.post(
        "/v1/schedules", json={**body, "cron": "61 * * * *"}, headers=auth("alice")
    )
    assert_problem(r, 400, "Bad request")
    r = await client.post("/v1/schedules", json={**body, "every": 5}, headers=auth("alice"))
    assert_problem(r, 400, "Bad request")  # cron and every
    # Periods past any calendar and unbounded priorities are refused, not a 500.
    huge = {**body, "cron": None, "every": 4.3e270}
    r = await client.post("/v1/schedules", json=huge, headers=auth("alice"))
    assert_problem(r, 422, "Validation error")
    r = await client.post(
        "/v1/schedules", json={**body, "priority": -480261301}, headers=auth("alice")
    )
    assert_problem(r, 422, "Validation error")
    assert [
        s["name"]
        for s in (await client.get("/v1/schedules", headers=auth("alice"))).json()["schedules"]
    ] == ["daily"]
    assert (await client.get("/v1/schedules", headers=auth("bob"))).json()["schedules"] == []
    r = await client.get("/v1/schedules/daily", headers=auth("bob"))
    assert_problem(r, 404, "Task not found")
    r = await client.post("/v1/schedules/daily/pause", headers=auth("alice"))
    assert r.json()["paused"] is True
    r = await client.post("/v1/schedules/daily/resume", headers=auth("alice"))
    assert r.json()["paused"] is False
    assert (await client.delete("/v1/schedules/daily", headers=auth("bob"))).status_code == 404
    assert (await client.delete("/v1/schedules/daily", headers=auth("alice"))).status_code == 204
    assert (await client.get("/v1/schedules/daily", headers=auth("alice"))).status_code == 404
    assert (await client.get("/v1/queues", headers=auth("alice"))).json() == {"queues": []}
