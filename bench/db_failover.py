"""Failover of the database server: promotion of the standby to the first commit on it.

    python -m bench.db_failover [--runs 5] [--ttl 3]

Each run makes its own pair of PostgreSQL clusters on free ports (bench/pg_pair.py,
synchronous replication; needs root and `pg_createcluster`), starts a worker
process (bench/failover_child.py, the `owner`: one long task of 20 ms tool
steps, committing all the time) on a store URL naming both hosts
(`target_session_attrs=read-write`), stops the primary with `-m immediate` and
promotes the standby. Reported: how long `pg_ctlcluster promote` took, and the
time from the promotion's start to the first entry the worker committed on the
new primary (its commit time is the entry's `created_at`, this host's clock),
as a table row: median (min–max) over the runs. Both clusters are dropped
after each run.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time

from bench import pg_pair
from bench.common import child_env
from duragent.store._postgres import PostgresStore


async def _last_seq(url: str) -> tuple[str, int]:
    store = PostgresStore(url, min_size=1, max_size=1)
    await store.open()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            page = await store.list_tasks()
            if page.tasks and page.tasks[0].last_seq > 10:
                return page.tasks[0].id, page.tasks[0].last_seq
            await asyncio.sleep(0.05)
        raise RuntimeError("the worker committed nothing within 60 s")
    finally:
        await store.close()


async def _first_commit_after(url: str, task_id: str, seq: int, since: float) -> float:
    """The commit time of the first entry after `seq` committed after `since`."""
    store = PostgresStore(url, min_size=1, max_size=1)
    await store.open()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            for e in await store.entries(task_id, after_seq=seq):
                if e.created_at.timestamp() > since:
                    return e.created_at.timestamp()
            await asyncio.sleep(0.01)
        raise RuntimeError("no commit on the new primary within 120 s")
    finally:
        await store.close()


def trial(ttl: float) -> tuple[float, float]:
    """(seconds the promotion took, seconds from its start to the first commit)."""
    with pg_pair.pair(sync=True) as made:
        url = made.url(schema="bench")
        owner = subprocess.Popen(
            [sys.executable, "-m", "bench.failover_child", url, "owner", str(ttl)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=child_env(),
        )
        try:
            assert owner.stdout is not None
            if not owner.stdout.readline().startswith("RUNNING"):
                raise RuntimeError("the worker did not start its task")
            task_id, seq = asyncio.run(_last_seq(url))
            promote = made.fail_over()
            assert made.promoted_at is not None
            first = asyncio.run(_first_commit_after(url, task_id, seq, made.promoted_at))
            return promote, first - made.promoted_at
        finally:
            owner.kill()
            owner.communicate(timeout=10)


def row(ttl: float, runs: list[tuple[float, float]]) -> str:
    def cell(values: list[float]) -> str:
        ms = [v * 1000 for v in values]
        return f"{statistics.median(ms):.0f} ({min(ms):.0f}–{max(ms):.0f})"

    return (
        f"| synchronous, `-m immediate` | {ttl:g} s | {len(runs)} "
        f"| {cell([p for p, _ in runs])} | {cell([f for _, f in runs])} |"
    )


HEADER = (
    "| replication, primary stopped | lease TTL | runs | promotion ms | "
    "promotion start → first commit ms |\n| --- | ---: | ---: | ---: | ---: |"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--ttl", type=float, default=3.0)
    args = parser.parse_args()
    reason = pg_pair.missing()
    if reason is not None:
        sys.exit(f"cannot run: {reason}")
    runs = []
    for i in range(args.runs):
        runs.append(trial(args.ttl))
        print(
            f"run {i + 1}: promotion {runs[-1][0] * 1000:.0f} ms, first commit "
            f"{runs[-1][1] * 1000:.0f} ms after it began",
            file=sys.stderr,
        )
    print(HEADER)
    print(row(args.ttl, runs))


if __name__ == "__main__":
    main()
