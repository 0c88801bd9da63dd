"""Faults: kill the worker's PostgreSQL connections again and again while tasks run.

    python -m bench.faults                          # 12 tasks, a kill every 2-30 ms
    python -m bench.faults --tasks 12 --rounds 4 --min-ms 2 --max-ms 30 --timeout 180

A `duragent worker` process runs `--tasks` tasks of `--rounds` rounds each (an
assistant message streamed in pieces, a never-replay tool that updates the
task's state and a replay-safe tool per round, then a final answer). Meanwhile
another connection calls `pg_terminate_backend` on every backend of that worker
(found by its application_name) every `--min-ms`..`--max-ms` milliseconds, for
the whole run (or for `--fault-seconds`, then the store is left alone and the
tasks must finish). The report counts how the tasks ended: completed, failed,
other (still active at the timeout, blocked, ...), the takeovers (an expired
lease claimed again: a restart counted), claims whose answer was lost and that
the worker found again by reading, and how many backends were terminated.

A store error must never make a task `failed` (DESIGN §9): the runner stops,
the task goes back to the queue (or its lease expires), and the next owner
recovers it from the log.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from duragent import Agent, Limits, ScriptedModel, Timing, ToolCall, ToolContext, tool
from duragent.llm._scripted import Turn
from duragent.types import AssistantMessage

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repo: bench/..
PG_URL = os.environ.get("DURAGENT_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")


# --- the agent the worker process runs ---------------------------------------


@tool
async def write_note(text: str, ctx: ToolContext) -> str:
    """Write a note (a side effect: never replayed)."""
    ctx.update_state(notes=int(ctx.context.get("notes", 0)) + 1)
    await asyncio.sleep(0.005)
    return f"noted: {text}"


@tool(replay="safe")
async def read_value(key: str) -> str:
    """Read a value (replay-safe)."""
    await asyncio.sleep(0.005)
    return f"{key} = 42"


def _script(messages: list[Any]) -> Any:
    done = sum(isinstance(m, AssistantMessage) for m in messages)
    if done < int(os.environ.get("FAULTS_ROUNDS", "4")):
        return Turn(
            text=f"Step {done + 1}: writing a note and reading a value.",
            tool_calls=[
                ToolCall("write_note", {"text": f"step {done + 1}"}),
                ToolCall("read_value", {"key": f"k{done + 1}"}),
            ],
        )
    return f"All {done} steps are done."


AGENTS = [
    Agent(
        name="faulty",
        model=ScriptedModel(_script, chunk_delay=0.003, chunk_size=6),
        tools=[write_note, read_value],
        timing=Timing(progress_interval=0.01, state_debounce=0.01),
        # Takeovers (a lease that expired while its renewals were refused) are
        # reported by the harness, not turned into blocked tasks.
        limits=Limits(max_iterations=50, max_restarts=100),
    )
]


# --- the run -------------------------------------------------------------------


@dataclass
class Outcome:
    tasks: int
    statuses: dict[str, int]
    restarts: int  # the most any one task counted
    terminated: int
    seconds: float
    worker_alive: bool
    errors: list[str] = field(default_factory=list)
    takeovers: int = 0
    adopted: int = 0  # claims whose answer was lost, found again by reading
    fault_seconds: float = 0.0  # how long the backends were being killed
    log: str = ""

    @property
    def completed(self) -> int:
        return self.statuses.get("completed", 0)

    @property
    def failed(self) -> int:
        return self.statuses.get("failed", 0)

    @property
    def other(self) -> int:
        return self.tasks - self.completed - self.failed

    def line(self) -> str:
        return (
            f"{self.tasks} tasks: {self.completed} completed, {self.failed} failed, "
            f"{self.other} other {dict(self.statuses)}; {self.takeovers} takeovers, at most "
            f"{self.restarts} restarts a task, {self.adopted} lost claims adopted; "
            f"{self.terminated} backends terminated in {self.fault_seconds:.1f} s of faults, "
            f"{self.seconds:.1f} s in all"
        )


def _admin() -> Any:
    import psycopg
    from psycopg.rows import dict_row

    return psycopg.connect(PG_URL, autocommit=True, row_factory=dict_row)


class Killer(threading.Thread):
    """Terminates every backend named `app` every min..max ms until stopped
    (or for `seconds`, if given)."""

    def __init__(
        self, app: str, min_ms: float, max_ms: float, seed: int, seconds: float | None
    ) -> None:
        super().__init__(daemon=True)
        self.app = app
        self.min_ms, self.max_ms = min_ms, max_ms
        self.rng = random.Random(seed)
        self.seconds = seconds
        self.terminated = 0
        self.halt = threading.Event()
        self.started = self.ended = 0.0

    def run(self) -> None:
        self.started = time.monotonic()
        try:
            self._kill()
        finally:
            self.ended = time.monotonic()

    def _kill(self) -> None:
        with _admin() as conn:
            while not self.halt.wait(self.rng.uniform(self.min_ms, self.max_ms) / 1000):
                if self.seconds is not None and time.monotonic() - self.started > self.seconds:
                    return
                rows = conn.execute(
                    "SELECT pg_terminate_backend(pid) AS ok FROM pg_stat_activity"
                    " WHERE application_name = %s AND pid <> pg_backend_pid()",
                    (self.app,),
                ).fetchall()
                self.terminated += sum(1 for r in rows if r["ok"])


def _wait_listening(app: str, worker: subprocess.Popen[bytes], timeout: float = 60) -> None:
    """Until the worker is up (its LISTEN connection is open): a worker that cannot
    open its store at start-up is its supervisor's business, not this harness's."""
    deadline = time.monotonic() + timeout
    while True:
        with _admin() as conn:
            row = conn.execute(
                "SELECT count(*) AS n FROM pg_stat_activity"
                " WHERE application_name = %s AND query LIKE 'LISTEN%%'",
                (app,),
            ).fetchone()
        if row is not None and row["n"]:
            return
        if worker.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the worker did not start listening")
        time.sleep(0.05)


def _statuses(schema: str) -> tuple[dict[str, int], int]:
    from psycopg import sql

    with _admin() as conn:
        rows = conn.execute(
            sql.SQL(
                "SELECT status, count(*) AS n, max((data::jsonb ->> 'restarts')::int) AS r"
                " FROM {}.tasks GROUP BY status"
            ).format(sql.Identifier(schema))
        ).fetchall()
    return {r["status"]: r["n"] for r in rows}, max((int(r["r"] or 0) for r in rows), default=0)


def _takeovers(schema: str) -> int:
    """Claims of a task whose lease had expired (each counts a restart)."""
    from psycopg import sql

    with _admin() as conn:
        row = conn.execute(
            sql.SQL(
                "SELECT count(*) AS n FROM {}.entries WHERE kind = 'status'"
                " AND payload::jsonb ->> 'takeover' = 'true'"
            ).format(sql.Identifier(schema))
        ).fetchone()
    return int(row["n"]) if row else 0


def _count_lines(path: str, text: str) -> int:
    with open(path, errors="replace") as f:
        return sum(text in line for line in f)


def _errors(schema: str) -> list[str]:
    from psycopg import sql

    with _admin() as conn:
        rows = conn.execute(
            sql.SQL(
                "SELECT DISTINCT data::jsonb ->> 'error' AS e FROM {}.tasks"
                " WHERE status <> 'completed'"
            ).format(sql.Identifier(schema))
        ).fetchall()
    return [r["e"] for r in rows if r["e"]]


async def _submit(url: str, tasks: int) -> None:
    from duragent.runtime._submit import new_task
    from duragent.store import Commit, open_store

    store = open_store(url)
    await store.open()
    try:
        made = [new_task(AGENTS[0], f"job {i}") for i in range(tasks)]
        await store.commit(Commit(new_tasks=[t for t, _ in made], entries=[e for _, e in made]))
    finally:
        await store.close()


def _start_worker(url: str, rounds: int, ttl: float, log: Any) -> subprocess.Popen[bytes]:
    path = os.environ.get("PYTHONPATH", "")
    env = {
        **{k: v for k, v in os.environ.items() if k != "PGAPPNAME"},
        "PYTHONPATH": ROOT + (os.pathsep + path if path else ""),
        "PYTHONUNBUFFERED": "1",
        "FAULTS_ROUNDS": str(rounds),
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
            "bench.faults:AGENTS",
            "--lease-ttl",
            str(ttl),
            "--poll-interval",
            "0.1",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log,
    )


def run_faults(
    *,
    tasks: int = 12,
    rounds: int = 4,
    min_ms: float = 2,
    max_ms: float = 30,
    timeout: float = 180,
    ttl: float = 10.0,
    seed: int | None = None,
    fault_seconds: float | None = None,
) -> Outcome:
    """One run. `fault_seconds`: stop killing after that long and let the tasks
    finish (to show they recover once the store works); default: kill until the end."""
    from duragent.store._postgres import PostgresStore

    schema = f"faults_{uuid.uuid4().hex[:10]}"
    app = f"faults-worker-{uuid.uuid4().hex[:8]}"
    base = f"{PG_URL}?schema={schema}"
    asyncio.run(PostgresStore(base).close())  # create and migrate the schema
    # The worker's log is kept for a look afterwards (its path is in the outcome).
    log_path = os.path.join(tempfile.gettempdir(), f"{app}.log")
    with open(log_path, "wb") as log:
        worker = _start_worker(f"{base}&application_name={app}", rounds, ttl, log)
    seed = seed if seed is not None else random.randrange(1 << 30)
    killer = Killer(app, min_ms, max_ms, seed, fault_seconds)
    started = time.monotonic()
    try:
        _wait_listening(app, worker)
        killer.start()
        asyncio.run(_submit(base, tasks))
        deadline = started + timeout
        while True:
            statuses, restarts = _statuses(schema)
            active = sum(statuses.get(s, 0) for s in ("pending", "running", "waiting"))
            if not active or time.monotonic() > deadline or worker.poll() is not None:
                break
            time.sleep(0.2)
        seconds = time.monotonic() - started
        killer.halt.set()
        killer.join()
        return Outcome(
            tasks=tasks,
            statuses=dict(collections.Counter(statuses)),
            restarts=restarts,
            terminated=killer.terminated,
            seconds=seconds,
            worker_alive=worker.poll() is None,
            errors=_errors(schema),
            takeovers=_takeovers(schema),
            adopted=_count_lines(log_path, "adopting a claim"),
            fault_seconds=killer.ended - killer.started,
            log=log_path,
        )
    finally:
        killer.halt.set()
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        from psycopg import sql

        with _admin() as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.faults", description=__doc__)
    ap.add_argument("--tasks", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--min-ms", type=float, default=2)
    ap.add_argument("--max-ms", type=float, default=30)
    ap.add_argument("--timeout", type=float, default=180)
    ap.add_argument("--lease-ttl", type=float, default=10.0)
    ap.add_argument(
        "--fault-seconds",
        type=float,
        default=None,
        help="stop killing after this long, then let the tasks finish (default: never stop)",
    )
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="one JSON line per run")
    args = ap.parse_args(argv)
    worst = 0
    for _ in range(args.runs):
        out = run_faults(
            tasks=args.tasks,
            rounds=args.rounds,
            min_ms=args.min_ms,
            max_ms=args.max_ms,
            timeout=args.timeout,
            ttl=args.lease_ttl,
            fault_seconds=args.fault_seconds,
        )
        if args.json:
            print(json.dumps({**out.__dict__, "line": out.line()}))
        else:
            print(out.line())
            for err in out.errors[:5]:
                print("   error:", err[:200])
        worst = max(worst, out.failed + out.other)
    return 1 if worst else 0


if __name__ == "__main__":
    sys.exit(main())
