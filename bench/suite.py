"""The workloads: which measurements run, in which order, and what they return.

Every measurement runs in its own child process (bench/run.py). Repeated runs
are interleaved (run 1 of every system, then run 2, ...) in a shuffled order,
so a burst of load on this shared machine hits all systems alike, and every
ratio is taken between numbers of the same run.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench import failover, machine
from bench.common import PG_URL, child_env, postgres_unreachable, raw_json_size


@dataclass(frozen=True)
class System:
    key: str  # row id, e.g. "duragent/sqlite-full"
    system: str  # bench.run system name
    config: str
    label: str  # e.g. "duragent"
    store: str  # e.g. "SQLite FULL"
    baseline: str | None = None  # the same system in memory, for the persistence overhead
    compare: str | None = None  # the duragent row it is compared with


ROUND_SYSTEMS: tuple[System, ...] = (
    System(
        "duragent/none",
        "duragent",
        "none",
        "duragent",
        "bare loop: same model and tool, no runtime, no persistence",
    ),
    System("duragent/memory", "duragent", "memory", "duragent", "memory:// (no persistence)"),
    System(
        "duragent/sqlite-normal",
        "duragent",
        "sqlite-normal",
        "duragent",
        "SQLite WAL, synchronous=NORMAL",
        baseline="duragent/memory",
    ),
    System(
        "duragent/sqlite-full",
        "duragent",
        "sqlite-full",
        "duragent",
        "SQLite WAL, synchronous=FULL",
        baseline="duragent/memory",
    ),
    System(
        "duragent/postgres",
        "duragent",
        "postgres",
        "duragent",
        "PostgreSQL",
        baseline="duragent/memory",
    ),
    System(
        "duragent/postgres-psycopg",
        "duragent",
        "postgres-psycopg",
        "duragent",
        "PostgreSQL, psycopg's documented API (?wire=psycopg)",
        baseline="duragent/memory",
    ),
    System("langgraph/none", "langgraph", "none", "LangGraph", "no checkpointer (no persistence)"),
    System(
        "langgraph/memory",
        "langgraph",
        "memory",
        "LangGraph",
        "InMemorySaver",
        baseline="langgraph/none",
    ),
    System(
        "langgraph/sqlite",
        "langgraph",
        "sqlite",
        "LangGraph",
        "AsyncSqliteSaver (WAL, synchronous=FULL)",
        baseline="langgraph/none",
        compare="duragent/sqlite-full",
    ),
    System(
        "langgraph/postgres",
        "langgraph",
        "postgres",
        "LangGraph",
        "AsyncPostgresSaver",
        baseline="langgraph/none",
        compare="duragent/postgres",
    ),
    System(
        "langgraph/postgres-pool",
        "langgraph",
        "postgres-pool",
        "LangGraph",
        "AsyncPostgresSaver on a connection pool",
        baseline="langgraph/none",
        compare="duragent/postgres",
    ),
    System(
        "langgraph/sqlite-delta",
        "langgraph",
        "sqlite-delta",
        "LangGraph",
        "AsyncSqliteSaver, messages in a DeltaChannel (beta)",
        baseline="langgraph/none",
        compare="duragent/sqlite-full",
    ),
    System(
        "langgraph/postgres-delta",
        "langgraph",
        "postgres-delta",
        "LangGraph",
        "AsyncPostgresSaver, messages in a DeltaChannel (beta)",
        baseline="langgraph/none",
        compare="duragent/postgres",
    ),
    System(
        "dbos/sqlite",
        "dbos",
        "sqlite",
        "DBOS",
        "SQLite (rollback journal, synchronous=FULL)",
        compare="duragent/sqlite-full",
    ),
    System("dbos/postgres", "dbos", "postgres", "DBOS", "PostgreSQL", compare="duragent/postgres"),
)
# DURAGENT_BENCH_BEFORE_SRC=/path/to/other/src adds duragent rows run from that
# source tree (e.g. `git archive <rev> src`), measured in the same run: before and
# after a change, side by side, under the same load.
BEFORE_SRC = os.environ.get("DURAGENT_BENCH_BEFORE_SRC")
BEFORE_REV = os.environ.get("DURAGENT_BENCH_BEFORE_REV", "before")
if BEFORE_SRC:
    ROUND_SYSTEMS += tuple(
        System(
            f"before/{config}",
            "duragent-before",
            config,
            f"duragent {BEFORE_REV}",
            store,
            baseline=None if config == "memory" else "before/memory",
            compare=f"duragent/{config}",
        )
        for config, store in (
            ("memory", "memory:// (no persistence)"),
            ("sqlite-normal", "SQLite WAL, synchronous=NORMAL"),
            ("sqlite-full", "SQLite WAL, synchronous=FULL"),
            ("postgres", "PostgreSQL"),
        )
    )
BY_KEY = {s.key: s for s in ROUND_SYSTEMS}


@dataclass
class Settings:
    runs: int
    rounds: int
    repeats: int  # tasks per run (one process); the run's figure is their median
    storage_rounds: list[int]
    resume_entries: int
    resume_repeats: int
    resume_runs: int
    concurrent_tasks: int
    concurrent_rounds: int
    concurrent_runs: int
    failover: dict[str, int]  # lease ttl -> trials
    fsync_seconds: float
    streaming_rounds: int = 20
    streaming_runs: int = 3
    pg_workers: tuple[int, ...] = (1, 4)
    pg_worker_runs: int = 3
    commit_cpu_runs: int = 5
    compaction_rounds: int = 1_000  # one task through a 16k-token window, and unwindowed
    compaction_runs: int = 3
    commit_cpu_commits: int = 3000

    @classmethod
    def make(cls, quick: bool, runs: int | None) -> Settings:
        if quick:
            return cls(
                runs=runs or 1,
                rounds=200,
                repeats=1,
                storage_rounds=[50, 100],
                resume_entries=10_000,
                resume_repeats=3,
                resume_runs=runs or 1,
                concurrent_tasks=100,
                concurrent_rounds=4,
                concurrent_runs=runs or 1,
                failover={"2": 1},
                fsync_seconds=0.5,
                streaming_rounds=5,
                streaming_runs=1,
                pg_worker_runs=1,
                commit_cpu_runs=runs or 1,
                commit_cpu_commits=500,
                compaction_rounds=300,
                compaction_runs=1,
            )
        return cls(
            runs=runs or 5,
            rounds=200,
            repeats=3,
            storage_rounds=[100, 500, 1000],
            resume_entries=10_000,
            resume_repeats=10,
            resume_runs=runs or 3,
            concurrent_tasks=200,
            concurrent_rounds=10,
            concurrent_runs=runs or 3,
            failover={"default": 3, "2": 5},
            fsync_seconds=1.0,
        )


@dataclass
class Results:
    settings: Settings
    machine: dict[str, Any] = field(default_factory=dict)
    fsync: list[dict[str, float]] = field(default_factory=list)
    unavailable: dict[str, str] = field(default_factory=dict)  # row key -> why n/a
    rounds: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # key -> per run
    storage: dict[str, dict[str, Any]] = field(default_factory=dict)
    resume: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    concurrent: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    streaming: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    pg_workers: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    commit_cpu: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # config -> runs
    compaction: list[dict[str, Any]] = field(default_factory=list)  # per run
    failover: dict[str, list[float]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)


Log = Callable[[str], None]


def measure(system: str, workload: str, params: dict[str, Any], timeout: float = 900) -> Any:
    """Run one measurement in a fresh interpreter; its result, or raise with its stderr."""
    env = child_env()
    if system == "duragent-before":
        assert BEFORE_SRC is not None
        system = "duragent"
        env["PYTHONPATH"] = BEFORE_SRC + os.pathsep + env["PYTHONPATH"]
    proc = subprocess.run(
        [sys.executable, "-m", "bench.run", system, workload, json.dumps(params)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-6:])
        raise RuntimeError(f"{system} {workload} failed ({proc.returncode}): {tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _measured(
    res: Results,
    log: Log,
    error: str,
    shown: str,
    system: str,
    workload: str,
    params: dict[str, Any],
    timeout: float = 900,
) -> Any:
    """`measure`'s result, or None when it failed: the failure is then noted in
    the report's errors (as `error: ...`) and in the log (as `shown: ...`)."""
    try:
        return measure(system, workload, params, timeout)
    except Exception as exc:
        res.errors.append(f"{error}: {exc}")
        log(f"  ! {shown}: {exc}")
        return None


def check_availability(res: Results, log: Log) -> None:
    problem = postgres_unreachable(PG_URL)
    if problem is None:
        from bench.sys_duragent import postgres_store_problem

        store_problem = postgres_store_problem()
        if store_problem is not None:
            res.unavailable["duragent/postgres"] = store_problem
    else:
        for s in ROUND_SYSTEMS:
            if s.config.startswith("postgres"):
                res.unavailable[s.key] = problem
    if "duragent/postgres" in res.unavailable and BEFORE_SRC:
        res.unavailable["before/postgres"] = res.unavailable["duragent/postgres"]
    for key, why in res.unavailable.items():
        log(f"  {key}: n/a — {why}")


def run_machine(res: Results, workdir: str, log: Log) -> None:
    res.machine = machine.describe(workdir, PG_URL)
    for _ in range(3):
        res.fsync.append(
            machine.fsync_rates(os.path.join(workdir, "fsync"), res.settings.fsync_seconds)
        )
    f = res.fsync[-1]
    log(
        f"  fsync/s append {f['fsync_append']:.0f}, overwrite {f['fsync_overwrite']:.0f}; "
        f"SQLite WAL FULL {f['sqlite_wal_full_tx']:.0f} tx/s, "
        f"NORMAL {f['sqlite_wal_normal_tx']:.0f}"
    )


def _available(res: Results) -> list[System]:
    return [s for s in ROUND_SYSTEMS if s.key not in res.unavailable]


def run_rounds(res: Results, workdir: str, log: Log) -> None:
    st = res.settings
    rng = random.Random(1)
    for run in range(st.runs):
        order = _available(res)
        rng.shuffle(order)
        for s in order:
            params = {
                "config": s.config,
                "workdir": os.path.join(workdir, f"rounds-{run}-{s.key.replace('/', '-')}"),
                "rounds": st.rounds,
                "repeats": st.repeats,
            }
            out = _measured(
                res, log, f"rounds {s.key} run {run + 1}", s.key, s.system, "rounds", params
            )
            if out is None:
                continue
            out["run"] = run
            res.rounds.setdefault(s.key, []).append(out)
            log(f"  run {run + 1}/{st.runs} {s.key:24} {out['ms_per_round']:.2f} ms/round")


STORAGE_KEYS = (
    "duragent/sqlite-normal",
    "duragent/postgres",
    "langgraph/sqlite",
    "langgraph/postgres",
    "langgraph/sqlite-delta",
    "langgraph/postgres-delta",
    "dbos/sqlite",
    "dbos/postgres",
)


def run_storage(res: Results, workdir: str, log: Log) -> None:
    sizes = res.settings.storage_rounds
    res.storage["raw"] = {str(n): raw_json_size_after(n) for n in sizes}
    for key in STORAGE_KEYS:
        if key in res.unavailable:
            continue
        s = BY_KEY[key]
        params = {
            "config": s.config,
            "workdir": os.path.join(workdir, f"storage-{key.replace('/', '-')}"),
            "rounds": max(sizes),
            "sizes": sizes,
        }
        out = _measured(res, log, f"storage {key}", key, s.system, "rounds", params, 1800)
        if out is None:
            continue
        res.storage[key] = out["sizes"]
        log(f"  {key:24} " + ", ".join(f"{n}: {v:,} B" for n, v in out["sizes"].items()))


def raw_json_size_after(rounds: int) -> int:
    """Raw JSON of the conversation after `rounds` rounds (no final answer yet)."""
    import json as _json

    from bench.common import openai_messages

    return raw_json_size(rounds) - len(_json.dumps(openai_messages(rounds)[-1]))


RESUME_KEYS: tuple[str, ...] = (
    "duragent/sqlite-normal",
    "duragent/postgres",
    "langgraph/sqlite",
    "langgraph/postgres",
)
if BEFORE_SRC:
    RESUME_KEYS += ("before/sqlite-normal", "before/postgres")


def run_resume(res: Results, workdir: str, log: Log) -> None:
    st = res.settings
    for run in range(st.resume_runs):
        for key in RESUME_KEYS:
            if key in res.unavailable:
                continue
            s = BY_KEY[key]
            params = {
                "config": s.config,
                "workdir": os.path.join(workdir, f"resume-{run}-{key.replace('/', '-')}"),
                "entries": st.resume_entries,
                "repeats": st.resume_repeats,
            }
            out = _measured(res, log, f"resume {key}", key, s.system, "resume", params)
            if out is None:
                continue
            res.resume.setdefault(key, []).append(out)
            log(f"  run {run + 1}/{st.resume_runs} {key:24} {out['resume_ms']:.1f} ms")


CONCURRENT_KEYS: tuple[str, ...] = ("duragent/sqlite-full", "langgraph/sqlite")
if BEFORE_SRC:
    CONCURRENT_KEYS += ("before/sqlite-full",)


def run_concurrent(res: Results, workdir: str, log: Log) -> None:
    st = res.settings
    for run in range(st.concurrent_runs):
        for key in CONCURRENT_KEYS:
            s = BY_KEY[key]
            rounds = st.concurrent_rounds
            if s.system == "langgraph":
                rounds = max(1, rounds // 2)  # ~5x slower per round; keeps the run short
            params = {
                "config": s.config,
                "workdir": os.path.join(workdir, f"concurrent-{run}-{key.replace('/', '-')}"),
                "tasks": st.concurrent_tasks,
                "rounds": rounds,
            }
            out = _measured(res, log, f"concurrent {key}", key, s.system, "concurrent", params)
            if out is None:
                continue
            out["fsync"] = machine.fsync_rates(
                os.path.join(workdir, "fsync"), res.settings.fsync_seconds
            )
            res.concurrent.setdefault(key, []).append(out)
            log(
                f"  run {run + 1}/{st.concurrent_runs} {key:24} "
                f"{out.get('commits_per_s', float('nan')):.0f} commits/s, "
                f"{out['rounds_per_s']:.0f} rounds/s"
            )


STREAMING_KEYS = ("duragent/memory", "duragent/sqlite-full", "duragent/postgres")


def run_streaming(res: Results, workdir: str, log: Log) -> None:
    st = res.settings
    for run in range(st.streaming_runs):
        for key in STREAMING_KEYS:
            if key in res.unavailable:
                continue
            s = BY_KEY[key]
            params = {
                "config": s.config,
                "workdir": os.path.join(workdir, f"streaming-{run}-{key.replace('/', '-')}"),
                "rounds": st.streaming_rounds,
            }
            out = _measured(res, log, f"streaming {key}", key, s.system, "streaming", params)
            if out is None:
                continue
            out["run"] = run
            res.streaming.setdefault(key, []).append(out)
            log(f"  run {run + 1}/{st.streaming_runs} {key:24} {out['ms_per_round']:.1f} ms/round")


def run_pg_workers(res: Results, workdir: str, log: Log) -> None:
    if "duragent/postgres" in res.unavailable:
        return
    from bench import pg_workers

    st = res.settings
    for run in range(st.pg_worker_runs):
        for n in st.pg_workers:
            load = os.getloadavg()[0]
            try:
                r = pg_workers.run_once(n, 400, 5, 32, 600)
            except Exception as exc:
                res.errors.append(f"pg_workers {n}: {exc}")
                log(f"  ! pg_workers {n}: {exc}")
                continue
            out = {
                "run": run,
                "rounds_per_s": r.rounds_per_s,
                "rounds_per_cpu_s": r.rounds_per_cpu_s,
                "cpu_s": r.cpu_seconds,
                "server_cpu_s": r.server_cpu_seconds,
                "cpu_ms_per_round": r.cpu_ms_per_round,
                "ceiling": r.ceiling,
                "load": load,
            }
            res.pg_workers.setdefault(n, []).append(out)
            log(
                f"  run {run + 1}/{st.pg_worker_runs} {n} worker(s): {r.rounds_per_s:.0f} "
                f"rounds/s, {r.rounds_per_cpu_s:.0f} rounds per worker CPU-second, "
                f"{r.cpu_ms_per_round:.3f} ms CPU per round with the server's "
                f"(the cores allow {r.ceiling:.0f} rounds/s)"
            )


COMMIT_CPU_CONFIGS = ("sqlite-normal", "sqlite-full", "postgres")


def run_commit_cpu(res: Results, workdir: str, log: Log) -> None:
    st = res.settings
    for run in range(st.commit_cpu_runs):
        for config in COMMIT_CPU_CONFIGS:
            if f"duragent/{config}" in res.unavailable:
                continue
            params = {
                "config": config,
                "workdir": os.path.join(workdir, f"commit-cpu-{run}-{config}"),
                "commits": st.commit_cpu_commits,
            }
            error = f"commit_cpu {config} run {run + 1}"
            out = _measured(res, log, error, config, "duragent", "commit_cpu", params)
            if out is None:
                continue
            res.commit_cpu.setdefault(config, []).append(out)
            log(
                f"  run {run + 1}/{st.commit_cpu_runs} {config:14} {out['cpu_us']:.0f} µs CPU"
                + (f", {out['python_us']:.0f} µs Python" if "python_us" in out else "")
                + " per commit"
            )


def run_failover(res: Results, workdir: str, log: Log) -> None:
    for ttl, trials in res.settings.failover.items():
        for i in range(trials):
            try:
                took = failover.trial(os.path.join(workdir, f"failover-{ttl}-{i}"), ttl)
            except Exception as exc:
                res.errors.append(f"failover lease {ttl}: {exc}")
                log(f"  ! failover {ttl}: {exc}")
                continue
            res.failover.setdefault(ttl, []).append(took)
            log(f"  lease_ttl={ttl} trial {i + 1}/{trials}: {took:.2f} s")


def run_compaction(res: Results, workdir: str, log: Log) -> None:
    st = res.settings
    for run in range(st.compaction_runs):
        params = {
            "config": "sqlite-normal",
            "workdir": os.path.join(workdir, f"compaction-{run}"),
            "rounds": st.compaction_rounds,
            "window": 16_000,
        }
        key = "duragent/sqlite-normal"
        out = _measured(res, log, "compaction", key, "duragent", "compaction", params)
        if out is None:
            continue
        res.compaction.append(out)
        w, u = out["windowed"], out["whole"]
        log(
            f"  run {run + 1}/{st.compaction_runs} windowed {w['ms_per_round']:.2f} ms/round, "
            f"resume {w['resume_ms']:.1f} ms; unwindowed {u['ms_per_round']:.2f} ms/round, "
            f"resume {u['resume_ms']:.1f} ms"
        )


WORKLOADS: dict[str, Callable[[Results, str, Log], None]] = {
    "rounds": run_rounds,
    "storage": run_storage,
    "resume": run_resume,
    "concurrent": run_concurrent,
    "streaming": run_streaming,
    "pg_workers": run_pg_workers,
    "commit_cpu": run_commit_cpu,
    "failover": run_failover,
    "compaction": run_compaction,
}


def run_all(res: Results, only: list[str], workdir: str, log: Log) -> None:
    log("machine")
    t0 = time.perf_counter()
    run_machine(res, workdir, log)
    check_availability(res, log)
    res.seconds["machine"] = time.perf_counter() - t0
    for name, fn in WORKLOADS.items():
        if only and name not in only:
            continue
        log(name)
        t0 = time.perf_counter()
        fn(res, workdir, log)
        res.seconds[name] = time.perf_counter() - t0
    res.fsync.append(
        machine.fsync_rates(os.path.join(workdir, "fsync"), res.settings.fsync_seconds)
    )
    res.machine["loadavg_end"] = os.getloadavg()
