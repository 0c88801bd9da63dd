"""Writing one entry costs the same whether the task has 10 or 100,000 entries.

    python -m bench.entry_cost [--runs 5] [--samples 300]

For each history size, fill a task (in large commits), then time single-entry
commits; prints median and min-max per size and store, several runs.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time

from duragent.store import Commit, open_store
from duragent.types import EntryKind, NewEntry, Task

SIZES = (10, 1_000, 100_000)
PAYLOAD = {"role": "assistant", "content": "x" * 200}


async def measure(url: str, size: int, samples: int) -> float:
    store = open_store(url)
    await store.open()
    task, _ = await store.create_task(Task(agent="bench"))
    entry = NewEntry(task_id=task.id, kind=EntryKind.API_MESSAGE, payload=PAYLOAD)
    for start in range(0, size, 5000):
        await store.commit(Commit(entries=[entry] * min(5000, size - start)))
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        await store.commit(Commit(entries=[entry]))
        times.append(time.perf_counter() - t0)
    await store.close()
    return statistics.median(times) * 1e6


async def main(runs: int, samples: int) -> None:
    print("| store | entries before | median µs per 1-entry commit (min–max of run medians) |")
    print("| --- | ---: | --- |")
    for label, durability in (("sqlite NORMAL", "normal"), ("sqlite FULL", "full")):
        for size in SIZES:
            meds = []
            for _ in range(runs):
                with tempfile.TemporaryDirectory() as d:
                    url = f"sqlite:///{d}/b.db?durability={durability}"
                    meds.append(await measure(url, size, samples))
            print(
                f"| {label} | {size:,} | {statistics.median(meds):.0f} "
                f"({min(meds):.0f}–{max(meds):.0f}) |"
            )
    for size in SIZES:
        meds = [await measure("memory://", size, samples) for _ in range(runs)]
        med, lo, hi = statistics.median(meds), min(meds), max(meds)
        print(f"| memory | {size:,} | {med:.0f} ({lo:.0f}–{hi:.0f}) |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--samples", type=int, default=300)
    a = ap.parse_args()
    asyncio.run(main(a.runs, a.samples))
