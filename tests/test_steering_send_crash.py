"""SIGKILL of the worker around a sent message's pickup: nothing lost, nothing run twice."""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import drop_schema, pg_schema_url
from duragent import Runtime, TaskStatus
from duragent.types import EntryKind, UserMessage
from send_child import make_agent
from support.crashlib import close_pipes, kill_at, ledger_lines, read_until, spawn

STRATEGIES = ["enqueue", "interrupt", "rollback"]


@pytest.fixture
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    kind = request.param
    if kind in ("postgres", "postgres-psycopg"):
        schema = f"test_{uuid.uuid4().hex[:12]}"
        yield pg_schema_url(kind, schema)
        drop_schema(schema)
    elif kind == "sqlite":
        yield f"sqlite:///{tmp_path}/s.db"
    else:
        yield f"jsonl:///{tmp_path}/s"


async def check_after_restart(url: str, task_id: str, ledger: Path) -> None:
    async with Runtime(url, agents=[make_agent(ledger)], lease_ttl=1.0, poll_interval=0.05) as rt:
        task = await rt.wait(task_id, timeout=60)
        view = await rt.model_view(task.id)
        entries = await rt.store.entries(task.id)
    assert task.status is TaskStatus.COMPLETED, task.error
    users = [m.content for m in view if isinstance(m, UserMessage)]
    assert sorted(users) == ["m0", "m1"]  # the message is in the model's view, once
    delivered = [e for e in entries if e.payload.get("type") == "delivered"]
    assert len(delivered) == 1 and "inbox" not in task.config
    # record(1), asked once the message was in, ran exactly once; record(0) at most once.
    runs = ledger_lines(ledger)
    assert runs.count("1") == 1 and runs.count("0") <= 1
    intents = [e.payload["call_id"] for e in entries if e.kind is EntryKind.TOOL_INTENT]
    assert len(set(intents)) == len(intents)


@pytest.mark.slow
@pytest.mark.parametrize(
    "store_url", ["sqlite", "jsonl", "postgres", "postgres-psycopg"], indirect=True
)
@pytest.mark.parametrize("strategy", STRATEGIES)
async def test_sigkill_right_after_a_messages_pickup_is_committed(
    tmp_path: Path, store_url: str, strategy: str
) -> None:
    ledger = tmp_path / "ledger"
    async with Runtime(store_url, agents=[make_agent(ledger)], run_worker=False) as rt:
        sub = await rt.submit("chat", "m0", multitask_strategy=strategy)  # type: ignore[arg-type]
        await rt.send(sub.task_id, "m1")
    # The worker takes the message (enqueue: after m0's turn; else before its first
    # model call) and is killed as the model is asked with it: the pickup committed.
    kill_at(spawn("send_child.py", store_url, str(ledger), "asked m1", sub.task_id), "asked m1")
    await check_after_restart(store_url, sub.task_id, ledger)


@pytest.mark.slow
@pytest.mark.parametrize("store_url", ["sqlite", "postgres", "postgres-psycopg"], indirect=True)
@pytest.mark.parametrize("strategy", STRATEGIES)
async def test_sigkill_after_a_message_is_sent_and_before_it_is_taken(
    tmp_path: Path, store_url: str, strategy: str
) -> None:
    ledger = tmp_path / "ledger"
    async with Runtime(store_url, agents=[make_agent(ledger)], run_worker=False) as rt:
        sub = await rt.submit("chat", "m0", multitask_strategy=strategy)  # type: ignore[arg-type]
        child = spawn("send_child.py", store_url, str(ledger), "tool 0", sub.task_id)
        assert child.stdout is not None
        read_until(child.stdout, "tool 0", 60)
        # Committed while the worker is inside record(0) (an interrupt may be under
        # way in it when the kill lands: any point will do).
        await rt.send(sub.task_id, "m1")
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        close_pipes(child)
        assert child.returncode == -signal.SIGKILL
    await check_after_restart(store_url, sub.task_id, ledger)
