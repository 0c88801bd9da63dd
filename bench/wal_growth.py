"""Why a SQLite store at FULL checkpoints its WAL every 200 pages (sqlite_schema.py).

    python -m bench.wal_growth [--runs 5] [--commits 400]

At FULL every commit syncs the WAL. While the WAL grows, each sync also makes
the file system journal the file's new size; once a checkpoint has copied the
WAL back, SQLite restarts it from its start and commits write over it in
place. A fresh store makes `--commits` commits of one entry and a task patch
(a round's commit) with the store's setting (200 pages) and with SQLite's
default (1,000), alternating, each on a new file: mean ms per commit, the
checkpoints included, and the WAL's largest size. Medians and min-max of the
runs, with the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from typing import Any

from bench.common import fmt
from duragent.store import Commit, TaskPatch, open_store
from duragent.store.sqlite import SQLiteStore
from duragent.store.sqlite_schema import FULL_WAL_PAGES
from duragent.types import EntryKind, NewEntry, Task

PAYLOAD = {"role": "assistant", "content": "x" * 200}


async def once(pages: int, commits: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "w.db")
        store = open_store(f"sqlite:///{path}?durability=full")
        assert isinstance(store, SQLiteStore)
        store._writer_conn.execute(f"PRAGMA wal_autocheckpoint={pages}")
        task, _ = await store.create_task(Task(agent="bench"))
        longest = 0
        elapsed = 0.0
        for i in range(commits):
            entry = NewEntry(task_id=task.id, kind=EntryKind.API_MESSAGE, round=i, payload=PAYLOAD)
            commit = Commit(entries=[entry], patches=[TaskPatch(task.id, {"iterations": i})])
            t0 = time.perf_counter()
            await store.commit(commit)
            elapsed += time.perf_counter() - t0
            longest = max(longest, os.path.getsize(f"{path}-wal"))
        await store.close()
        return {"ms": elapsed / commits * 1e3, "wal_kb": longest / 1024}


async def main(runs: int, commits: int) -> None:
    print(f"{commits} commits at FULL on a new store, {runs} runs alternating the settings")
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    settings = [FULL_WAL_PAGES, 1000]
    results: dict[int, list[dict[str, Any]]] = {p: [] for p in settings}
    for _ in range(runs):
        for pages in settings:
            results[pages].append(await once(pages, commits))
    print("| checkpoint every | ms per commit | largest WAL, KB |")
    print("| ---: | ---: | ---: |")
    for pages in settings:
        rs = results[pages]
        label = f"{pages} pages" + (" (the store's)" if pages == FULL_WAL_PAGES else " (SQLite's)")
        ms = fmt([r["ms"] for r in rs], 3)
        wal = fmt([r["wal_kb"] for r in rs], 0)
        print(f"| {label} | {ms} | {wal} |")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--commits", type=int, default=400)
    args = ap.parse_args()
    asyncio.run(main(args.runs, args.commits))
