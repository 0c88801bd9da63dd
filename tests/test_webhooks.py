"""Webhooks: a durable outbox written with the status change, signed POSTs,
retried with back-off, delivered at least once across a SIGKILL."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import drop_schema, require_postgres
from duragent import (
    Agent,
    BuiltinTools,
    Limits,
    Runtime,
    ScriptedModel,
    Store,
    TaskStatus,
    ToolCall,
    tool,
)
from duragent.errors import UsageError
from duragent.store import open_store
from duragent.webhooks import OUTBOX, SECRET_ENV, WebhookDelivery, sign, verify_signature
from support.crashlib import close_pipes, finish, kill_at, spawn
from webhook_receiver import Received, Receiver

SECRET = "whsec-test-secret"
FAST = WebhookDelivery(secret=SECRET, base_delay=0.05, poll_interval=0.1)


@pytest.fixture(params=["sqlite", "postgres"])
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A store several processes share: a SQLite file, or a PostgreSQL schema."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/shared.db"
        return
    schema = f"test_{uuid.uuid4().hex[:12]}"
    yield f"{require_postgres()}?schema={schema}"
    drop_schema(schema)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(fail_first=2)
    try:
        yield r
    finally:
        r.close()


async def until_delivered(receiver: Receiver, n: int = 1, timeout: float = 30.0) -> None:
    def accepted(reqs: list[Received]) -> bool:
        return len([r for r in reqs if r.answered == 200]) >= n

    await asyncio.to_thread(receiver.wait_for, accepted, timeout)


async def until_outbox_empty(store: Store, timeout: float = 30.0) -> None:
    async def empty() -> None:
        while await store.list_documents(OUTBOX):
            await store.wait_for_change(0.1)

    await asyncio.wait_for(empty(), timeout)


@pytest.mark.slow
async def test_failed_attempts_are_retried_with_one_idempotency_key(
    store: Store, receiver: Receiver
) -> None:
    agent = Agent(name="a", model=ScriptedModel(["Done."]))
    async with Runtime(store, agents=[agent], webhook_delivery=FAST) as rt:
        sub = await rt.submit("a", "hi", webhook=receiver.url)
        task = await sub.wait(20)
        await until_delivered(receiver)
        await until_outbox_empty(store)  # the delivery is recorded: gone from the outbox
    assert task.status is TaskStatus.COMPLETED
    assert [r.answered for r in receiver.requests] == [500, 500, 200]
    keys = {r.headers["Idempotency-Key"] for r in receiver.requests}
    (key,) = keys  # one event, one key across every attempt
    for r in receiver.requests:
        verify_signature(SECRET, r.body, r.headers["Duragent-Signature"])
        assert r.event["id"] == key
    event = receiver.requests[-1].event
    assert event["type"] == "task.completed"
    assert event["task"]["id"] == task.id and event["task"]["output"] == "Done."


@pytest.mark.slow
async def test_agent_webhook_announces_input_waits_and_the_end(tmp_path: Path) -> None:
    receiver = Receiver()
    try:
        model = ScriptedModel([[ToolCall("ask_user", {"question": "Which city?"})], "Paris it is."])
        agent = Agent(
            name="a", model=model, builtin_tools=BuiltinTools(ask_user=True), webhook=receiver.url
        )
        async with Runtime(
            f"sqlite:///{tmp_path}/h.db", agents=[agent], webhook_delivery=FAST
        ) as rt:
            sub = await rt.submit("a", "plan a trip")
            await rt.wait(sub.task_id, timeout=20, until=lambda t: t.status is TaskStatus.WAITING)
            await until_delivered(receiver, 1)
            await rt.respond(sub.task_id, answer="Paris")
            await sub.wait(20)
            await until_delivered(receiver, 2)
        types = [r.event["type"] for r in receiver.accepted()]
        assert types == ["task.waiting_for_input", "task.completed"]
        assert receiver.requests[0].event["task"]["status_reason"] == "input"
    finally:
        receiver.close()


@pytest.mark.slow
async def test_failed_aborted_and_blocked_tasks_are_announced(tmp_path: Path) -> None:
    receiver = Receiver()
    hang = asyncio.Event()

    @tool
    async def stuck() -> str:
        """Never returns (its worker dies)."""
        await hang.wait()
        return "unreachable"

    try:
        looping = Agent(
            name="loop",
            model=ScriptedModel([[ToolCall("update_plan", {"steps": ["x"]})]] * 3),
            limits=Limits(max_iterations=1),
            webhook=receiver.url,
        )
        asking = Agent(
            name="ask",
            model=ScriptedModel([[ToolCall("ask_user", {"question": "?"})]]),
            builtin_tools=BuiltinTools(ask_user=True),
        )
        fragile = Agent(
            name="fragile",
            model=ScriptedModel([[ToolCall("stuck", {})]]),
            tools=[stuck],
            limits=Limits(max_restarts=0),
            webhook=receiver.url,
        )
        store = open_store(f"sqlite:///{tmp_path}/h.db")
        await store.open()
        agents = [looping, asking, fragile]
        async with Runtime(store, agents=agents, webhook_delivery=FAST) as rt:
            failed = await (await rt.submit("loop", "go")).wait(20)
            await until_delivered(receiver, 1)
            sub = await rt.submit("ask", "go", webhook=receiver.url)
            await rt.wait(sub.task_id, timeout=20, until=lambda t: t.status is TaskStatus.WAITING)
            await until_delivered(receiver, 2)
            await rt.abort(sub.task_id, "not needed")
            await until_delivered(receiver, 3)
        # A worker dies running `stuck`; the next one finds the restart limit passed.
        dying = Runtime(store, agents=agents, lease_ttl=1.0, poll_interval=0.1)
        blocked_id = (await dying.submit("fragile", "go")).task_id
        await dying.wait(blocked_id, timeout=20, until=lambda t: t.status is TaskStatus.RUNNING)
        await dying.close(graceful=False)
        async with Runtime(store, agents=agents, lease_ttl=1.0, webhook_delivery=FAST) as rt:
            rt.start_worker()
            await until_delivered(receiver, 4)
        await store.close()
        events = [r.event for r in receiver.accepted()]
        assert [e["type"] for e in events] == [
            "task.failed",
            "task.waiting_for_input",
            "task.aborted",
            "task.blocked",
        ]
        assert (
            events[0]["task"]["id"] == failed.id and "max_iterations" in events[0]["task"]["error"]
        )
        assert events[2]["task"]["error"] == "not needed"
        assert events[3]["task"]["id"] == blocked_id
        assert events[3]["task"]["status_reason"] == "restart_limit"
    finally:
        receiver.close()


@pytest.mark.slow
async def test_without_a_secret_events_wait_in_the_outbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SECRET_ENV, raising=False)
    receiver = Receiver()
    url = f"sqlite:///{tmp_path}/h.db"
    try:
        agent = Agent(name="a", model=ScriptedModel(["Done."]), webhook=receiver.url)
        unsigned = WebhookDelivery(base_delay=0.05, poll_interval=0.1)
        async with Runtime(url, agents=[agent], webhook_delivery=unsigned) as rt:
            await (await rt.submit("a", "hi")).wait(20)
            await rt.worker.webhooks.deliver_due()  # type: ignore[union-attr]
            assert len(await rt.store.list_documents(OUTBOX)) == 1
        assert receiver.requests == []
        monkeypatch.setenv(SECRET_ENV, SECRET)
        async with Runtime(url, agents=[agent], webhook_delivery=unsigned) as rt:
            rt.start_worker()
            await until_delivered(receiver, 1)
        verify_signature(
            SECRET, receiver.requests[0].body, receiver.requests[0].headers["Duragent-Signature"]
        )
    finally:
        receiver.close()


def test_a_webhook_must_be_an_http_url() -> None:
    with pytest.raises(UsageError, match="http:// or https://"):
        Agent(name="a", model="scripted:none", webhook="ftp://example.com/x")


def test_signature_rejects_tampering_and_old_timestamps() -> None:
    body = b'{"id":"evt_1"}'
    header = sign(SECRET, body, 1_000_000)
    verify_signature(SECRET, body, header, now=1_000_010)
    with pytest.raises(ValueError, match="does not match"):
        verify_signature(SECRET, body + b" ", header, now=1_000_010)
    with pytest.raises(ValueError, match="does not match"):
        verify_signature("other", body, header, now=1_000_010)
    with pytest.raises(ValueError, match="tolerance"):
        verify_signature(SECRET, body, header, now=1_000_000 + 301)
    with pytest.raises(ValueError, match="malformed"):
        verify_signature(SECRET, body, "v1=abc")


# --- a worker SIGKILLed between the status commit and the delivery -----------------


async def outbox_of(url: str) -> int:
    store = open_store(url)
    await store.open()
    try:
        return len(await store.list_documents(OUTBOX))
    finally:
        await store.close()


@pytest.mark.slow
async def test_sigkill_before_any_delivery_loses_nothing(
    shared_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, receiver = shared_url, Receiver()
    try:
        monkeypatch.delenv(SECRET_ENV, raising=False)  # this child writes events, sends none
        kill_at(spawn("webhook_agent.py", url, receiver.url, "run"), "DONE completed")
        assert receiver.requests == [] and await outbox_of(url) == 1
        monkeypatch.setenv(SECRET_ENV, SECRET)
        out = finish(spawn("webhook_agent.py", url, receiver.url, "deliver"))
        assert "DELIVERED" in out
        (got,) = receiver.requests
        assert got.answered == 200 and got.event["type"] == "task.completed"
        verify_signature(SECRET, got.body, got.headers["Duragent-Signature"])
    finally:
        receiver.close()


@pytest.mark.slow
async def test_sigkill_during_delivery_sends_it_again(
    shared_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, receiver = shared_url, Receiver(hold_first=True)
    try:
        monkeypatch.setenv(SECRET_ENV, SECRET)
        proc = spawn("webhook_agent.py", url, receiver.url, "run")
        # The first POST arrived and is held unanswered: kill the sender now.
        await asyncio.to_thread(receiver.wait_for, lambda reqs: len(reqs) == 1)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        close_pipes(proc)
        assert await outbox_of(url) == 1  # not acknowledged, so still owed
        out = finish(spawn("webhook_agent.py", url, receiver.url, "deliver"))
        assert "DELIVERED" in out
        first, *again = receiver.requests
        assert first.answered == 0 and again and again[-1].answered == 200
        # At least once, under one idempotency key.
        assert {r.headers["Idempotency-Key"] for r in receiver.requests} == {first.event["id"]}
        assert await outbox_of(url) == 0
    finally:
        receiver.close()
