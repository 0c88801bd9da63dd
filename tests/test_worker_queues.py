"""Workers kept to named queues (`duragent worker --queues a,b`, `WorkerOptions(queues=)`), and
queue limits changed while workers run."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from duragent import Runtime, TaskStatus, UsageError
from duragent.runtime._worker import Worker, WorkerOptions
from duragent.store import Commit, Store, TaskQuery
from duragent.store._queues import Queue
from duragent.types import EntryKind, Task
from support.workerlib import WorkerProc, workers  # noqa: F401  (the fixture)
from worker_agents import AGENTS


@pytest.fixture
async def rt(shared_url: str) -> AsyncIterator[Runtime]:
    """A Runtime without a worker: it only submits and reads."""
    async with Runtime(shared_url, agents=AGENTS, run_worker=False) as runtime:
        yield runtime


async def claimed_by(store: Store, task_id: str) -> set[str]:
    """The workers that claimed the task, from its status entries."""
    entries = await store.entries(task_id, kinds=[EntryKind.STATUS])
    return {e.payload["worker"] for e in entries if e.payload.get("to") == "running"}


async def submit_at_once(store: Store, tasks: list[Task]) -> list[str]:
    """One commit: the first claim that looks sees every one of them."""
    await store.commit(Commit(new_tasks=tasks))
    return [t.id for t in tasks]


@pytest.mark.slow
async def test_workers_claim_only_from_their_queues(
    rt: Runtime,
    workers: list[WorkerProc],  # noqa: F811
) -> None:
    url = rt.store.url
    by_queue = {
        q: [(await rt.submit("chat", f"{q} {i}", queue=q)).task_id for i in range(3)]
        for q in ("a", "b", "c", "d")
    }
    workers.append(WorkerProc(url, args=("--queues", "a", "--worker-id", "wa")))
    workers.append(WorkerProc(url, args=("--queues", "b, c", "--worker-id", "wbc")))
    for q, want in (("a", {"wa"}), ("b", {"wbc"}), ("c", {"wbc"})):
        for tid in by_queue[q]:
            done = await rt.wait(tid, timeout=60)
            assert done.status is TaskStatus.COMPLETED
            assert await claimed_by(rt.store, tid) == want, (q, tid)
    # Both workers are idle now, and neither takes queue d.
    for tid in by_queue["d"]:
        assert (await rt.get(tid)).status is TaskStatus.PENDING
    assert await rt.counts(queue="d") == {"d": {"pending": 3}}


@pytest.mark.slow
async def test_a_limit_set_while_a_worker_runs_holds_at_its_next_claim(
    rt: Runtime,
    workers: list[WorkerProc],  # noqa: F811
    tmp_path: Path,
) -> None:
    url = rt.store.url
    release = tmp_path / "release"
    worker = WorkerProc(
        url, args=("--queues", "slow"), HOLD="nap", HOLD_UNTIL=str(release), HOLD_EVERY="1"
    )
    workers.append(worker)
    first = (await rt.submit("sleeper", "warm-up", queue="slow")).task_id
    await worker.wait_output(f"AT nap {first}")  # the worker runs, with no limit yet
    release.touch()
    await rt.wait(first, timeout=60)
    release.unlink()

    # Another process changes the limit: `duragent queue set`.
    got = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "duragent", "queue", "set", "slow", "--store", url,
         "--concurrency", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr
    ids = await submit_at_once(
        rt.store, [Task(agent="sleeper", input=f"job {i}", queue="slow") for i in range(3)]
    )
    line = await worker.wait_output("AT nap ", timeout=60)
    while first in line:  # the warm-up's line: look for the next one
        worker.out.remove(line)
        line = await worker.wait_output("AT nap ", timeout=60)
    held = line.split()[2]
    # The claim that took `held` saw all three (one commit) and took only one.
    running = await rt.store.list_tasks(TaskQuery(queue="slow", status=TaskStatus.RUNNING))
    assert [t.id for t in running.tasks] == [held]
    release.touch()
    for tid in ids:
        done = await rt.wait(tid, timeout=60)
        assert done.status is TaskStatus.COMPLETED


@pytest.mark.slow
async def test_worker_object_keeps_to_its_queues_on_every_store(store: Store) -> None:
    mine = await submit_at_once(
        store, [Task(agent="chat", input=f"a{i}", queue="a") for i in range(3)]
    )
    other = await submit_at_once(
        store, [Task(agent="chat", input=f"b{i}", queue="b") for i in range(2)]
    )
    worker = Worker(
        store, AGENTS, WorkerOptions(queues=["a"], poll_interval=0.05, housekeeping=False)
    )
    job = asyncio.ensure_future(worker.run())
    try:
        for tid in mine:
            while not (await store.get_task(tid)).status.terminal:
                await store.wait_for_change(1.0)
        # Created before the worker started: its first claim saw them and passed them over.
        assert worker.claimed == 3
        for tid in other:
            assert (await store.get_task(tid)).status is TaskStatus.PENDING
    finally:
        await worker.stop()
        await job


async def test_runtime_keeps_its_in_process_worker_to_worker_queues(store: Store) -> None:
    async with Runtime(store, agents=AGENTS, worker_queues=["a"], concurrency=1) as rt:
        # Submitted first and with a higher priority: a worker free to take any
        # queue would claim it before the task of queue a, one at a time.
        other = await rt.submit("chat", "b0", queue="b", priority=10)
        mine = await rt.submit("chat", "a0", queue="a")
        assert (await mine.wait(30)).status is TaskStatus.COMPLETED
        assert rt.worker is not None and rt.worker.queues == ["a"]
        assert rt.worker.claimed == 1
        assert (await rt.get(other.task_id)).status is TaskStatus.PENDING
        assert await claimed_by(rt.store, other.task_id) == set()


def test_runtime_refuses_queue_definitions_as_worker_queues() -> None:
    with pytest.raises(UsageError, match="takes queue names"):
        Runtime("memory://", worker_queues=[Queue("a", concurrency=1)])  # type: ignore[list-item]


@pytest.mark.slow
def test_worker_refuses_an_empty_queue_name(tmp_path: Path) -> None:
    got = subprocess.run(
        [
            sys.executable, "-m", "duragent", "worker", "--store", f"sqlite:///{tmp_path}/x.db",
            "--agents", "worker_agents:AGENTS", "--queues", "a,,b",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).parent,
    )  # fmt: skip
    assert got.returncode == 2 and "queue names separated by commas" in got.stderr
