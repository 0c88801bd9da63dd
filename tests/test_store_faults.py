"""A store error ends the runner, never the task (DESIGN §9, issue 11 item 3).

Real faults only: a SQLite store whose process hits its file-size limit (the
writes fail exactly as on a full disk), and a `duragent worker` process whose
PostgreSQL backends another connection terminates every 2-30 ms.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo root holds bench/

from conftest import require_postgres
from duragent import Agent, BuiltinTools, ScriptedModel, TaskStatus, Worker, WorkerOptions
from duragent.runtime._submit import new_task
from duragent.store._protocol import Store

HERE = Path(__file__).parent


def run_disk_full_child(tmp_path: Path, mode: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(HERE / "disk_full_child.py"), str(tmp_path / "t.db"), mode],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.slow
def test_a_write_lost_to_a_full_disk_does_not_fail_the_task(tmp_path: Path) -> None:
    out = run_disk_full_child(tmp_path, "blip")
    assert out["failed_writes"] >= 1  # the fault really happened
    assert out["status"] == "completed", out
    # Every call of the three rounds has exactly one result in the model's view,
    # the never-replay call whose result was lost is reported interrupted, not re-run.
    assert len(out["results"]) == 6, out["results"]
    assert out["ran"].count("write_note:s2") == 1
    assert sum("interrupted" in r for r in out["results"]) <= 1


@pytest.mark.slow
def test_a_task_waits_out_a_full_disk_and_continues(tmp_path: Path) -> None:
    out = run_disk_full_child(tmp_path, "outage")
    assert out["failed_writes"] > 1  # several writes failed while the disk was full
    assert out["status"] == "completed", out
    assert out["restarts"] == 0  # handed back, not left to a lease and taken over
    assert len(out["results"]) == 6, out["results"]
    assert out["ran"].count("write_note:s2") == 1


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.usefixtures("pg_wire")  # both wires, the workers' too
def test_killing_the_workers_postgres_connections_fails_no_task() -> None:
    require_postgres()
    from bench.faults import run_faults

    # Kill for 20 s (no task may fail meanwhile), then let the store work: every
    # task must then finish, recovered from its log.
    out = run_faults(tasks=12, rounds=3, min_ms=2, max_ms=30, fault_seconds=20, timeout=300)
    assert out.terminated > 20, out.line()  # the connections really were killed, often
    assert out.failed == 0, out.line() + "\n" + "\n".join(out.errors)
    assert out.completed == 12, out.line() + "\n" + "\n".join(out.errors)
    assert out.worker_alive


async def test_a_claim_whose_answer_was_lost_is_found_again_by_reading(store: Store) -> None:
    """The claim committed but its worker never heard back (CommitOutcomeUnknown):
    the worker finds the task by reading the store, and runs it at once with the
    epoch it got, instead of leaving it until its lease expires (a restart)."""
    agent = Agent(name="a", model=ScriptedModel(["done"]), builtin_tools=BuiltinTools(plan=False))
    task, first = new_task(agent, "go")
    await store.create_task(task, [first])
    worker = Worker(store, [agent], WorkerOptions(lease_ttl=600, poll_interval=0.05))
    lost = await store.claim_task(worker.id, agents=["a"], ttl=600)  # the answer nobody got
    assert lost is not None and lost.lease.owner == worker.id
    worker._lost_claim = True  # what a claim raising CommitOutcomeUnknown leaves behind
    job = asyncio.ensure_future(worker.run())
    try:
        async with asyncio.timeout(30):
            while not (await store.get_task(task.id)).status.terminal:
                await store.wait_for_change(0.1)
    finally:
        await worker.stop()
        await job
    done = await store.get_task(task.id)
    assert done.status is TaskStatus.COMPLETED and done.restarts == 0
    assert done.lease.epoch == lost.lease.epoch  # run under the lost claim's own epoch
