"""How much CPU one commit costs in duragent's process (issue 15, targets 1 and 3).

    python -m bench.commit_cpu [--runs 5] [--commits 3000] [--postgres]

A claimed task takes commits of one entry plus a task patch (what a round's
model-message commit writes), fenced by its lease, as the engine makes them,
one after another. For each commit the process CPU time is measured.

- SQLite: the CPU time spent inside the writer connection's `execute` and
  `executemany` calls is measured too (SQLite's C code and the kernel's work
  for its writes; waiting for an fsync is not CPU). What is left is duragent's
  Python: building the transaction, encoding, the hand-off, the asyncio
  future. An upper bound: the event loop's own CPU counts in it too. The
  process CPU comes from a pass with nothing timed inside, the CPU inside
  SQLite from a second pass of as many commits (its clock reads cost CPU of
  their own, which would otherwise count as duragent's; what an empty timed
  interval measures is taken off each call's).
- PostgreSQL: the server runs in other processes, so the process CPU per
  commit is the client's (duragent, psycopg, the writer thread) and nothing
  needs subtracting.

Prints median and min-max over the runs, with the load average. The full
suite (`python -m bench`) runs the same measurement for its report.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from typing import Any

from bench.common import PG_URL, drop_schema, new_schema
from duragent.store import Commit, TaskPatch, open_store
from duragent.types import EntryKind, NewEntry, Task

PAYLOAD = {"role": "assistant", "content": "x" * 200}


class TimedConnection:
    """The writer's sqlite3 connection, with the CPU time spent inside SQLite added up
    (the calling thread's CPU: an fsync's wait for the disk is not CPU and not counted)."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self.inside = 0.0
        self.calls = 0

    def execute(self, *args: Any) -> Any:
        self.calls += 1
        t0 = time.thread_time()
        try:
            return self._conn.execute(*args)
        finally:
            self.inside += time.thread_time() - t0

    def executemany(self, *args: Any) -> Any:
        self.calls += 1
        t0 = time.thread_time()
        try:
            return self._conn.executemany(*args)
        finally:
            self.inside += time.thread_time() - t0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def empty_interval() -> float:
    """What one timed interval with nothing in it measures, in seconds: part of
    the clock reads' own cost (a system call here), to take off each call's."""
    samples = []
    for _ in range(5):
        total = 0.0
        for _ in range(2000):
            t0 = time.thread_time()
            total += time.thread_time() - t0
        samples.append(total / 2000)
    return statistics.median(samples)


async def once(config: str, commits: int, workdir: str | None = None) -> dict[str, float]:
    """CPU per commit in µs: `cpu_us` (the process), and on SQLite `sqlite_us`
    (inside SQLite's calls) and `python_us` (the rest)."""
    schema = None
    with tempfile.TemporaryDirectory(dir=workdir) as d:
        if config == "postgres":
            schema = new_schema("bench_commit_cpu")
            url = f"{PG_URL}?schema={schema}"
        else:
            url = f"sqlite:///{d}/c.db?durability={config.removeprefix('sqlite-')}"
        store = open_store(url)
        await store.open()
        try:
            task, _ = await store.create_task(Task(agent="bench"))
            claimed = await store.claim_task("bench", task_id=task.id, ttl=600)
            assert claimed is not None
            fence = {task.id: claimed.lease.epoch}

            async def commit(i: int) -> None:
                entry = NewEntry(
                    task_id=task.id, kind=EntryKind.API_MESSAGE, round=i, payload=PAYLOAD
                )
                patch = TaskPatch(task.id, {"iterations": i})
                await store.commit(Commit(fence=fence, entries=[entry], patches=[patch]))

            for i in range(200):  # warm up: caches, the writer thread, the WAL
                await commit(i)
            # The process CPU from commits as the engine makes them, untimed inside.
            cpu0 = time.process_time()
            for i in range(commits):
                await commit(200 + i)
            cpu = (time.process_time() - cpu0) / commits * 1e6
            if schema is not None:
                return {"cpu_us": cpu}
            # Then as many more with each SQLite call timed: the clock reads cost
            # CPU of their own, so this pass gives only the share inside SQLite
            # (less what an empty interval measures, once per call).
            timed = TimedConnection(store._writer_conn)  # type: ignore[attr-defined]
            store._writer_conn = timed  # type: ignore[attr-defined]
            for i in range(commits):
                await commit(200 + commits + i)
            inside = (timed.inside - timed.calls * empty_interval()) / commits * 1e6
            return {"cpu_us": cpu, "sqlite_us": inside, "python_us": cpu - inside}
        finally:
            await store.close()
            if schema is not None:
                drop_schema(schema)


def cell(values: list[float]) -> str:
    return f"{statistics.median(values):.0f} ({min(values):.0f}–{max(values):.0f})"


async def main(runs: int, commits: int, postgres: bool) -> None:
    print(f"A 1-entry commit with a task patch: µs per commit, median (min–max of {runs})")
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    print("| store | process CPU | inside SQLite | duragent's Python (the rest) |")
    print("| --- | --- | --- | --- |")
    configs = ["sqlite-normal", "sqlite-full"] + (["postgres"] if postgres else [])
    for config in configs:
        results = [await once(config, commits) for _ in range(runs)]
        cols = [
            cell([r[k] for r in results]) if k in results[0] else "—"
            for k in ("cpu_us", "sqlite_us", "python_us")
        ]
        print(f"| {config} | " + " | ".join(cols) + " |")
    print(
        f"load average at end: {os.getloadavg()[0]:.2f}; goals: SQLite's Python part ≤ 80 µs,"
        " PostgreSQL's process CPU ≤ 300 µs"
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--commits", type=int, default=3000)
    ap.add_argument("--postgres", action="store_true", help=f"also PostgreSQL at {PG_URL}")
    args = ap.parse_args()
    asyncio.run(main(args.runs, args.commits, args.postgres))
