"""Claims per second at 1,000 and 100,000 pending tasks, SQLite and PostgreSQL, in one run.

    python -m bench.claims                  # both stores, 1,000 and 100,000 pending
    python -m bench.claims --stores sqlite --sizes 1000,10000 --claims 500

For each store and queue size a fresh store is filled with `size + 2 * claims`
pending tasks (small inputs, one agent), then one claimer takes `claims` tasks
one call at a time (`claim_task`) and `claims` more in calls of `--batch`
(`claim_tasks`), so the queue stays between `size` and `size + 2 * claims`
while it is measured. Each claim is a full write transaction (lease, status
entry; PostgreSQL also NOTIFY). Repeated `--runs` times; figures are median
(min-max). The target (issue 14): at 100,000 pending, >= 2,000/s on SQLite and
>= 1,000/s on PostgreSQL, within 20% of the rate at 1,000.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from typing import Any

from bench.common import PG_URL, postgres_unreachable, throwaway_schema
from duragent.store import Commit, Store, open_store
from duragent.types import Task


async def fill(store: Store, n: int) -> None:
    batch = 1000
    for start in range(0, n, batch):
        tasks = [Task(agent="a", input={"i": i}) for i in range(start, min(n, start + batch))]
        await store.commit(Commit(new_tasks=tasks))


async def measure(store: Store, claims: int, batch: int) -> tuple[float, float]:
    t0 = time.perf_counter()
    for _ in range(claims):
        assert await store.claim_task("w", ttl=3600) is not None
    single = claims / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    done = 0
    while done < claims:
        got = await store.claim_tasks("w", min(batch, claims - done), ttl=3600)
        assert got
        done += len(got)
    many = claims / (time.perf_counter() - t0)
    return single, many


async def one(kind: str, size: int, claims: int, batch: int) -> tuple[float, float]:
    if kind == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            store = open_store(f"sqlite:///{os.path.join(tmp, 'claims.db')}")
            await store.open()
            try:
                await fill(store, size + 2 * claims)
                return await measure(store, claims, batch)
            finally:
                await store.close()
    with throwaway_schema("bench_claims") as schema:
        store = open_store(f"{PG_URL}?schema={schema}")
        await store.open()
        try:
            await fill(store, size + 2 * claims)
            return await measure(store, claims, batch)
        finally:
            await store.close()


def fmt(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.claims", description=__doc__)
    ap.add_argument("--stores", default="sqlite,postgres")
    ap.add_argument("--sizes", default="1000,100000")
    ap.add_argument("--claims", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    results: dict[tuple[str, int], dict[str, list[float]]] = {}
    for kind in args.stores.split(","):
        if kind == "postgres" and (why := postgres_unreachable()) is not None:
            print(f"postgres skipped: {why}")
            continue
        for size in sizes:
            row: dict[str, Any] = {"single": [], "batch": []}
            for _ in range(args.runs):
                single, many = asyncio.run(one(kind, size, args.claims, args.batch))
                row["single"].append(single)
                row["batch"].append(many)
            results[(kind, size)] = row
            print(
                f"{kind:8} {size:>8,} pending: claim_task {fmt(row['single'])}/s,"
                f" claim_tasks(n={args.batch}) {fmt(row['batch'])}/s",
                flush=True,
            )
    print(f"\nload average: {os.getloadavg()[0]:.1f} (1 min), cpus: {os.cpu_count()}")
    for kind in args.stores.split(","):
        if (kind, sizes[0]) in results and (kind, sizes[-1]) in results:
            for mode in ("single", "batch"):
                small = statistics.median(results[(kind, sizes[0])][mode])
                big = statistics.median(results[(kind, sizes[-1])][mode])
                print(f"{kind} {mode}: {sizes[-1]:,} vs {sizes[0]:,} pending = {big / small:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
