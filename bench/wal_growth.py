"""Why a SQLite store at FULL readies its WAL and checkpoints it every 200 pages
(_sqlite_schema.py).

    python -m bench.wal_growth [--runs 5] [--commits 400]

At FULL every commit syncs the WAL. While the WAL grows, each sync also makes
the file system journal the file's new size; once a checkpoint has copied the
WAL back, SQLite restarts it from its start and commits write over it in
place. The store's first write transaction extends the WAL to its working
length at once (`ready_wal`), so that no commit grows it. A fresh store makes
`--commits` commits of one entry and a task patch (a round's commit): as the
store makes them (WAL readied, a checkpoint every 200 pages), without the
readied WAL, and with SQLite's default checkpoint (1,000 pages), alternating,
each on a new file: mean ms per commit over the first 100 commits and over the
rest, the checkpoints included, and the WAL's largest size. Medians and
min-max of the runs, with the load average.
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
from duragent.store._sqlite import SQLiteStore
from duragent.store._sqlite_schema import FULL_WAL_PAGES
from duragent.types import EntryKind, NewEntry, Task

PAYLOAD = {"role": "assistant", "content": "x" * 200}


# (label, checkpoint every N pages, WAL readied by the first write transaction)
SETTINGS = [
    (f"the store's: WAL readied, checkpoint every {FULL_WAL_PAGES} pages", FULL_WAL_PAGES, True),
    (f"WAL not readied, checkpoint every {FULL_WAL_PAGES} pages", FULL_WAL_PAGES, False),
    ("WAL readied, checkpoint every 1000 pages (SQLite's default)", 1000, True),
]


async def once(pages: int, readied: bool, commits: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "w.db")
        store = open_store(f"sqlite:///{path}?durability=full")
        await store.open()
        assert isinstance(store, SQLiteStore)
        store._writer_conn.execute(f"PRAGMA wal_autocheckpoint={pages}")
        store._writer.wal_short = readied  # before the first write transaction
        task, _ = await store.create_task(Task(agent="bench"))
        longest = 0
        times = []
        for i in range(commits):
            entry = NewEntry(task_id=task.id, kind=EntryKind.API_MESSAGE, round=i, payload=PAYLOAD)
            commit = Commit(entries=[entry], patches=[TaskPatch(task.id, {"iterations": i})])
            t0 = time.perf_counter()
            await store.commit(commit)
            times.append(time.perf_counter() - t0)
            longest = max(longest, os.path.getsize(f"{path}-wal"))
        await store.close()
        early, late = times[:100], times[100:] or times[:100]
        return {
            "early_ms": sum(early) / len(early) * 1e3,
            "late_ms": sum(late) / len(late) * 1e3,
            "wal_kb": longest / 1024,
        }


async def main(runs: int, commits: int) -> None:
    print(f"{commits} commits at FULL on a new store, {runs} runs alternating the settings")
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    results: dict[str, list[dict[str, Any]]] = {label: [] for label, _, _ in SETTINGS}
    for _ in range(runs):
        for label, pages, readied in SETTINGS:
            results[label].append(await once(pages, readied, commits))
    print("| setting | ms per commit, first 100 | ms per commit, the rest | largest WAL, KB |")
    print("| --- | ---: | ---: | ---: |")
    for label, rs in results.items():
        early = fmt([r["early_ms"] for r in rs], 3)
        late = fmt([r["late_ms"] for r in rs], 3)
        wal = fmt([r["wal_kb"] for r in rs], 0)
        print(f"| {label} | {early} | {late} | {wal} |")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--commits", type=int, default=400)
    args = ap.parse_args()
    asyncio.run(main(args.runs, args.commits))
