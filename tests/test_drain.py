"""Graceful drain (issue 43, item 2), with real worker processes on SQLite and
PostgreSQL: SIGTERM stops claiming, running rounds reach a safe point, the tasks
are handed back and another worker continues them at once; a second signal
stops at once and leaves the tasks to takeover.

"At once" is forced, not timed: the draining worker's leases last 600 s, so a
task left to its lease would outlast every wait here (and count a restart)."""

from __future__ import annotations

import asyncio
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from conftest import drop_schema, require_postgres
from duragent import Agent, Runtime, ScriptedModel, TaskStatus, Timing, ToolCall, tool
from duragent.runtime._presence import WORKERS_SCOPE
from duragent.runtime._worker import Worker, WorkerOptions
from duragent.store._memory import MemoryStore
from duragent.types import EntryKind, Task
from support.workerlib import (
    WorkerProc,
    ledger_lines,
    one_result_per_call,
    workers,  # noqa: F401  (the fixture)
)
from worker_agents import AGENTS

LONG_LEASE = 600.0  # far past every wait below: a task waiting for it times the test out


@pytest.fixture(params=["sqlite", "postgres"])
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/drain.db"
        return
    schema = f"test_{uuid.uuid4().hex[:12]}"
    yield f"{require_postgres()}?schema={schema}"
    drop_schema(schema)


@pytest.fixture
async def rt(shared_url: str) -> AsyncIterator[Runtime]:
    """A Runtime without a worker: it submits and reads."""
    async with Runtime(shared_url, agents=AGENTS, run_worker=False) as runtime:
        yield runtime


def worker(
    url: str, name: str, *, ttl: float = LONG_LEASE, grace: str = "600", **env: str
) -> WorkerProc:
    """A worker process named `name`; `env`: the environment worker_agents.py reads."""
    extra: dict[str, Any] = dict(env)  # only environment variables, whatever mypy fears
    return WorkerProc(url, ttl=ttl, args=("--worker-id", name, "--grace", grace), **extra)


async def presence(rt: Runtime, name: str) -> dict[str, Any] | None:
    doc = await rt.store.get_document(WORKERS_SCOPE, name)
    return doc.value if doc is not None and isinstance(doc.value, dict) else None


async def until_presence(rt: Runtime, name: str, *, draining: bool, timeout: float = 60) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while (value := await presence(rt, name)) is None or value.get("draining") is not draining:
        assert loop.time() < deadline, f"{name}'s presence record: {value}"
        await asyncio.sleep(0.02)


async def exit_code(w: WorkerProc, timeout: float = 120) -> int:
    return await asyncio.to_thread(w.proc.wait, timeout)


async def all_done(rt: Runtime, ids: list[str], timeout: float = 120) -> list[Task]:
    return [await rt.wait(i, timeout=timeout, until=lambda t: t.status.terminal) for i in ids]


async def statuses(rt: Runtime, task_id: str) -> list[dict[str, Any]]:
    return [e.payload for e in await rt.store.entries(task_id, kinds=[EntryKind.STATUS])]


async def outcomes(rt: Runtime, task_id: str) -> list[tuple[str, str]]:
    results = await rt.store.entries(task_id, kinds=[EntryKind.TOOL_RESULT])
    return [(e.payload["outcome"], e.payload["content"]) for e in results]


@pytest.mark.slow
async def test_sigterm_drains_and_another_worker_continues_every_task_at_once(
    rt: Runtime,
    shared_url: str,
    workers: list[WorkerProc],  # noqa: F811
    tmp_path: Path,
) -> None:
    ledger, release = tmp_path / "ledger.txt", tmp_path / "release"
    ids = [(await rt.submit("sleeper", f"task {i}")).task_id for i in range(6)]
    # A holds every task inside its never-replay tool (`nap`) until the test lets go
    # (and the agent would wait 600 s for its tools: the drain's grace is what counts).
    a = worker(
        shared_url,
        "drain-a",
        LEDGER=str(ledger),
        HOLD="nap",
        HOLD_UNTIL=str(release),
        TOOL_GRACE="600",
    )
    workers.append(a)
    for task_id in ids:
        await a.wait_output(f"AT nap {task_id}")
    a.signal(signal.SIGTERM)
    await until_presence(rt, "drain-a", draining=True)
    # A has free slots and hears of new work at once, but claims no more.
    late = (await rt.submit("sleeper", "submitted while A drains")).task_id
    b = worker(shared_url, "drain-b", LEDGER=str(ledger))
    workers.append(b)
    await until_presence(rt, "drain-b", draining=False)
    assert [(await rt.get(i)).status for i in ids] == [TaskStatus.RUNNING] * 6  # still in `nap`
    release.touch()  # the tools finish within the grace period
    assert await exit_code(a) == 0, "\n".join(a.err[-30:])
    assert await presence(rt, "drain-a") is None  # withdrawn as it exited
    done = await all_done(rt, [*ids, late])
    assert all(t.status is TaskStatus.COMPLETED for t in done), [t.status for t in done]
    assert all(t.restarts == 0 for t in done)  # handed back, never taken over
    lines = ledger_lines(ledger)
    for task_id in ids:
        # The never-replay tool ran once, in A, to its end; the next round ran in B.
        starts = [x for x in lines if x.startswith(f"start nap {task_id}:")]
        assert len(starts) == 1 and starts[0].endswith(f"pid={a.pid}"), starts
        assert any(x.startswith(f"end nap {task_id}:") for x in lines)
        safe = [x for x in lines if x.startswith(f"start nap_safe {task_id}:")]
        assert len(safe) == 1 and safe[0].endswith(f"pid={b.pid}"), safe
        assert [o for o, _ in await outcomes(rt, task_id)] == ["ok", "ok"]
        moves = [(s["from"], s["to"]) for s in await statuses(rt, task_id)]
        assert ("running", "pending") in moves and not any(
            s.get("takeover") for s in await statuses(rt, task_id)
        )
        await one_result_per_call(rt, task_id)
    late_lines = [x for x in lines if f" {late}:" in x]
    assert late_lines and all(x.endswith(f"pid={b.pid}") for x in late_lines)


@pytest.mark.slow
async def test_past_the_grace_running_tools_are_cancelled_and_the_task_released(
    rt: Runtime,
    shared_url: str,
    workers: list[WorkerProc],  # noqa: F811
    tmp_path: Path,
) -> None:
    ledger = tmp_path / "ledger.txt"
    ids = [(await rt.submit("sleeper", f"task {i}")).task_id for i in range(2)]
    # The tools never end by themselves, and the agent would wait 600 s for them.
    a = worker(shared_url, "drain-a", grace="1", LEDGER=str(ledger), HOLD="nap", TOOL_GRACE="600")
    workers.append(a)
    for task_id in ids:
        await a.wait_output(f"AT nap {task_id}")
    a.signal(signal.SIGTERM)
    assert await exit_code(a) == 0, "\n".join(a.err[-30:])
    for task_id in ids:
        task = await rt.get(task_id)
        assert task.status is TaskStatus.PENDING  # claimable by any worker now
        assert await outcomes(rt, task_id) == [
            (
                "interrupted",
                "Tool call cancelled: the task was released while it ran. "
                "It may or may not have taken effect.",
            )
        ]
    workers.append(worker(shared_url, "drain-b", LEDGER=str(ledger)))
    done = await all_done(rt, ids)
    assert all(t.status is TaskStatus.COMPLETED and t.restarts == 0 for t in done)
    lines = ledger_lines(ledger)
    for task_id in ids:
        # Answered "cancelled", the never-replay tool is not run again.
        assert len([x for x in lines if x.startswith(f"start nap {task_id}:")]) == 1
        assert not any(x.startswith(f"end nap {task_id}:") for x in lines)
        await one_result_per_call(rt, task_id)


@pytest.mark.slow
async def test_a_second_signal_stops_at_once_and_the_tasks_are_taken_over(
    rt: Runtime,
    shared_url: str,
    workers: list[WorkerProc],  # noqa: F811
    tmp_path: Path,
) -> None:
    ledger = tmp_path / "ledger.txt"
    ids = [(await rt.submit("sleeper", f"task {i}")).task_id for i in range(3)]
    # A short lease: the takeover after the hard stop waits for it by design.
    a = worker(shared_url, "drain-a", ttl=2.0, LEDGER=str(ledger), HOLD="nap", TOOL_GRACE="600")
    workers.append(a)
    for task_id in ids:
        await a.wait_output(f"AT nap {task_id}")
    a.signal(signal.SIGTERM)
    await until_presence(rt, "drain-a", draining=True)  # draining, its tools held for 600 s
    a.signal(signal.SIGTERM)
    assert await exit_code(a, 60) == 128 + signal.SIGTERM, "\n".join(a.err[-30:])
    assert any("stopping at once" in line for line in a.err)
    for task_id in ids:
        task = await rt.get(task_id)  # nothing written: left to its lease
        assert task.status is TaskStatus.RUNNING and task.lease.owner == "drain-a"
        assert await outcomes(rt, task_id) == []
    workers.append(worker(shared_url, "drain-b", ttl=2.0, LEDGER=str(ledger)))
    done = await all_done(rt, ids)
    assert all(t.status is TaskStatus.COMPLETED and t.restarts == 1 for t in done)
    lines = ledger_lines(ledger)
    for task_id in ids:
        assert any(s.get("takeover") for s in await statuses(rt, task_id))
        # The never-replay tool that was cut short is answered, not run again.
        assert [o for o, _ in await outcomes(rt, task_id)] == ["interrupted", "ok"]
        assert len([x for x in lines if x.startswith(f"start nap {task_id}:")]) == 1
        await one_result_per_call(rt, task_id)


def held_tool_agent() -> tuple[Agent, asyncio.Event, asyncio.Event]:
    """An agent whose one tool runs until `finish` is set (`started` once it runs)."""
    started, finish = asyncio.Event(), asyncio.Event()

    @tool
    async def slow() -> str:
        """Run until the test lets go."""
        started.set()
        await finish.wait()
        return "done"

    agent = Agent(
        name="slow",
        model=ScriptedModel(lambda m: [ToolCall("slow")] if len(m) < 2 else "ok"),
        tools=[slow],
        timing=Timing(tool_grace=600),
    )
    return agent, started, finish


async def test_a_draining_worker_keeps_renewing_the_leases_of_tasks_not_yet_handed_back() -> None:
    """In one process: while a drain waits for a tool, the task's lease is renewed
    (else it would lapse and be taken over) and the presence record says so."""

    agent, started, finish = held_tool_agent()
    store = MemoryStore()
    async with Runtime(store, agents=[agent], run_worker=False) as rt:
        task_id = (await rt.submit("slow", "x")).task_id
        w = Worker(store, [agent], WorkerOptions(lease_ttl=0.6, shutdown_grace=600))
        job = asyncio.ensure_future(w.run())
        await asyncio.wait_for(started.wait(), 30)
        stopping = asyncio.ensure_future(w.stop())
        before = (await store.get_task(task_id)).lease.expires_at
        assert before is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while (now := (await store.get_task(task_id)).lease.expires_at) is None or now <= before:
            assert loop.time() < deadline, "the lease was not renewed while draining"
            await asyncio.sleep(0.02)
        assert w.draining
        value = (await store.get_document(WORKERS_SCOPE, w.id)).value  # type: ignore[union-attr]
        assert value["draining"] is True
        finish.set()
        await asyncio.wait_for(stopping, 30)
        await job
        task = await store.get_task(task_id)
        assert task.status is TaskStatus.PENDING and task.restarts == 0
        assert await store.get_document(WORKERS_SCOPE, w.id) is None


async def test_a_draining_worker_fires_no_more_schedules() -> None:
    """Once a drain begins, the worker's housekeeping (schedule ticks, queue TTLs)
    stops, while its running task still finishes: a draining worker would else go
    on firing scheduled tasks pinned to its own, outgoing, version."""

    agent, started, finish = held_tool_agent()
    store = MemoryStore()
    async with Runtime(store, agents=[agent], run_worker=False) as rt:
        await rt.submit("slow", "x")
        w = Worker(store, [agent], WorkerOptions(lease_ttl=60, shutdown_grace=600))
        housekeeping, stopped = asyncio.Event(), asyncio.Event()

        async def housekeeper_run() -> None:
            housekeeping.set()
            try:
                await asyncio.Event().wait()  # fires ticks until cancelled
            finally:
                stopped.set()

        w.housekeeper.run = housekeeper_run  # type: ignore[method-assign]
        job = asyncio.ensure_future(w.run())
        await asyncio.wait_for(asyncio.gather(started.wait(), housekeeping.wait()), 30)
        stopping = asyncio.ensure_future(w.stop())
        await asyncio.wait_for(stopped.wait(), 30)  # while the tool still runs
        assert not finish.is_set() and not stopping.done()
        finish.set()
        await asyncio.wait_for(stopping, 30)
        await job
