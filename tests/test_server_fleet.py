"""REST for many tasks: submit to a queue with priority, metadata and a start time;
filter and count my tasks; my schedules under /v1/schedules (another user's are
not found)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from duragent import Runtime
from duragent.server import TokenStore, create_app
from duragent.types import TaskStatus
from support.api import (  # noqa: F401
    TOKENS,
    assert_problem,
    auth,
    client,
    runtime,
    start,
    wait_for,
)


@pytest.fixture
async def admin_client(runtime: Runtime) -> AsyncIterator[httpx.AsyncClient]:  # noqa: F811
    """Alice is an admin of this server, bob is not."""
    app = create_app(runtime, TokenStore.from_mapping(TOKENS), admins=["alice"])
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as c:
        yield c


async def test_queue_priority_metadata_start_at_and_filters(
    client: httpx.AsyncClient,  # noqa: F811
    runtime: Runtime,  # noqa: F811
) -> None:
    a = await start(client, "quick", queue="fast", priority=3, metadata={"team": "red"})
    b = await start(client, "quick", metadata={"team": "blue"})
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    held = await start(client, "quick", start_at=later)
    bobs = await start(client, "quick", user="bob", metadata={"team": "red"})
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
    r = await client.get("/v1/tasks", params={"id_prefix": a}, headers=auth("alice"))
    assert [t["id"] for t in r.json()["tasks"]] == [a]
    r = await client.get("/v1/tasks", params={"id_prefix": "t_"}, headers=auth("alice"))
    assert {t["id"] for t in r.json()["tasks"]} == {a, b, held}
    r = await client.get("/v1/tasks", params={"id_prefix": bobs}, headers=auth("alice"))
    assert r.json()["tasks"] == []  # another user's task is not found by its id either
    r = await client.get("/v1/tasks", params={"id_prefix": ""}, headers=auth("alice"))
    assert_problem(r, 422, "Validation error")
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
    assert_problem(r, 404, "Schedule not found")
    for path in ("/v1/schedules/daily/pause", "/v1/schedules/daily/resume"):
        assert_problem(await client.post(path, headers=auth("bob")), 404, "Schedule not found")
    r = await client.post("/v1/schedules/daily/pause", headers=auth("alice"))
    assert r.json()["paused"] is True
    r = await client.post("/v1/schedules/daily/resume", headers=auth("alice"))
    assert r.json()["paused"] is False
    assert (await client.delete("/v1/schedules/daily", headers=auth("bob"))).status_code == 404
    assert (await client.delete("/v1/schedules/daily", headers=auth("alice"))).status_code == 204
    assert (await client.get("/v1/schedules/daily", headers=auth("alice"))).status_code == 404
    assert (await client.get("/v1/queues", headers=auth("alice"))).json() == {
        "queues": [],
        "counts_of": "mine",
    }


async def test_only_an_admin_sets_and_removes_queue_limits(
    admin_client: httpx.AsyncClient,
    runtime: Runtime,  # noqa: F811
) -> None:
    c = admin_client
    # /v1/me says who may (the page shows the editing controls to admins only).
    assert (await c.get("/v1/me", headers=auth("alice"))).json() == {"user": "alice", "admin": True}
    assert (await c.get("/v1/me", headers=auth("bob"))).json() == {"user": "bob", "admin": False}
    limits = {"concurrency": 2, "per_owner": 1, "rate": {"tasks": 10, "seconds": 60}, "ttl": 3600}
    assert_problem(await c.put("/v1/queues/mail", json=limits), 401, "Unauthorized")
    r = await c.put("/v1/queues/mail", json=limits, headers=auth("bob"))
    assert "--admin" in assert_problem(r, 403, "Forbidden")["detail"]
    assert await runtime.queues() == []
    r = await c.put("/v1/queues/mail", json=limits, headers=auth("alice"))
    assert r.status_code == 200, r.text
    assert r.json() == {
        "name": "mail",
        "concurrency": 2,
        "per_worker": None,
        "per_owner": 1,
        "rate": {"tasks": 10, "seconds": 60.0},
        "ttl": 3600.0,
        "counts": {},
    }
    (stored,) = await runtime.queues()  # in the store: every worker's next claim reads it
    assert stored.concurrency == 2 and stored.rate == (10, 60.0)
    r = await c.get("/v1/queues", headers=auth("bob"))  # anyone may read the limits
    assert r.json()["counts_of"] == "mine" and r.json()["queues"][0]["per_owner"] == 1
    # PUT replaces: what is left out is no limit.
    r = await c.put("/v1/queues/mail", json={"per_worker": 1.0}, headers=auth("alice"))
    assert (r.json()["concurrency"], r.json()["per_worker"]) == (None, 1)
    assert_problem(await c.delete("/v1/queues/mail", headers=auth("bob")), 403, "Forbidden")
    assert (await c.delete("/v1/queues/mail", headers=auth("alice"))).status_code == 204
    assert await runtime.queues() == []
    r = await c.delete("/v1/queues/mail", headers=auth("alice"))
    assert_problem(r, 404, "Queue not found")
    assert_problem(await c.get("/v1/queues/mail", headers=auth("alice")), 404, "Queue not found")


async def test_without_admins_nobody_changes_queues(client: httpx.AsyncClient) -> None:  # noqa: F811
    r = await client.put("/v1/queues/mail", json={"concurrency": 1}, headers=auth("alice"))
    assert_problem(r, 403, "Forbidden")


async def test_queue_limits_that_cannot_be_are_refused_with_422(
    admin_client: httpx.AsyncClient,
    runtime: Runtime,  # noqa: F811
) -> None:
    bad = [
        {"concurrency": 0},
        {"concurrency": "2"},
        {"concurrency": True},
        {"concurrency": 2.5},
        {"per_owner": -1},
        {"per_worker": 10**7},
        {"rate": {"tasks": 0, "seconds": 60}},
        {"rate": {"tasks": 10}},
        {"rate": {"tasks": 10, "seconds": 60, "burst": 1}},
        {"rate": [10, 60]},
        {"rate": "10/60"},
        {"rate": {"tasks": 10, "seconds": 0}},
        {"rate": {"tasks": "10", "seconds": 60}},
        {"ttl": -5},
        {"ttl": 1e300},
        {"limit": 3},  # not a field
    ]
    for body in bad:
        r = await admin_client.put("/v1/queues/mail", json=body, headers=auth("alice"))
        assert_problem(r, 422, "Validation error")
    r = await admin_client.put(
        "/v1/queues/mail",
        content=b'{"ttl": NaN}',
        headers={**auth("alice"), "content-type": "application/json"},
    )
    assert_problem(r, 422, "Validation error")
    r = await admin_client.put("/v1/queues/" + "q" * 201, json={}, headers=auth("alice"))
    assert_problem(r, 422, "Validation error")
    assert await runtime.queues() == []


async def test_queue_counts_are_mine_unless_i_am_an_admin(
    admin_client: httpx.AsyncClient,
    runtime: Runtime,  # noqa: F811
) -> None:
    c = admin_client
    mine = await start(c, "quick", user="bob", queue="q")
    theirs = [await start(c, "quick", user="alice", queue="q") for _ in range(2)]
    for tid in (mine, *theirs):
        await wait_for(runtime, tid, TaskStatus.COMPLETED)
    await c.put("/v1/queues/q", json={"concurrency": 5}, headers=auth("alice"))
    r = await c.get("/v1/queues", headers=auth("bob"))
    assert r.json() == {
        "queues": [
            {
                "name": "q",
                "concurrency": 5,
                "per_worker": None,
                "per_owner": None,
                "rate": None,
                "ttl": None,
                "counts": {"completed": 1},
            }
        ],
        "counts_of": "mine",
    }
    r = await c.get("/v1/queues", headers=auth("alice"))
    assert r.json()["counts_of"] == "everyone"
    assert r.json()["queues"][0]["counts"] == {"completed": 3}
    r = await c.get("/v1/queues/q", headers=auth("bob"))
    assert r.json()["counts"] == {"completed": 1}
    # A queue with tasks but no limits is listed too, with its limits null.
    await start(c, "quick", user="bob", queue="plain")
    r = await c.get("/v1/queues/plain", headers=auth("bob"))
    assert r.status_code == 200 and r.json()["concurrency"] is None
    # Another user's queue without limits is not found: its name is theirs.
    await start(c, "quick", user="alice", queue="alices")
    assert_problem(await c.get("/v1/queues/alices", headers=auth("bob")), 404, "Queue not found")
    names = [q["name"] for q in (await c.get("/v1/queues", headers=auth("bob"))).json()["queues"]]
    assert names == ["plain", "q"]
