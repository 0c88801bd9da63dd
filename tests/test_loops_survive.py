"""Background loops outlive one bad row (issue 37, item 5): a schedule, a queue
definition, a webhook event or a task row written straight into the store,
around every validation, is logged and skipped; every other owner's schedules,
purges, deliveries and leases go on. And the edges refuse such values first."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from duragent import Agent, BuiltinTools, Queue, Runtime, ScriptedModel, ToolCall, tool
from duragent.errors import InvalidOption
from duragent.runtime._housekeeping import Housekeeper
from duragent.runtime._schedules import (
    SCHEDULES_SCOPE,
    new_schedule,
    put_schedule,
    schedule_key,
)
from duragent.runtime._worker import Worker, WorkerOptions
from duragent.store import open_store
from duragent.store._commits import Commit, DocumentWrite, TaskQuery
from duragent.store._protocol import Store
from duragent.store._queues import QUEUES_SCOPE, define_queue
from duragent.types import TaskStatus
from duragent.webhooks import OUTBOX, WebhookDelivery, WebhookSender
from support.api import assert_problem, auth, client, runtime  # noqa: F401
from webhook_receiver import Receiver

CHAT = Agent(name="chat", model=ScriptedModel(["ok"]), builtin_tools=BuiltinTools(plan=False))


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    s = open_store(f"sqlite:///{tmp_path}/loops.db")
    await s.open()
    try:
        yield s
    finally:
        await s.close()


async def poison(store: Store, scope: str, key: str, value: Any) -> None:
    """A document as nothing in duragent would write it: straight into the store."""
    await store.commit(Commit(documents=[DocumentWrite(scope, key, value)]))


@contextlib.asynccontextmanager
async def running(job: Callable[[], Awaitable[None]]) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.ensure_future(job())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def until(check: Callable[[], Awaitable[bool]], store: Store, timeout: float = 20) -> None:
    async def go() -> None:
        while not await check():
            await store.wait_for_change(0.1)

    await asyncio.wait_for(go(), timeout)


# --- the edges refuse what would break a loop -----------------------------------


@pytest.mark.parametrize("every", [1e-7, 0.5, math.inf, math.nan, -1.0, 4e11])
def test_the_library_refuses_an_every_no_schedule_can_tick_on(every: float) -> None:
    with pytest.raises(InvalidOption, match="every"):
        new_schedule("s", "chat", "x", every=every)
    with pytest.raises(InvalidOption, match="every"):
        new_schedule("s", "chat", "x", every=timedelta(microseconds=1))


@pytest.mark.parametrize("bad", [{"ttl": math.inf}, {"ttl": 4e11}, {"rate": (1, math.nan)}])
def test_the_library_refuses_queue_times_past_any_calendar(bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidOption):
        Queue("q", **bad)


@pytest.mark.parametrize(
    "options",
    [
        {"lease_ttl": 0},
        {"lease_ttl": math.nan},
        {"poll_interval": -1},
        {"poll_interval": math.inf},
        {"heartbeat": 0},
        {"heartbeat": 40, "lease_ttl": 30},
        {"missing_agent_grace": math.nan},
        {"concurrency": 0},
    ],
)
async def test_a_worker_refuses_periods_its_loops_cannot_run_on(
    store: Store, options: dict[str, Any]
) -> None:
    with pytest.raises(InvalidOption):
        Worker(store, [CHAT], WorkerOptions(**options))


@pytest.mark.parametrize(
    "bad", [{"poll_interval": 0}, {"base_delay": math.nan}, {"concurrency": 0}]
)
def test_webhook_delivery_refuses_periods_its_loop_cannot_run_on(bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidOption):
        WebhookDelivery(**bad)


async def test_rest_refuses_an_every_below_a_second(client: httpx.AsyncClient) -> None:  # noqa: F811
    body = {"name": "fast", "agent": "quick", "input": "x"}
    for every in (1e-7, 0.5, 0):
        r = await client.post("/v1/schedules", json={**body, "every": every}, headers=auth("alice"))
        assert_problem(r, 422, "Validation error")
    r = await client.post("/v1/schedules", json={**body, "every": 1}, headers=auth("alice"))
    assert r.status_code == 201, r.text


@pytest.mark.slow
def test_the_cli_refuses_an_every_below_a_second_in_one_line(tmp_path: Path) -> None:
    got = subprocess.run(
        [
            *(sys.executable, "-m", "duragent", "schedule", "add", "fast", "--agent", "chat"),
            *("--input", "x", "--every", "1e-7", "--store", f"sqlite:///{tmp_path}/cli.db"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert got.returncode != 0
    assert "every must be between 1 and" in got.stderr
    assert "Traceback" not in got.stderr and len(got.stderr.strip().splitlines()) == 1


# --- one poisoned row per loop ---------------------------------------------------


async def test_a_poisoned_schedule_does_not_stop_any_other_owners(store: Store) -> None:
    past = datetime.now(UTC) - timedelta(seconds=5)
    # Listed before the good one (keys sort by owner): today's code died on it first.
    bad = new_schedule("tiny", "chat", "x", every=60, owner="a-mallory", start_at=past)
    value = {**bad.model_dump(mode="json"), "every": 1e-7}
    await poison(store, SCHEDULES_SCOPE, schedule_key("a-mallory", "tiny"), value)
    await poison(store, SCHEDULES_SCOPE, schedule_key("a-mallory", "junk"), {"name": 3})
    good = new_schedule("daily", "chat", "x", every=60, owner="b-alice", start_at=past)
    await put_schedule(store, good)
    keeper = Housekeeper(store, {"chat": CHAT}, interval=0.05, ttl_interval=3600)

    async def fired() -> bool:
        return keeper.fired >= 1

    async with running(keeper.run) as loop:
        await until(fired, store)
        # Still looping after meeting both bad rows more than once.
        passes = keeper.fired
        await asyncio.sleep(0)
        assert not loop.done() and passes == 1
    page = await store.list_tasks(TaskQuery(owner="b-alice"))
    assert [t.metadata["schedule"] for t in page.tasks] == ["daily"]


async def test_a_poisoned_schedule_is_a_409_to_its_owner_and_can_be_deleted(
    client: httpx.AsyncClient,  # noqa: F811
    runtime: Runtime,  # noqa: F811
) -> None:
    bad = new_schedule("tiny", "quick", "x", every=60, owner="alice")
    value = {**bad.model_dump(mode="json"), "every": 1e-7}
    await poison(runtime.store, SCHEDULES_SCOPE, schedule_key("alice", "tiny"), value)
    for path in ("/v1/schedules/tiny/resume", "/v1/schedules/tiny/pause"):
        r = await client.post(path, headers=auth("alice"))
        assert "delete it" in assert_problem(r, 409, "Schedule unreadable")["detail"]
    r = await client.get("/v1/schedules", headers=auth("alice"))
    assert r.status_code == 200 and r.json()["schedules"] == []
    assert (await client.delete("/v1/schedules/tiny", headers=auth("alice"))).status_code == 204
    assert await runtime.store.list_documents(SCHEDULES_SCOPE) == []


async def test_a_poisoned_queue_ttl_does_not_stop_other_queues_purges(tmp_path: Path) -> None:
    async with Runtime(f"sqlite:///{tmp_path}/ttl.db", agents=[CHAT]) as rt:
        sub = await rt.submit("chat", "x")
        done = await sub.wait(timeout=30)
        assert done.status is TaskStatus.COMPLETED
        store = rt.store
        # A ttl no time can be computed from (timedelta overflows), sorted first.
        await poison(store, QUEUES_SCOPE, "a-broken", {"name": "a-broken", "ttl": 1e300})
        await poison(store, QUEUES_SCOPE, "a-junk", {"name": 5, "ttl": "soon"})
        await define_queue(store, Queue("chat", ttl=0.001))
        keeper = Housekeeper(store, {}, interval=0.05, ttl_interval=0)

        async def purged() -> bool:
            return keeper.purged >= 1

        async with running(keeper.run) as loop:
            await until(purged, store)
            assert not loop.done()
        assert (await store.list_tasks(TaskQuery())).tasks == []


@pytest.mark.slow
async def test_a_poisoned_webhook_event_does_not_stop_the_others(store: Store) -> None:
    receiver = Receiver()
    try:
        good = {
            "url": receiver.url,
            "body": {"id": "evt_b", "type": "task.completed", "task": {}},
            "attempts": 0,
            "next_at": None,
            "claimed_until": None,
        }
        # Listed first, each breaks what delivery reads of it.
        await poison(store, OUTBOX, "evt_a1", {**good, "next_at": "not a time"})
        await poison(store, OUTBOX, "evt_a2", {**good, "next_at": "2020-01-01T00:00:00"})
        await poison(store, OUTBOX, "evt_a3", {**good, "body": "text"})
        await poison(store, OUTBOX, "evt_a4", ["not", "an", "event"])
        await poison(store, OUTBOX, "evt_b", good)
        options = WebhookDelivery(secret="whsec-test", poll_interval=0.05)
        sender = WebhookSender(store, "w1", options=options)

        async def delivered() -> bool:
            return sender.delivered >= 1

        async with running(sender.run) as loop:
            await until(delivered, store)  # answered 200, and deleted from the outbox
            assert not loop.done()
        assert [r.event["id"] for r in receiver.requests] == ["evt_b"]
        left = sorted(d.key for d in await store.list_documents(OUTBOX))
        assert left == ["evt_a1", "evt_a2", "evt_a3", "evt_a4"]
    finally:
        receiver.close()


async def test_a_poisoned_task_row_does_not_stop_the_other_leases(tmp_path: Path) -> None:
    path = tmp_path / "leases.db"
    release = asyncio.Event()

    @tool
    async def hold() -> str:
        """Wait until the test lets go."""
        await release.wait()
        return "held"

    def script(messages: list[Any]) -> Any:
        return [ToolCall("hold", {})] if len(messages) == 1 else "done"

    agent = Agent(
        name="holder",
        model=ScriptedModel(script),
        tools=[hold],
        builtin_tools=BuiltinTools(plan=False),
    )
    store = open_store(f"sqlite:///{path}")
    await store.open()
    worker = Worker(store, [agent], WorkerOptions(lease_ttl=1.5, heartbeat=0.1, poll_interval=0.05))
    try:
        async with Runtime(store, agents=[agent], run_worker=False) as rt:
            a = (await rt.submit("holder", "a")).task_id
            b = (await rt.submit("holder", "b")).task_id
        async with running(worker.run) as loop:

            async def both_running() -> bool:
                return set(worker.runners) == {a, b}

            await until(both_running, store)
            # The first task's row no longer reads as a task.
            with sqlite3.connect(path) as db:
                (text,) = db.execute("SELECT data FROM tasks WHERE id=?", (a,)).fetchone()
                data = json.loads(text)
                data["iterations"] = "many"
                db.execute(
                    "UPDATE tasks SET data=?, version=version+1 WHERE id=?", (json.dumps(data), a)
                )
            first = (await store.get_task(b)).lease.expires_at
            assert first is not None

            async def renewed_twice() -> bool:
                now = (await store.get_task(b)).lease.expires_at
                return now is not None and now > first + timedelta(seconds=0.15)

            await until(renewed_twice, store)
            assert not loop.done() and b in worker.runners
            release.set()
            await worker.wait_task(b)
        assert (await store.get_task(b)).status is TaskStatus.COMPLETED
    finally:
        release.set()
        await store.close()
