"""The fork and messages routes check their JSON like every other route (issue 37,
item 9): no NUL or lone surrogate anywhere, numbers are numbers, an edit is held to
the input limit, and a fork's request_id never answers with another task."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from conftest import drop_schema, require_postgres
from duragent import Runtime
from duragent.types import TaskStatus
from support.api import assert_problem, auth, client, runtime, start, wait_for
from support.server_live import live_server

__all__ = ["client", "runtime"]  # the fixtures this module uses from support.api

NUL_BODIES = [
    b'{"at_round": 1, "request_id": "f\\u0000"}',
    b'{"at_round": 1, "edit": {"append_user": "a\\u0000b"}}',
    b'{"at_round": 1, "edit": {"replace_last_user": "\\ud800"}}',
]
NUL_MESSAGES = [
    b'{"text": "hi", "request_id": "m\\u0000"}',
    b'{"text": "a\\u0000b"}',
]


async def finished(client: httpx.AsyncClient, runtime: Runtime) -> str:
    tid = await start(client, "quick")
    await wait_for(runtime, tid, TaskStatus.COMPLETED)
    return tid


async def post_raw(client: httpx.AsyncClient, path: str, body: bytes) -> httpx.Response:
    headers = {**auth("alice"), "Content-Type": "application/json"}
    return await client.post(path, content=body, headers=headers)


async def test_nul_and_surrogates_in_forks_and_messages_are_422(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    tid = await finished(client, runtime)
    live = await start(client, "approver")
    for body in NUL_BODIES:
        r = await post_raw(client, f"/v1/tasks/{tid}/fork", body)
        assert_problem(r, 422, "Validation error")
    for body in NUL_MESSAGES:
        r = await post_raw(client, f"/v1/tasks/{live}/messages", body)
        assert_problem(r, 422, "Validation error")
    page = await runtime.list_tasks(owner="alice")
    assert sorted(t.id for t in page.tasks) == sorted([tid, live])  # nothing forked


@pytest.mark.parametrize(
    "body",
    [
        {"at_round": "1"},
        {"at_round": True},
        {"at_round": 1.5},
        {"at_round": 1, "edit": {"drop_last_assistant": "true"}},
        {"at_round": 1, "edit": {"append_user": 5}},
    ],
)
async def test_fork_numbers_and_booleans_are_not_text(
    client: httpx.AsyncClient, runtime: Runtime, body: dict[str, object]
) -> None:
    tid = await finished(client, runtime)
    r = await client.post(f"/v1/tasks/{tid}/fork", json=body, headers=auth("alice"))
    assert_problem(r, 422, "Validation error")


async def test_a_fork_edit_is_held_to_the_input_limit(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    tid = await finished(client, runtime)
    big = {"at_round": 1, "edit": {"append_user": "x" * 900_000}}
    r = await client.post(f"/v1/tasks/{tid}/fork", json=big, headers=auth("alice"))
    body = assert_problem(r, 422, "Validation error")
    assert "--max-input" in str(body)
    ok = {"at_round": 1, "edit": {"append_user": "x" * 1000}}
    r = await client.post(f"/v1/tasks/{tid}/fork", json=ok, headers=auth("alice"))
    assert r.status_code == 201, r.text


async def test_a_reused_request_id_never_returns_another_task(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    tid = await finished(client, runtime)
    # A submission's request_id, then asked of a fork: 409, not the submission.
    sub = await start(client, "quick", request_id="shared")
    r = await client.post(
        f"/v1/tasks/{tid}/fork", json={"at_round": 1, "request_id": "shared"}, headers=auth("alice")
    )
    assert assert_problem(r, 409, "Request id already used")["detail"].count(sub) == 1
    # A fork's request_id: the same fork again is 200; another round or edit is 409.
    asked = {"at_round": 1, "request_id": "f1", "edit": {"append_user": "more"}}
    r = await client.post(f"/v1/tasks/{tid}/fork", json=asked, headers=auth("alice"))
    assert r.status_code == 201, r.text
    fork = r.json()["id"]
    r = await client.post(f"/v1/tasks/{tid}/fork", json=asked, headers=auth("alice"))
    assert r.status_code == 200 and r.json()["id"] == fork
    other = {**asked, "edit": {"append_user": "less"}}
    r = await client.post(f"/v1/tasks/{tid}/fork", json=other, headers=auth("alice"))
    assert_problem(r, 409, "Request id already used")
    other_source = await finished(client, runtime)
    r = await client.post(f"/v1/tasks/{other_source}/fork", json=asked, headers=auth("alice"))
    assert_problem(r, 409, "Request id already used")
    # ...and a submission under the fork's request_id is not the fork either.
    r = await client.post(
        "/v1/tasks",
        json={"agent": "quick", "input": "go", "request_id": "f1"},
        headers=auth("alice"),
    )
    assert_problem(r, 409, "Request id already used")


@pytest.mark.slow
def test_nul_in_forks_and_messages_on_postgres_is_422_not_503(tmp_path: Path) -> None:
    url = require_postgres()
    schema = f"strict_{tmp_path.name[-8:].replace('-', '_')}"
    try:
        with live_server(tmp_path, workers=1, store_url=f"{url}?schema={schema}") as server:
            headers = {**server.headers(), "Content-Type": "application/json"}
            r = httpx.post(
                f"{server.url}/v1/tasks", json={"agent": "quick", "input": "go"}, headers=headers
            )
            assert r.status_code == 201, r.text
            tid = r.json()["id"]  # refused before the task's state matters
            for path, bodies in (("fork", NUL_BODIES), ("messages", NUL_MESSAGES)):
                for body in bodies:
                    r = httpx.post(
                        f"{server.url}/v1/tasks/{tid}/{path}",
                        content=body,
                        headers=headers,
                        timeout=30,
                    )
                    assert r.status_code == 422, (body, r.text)
    finally:
        drop_schema(schema)
