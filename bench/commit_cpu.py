"""How much Python one commit costs on SQLite, apart from SQLite's own work (issue 15, target 3).

    python -m bench.commit_cpu [--runs 5] [--commits 3000]

A claimed task takes commits of one entry plus a task patch (what a round's
model-message commit writes), fenced by its lease, as the engine makes them.
For each commit the process CPU time is measured, and so is the CPU time
spent inside the SQLite connection's `execute`/`executemany` calls (SQLite's C
code and the kernel's work for its writes; waiting for an fsync is not CPU).
What is left is duragent's Python:
building the transaction, encoding, the writer thread's hand-off, the asyncio
future. An upper bound: CPU of the event loop and of other threads counts in
it too. Prints median and min-max over the runs, with the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from typing import Any

from duragent.store import Commit, TaskPatch, open_store
from duragent.types import EntryKind, NewEntry, Task

PAYLOAD = {"role": "assistant", "content": "x" * 200}


class TimedConnection:
    """The writer's sqlite3 connection, with the CPU time spent inside SQLite added up
    (the calling thread's CPU: an fsync's wait for the disk is not CPU and not counted)."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self.inside = 0.0

    def execute(self, *args: Any) -> Any:
        t0 = time.thread_time()
        try:
            return self._conn.execute(*args)
        finally:
            self.inside += time.thread_time() - t0

    def executemany(self, *args: Any) -> Any:
        t0 = time.thread_time()
        try:
            return self._conn.executemany(*args)
        finally:
            self.inside += time.thread_time() - t0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


async def once(durability: str, commits: int) -> tuple[float, float, float]:
    """(process CPU, inside SQLite, the rest) in µs per commit."""
    with tempfile.TemporaryDirectory() as d:
        store = open_store(f"sqlite:///{d}/c.db?durability={durability}")
        await store.open()
        try:
            task, _ = await store.create_task(Task(agent="bench"))
            claimed = await store.claim_task("bench", task_id=task.id, ttl=600)
            assert claimed is not None
            fence = {task.id: claimed.lease.epoch}
            timed = TimedConnection(store._writer_conn)  # type: ignore[attr-defined]
            store._writer_conn = timed  # type: ignore[attr-defined]

            async def commit(i: int) -> None:
                entry = NewEntry(
                    task_id=task.id, kind=EntryKind.API_MESSAGE, round=i, payload=PAYLOAD
                )
                patch = TaskPatch(task.id, {"iterations": i})
                await store.commit(Commit(fence=fence, entries=[entry], patches=[patch]))

            for i in range(200):  # warm up: caches, the writer thread, the WAL
                await commit(i)
            timed.inside = 0.0
            cpu0 = time.process_time()
            for i in range(commits):
                await commit(200 + i)
            cpu = (time.process_time() - cpu0) / commits * 1e6
            inside = timed.inside / commits * 1e6
            return cpu, inside, cpu - inside
        finally:
            await store.close()


def cell(values: list[float]) -> str:
    return f"{statistics.median(values):.0f} ({min(values):.0f}–{max(values):.0f})"


async def main(runs: int, commits: int) -> None:
    print(f"SQLite, a 1-entry commit with a task patch: µs per commit, median (min–max of {runs})")
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    print("| durability | process CPU | inside SQLite | duragent's Python (the rest) |")
    print("| --- | --- | --- | --- |")
    for durability in ("normal", "full"):
        results = [await once(durability, commits) for _ in range(runs)]
        cols = [cell([r[i] for r in results]) for i in range(3)]
        print(f"| {durability} | " + " | ".join(cols) + " |")
    print(f"load average at end: {os.getloadavg()[0]:.2f}; goal for the Python part: ≤ 80 µs")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--commits", type=int, default=3000)
    args = ap.parse_args()
    asyncio.run(main(args.runs, args.commits))
