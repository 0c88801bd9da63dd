"""The REST API's test kit: an in-process app on a SQLite runtime, two users, problem checks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from duragent import Runtime
from duragent.server import TokenStore, create_app
from duragent.types import Task, TaskStatus
from server_agents import agents

TOKENS = {"alice": "alice-secret-token", "bob": "bob-secret-token"}


def auth(user: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[user]}"}


@pytest.fixture
async def runtime(tmp_path: Path) -> AsyncIterator[Runtime]:
    rt = Runtime(f"sqlite:///{tmp_path}/api.db", agents(), poll_interval=0.05, lease_ttl=5.0)
    async with rt:
        yield rt


@pytest.fixture
async def client(runtime: Runtime) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(runtime, TokenStore.from_mapping(TOKENS))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as c:
        yield c


async def start(client: httpx.AsyncClient, agent: str, user: str = "alice", **body: Any) -> str:
    r = await client.post(
        "/v1/tasks", json={"agent": agent, "input": "go", **body}, headers=auth(user)
    )
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


async def wait_for(runtime: Runtime, task_id: str, *statuses: TaskStatus) -> Task:
    return await runtime.wait(task_id, timeout=30, until=lambda t: t.status in statuses)


def assert_problem(r: httpx.Response, status: int, title: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = r.json()
    assert body["status"] == status
    assert body["title"] == title
    return body


# --- health and auth ---------------------------------------------------------
