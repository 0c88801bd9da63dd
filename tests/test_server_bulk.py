"""REST for bulk operations: POST /v1/bulk (a dry-run count, or a started operation),
GET /v1/bulk/{id} and GET /v1/bulk. A user acts on their own tasks only and sees
only their own operations (another's answers 404); an admin acts on everyone's."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from duragent import Runtime
from duragent.client import AsyncClient, BulkCount, BulkOut
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


async def askers(client: httpx.AsyncClient, runtime: Runtime, user: str, n: int) -> list[str]:  # noqa: F811
    ids = [await start(client, "asker", user) for _ in range(n)]
    for task_id in ids:
        await wait_for(runtime, task_id, TaskStatus.WAITING)
    return ids


@pytest.mark.slow
async def test_bulk_pause_over_rest_touches_only_my_tasks(
    client: httpx.AsyncClient,  # noqa: F811
    runtime: Runtime,  # noqa: F811
) -> None:
    mine = await askers(client, runtime, "alice", 3)
    theirs = await askers(client, runtime, "bob", 2)
    body = {"action": "pause", "filter": {"agent": "asker"}}
    r = await client.post("/v1/bulk", json={**body, "dry_run": True}, headers=auth("alice"))
    assert r.status_code == 200, r.text
    assert r.json() == {"count": 3}
    assert {(await runtime.get(t)).status for t in mine} == {TaskStatus.WAITING}

    r = await client.post("/v1/bulk", json=body, headers=auth("alice"))
    assert r.status_code == 202, r.text
    op = r.json()
    assert {k: op[k] for k in ("action", "status", "done", "skipped", "failed")} == {
        "action": "pause",
        "status": "running",
        "done": 0,
        "skipped": 0,
        "failed": 0,
    }
    given = {k: v for k, v in op["filter"].items() if v is not None}
    assert given == {"agent": "asker", "owner": "alice"}  # mine only
    await runtime.wait(op["id"], timeout=30)
    r = await client.get(f"/v1/bulk/{op['id']}", headers=auth("alice"))
    assert r.status_code == 200, r.text
    got = r.json()
    assert (got["status"], got["total"], got["done"], got["skipped"], got["failed"]) == (
        "done",
        3,
        3,
        0,
        0,
    )
    assert {(await runtime.get(t)).status for t in mine} == {TaskStatus.PAUSED}
    assert {(await runtime.get(t)).status for t in theirs} == {TaskStatus.WAITING}

    # Another user's operation is not found, and not listed.
    r = await client.get(f"/v1/bulk/{op['id']}", headers=auth("bob"))
    assert_problem(r, 404, "Task not found")  # an operation is a task
    r = await client.get("/v1/bulk", headers=auth("bob"))
    assert r.json() == {"operations": [], "next_cursor": None}
    r = await client.get("/v1/bulk", headers=auth("alice"))
    assert [o["id"] for o in r.json()["operations"]] == [op["id"]]
    # A user names no other owner.
    r = await client.post(
        "/v1/bulk",
        json={"action": "abort", "filter": {"owner": "alice"}, "dry_run": True},
        headers=auth("bob"),
    )
    assert_problem(r, 403, "Forbidden")


@pytest.mark.slow
async def test_an_admin_acts_on_every_owners_tasks(
    admin_client: httpx.AsyncClient,
    runtime: Runtime,  # noqa: F811
) -> None:
    mine = await askers(admin_client, runtime, "alice", 1)
    theirs = await askers(admin_client, runtime, "bob", 2)
    body = {"action": "abort", "filter": {"agent": "asker"}}
    r = await admin_client.post("/v1/bulk", json={**body, "dry_run": True}, headers=auth("alice"))
    assert r.json() == {"count": 3}
    only_bob = {"action": "abort", "filter": {"agent": "asker", "owner": "bob"}}
    r = await admin_client.post("/v1/bulk", json=only_bob, headers=auth("alice"))
    assert r.status_code == 202, r.text
    await runtime.wait(r.json()["id"], timeout=30)
    assert {(await runtime.get(t)).status for t in theirs} == {TaskStatus.ABORTED}
    assert {(await runtime.get(t)).status for t in mine} == {TaskStatus.WAITING}
    # The admin sees every operation; bob (no admin) still only his own.
    r = await admin_client.post(
        "/v1/bulk", json={"action": "purge", "filter": {}}, headers=auth("bob")
    )
    assert r.status_code == 202, r.text
    await runtime.wait(r.json()["id"], timeout=30)
    listed = (await admin_client.get("/v1/bulk", headers=auth("alice"))).json()["operations"]
    assert len(listed) == 2
    assert (await admin_client.get("/v1/bulk", headers=auth("bob"))).json()["operations"][0][
        "done"
    ] == 2  # his two aborted tasks


async def test_bad_bulk_requests_are_refused_with_a_reason(
    client: httpx.AsyncClient,  # noqa: F811
) -> None:
    r = await client.post("/v1/bulk", json={"action": "restart"}, headers=auth("alice"))
    body = assert_problem(r, 422, "Validation error")
    assert "unknown bulk action 'restart'" in str(body)
    r = await client.post(
        "/v1/bulk",
        json={"action": "retry", "filter": {"stauts": ["failed"]}},
        headers=auth("alice"),
    )
    assert_problem(r, 422, "Validation error")
    r = await client.post(
        "/v1/bulk",
        json={"action": "retry", "filter": {"status": ["running"]}, "dry_run": True},
        headers=auth("alice"),
    )
    assert r.json() == {"count": 0}  # retry never touches a running task
    assert_problem(await client.post("/v1/bulk", json={"action": "retry"}), 401, "Unauthorized")


@pytest.mark.slow
async def test_the_python_client_starts_reads_and_lists_bulk_operations(
    runtime: Runtime,  # noqa: F811
) -> None:
    app = create_app(runtime, TokenStore.from_mapping(TOKENS))
    http = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://api", headers=auth("alice")
    )
    async with AsyncClient(http=http) as c, http:
        task = await c.submit("asker", "go")
        await wait_for(runtime, task.id, TaskStatus.WAITING)
        counted = await c.bulk("abort", {"agent": "asker"}, dry_run=True)
        assert isinstance(counted, BulkCount) and counted.count == 1
        op = await c.bulk("abort", {"agent": "asker"})
        assert isinstance(op, BulkOut) and op.status == "running"
        await runtime.wait(op.id, timeout=30)
        done = await c.bulk_operation(op.id)
        assert (done.status, done.total, done.done) == ("done", 1, 1)
        assert [o.id for o in (await c.bulk_operations()).operations] == [op.id]


@pytest.mark.slow
async def test_bulk_migrate_over_rest_moves_only_my_tasks_of_that_version(
    client: httpx.AsyncClient,  # noqa: F811
    runtime: Runtime,  # noqa: F811
) -> None:
    mine = await askers(client, runtime, "alice", 2)
    theirs = await askers(client, runtime, "bob", 1)
    version = (await runtime.get(mine[0])).agent_version
    assert version is not None
    # The task list and the bulk filter agree on `version`.
    r = await client.get("/v1/tasks", params={"version": version}, headers=auth("alice"))
    assert {t["id"] for t in r.json()["tasks"]} == set(mine)
    r = await client.get("/v1/tasks", params={"version": "v9"}, headers=auth("alice"))
    assert r.json()["tasks"] == []
    body = {"action": "migrate", "filter": {"agent": "asker", "version": version}}
    r = await client.post(
        "/v1/bulk", json={**body, "to_version": "v9", "dry_run": True}, headers=auth("alice")
    )
    assert r.json() == {"count": 2}
    r = await client.post("/v1/bulk", json={**body, "to_version": "v9"}, headers=auth("alice"))
    assert r.status_code == 202, r.text
    op = r.json()
    await runtime.wait(op["id"], timeout=30)
    got = (await client.get(f"/v1/bulk/{op['id']}", headers=auth("alice"))).json()
    assert (got["status"], got["total"], got["done"]) == ("done", 2, 2)
    assert {(await runtime.get(t)).agent_version for t in mine} == {"v9"}
    assert (await runtime.get(theirs[0])).agent_version == version  # bob's: untouched
    r = await client.get("/v1/tasks", params={"version": "v9"}, headers=auth("alice"))
    assert {t["id"] for t in r.json()["tasks"]} == set(mine)
    r = await client.get("/v1/tasks", params={"version": "v9"}, headers=auth("bob"))
    assert r.json()["tasks"] == []


async def test_to_version_is_required_for_migrate_and_refused_for_the_others(
    client: httpx.AsyncClient,  # noqa: F811
) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"action": "migrate"}, "migrate needs to_version: the version to move the tasks to"),
        ({"action": "pause", "to_version": "v2"}, "pause takes no to_version (only migrate does)"),
        ({"action": "migrate", "to_version": "v 2"}, "to_version"),
        ({"action": "migrate", "to_version": "v2", "filter": {"version": ""}}, "version"),
    ]
    for body, message in cases:
        r = await client.post("/v1/bulk", json={**body, "dry_run": True}, headers=auth("alice"))
        problem = assert_problem(r, 422, "Validation error")
        assert message in problem["detail"] and "\n" not in problem["detail"], problem
    r = await client.get("/v1/tasks", params={"version": "v 2"}, headers=auth("alice"))
    assert_problem(r, 422, "Validation error")


async def test_the_python_client_migrates_by_filter_and_lists_by_version(
    runtime: Runtime,  # noqa: F811
) -> None:
    app = create_app(runtime, TokenStore.from_mapping(TOKENS))
    http = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://api", headers=auth("alice")
    )
    async with AsyncClient(http=http) as c, http:
        task = await c.submit("asker", "go")
        await wait_for(runtime, task.id, TaskStatus.WAITING)
        op = await c.bulk("migrate", {"agent": "asker"}, to_version="v7")
        assert isinstance(op, BulkOut) and op.to_version == "v7"
        await runtime.wait(op.id, timeout=30)
        assert [t.id for t in (await c.list(version="v7")).tasks] == [task.id]
