"""Control requests and new work reach a worker in another process at once,
not at its next heartbeat or poll (issue 11, item 6)."""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from conftest import drop_schema, require_postgres
from duragent import Agent, Runtime, ScriptedModel, TaskStatus, ToolCall, tool
from duragent.store import Commit, TaskPatch
from duragent.store._memory import MemoryStore
from duragent.types import AssistantMessage, EntryKind
from support.workerlib import WorkerProc, workers  # noqa: F401  (the fixture)
from worker_agents import AGENTS

# A heartbeat (lease / 3) far longer than any wait below: whatever reaches the
# worker in time did not come with a lease renewal.
LONG_LEASE = 900.0


@pytest.fixture(params=["sqlite", "postgres"])
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/shared.db"
        return
    schema = f"test_{uuid.uuid4().hex[:12]}"
    yield f"{require_postgres()}?schema={schema}"
    drop_schema(schema)


@pytest.fixture
async def rt(shared_url: str) -> AsyncIterator[Runtime]:
    """A Runtime without a worker, in this process: the 'other process' of the tests."""
    async with Runtime(shared_url, agents=AGENTS, run_worker=False) as runtime:
        yield runtime


@pytest.mark.slow
async def test_pause_and_abort_from_another_process_land_without_a_heartbeat(
    rt: Runtime,
    shared_url: str,
    workers: list[WorkerProc],  # noqa: F811
) -> None:
    first = await rt.submit("sleeper", "pause me")
    second = await rt.submit("sleeper", "abort me")
    w = WorkerProc(shared_url, ttl=LONG_LEASE, HOLD="nap", TOOL_GRACE="0.5")
    workers.append(w)
    for sub in (first, second):
        await w.wait_output(f"AT nap {sub.task_id}")
    # The first heartbeat is LONG_LEASE / 3 = 300 s away; these would time out.
    paused = await rt.pause(first.task_id, timeout=120)
    assert paused.status is TaskStatus.PAUSED
    aborted = await rt.abort(second.task_id, timeout=120)
    assert aborted.status is TaskStatus.ABORTED
    results = await rt.store.entries(first.task_id, kinds=[EntryKind.TOOL_RESULT])
    assert [e.payload["outcome"] for e in results] == ["interrupted"]
    # The worker lives on and still runs work.
    third = await rt.submit("chat", "still there?")
    done = await rt.wait(third.task_id, timeout=60, until=lambda t: t.status.terminal)
    assert done.status is TaskStatus.COMPLETED


@pytest.mark.slow
async def test_worker_picks_up_work_from_another_process_without_polling(
    rt: Runtime,
    shared_url: str,
    workers: list[WorkerProc],  # noqa: F811
) -> None:
    w = WorkerProc(shared_url, ttl=30.0, poll=600.0)
    workers.append(w)
    warmup = await rt.submit("chat", "hello")
    # Claimed by the worker's first look, before it ever waits.
    await rt.wait(warmup.task_id, timeout=60, until=lambda t: t.status.terminal)
    for i in range(3):
        # Now it sleeps for up to 600 s unless the submit wakes it.
        sub = await rt.submit("chat", f"message {i}")
        done = await rt.wait(sub.task_id, timeout=120, until=lambda t: t.status.terminal)
        assert done.status is TaskStatus.COMPLETED


class DeafStore(MemoryStore):
    """Hears no control notices: only the rows its commits return tell a runner."""

    def watch_controls(self, callback: Any) -> Any:
        return lambda: None


async def test_control_committed_before_the_intents_commit_starts_no_tool() -> None:
    ran: list[str] = []

    @tool
    async def first() -> str:
        """The first step."""
        ran.append("first")
        return "one"

    @tool
    async def second() -> str:
        """Must never start: the pause was committed before its intent."""
        ran.append("second")
        return "two"

    def script(messages: list[Any]) -> Any:
        n = sum(isinstance(m, AssistantMessage) for m in messages)
        if n == 0:
            return [ToolCall("first", {})]
        return [ToolCall("second", {})] if n == 1 else "done"

    store = DeafStore()
    holding = asyncio.Event()
    release = asyncio.Event()

    async def trace(point: str, **info: Any) -> None:
        if point == "result" and info.get("call_id") is not None and not release.is_set():
            holding.set()
            await release.wait()

    agent = Agent(name="stepper", model=ScriptedModel(script), tools=[first, second])
    async with Runtime(store, agents=[agent], trace=trace, lease_ttl=LONG_LEASE) as rt:
        sub = await rt.submit("stepper", "go")
        await asyncio.wait_for(holding.wait(), 30)
        # What `duragent pause` in another process commits on a running task.
        control = {"action": "pause", "rollback": False, "reason": None}
        await store.commit(
            Commit(
                patches=[
                    TaskPatch(sub.task_id, {"control": control}, expect_status=[TaskStatus.RUNNING])
                ]
            )
        )
        release.set()
        task = await rt.wait(
            sub.task_id,
            timeout=60,
            until=lambda t: t.status.terminal or t.status is TaskStatus.PAUSED,
        )
        assert ran == ["first"], "a tool started after the pause was committed"
        assert task.status is TaskStatus.PAUSED
        outcomes = [
            e.payload["outcome"]
            for e in await store.entries(sub.task_id, kinds=[EntryKind.TOOL_RESULT])
        ]
        assert outcomes == ["ok", "interrupted"]
