"""Claims per second at 1,000 and 100,000 pending tasks, SQLite and PostgreSQL, in one run.

    python -m bench.claims                  # both stores, 1,000 and 100,000 pending
    python -m bench.claims --stores sqlite --sizes 1000,10000 --claims 500
    python -m bench.claims --modes agent,versioned  # as a worker claims: by agent (and version)

For each store and queue size a fresh store is filled with `size + 2 * claims`
pending tasks (small inputs, one agent), then one claimer takes `claims` tasks
one call at a time (`claim_task`) and `claims` more in calls of `--batch`
(`claim_tasks`), so the queue stays between `size` and `size + 2 * claims`
while it is measured. Each claim is a full write transaction (lease, status
entry; PostgreSQL also NOTIFY). Repeated `--runs` times; figures are median
(min-max). `--modes`: `plain` claims any task; `agent` names the agent, as a
worker did before versions; `versioned` pins the tasks to an agent version and
names agent and version, as a worker does now (issue 43: that filter must cost
the claim nothing); the modes alternate within each run.
The target (issue 14): at 100,000 pending, >= 2,000/s on SQLite and >= 1,000/s
on PostgreSQL, within 20% of the rate at 1,000.
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


async def fill(store: Store, n: int, version: str | None = None) -> None:
    batch = 1000
    for start in range(0, n, batch):
        tasks = [
            Task(agent="a", input={"i": i}, agent_version=version)
            for i in range(start, min(n, start + batch))
        ]
        await store.commit(Commit(new_tasks=tasks))


async def measure(store: Store, claims: int, batch: int, mode: str) -> tuple[float, float]:
    kw: dict[str, Any] = {"agents": ["a"]} if mode != "plain" else {}
    if mode == "versioned":
        kw["versions"] = {"a": "v1"}
    t0 = time.perf_counter()
    for _ in range(claims):
        assert await store.claim_task("w", ttl=3600, **kw) is not None
    single = claims / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    done = 0
    while done < claims:
        got = await store.claim_tasks("w", min(batch, claims - done), ttl=3600, **kw)
        assert got
        done += len(got)
    many = claims / (time.perf_counter() - t0)
    return single, many


async def one(
    kind: str, size: int, claims: int, batch: int, mode: str = "plain"
) -> tuple[float, float]:
    version = "v1" if mode == "versioned" else None
    if kind == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            store = open_store(f"sqlite:///{os.path.join(tmp, 'claims.db')}")
            await store.open()
            try:
                await fill(store, size + 2 * claims, version)
                return await measure(store, claims, batch, mode)
            finally:
                await store.close()
    with throwaway_schema("bench_claims") as schema:
        store = open_store(f"{PG_URL}?schema={schema}")
        await store.open()
        try:
            await fill(store, size + 2 * claims, version)
            return await measure(store, claims, batch, mode)
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
    ap.add_argument("--modes", default="plain", help="plain, agent, versioned: comma-separated")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    modes = args.modes.split(",")
    results: dict[tuple[str, int], dict[str, list[float]]] = {}
    for kind in args.stores.split(","):
        if kind == "postgres" and (why := postgres_unreachable()) is not None:
            print(f"postgres skipped: {why}")
            continue
        for size in sizes:
            rows: dict[str, dict[str, list[float]]] = {
                m: {"single": [], "batch": []} for m in modes
            }
            for _ in range(args.runs):
                for mode in modes:  # alternating: the same machine load for each
                    got = asyncio.run(one(kind, size, args.claims, args.batch, mode))
                    rows[mode]["single"].append(got[0])
                    rows[mode]["batch"].append(got[1])
            results[(kind, size)] = rows[modes[0]]
            for mode, row in rows.items():
                print(
                    f"{kind:8} {size:>8,} pending, {mode:9}: claim_task {fmt(row['single'])}/s,"
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
