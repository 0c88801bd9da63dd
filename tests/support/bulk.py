"""What the bulk-operation tests share: agents whose tasks fail or wait, and counting retries."""

from __future__ import annotations

from typing import Any

from duragent import Agent, BuiltinTools, ModelError, Runtime, ScriptedModel, TaskStatus, ToolCall
from duragent.store._protocol import Store
from duragent.types import EntryKind

RETRIED = "Retried after the failure"


def failing_agent(name: str = "flaky") -> Agent:
    """Every model call fails for good: a task of it fails at once (and again after a retry)."""

    def script(messages: list[Any]) -> Any:
        raise ModelError("the provider refused the request")

    return Agent(name=name, model=ScriptedModel(script), builtin_tools=BuiltinTools(plan=False))


def waiting_agent(name: str = "slow", version: str | None = None) -> Agent:
    """Asks a question at once: its tasks wait for input until answered."""
    return Agent(
        name=name,
        version=version,
        model=ScriptedModel([[ToolCall("ask_user", {"question": "go?"})], "ok"]),
        builtin_tools=BuiltinTools(plan=False, ask_user=True),
    )


async def retries_of(store: Store, task_id: str) -> int:
    """How many retries the task's log records (each retry commits one notice)."""
    entries = await store.entries(task_id, kinds=[EntryKind.UI_MESSAGE])
    return sum(1 for e in entries if RETRIED in str(e.payload))


async def failed_tasks(rt: Runtime, n: int, owner: str, **meta: str) -> list[str]:
    ids = []
    for i in range(n):
        ids.append((await rt.submit("flaky", f"t{i}", owner=owner, metadata=meta)).task_id)
    for task_id in ids:
        assert (await rt.wait(task_id, timeout=30)).status is TaskStatus.FAILED
    return ids


async def waiting_tasks(rt: Runtime, agent: str, n: int, owner: str) -> list[str]:
    ids = [(await rt.submit(agent, f"w{i}", owner=owner)).task_id for i in range(n)]
    for task_id in ids:
        await rt.wait(task_id, timeout=30, until=lambda t: t.status is TaskStatus.WAITING)
    return ids


async def migrations_of(store: Store, task_id: str) -> list[dict[str, Any]]:
    """The migrations the task's log records ({"from", "to", "by"} each)."""
    entries = await store.entries(task_id, kinds=[EntryKind.STATUS])
    return [e.payload["migration"] for e in entries if "migration" in e.payload]
