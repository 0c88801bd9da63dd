"""What one user may put on a shared server (issue 37, item 6): a bounded number of
schedules ticking a bounded number of times a minute, metadata within a size
limit, and task lists in pages of bounded size."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from duragent import Runtime
from duragent.server import ServerLimits, TokenStore, create_app
from support.api import TOKENS, assert_problem, auth, runtime

__all__ = ["runtime"]  # the fixture this module uses from support.api

LIMITS = ServerLimits(max_schedules=3, max_schedule_ticks_per_minute=60, max_page=4000)


@pytest.fixture
async def api(runtime: Runtime) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(runtime, TokenStore.from_mapping(TOKENS), LIMITS)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as c:
        yield c


async def schedule(api: httpx.AsyncClient, name: str, user: str = "alice", **body: Any) -> Any:
    sent = {"name": name, "agent": "quick", "input": "x", **body}
    return await api.post("/v1/schedules", json=sent, headers=auth(user))


async def test_a_users_schedules_are_capped_in_ticks_per_minute(api: httpx.AsyncClient) -> None:
    assert (await schedule(api, "fast", every=1)).status_code == 201  # 60 a minute: all of it
    r = await schedule(api, "more", every=60)
    assert "60 per user" in assert_problem(r, 409, "Limit reached")["detail"]
    assert_problem(await schedule(api, "daily", cron="0 9 * * *"), 409, "Limit reached")
    # Replacing a schedule counts it once, with its new period.
    assert (await schedule(api, "fast", every=2)).status_code == 201  # 30 a minute
    assert (await schedule(api, "more", every=2)).status_code == 201  # 60 together
    assert_problem(await schedule(api, "daily", cron="0 9 * * *"), 409, "Limit reached")
    # Another user's share is their own.
    assert (await schedule(api, "fast", user="bob", every=1)).status_code == 201


async def test_a_users_schedules_are_capped_in_number(api: httpx.AsyncClient) -> None:
    for name in ("a", "b", "c"):
        assert (await schedule(api, name, cron="0 9 * * *")).status_code == 201
    r = await schedule(api, "d", cron="0 9 * * *")
    assert "--max-schedules" in assert_problem(r, 409, "Limit reached")["detail"]
    assert (await schedule(api, "c", cron="0 10 * * *")).status_code == 201  # a replacement
    assert (await api.delete("/v1/schedules/a", headers=auth("alice"))).status_code == 204
    assert (await schedule(api, "d", cron="0 9 * * *")).status_code == 201


async def test_metadata_and_schedule_inputs_are_held_to_the_size_limits(
    api: httpx.AsyncClient,
) -> None:
    fat = {f"k{i}": "v" * 1000 for i in range(32)}  # within 32 keys, 32 KB of text
    r = await api.post(
        "/v1/tasks", json={"agent": "quick", "input": "x", "metadata": fat}, headers=auth("alice")
    )
    assert "--max-metadata" in str(assert_problem(r, 422, "Validation error"))
    assert_problem(await schedule(api, "s", every=60, metadata=fat), 422, "Validation error")
    r = await schedule(api, "s", every=60, input="x" * 600_000)
    assert "--max-input" in str(assert_problem(r, 422, "Validation error"))
    assert (await api.get("/v1/schedules", headers=auth("alice"))).json()["schedules"] == []
    r = await api.post(
        "/v1/tasks",
        json={"agent": "quick", "input": "x", "metadata": {"team": "red"}},
        headers=auth("alice"),
    )
    assert r.status_code == 201, r.text


async def test_a_list_page_is_bounded_in_bytes_and_the_cursor_gives_the_rest(
    api: httpx.AsyncClient, runtime: Runtime
) -> None:
    meta = {f"k{i}": "v" * 100 for i in range(8)}  # ~900 bytes a task summary and more
    made = set()
    for i in range(12):
        sub = await runtime.submit("quick", f"q{i}", owner="alice", metadata=meta)
        made.add(sub.task_id)
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 500, **({"cursor": cursor} if cursor else {})}
        r = await api.get("/v1/tasks", params=params, headers=auth("alice"))
        assert r.status_code == 200, r.text
        assert len(r.content) <= LIMITS.max_page + 2000  # one summary past the budget at most
        seen += [t["id"] for t in r.json()["tasks"]]
        pages += 1
        cursor = r.json()["next_cursor"]
        if cursor is None:
            break
    assert pages > 1 and len(seen) == len(set(seen)) and set(seen) == made
