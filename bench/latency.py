"""How fast a worker in another process hears of work and of control requests,
and whether its leases hold while it is busy.

    python -m bench.latency                     # SQLite and PostgreSQL, ~2 min
    python -m bench.latency --stores sqlite --only pickup,control --hog 2

- pick-up: a task created by this process -> the worker's claim commit
  (the claim's status entry time minus the task's creation time; both are
  stamped by the committing process on this one host).
- control: an abort committed by this process on a task sitting in a tool ->
  the worker's `aborted` commit (its completed_at minus the time just before
  the control commit was sent). Workers run with a 30 s lease: a 10 s
  heartbeat, so a figure far below 10 s did not wait for one.
- leases: two workers, a 2 s lease, 30 busy tasks each (a tool round every
  ~60 ms with progress commits); a sampler reads every running task's lease
  every 100 ms. Reported: the smallest time left on any lease (a negative
  figure is a lapse) and the takeovers (restarts) that happened.

`--hog N` runs N processes spinning on the CPU during the measurements.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime

from bench.common import PG_URL, child_env, drop_schema, new_schema, postgres_unreachable
from duragent import open_store
from duragent.store import Commit, Store, TaskPatch, TaskQuery
from duragent.types import EntryKind, Task, TaskStatus


def _worker(url: str, *, ttl: float, concurrency: int = 32) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "duragent",
            "worker",
            "--store",
            url,
            "--agents",
            "bench.latency_agents:AGENTS",
            "--lease-ttl",
            str(ttl),
            "--concurrency",
            str(concurrency),
        ],  # the default poll interval (0.5 s): what a user runs
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=child_env(),
    )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(10)


@contextlib.contextmanager
def _hogs(n: int) -> Iterator[None]:
    procs: list[subprocess.Popen[bytes]] = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)
    ]
    try:
        yield
    finally:
        for p in procs:
            _stop(p)


async def _until(store: Store, task_id: str, cond: object, timeout: float = 60) -> Task:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        task = await store.get_task(task_id)
        if cond(task):  # type: ignore[operator]
            return task
        await store.wait_for_change(0.2)
    raise RuntimeError(f"task {task_id} did not get there within {timeout}s")


async def pickup(url: str, n: int) -> list[float]:
    """Seconds from a task's creation to the worker's claim, n times."""
    store = open_store(url)
    await store.open()
    worker = _worker(url, ttl=30.0)
    out = []
    try:
        warm, _ = await store.create_task(Task(agent="quick", input="warm up"))
        await _until(store, warm.id, lambda t: t.status.terminal)
        for i in range(n):
            await asyncio.sleep(random.uniform(0.05, 0.15))  # the worker is idle, waiting
            task, _ = await store.create_task(Task(agent="quick", input=f"task {i}"))
            await _until(store, task.id, lambda t: t.status.terminal)
            claim = next(
                e
                for e in await store.entries(task.id, kinds=[EntryKind.STATUS])
                if e.payload.get("to") == "running"
            )
            out.append((claim.created_at - task.created_at).total_seconds())
    finally:
        _stop(worker)
        await store.close()
    return out


async def control(url: str, n: int) -> list[float]:
    """Seconds from an abort's commit to the worker's `aborted` commit, n times."""
    store = open_store(url)
    await store.open()
    worker = _worker(url, ttl=30.0)
    out = []
    try:
        for i in range(n):
            task, _ = await store.create_task(Task(agent="holder", input=f"hold {i}"))
            await _until(
                store,
                task.id,
                lambda t: t.status is TaskStatus.RUNNING and t.last_seq >= 3,  # the tool's intent
            )
            await asyncio.sleep(random.uniform(0.05, 0.3))  # somewhere inside the tool
            row = await store.get_task(task.id)
            request = {"action": "abort", "rollback": False, "reason": "bench"}
            sent = time.time()
            await store.commit(  # what `duragent abort ID` commits for a remote worker
                Commit(
                    patches=[
                        TaskPatch(
                            task.id,
                            {"control": request},
                            expect_status=[TaskStatus.RUNNING],
                            expect_version=row.version,
                        )
                    ]
                )
            )
            done = await _until(store, task.id, lambda t: t.status.terminal, timeout=120)
            assert done.status is TaskStatus.ABORTED and done.completed_at is not None
            out.append(done.completed_at.timestamp() - sent)
    finally:
        _stop(worker)
        await store.close()
    return out


async def leases(url: str, per_worker: int = 30, ttl: float = 2.0) -> dict[str, float]:
    store = open_store(url)
    await store.open()
    workers = [_worker(url, ttl=ttl, concurrency=per_worker) for _ in range(2)]
    ids = []
    lowest = float("inf")
    started = time.monotonic()
    try:
        for i in range(2 * per_worker):
            task, _ = await store.create_task(Task(agent="busy", input=f"busy {i}"))
            ids.append(task.id)
        while True:
            # One query per sample, so the sampler itself loads the store little.
            page = await store.list_tasks(TaskQuery(status=TaskStatus.RUNNING, limit=1000))
            now = datetime.now(UTC)
            for t in page.tasks:
                if t.lease.expires_at is not None:
                    lowest = min(lowest, (t.lease.expires_at - now).total_seconds())
            ended = await store.list_tasks(TaskQuery(status=TaskStatus.COMPLETED, limit=1000))
            if len(ended.tasks) == len(ids):
                break
            if time.monotonic() - started > 600:
                raise RuntimeError("the busy tasks did not finish within 600 s")
            await asyncio.sleep(0.1)
        rows = [await store.get_task(tid) for tid in ids]
    finally:
        for w in workers:
            _stop(w)
        await store.close()
    return {
        "tasks": len(rows),
        "completed": sum(t.status is TaskStatus.COMPLETED for t in rows),
        "takeovers": sum(t.restarts for t in rows),
        "lowest_margin": lowest,
        "seconds": time.monotonic() - started,
    }


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _row(name: str, values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return (
        f"| {name} | {len(ms)} | {statistics.median(ms):.1f} | {_pct(ms, 0.99):.1f}"
        f" | {min(ms):.1f} | {max(ms):.1f} |"
    )


def _urls(stores: list[str], tmp: str) -> Iterator[tuple[str, str, str | None]]:
    for name in stores:
        if name == "sqlite":
            yield name, f"sqlite:///{tmp}/{new_schema('lat')}.db", None
        elif name == "postgres":
            reason = postgres_unreachable()
            if reason is not None:
                print(f"(postgres skipped: {reason})")
                continue
            schema = new_schema("bench_latency")
            yield name, f"{PG_URL}?schema={schema}", schema


async def main(args: argparse.Namespace) -> None:
    stores = args.stores.split(",")
    only = args.only.split(",")
    print(f"load average at start: {os.getloadavg()}")
    rows = []
    lease_rows = []
    with tempfile.TemporaryDirectory() as tmp, _hogs(args.hog):
        for name, url, schema in _urls(stores if "pickup" in only else [], tmp):
            try:
                rows.append(_row(f"pick-up, {name}", await pickup(url, args.n)))
            finally:
                if schema:
                    drop_schema(schema)
        for name, url, schema in _urls(stores if "control" in only else [], tmp):
            try:
                rows.append(_row(f"control (abort), {name}", await control(url, args.n // 2)))
            finally:
                if schema:
                    drop_schema(schema)
        if "leases" in only:
            for name, url, schema in _urls(stores, tmp):
                try:
                    lease_rows.append((name, await leases(url)))
                finally:
                    if schema:
                        drop_schema(schema)
    print(f"load average at end: {os.getloadavg()}; CPU hogs: {args.hog}")
    print("\n| what | n | p50 ms | p99 ms | min ms | max ms |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    print("\n".join(rows))
    if lease_rows:
        print(
            "\n| leases (2 workers x 30 busy tasks, 2 s lease) | completed | takeovers"
            " | lowest time left on a lease | took |\n| --- | ---: | ---: | ---: | ---: |"
        )
        for name, r in lease_rows:
            print(
                f"| {name} | {r['completed']:.0f}/{r['tasks']:.0f} | {r['takeovers']:.0f}"
                f" | {r['lowest_margin']:.2f} s | {r['seconds']:.0f} s |"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stores", default="sqlite,postgres")
    parser.add_argument("-n", type=int, default=40, help="pick-ups timed (controls: half)")
    parser.add_argument("--hog", type=int, default=0, help="CPU-spinning processes beside")
    parser.add_argument("--only", default="pickup,control,leases")
    asyncio.run(main(parser.parse_args()))
