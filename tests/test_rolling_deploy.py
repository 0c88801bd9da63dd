"""A rolling deploy with real worker processes (issue 43, items 1 and 2): v1 workers
run 50 tasks, v2 workers start, the v1 workers drain (SIGTERM) and stop. Every
task completes, none fails, none waits out a lease, and each ran on its version
or was migrated (recorded) to the new one.

"None waits out a lease" is forced, not timed: every lease lasts 600 s, so a task
left to its lease would outlast every wait here (and count a restart)."""

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
from duragent import Runtime, TaskStatus
from duragent.runtime._presence import WORKERS_SCOPE
from duragent.types import EntryKind, Task
from support.workerlib import (
    WorkerProc,
    ledger_lines,
    one_result_per_call,
    workers,  # noqa: F401  (the fixture)
)
from worker_agents import build_agents

LONG_LEASE = 600.0


@pytest.fixture(params=["sqlite", "postgres"])
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/deploy.db"
        return
    schema = f"test_{uuid.uuid4().hex[:12]}"
    yield f"{require_postgres()}?schema={schema}"
    drop_schema(schema)


@pytest.fixture
async def deployer(shared_url: str) -> AsyncIterator[tuple[Runtime, Runtime]]:
    """Runtimes that submit (and migrate) for v1 and for v2, and run nothing."""
    async with (
        Runtime(shared_url, agents=build_agents("v1"), run_worker=False) as v1,
        Runtime(shared_url, agents=build_agents("v2"), run_worker=False) as v2,
    ):
        yield v1, v2


def worker(
    url: str, name: str, version: str, *, concurrency: int = 50, env: dict[str, str]
) -> WorkerProc:
    """A worker process serving `version` of worker_agents.py's agents; `env`: the
    environment they read."""
    extra: dict[str, Any] = {"AGENT_VERSION": version, **env}
    return WorkerProc(
        url,
        ttl=LONG_LEASE,
        concurrency=concurrency,
        args=("--worker-id", name, "--grace", "600"),
        **extra,
    )


async def until_announced(rt: Runtime, name: str, *, draining: bool = False) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while True:
        doc = await rt.store.get_document(WORKERS_SCOPE, name)
        value = doc.value if doc is not None and isinstance(doc.value, dict) else None
        if value is not None and value.get("draining") is draining:
            return
        assert loop.time() < deadline, f"{name}'s presence record: {value}"
        await asyncio.sleep(0.02)


async def all_done(rt: Runtime, ids: list[str], timeout: float = 180) -> list[Task]:
    return [await rt.wait(i, timeout=timeout, until=lambda t: t.status.terminal) for i in ids]


async def statuses(rt: Runtime, task_id: str) -> list[dict[str, Any]]:
    return [e.payload for e in await rt.store.entries(task_id, kinds=[EntryKind.STATUS])]


def pids_of(lines: list[str], what: str, task_id: str) -> list[int]:
    prefix = f"start {what} {task_id}:"
    return [int(x.rsplit("pid=", 1)[1]) for x in lines if x.startswith(prefix)]


@pytest.mark.slow
async def test_a_rolling_deploy_loses_no_task_and_waits_out_no_lease(
    deployer: tuple[Runtime, Runtime],
    shared_url: str,
    workers: list[WorkerProc],  # noqa: F811
    tmp_path: Path,
) -> None:
    rt1, rt2 = deployer
    ledger, release = tmp_path / "ledger.txt", tmp_path / "release"
    ids = [(await rt1.submit("sleeper", f"task {i}")).task_id for i in range(50)]
    assert {(await rt1.get(i)).agent_version for i in ids} == {"v1"}
    held = {"LEDGER": str(ledger), "HOLD": "nap", "HOLD_UNTIL": str(release)}
    # v1: A takes the 25 oldest tasks, B the other 25, each held inside its
    # never-replay tool `nap` until the test lets go.
    a = worker(shared_url, "v1-a", "v1", concurrency=25, env={"TOOL_GRACE": "600", **held})
    workers.append(a)
    for task_id in ids[:25]:
        await a.wait_output(f"AT nap {task_id}")
    b = worker(shared_url, "v1-b", "v1", env={"TOOL_GRACE": "600", **held})
    workers.append(b)
    for task_id in ids[25:]:
        await b.wait_output(f"AT nap {task_id}")

    # v2 starts beside them and takes only v2's tasks.
    new_workers = [worker(shared_url, f"v2-{n}", "v2", env={"LEDGER": str(ledger)}) for n in "ab"]
    workers.extend(new_workers)
    for n in "ab":
        await until_announced(rt2, f"v2-{n}")
    fresh = [(await rt2.submit("sleeper", f"new {i}")).task_id for i in range(10)]
    assert all(t.status is TaskStatus.COMPLETED for t in await all_done(rt2, fresh))
    assert [(await rt1.get(i)).status for i in ids] == [TaskStatus.RUNNING] * 50

    # The deployer moves 12 of A's tasks to v2, then A drains: the migrated ones go
    # on in v2's workers, the others in B (still v1), each handed back at once.
    migrated = ids[:12]
    for task_id in migrated:
        moved = await rt2.migrate(task_id, "v2", by="deployer")
        assert moved.status is TaskStatus.RUNNING and moved.agent_version == "v2"
    a.signal(signal.SIGTERM)
    await until_announced(rt1, "v1-a", draining=True)
    release.touch()  # the naps end within the drain's grace
    assert await asyncio.to_thread(a.proc.wait, 120) == 0, "\n".join(a.err[-30:])
    done = await all_done(rt1, ids)
    b.signal(signal.SIGTERM)  # idle now: it drains and stops at once
    assert await asyncio.to_thread(b.proc.wait, 120) == 0, "\n".join(b.err[-30:])

    # No v1 worker is left: a v1 task says so, until it is migrated too.
    late = (await rt1.submit("sleeper", "after the deploy")).task_id
    assert await rt1.unserved([await rt1.get(late)]) == {
        late: "waiting for sleeper@v1: no worker serves it"
    }
    await rt1.migrate(late, "v2", by="deployer")
    done += await all_done(rt1, [late])

    assert all(t.status is TaskStatus.COMPLETED and t.restarts == 0 for t in done), [
        (t.id, t.status, t.restarts) for t in done
    ]
    lines = ledger_lines(ledger)
    new_pids = {w.pid for w in new_workers}
    for task_id in [*ids, late]:
        moves = await statuses(rt1, task_id)
        assert not any(s.get("takeover") for s in moves), task_id  # no lease waited out
        records = [s["migration"] for s in moves if "migration" in s]
        task = await rt1.get(task_id)
        if task_id in [*migrated, late]:
            assert records == [{"from": "v1", "to": "v2", "by": "deployer"}]
            assert task.agent_version == "v2"
            assert set(pids_of(lines, "nap_safe", task_id)) <= new_pids
        else:
            assert records == [] and task.agent_version == "v1"
            assert pids_of(lines, "nap_safe", task_id) == [b.pid]  # ran on v1, to its end
        if task_id != late:
            # The never-replay tool ran once, in the v1 worker that claimed it first.
            assert pids_of(lines, "nap", task_id) == [a.pid if task_id in ids[:25] else b.pid]
            await one_result_per_call(rt1, task_id)
    for task_id in ids[:25]:  # A's: handed back by its drain, not taken over
        assert ("running", "pending") in [
            (s["from"], s["to"]) for s in await statuses(rt1, task_id)
        ]
    for task_id in fresh:  # v2's own: only v2's workers ran them
        assert set(pids_of(lines, "nap", task_id)) <= new_pids
        assert set(pids_of(lines, "nap_safe", task_id)) <= new_pids
