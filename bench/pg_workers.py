"""Rounds per second of 1, 2 and 4 `duragent worker` processes sharing one PostgreSQL schema.

    python -m bench.pg_workers                       # 1, 2, 4 workers; median of 3 runs
    python -m bench.pg_workers --workers 1,4 --tasks 200 --rounds 3 --runs 5

Each task is `--rounds` rounds of one assistant message with one call of a
zero-latency tool and its result, then a final-answer round; a round is what
the task's `iterations` counter counts (here rounds + 1). What is measured
is the cost of making rounds durable and of coordinating the workers through
the database (claims with SKIP LOCKED, wake-ups with LISTEN/NOTIFY).

A run: a fresh schema; the workers are started and wait until each one is
LISTENing; then every task is inserted in one commit, so they all see the
work at the same moment. The time is the store's own: from the tasks'
creation to the last task's completion (`max(updated_at) - created_at`), so
neither process start-up nor this script's polling is counted. The workers
load their agent from this module (`--agents bench.pg_workers:AGENTS`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any

from duragent import Agent, Limits, ScriptedModel, ToolCall, tool
from duragent.types import AssistantMessage

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repo: bench/..
PG_URL = os.environ.get("DURAGENT_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")


# --- the agent the worker processes run ---------------------------------------


@tool
async def work(n: int) -> str:
    """Process batch n (instantly)."""
    return f"batch {n} processed"


def _script(messages: list[Any]) -> Any:
    done = sum(isinstance(m, AssistantMessage) for m in messages)
    if done < int(os.environ.get("BENCH_ROUNDS", "5")):
        return [ToolCall("work", {"n": done})]
    return f"all {done} batches processed"


AGENTS = [
    Agent(
        name="bench", model=ScriptedModel(_script), tools=[work], limits=Limits(max_iterations=1000)
    )
]


# --- one measured run --------------------------------------------------------------


@dataclass
class Run:
    workers: int
    tasks: int
    rounds: int
    seconds: float
    cpu_seconds: float = 0.0  # user + system time of the worker processes while they ran
    server_cpu_seconds: float = 0.0  # the same of every PostgreSQL server process

    @property
    def rounds_per_s(self) -> float:
        return self.rounds / self.seconds

    @property
    def rounds_per_cpu_s(self) -> float:
        return self.rounds / self.cpu_seconds if self.cpu_seconds else 0.0

    @property
    def cpu_ms_per_round(self) -> float:
        """Workers' and server's CPU per round: what bounds rounds/s when the
        cores, not the latency, are the limit."""
        return (self.cpu_seconds + self.server_cpu_seconds) / self.rounds * 1e3

    @property
    def ceiling(self) -> float:
        """The rounds/s this machine's cores allow at this CPU per round."""
        ms = self.cpu_ms_per_round
        return (os.cpu_count() or 1) * 1e3 / ms if ms else 0.0


def _cpu_seconds(procs: list[subprocess.Popen[bytes]]) -> float:
    """User + system CPU time of the processes so far (Linux /proc)."""
    total = 0
    for p in procs:
        ticks = _ticks(p.pid)
        if ticks is None:
            return 0.0
        total += ticks[1]
    return total / os.sysconf("SC_CLK_TCK")


def _ticks(pid: int | str) -> tuple[str, int] | None:
    """A process's command name and its user + system CPU time in clock ticks."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
        name, rest = text.split("(", 1)[1].rsplit(")", 1)
        fields = rest.split()
        return name, int(fields[11]) + int(fields[12])  # utime, stime
    except (OSError, IndexError, ValueError):
        return None


def _server_cpu_seconds() -> float:
    """User + system CPU time so far of every PostgreSQL server process on this
    machine (backends and background writers alike); 0 where /proc is not there.
    A backend that ends between two readings takes its ticks with it: the
    workers' connections live through a run, so that is only this script's."""
    total = 0
    with contextlib.suppress(OSError):
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                ticks = _ticks(pid)
                if ticks is not None and ticks[0] == "postgres":
                    total += ticks[1]
    return total / os.sysconf("SC_CLK_TCK")


def _admin() -> Any:
    import psycopg
    from psycopg.rows import dict_row

    return psycopg.connect(PG_URL, autocommit=True, row_factory=dict_row)


def _listening(apps: list[str]) -> bool:
    with _admin() as conn:
        rows = conn.execute(
            "SELECT DISTINCT application_name AS app FROM pg_stat_activity"
            " WHERE application_name = ANY(%s) AND query LIKE '%%LISTEN %%'",
            (apps,),
        ).fetchall()
    return len(rows) == len(apps)


def _progress(schema: str) -> dict[str, Any]:
    from psycopg import sql

    with _admin() as conn:
        row = conn.execute(
            sql.SQL(
                "SELECT count(*) FILTER (WHERE status = 'completed') AS done,"
                " count(*) FILTER (WHERE status IN ('failed', 'blocked', 'aborted')) AS bad,"
                " coalesce(sum((data::jsonb ->> 'iterations')::int), 0) AS rounds,"
                " coalesce(sum((data::jsonb ->> 'restarts')::int), 0) AS restarts,"
                " min(created_at) AS first, max(updated_at) AS last FROM {}.tasks"
            ).format(sql.Identifier(schema))
        ).fetchone()
    assert row is not None
    return dict(row)


def _start_worker(url: str, concurrency: int, rounds: int) -> subprocess.Popen[bytes]:
    path = os.environ.get("PYTHONPATH", "")
    env = {
        **{k: v for k, v in os.environ.items() if k != "PGAPPNAME"},
        "PYTHONPATH": ROOT + (os.pathsep + path if path else ""),
        "BENCH_ROUNDS": str(rounds),
    }
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "duragent",
            "worker",
            "--store",
            url,
            "--agents",
            "bench.pg_workers:AGENTS",
            "--concurrency",
            str(concurrency),
            "--lease-ttl",
            "30",
            "--poll-interval",
            "5",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def _submit_all(url: str, tasks: int) -> None:
    from duragent.runtime._submit import new_task
    from duragent.store import Commit, open_store

    store = open_store(url)
    await store.open()
    try:
        made = [new_task(AGENTS[0], f"job {i}") for i in range(tasks)]
        await store.commit(Commit(new_tasks=[t for t, _ in made], entries=[e for _, e in made]))
    finally:
        await store.close()


def run_once(workers: int, tasks: int, rounds: int, concurrency: int, timeout: float) -> Run:
    from duragent.store._postgres import PostgresStore

    schema = f"bench_{uuid.uuid4().hex[:10]}"
    url = f"{PG_URL}?schema={schema}"
    asyncio.run(PostgresStore(url).close())  # create and migrate the schema
    procs = [_start_worker(url, concurrency, rounds) for _ in range(workers)]
    try:
        apps = [f"duragent-{p.pid}" for p in procs]
        deadline = time.monotonic() + 60
        while not _listening(apps):
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError("the workers did not start listening")
            time.sleep(0.05)
        cpu0 = _cpu_seconds(procs)  # start-up (imports, connecting) is not counted
        server0 = _server_cpu_seconds()
        asyncio.run(_submit_all(url, tasks))
        deadline = time.monotonic() + timeout
        while True:
            state = _progress(schema)
            if state["bad"]:
                raise RuntimeError(f"{state['bad']} tasks did not complete")
            if state["done"] == tasks:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {state['done']}/{tasks} tasks done in {timeout}s")
            time.sleep(0.1)
        cpu = _cpu_seconds(procs) - cpu0
        server = _server_cpu_seconds() - server0
        seconds = (state["last"] - state["first"]).total_seconds()
        assert state["rounds"] == tasks * (rounds + 1), state  # each task's rounds, counted
        return Run(workers, tasks, state["rounds"], seconds, cpu, server)
    finally:
        _stop_and_drop(procs, schema)


def _stop_and_drop(procs: list[subprocess.Popen[bytes]], schema: str) -> None:
    """Stop the worker processes (SIGTERM, then SIGKILL after 30 s) and drop their schema."""
    from psycopg import sql

    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
    with _admin() as conn:
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


def _server_version() -> str:
    with _admin() as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return str(row["server_version"]) if row else "?"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.pg_workers", description=__doc__)
    parser.add_argument("--workers", default="1,2,4", help="worker counts to measure")
    parser.add_argument("--tasks", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=5, help="tool rounds per task")
    parser.add_argument("--runs", type=int, default=3, help="runs per worker count")
    parser.add_argument("--concurrency", type=int, default=32, help="tasks per worker at once")
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.workers.split(",")]

    print(
        f"# {args.tasks} tasks x {args.rounds} rounds, zero-latency model and tool, "
        f"concurrency {args.concurrency} per worker"
    )
    print(
        f"# {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"PostgreSQL {_server_version()}"
    )
    results: dict[int, list[Run]] = {}
    for n in counts:
        for i in range(args.runs):
            load = os.getloadavg()[0]  # other work on the machine skews the figures
            run = run_once(n, args.tasks, args.rounds, args.concurrency, args.timeout)
            results.setdefault(n, []).append(run)
            print(
                f"#   {n} worker(s), run {i + 1}: {run.rounds_per_s:,.0f} rounds/s "
                f"({run.seconds:.2f}s; load average before: {load:.2f})",
                flush=True,
            )
    print()
    print(
        "| worker processes | rounds/s (median) | min–max | tasks/s (median) "
        "| CPU per round, workers + server, ms | the cores' ceiling, rounds/s |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for n, runs in results.items():
        rates = [r.rounds_per_s for r in runs]
        tasks = statistics.median(r.tasks / r.seconds for r in runs)
        cpu = statistics.median(r.cpu_ms_per_round for r in runs)
        ceiling = statistics.median(r.ceiling for r in runs)
        print(
            f"| {n} | {statistics.median(rates):,.0f} | {min(rates):,.0f}–{max(rates):,.0f} "
            f"| {tasks:,.1f} | {cpu:.3f} | {ceiling:,.0f} |"
        )


if __name__ == "__main__":
    main()
