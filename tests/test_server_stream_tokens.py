"""Stream tokens: a browser opens one task's event stream without its bearer token in
the URL. A token opens its own task's /events only, for its owner only, until it
expires; it opens no other route and is no API token."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from duragent import Runtime
from duragent.errors import UsageError
from duragent.server import TokenStore, create_app
from duragent.server._stream_tokens import SECRET_VAR, HideStreamTokens, StreamTokens
from duragent.types import TaskStatus
from server_agents import agents
from support.api import TOKENS, assert_problem, auth, start, wait_for
from support.server_live import live_server

SECRET = "s" * 40


@pytest.fixture
async def runtime(tmp_path: Path) -> AsyncIterator[Runtime]:
    rt = Runtime(f"sqlite:///{tmp_path}/api.db", agents(), poll_interval=0.05, lease_ttl=5.0)
    async with rt:
        yield rt


@pytest.fixture
def signer() -> StreamTokens:
    return StreamTokens(SECRET)


@pytest.fixture
async def client(runtime: Runtime, signer: StreamTokens) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(runtime, TokenStore.from_mapping(TOKENS), stream_tokens=signer)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as c:
        yield c


async def finished(client: httpx.AsyncClient, runtime: Runtime, user: str = "alice") -> str:
    tid = await start(client, "quick", user=user)
    await wait_for(runtime, tid, TaskStatus.COMPLETED)
    return tid


async def mint(client: httpx.AsyncClient, tid: str, user: str = "alice") -> dict[str, Any]:
    r = await client.post(f"/v1/tasks/{tid}/stream-token", headers=auth(user))
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


async def test_a_stream_token_opens_its_tasks_events_without_the_bearer_token(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    tid = await finished(client, runtime)
    got = await mint(client, tid)
    assert got["events_url"] == f"/v1/tasks/{quote(tid)}/events?stream_token={got['token']}"
    assert SECRET not in got["token"]
    r = await client.get(got["events_url"])  # no Authorization header
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert "event: end" in r.text and '"kind": "end"' in r.text
    with_bearer = await client.get(f"/v1/tasks/{tid}/events", headers=auth("alice"))
    assert with_bearer.text == r.text


async def test_a_token_for_task_a_cannot_read_task_b(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    a, b = await finished(client, runtime), await finished(client, runtime)
    token = (await mint(client, a))["token"]
    r = await client.get(f"/v1/tasks/{b}/events", params={"stream_token": token})
    body = assert_problem(r, 404, "Task not found")
    assert body["type"] == "/problems/task-not-found" and "event:" not in r.text
    # The same answer as for a task that does not exist, asked with the bearer token.
    missing = await client.get(f"/v1/tasks/{b}x/events", headers=auth("alice"))
    assert r.json()["title"] == missing.json()["title"]
    # Bob's task, with Alice's token for her own: 404 too.
    bobs = await finished(client, runtime, user="bob")
    r = await client.get(f"/v1/tasks/{bobs}/events", params={"stream_token": token})
    assert_problem(r, 404, "Task not found")


async def test_an_expired_forged_or_foreign_token_is_refused(
    client: httpx.AsyncClient, runtime: Runtime, signer: StreamTokens
) -> None:
    tid = await finished(client, runtime)
    expired = signer.token(signer.mint(tid, "alice", now=time.time() - signer.ttl - 1))
    r = await client.get(f"/v1/tasks/{tid}/events", params={"stream_token": expired})
    assert "expired" in assert_problem(r, 401, "Unauthorized")["detail"]
    good = (await mint(client, tid))["token"]
    payload, _, mac = good.partition(".")
    forged = [
        f"{payload}.{mac[:-2]}AA",  # another MAC
        StreamTokens("t" * 40).token(signer.mint(tid, "alice")),  # another server's secret
        signer.token(signer.mint(tid, "bob")).split(".")[0] + "." + mac,  # Bob's, Alice's MAC
        "not-a-token",
        "",
        "é.é",
        f"{payload}.é",  # an ASCII payload with a non-ASCII MAC: once a 500
    ]
    for token in forged:
        r = await client.get(f"/v1/tasks/{tid}/events", params={"stream_token": token})
        assert_problem(r, 401, "Unauthorized")


async def test_another_users_task_gets_no_token(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    tid = await finished(client, runtime)
    r = await client.post(f"/v1/tasks/{tid}/stream-token", headers=auth("bob"))
    assert_problem(r, 404, "Task not found")
    r = await client.post(f"/v1/tasks/{tid}/stream-token")
    assert_problem(r, 401, "Unauthorized")


async def test_a_stream_token_opens_no_other_route(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    tid = await finished(client, runtime)
    token = (await mint(client, tid))["token"]
    spec = client._transport.app.openapi()  # type: ignore[attr-defined]
    tried = 0
    for path, ops in spec["paths"].items():
        if path.endswith("/events") or path == "/v1/health":
            continue
        for method in ops:
            url = path.replace("{task_id}", tid).replace("{session_id}", "s")
            url = url.replace("{name}", "n")
            r = await client.request(method.upper(), url, params={"stream_token": token})
            assert_problem(r, 401, "Unauthorized")
            tried += 1
    assert tried >= 30
    # Nor is it an API token.
    r = await client.get(f"/v1/tasks/{tid}", headers={"Authorization": f"Bearer {token}"})
    assert_problem(r, 401, "Unauthorized")
    r = await client.get(f"/v1/tasks/{tid}/events", headers={"Authorization": f"Bearer {token}"})
    assert_problem(r, 401, "Unauthorized")
    # Nor does it open the events of a path that only looks like the task's.
    r = await client.get(f"/v1/tasks/{tid}/events/x", params={"stream_token": token})
    assert_problem(r, 401, "Unauthorized")


def test_the_secret_comes_from_the_environment_and_must_be_long(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(SECRET_VAR, SECRET)
    one, two = StreamTokens(), StreamTokens()  # two server processes sharing the secret
    token = one.token(one.mint("t_1", "alice"))
    assert two.check(token).task_id == "t_1"
    monkeypatch.delenv(SECRET_VAR)
    own = StreamTokens()  # random per process: its tokens are no other's
    with pytest.raises(Exception, match="not valid"):
        own.check(token)
    monkeypatch.setenv(SECRET_VAR, "short-secret")
    with pytest.raises(UsageError, match="at least 32") as refused:
        StreamTokens()
    assert "short-secret" not in str(refused.value)


def test_the_access_log_shows_no_stream_token() -> None:
    # uvicorn's access line: client, method, path with its query, version, status.
    path = "/v1/tasks/t_1/events?after=3&stream_token=abc.def&x=1"
    record = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        "",
        0,
        '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5", "GET", path, "1.1", 200),
        None,
    )
    HideStreamTokens().filter(record)
    line = record.getMessage()
    assert "abc.def" not in line and "stream_token=…&x=1" in line and "after=3" in line
    create_app(Runtime("memory://", agents()), TokenStore.from_mapping(TOKENS))
    access = logging.getLogger("uvicorn.access").filters
    assert any(isinstance(f, HideStreamTokens) for f in access)  # create_app installed it


@pytest.mark.slow
async def test_a_browser_follows_a_running_task_with_a_stream_token(tmp_path: Path) -> None:
    """A real server: the stream opened with the token goes on live to the end, and
    the server's log (its access lines included) never shows the token."""
    with live_server(tmp_path, workers=1, args=["--log-level", "info"]) as server:
        async with httpx.AsyncClient(timeout=30) as c:
            r = await c.post(
                f"{server.url}/v1/tasks",
                json={"agent": "streamer", "input": "go"},
                headers=server.headers(),
            )
            tid = r.json()["id"]
            r = await c.post(f"{server.url}/v1/tasks/{tid}/stream-token", headers=server.headers())
            got = r.json()
            kinds = []
            async with c.stream("GET", server.url + got["events_url"]) as stream:
                assert stream.status_code == 200
                async for line in stream.aiter_lines():
                    if line.startswith("event: "):
                        kinds.append(line.removeprefix("event: "))
            assert kinds[-1] == "end" and "progress" in kinds
            done = await c.get(f"{server.url}/v1/tasks/{tid}", headers=server.headers())
            assert done.json()["status"] == "completed"
        log = server.log_text()
    assert f"/v1/tasks/{tid}/events?stream_token=" in log  # the request was logged,
    assert got["token"] not in log  # its token was not
