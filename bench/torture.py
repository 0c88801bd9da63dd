"""Crash torture: SIGKILL a worker at random moments, restart it, check nothing broke.

    python -m bench.torture [--trials 200] [--kills 3] [--tasks 6]
                            [--store sqlite|jsonl|postgres|all] [--seed S] [-v]

Each trial starts a worker process (bench/torture_child.py) on a fresh store
with a batch of tasks whose tools append to an fsync'd ledger file (replay-safe
and never-replay tools, several rounds, parallel calls), SIGKILLs it at a
random moment, snapshots the store, restarts it, K times, then lets it finish
and checks:

- every task completed, with its scripted output;
- entry seqs are 1..last_seq with no gap, after every kill and at the end;
- nothing committed before a kill is missing or changed after it;
- every tool call in each task's model view has exactly one result, and every
  intent exactly one stored result;
- no tool ran without its intent committed first (every ledger key is an intent);
- a never-replay tool ran at most once per idempotency key (unsafe executions
  == unique unsafe intents that ran); its `ok` result means it ran exactly
  once, otherwise its result says it was interrupted;
- a replay-safe call always ends `ok` (re-run as needed; re-runs are counted).

Prints the counts and exits non-zero on any violation. `memory://` is refused:
it cannot survive a kill.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import IO, Any

from bench.common import PG_URL, child_env, drop_schema, new_schema, postgres_unreachable
from bench.torture_child import task_input, task_output

STORES = ("sqlite", "jsonl", "postgres")

# (task_id, seq) -> canonical JSON of (kind, round, payload)
Snapshot = dict[tuple[str, int], str]


@dataclass
class TaskDump:
    id: str
    status: str
    input: Any
    output: Any
    last_seq: int
    entries: list[tuple[int, str, int, dict[str, Any]]]  # (seq, kind, round, payload)
    view: list[dict[str, Any]]  # the model's view, as OpenAI-format dicts


@dataclass
class StoreDump:
    tasks: dict[str, TaskDump] = field(default_factory=dict)

    def snapshot(self) -> Snapshot:
        return {
            (t.id, seq): _canon(kind, rnd, payload)
            for t in self.tasks.values()
            for seq, kind, rnd, payload in t.entries
        }


@dataclass
class Counts:
    trials: int = 0
    kills: int = 0
    missed_kills: int = 0  # the child finished before its kill moment
    tasks: int = 0
    tool_runs: int = 0
    unsafe_runs: int = 0
    unsafe_keys: int = 0
    safe_reruns: int = 0
    interrupted: int = 0
    violations: int = 0

    def add(self, other: Counts) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


def _canon(kind: str, rnd: int, payload: Any) -> str:
    return json.dumps([kind, rnd, payload], sort_keys=True, default=str)


# --- the checker: pure, so a test can feed it a fabricated violation -----------


def check(
    final: StoreDump,
    snapshots: list[StoreDump],
    ledger: list[str],
    expected: dict[str, str],
) -> tuple[list[str], Counts]:
    """Violations of the durability invariants, and what happened (see module doc).

    `expected` maps each task's input to the output it must end with.
    """
    v: list[str] = []
    c = Counts(tasks=len(final.tasks))

    # Every task completed, exactly once per input.
    by_input = Counter(str(t.input) for t in final.tasks.values())
    for inp in expected:
        if by_input[inp] != 1:
            v.append(f"{by_input[inp]} tasks for input {inp!r}, expected exactly 1")
    for t in final.tasks.values():
        if t.status != "completed":
            v.append(f"task {t.id} ended {t.status}, not completed")
        elif expected.get(str(t.input)) != t.output:
            v.append(f"task {t.id} output {t.output!r} != {expected.get(str(t.input))!r}")

    # Seqs gap-free, at the end and after every kill (a commit is all or nothing).
    for label, dump in [("final", final)] + [
        (f"after kill {i + 1}", s) for i, s in enumerate(snapshots)
    ]:
        for t in dump.tasks.values():
            seqs = [e[0] for e in t.entries]
            if seqs != list(range(1, len(seqs) + 1)) or (seqs and seqs[-1] != t.last_seq):
                v.append(
                    f"{label}: task {t.id} seqs not 1..{t.last_seq} without gaps: {_gaps(seqs)}"
                )

    # Nothing committed before a kill is missing or changed after it.
    now = final.snapshot()
    for i, snap in enumerate(snapshots):
        for entry, value in snap.snapshot().items():
            if entry not in now:
                v.append(f"entry {entry} committed before kill {i + 1} is missing at the end")
            elif now[entry] != value:
                v.append(
                    f"entry {entry} committed before kill {i + 1} changed: {value} -> {now[entry]}"
                )

    # Every call in the model view has exactly one result; every intent one stored result.
    intents: dict[str, dict[str, Any]] = {}  # idempotency key -> intent payload
    results: dict[str, dict[str, Any]] = {}
    for t in final.tasks.values():
        calls = [
            c_["id"]
            for m in t.view
            if m.get("role") == "assistant"
            for c_ in m.get("tool_calls") or ()
        ]
        answered = Counter(m["tool_call_id"] for m in t.view if m.get("role") == "tool")
        for cid in calls:
            if answered[cid] != 1:
                v.append(f"task {t.id}: call {cid} has {answered[cid]} results in the model view")
        for cid in set(answered) - set(calls):
            v.append(f"task {t.id}: result for unknown call {cid} in the model view")
        stored: Counter[str] = Counter()
        for _seq, kind, rnd, p in t.entries:
            if kind == "tool_intent":
                intents[f"{t.id}:{rnd}:{p['call_id']}"] = p
            elif kind == "tool_result":
                key = f"{t.id}:{rnd}:{p['tool_call_id']}"
                stored[key] += 1
                results[key] = p
        for key in intents:
            if key.startswith(t.id + ":") and stored[key] != 1:
                v.append(f"intent {key} has {stored[key]} stored results")
        for key in stored:
            if key not in intents:
                v.append(f"result {key} has no intent")

    # The ledger against the intents and results.
    starts: Counter[str] = Counter()
    ends: Counter[str] = Counter()
    kinds: dict[str, str] = {}
    for line in ledger:
        parts = line.split()
        if len(parts) != 3 or parts[0] not in ("start", "end"):
            v.append(f"malformed ledger line {line!r}")
            continue
        what, kind, key = parts
        (starts if what == "start" else ends)[key] += 1
        kinds[key] = kind
        if key not in intents:
            v.append(f"tool ran for {key} with no committed intent (effect before intent)")
    c.tool_runs = sum(starts.values())
    for key, kind in kinds.items():
        if kind == "unsafe":
            c.unsafe_runs += starts[key]
            c.unsafe_keys += 1
            if starts[key] > 1:
                v.append(f"never-replay tool ran {starts[key]} times for {key}")
        else:
            c.safe_reruns += max(0, starts[key] - 1)
    for key, intent in intents.items():
        result = results.get(key)
        if result is None:
            continue  # reported above
        outcome = result.get("outcome")
        if outcome == "interrupted":
            c.interrupted += 1
        if intent.get("replay") == "safe":
            if outcome != "ok":
                v.append(f"replay-safe call {key} ended {outcome!r}, expected ok")
            elif ends[key] < 1:
                v.append(f"replay-safe call {key} is ok but never finished in the ledger")
        elif outcome == "ok" and (starts[key] != 1 or ends[key] != 1):
            v.append(f"never-replay call {key} is ok but ran {starts[key]}x/finished {ends[key]}x")
        elif outcome == "interrupted" and starts[key] > 1:
            v.append(f"never-replay call {key} interrupted after running {starts[key]}x")
    c.violations = len(v)
    return v, c


def _gaps(seqs: list[int]) -> str:
    return f"{seqs[:5]}...{seqs[-5:]}" if len(seqs) > 10 else str(seqs)


# --- reading a store ---------------------------------------------------------------


async def dump_store(url: str) -> StoreDump:
    from duragent import open_store
    from duragent.store._commits import TaskQuery
    from duragent.types import dump_message

    store = open_store(url)
    await store.open()
    try:
        out = StoreDump()
        page = await store.list_tasks(TaskQuery(limit=10_000))
        for t in page.tasks:
            entries = [(e.seq, e.kind.value, e.round, e.payload) for e in await store.entries(t.id)]
            view = [dump_message(m) for m in await store.model_view(t.id)]
            out.tasks[t.id] = TaskDump(
                t.id, t.status.value, t.input, t.output, t.last_seq, entries, view
            )
        return out
    finally:
        await store.close()


# --- a trial -----------------------------------------------------------------------


def _spawn(url: str, ledger: str, tasks: int, log: IO[str]) -> subprocess.Popen[str]:
    # stderr goes to a file: a pipe nobody drains fills up and blocks a chatty child.
    return subprocess.Popen(
        [sys.executable, "-m", "bench.torture_child", url, ledger, str(tasks)],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        env=child_env(),
    )


def _read_until(proc: subprocess.Popen[str], stream: IO[str] | None, marker: str) -> bool:
    """Read the child's lines until `marker`; False if it exited first."""
    assert stream is not None
    while True:
        line = stream.readline()
        if not line:
            return False
        if line.startswith(marker):
            return True


def _kill(proc: subprocess.Popen[str]) -> bool:
    """SIGKILL the child if it still runs; True if the kill landed."""
    if proc.poll() is not None:
        return False
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    return proc.returncode == -signal.SIGKILL


def _store_url(kind: str, workdir: str) -> tuple[str, str | None]:
    if kind == "sqlite":
        return f"sqlite:///{workdir}/torture.db", None
    if kind == "jsonl":
        return f"jsonl:///{workdir}/store", None
    if kind == "postgres":
        schema = new_schema("torture")
        return f"{PG_URL}?schema={schema}", schema
    raise ValueError(f"unknown store {kind!r}; use one of {', '.join(STORES)}")


def run_trial(
    kind: str, kills: int, tasks: int, window: float, rng: random.Random, root: str
) -> tuple[list[str], Counts]:
    workdir = tempfile.mkdtemp(prefix="trial-", dir=root)
    url, schema = _store_url(kind, workdir)
    ledger_path = os.path.join(workdir, "ledger.txt")
    log = open(os.path.join(workdir, "stderr.txt"), "w+")  # noqa: SIM115 - closed below
    counts = Counts(trials=1)
    snapshots: list[StoreDump] = []
    violations: list[str] = []
    try:
        for _ in range(kills):
            proc = _spawn(url, ledger_path, tasks, log)
            try:
                if not _read_until(proc, proc.stdout, "READY"):
                    break
                if rng.random() < 0.15:
                    time.sleep(rng.uniform(0, 0.05))  # early: while submitting / claiming
                elif _read_until(proc, proc.stdout, "WORKING"):
                    time.sleep(rng.uniform(0, window))
                landed = _kill(proc)
            finally:
                _kill(proc)
                proc.communicate(timeout=30)
            if landed:
                counts.kills += 1
                try:
                    snapshots.append(asyncio.run(dump_store(url)))
                except Exception as exc:
                    violations.append(f"the store cannot be read after kill {counts.kills}: {exc}")
                    break
            else:
                counts.missed_kills += 1
        proc = _spawn(url, ledger_path, tasks, log)
        try:
            out, _ = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            _kill(proc)
            out, _ = proc.communicate()
        if proc.returncode != 0 or "DONE" not in out:
            log.seek(0)
            tail = "\n".join(log.read().strip().splitlines()[-8:])
            violations.append(f"the final run failed ({proc.returncode}): {tail}")
        try:
            final = asyncio.run(dump_store(url))
        except Exception as exc:
            violations.append(f"the store cannot be read at the end: {exc}")
            counts.violations = len(violations)
            return violations, counts
        ledger: list[str] = []
        if os.path.exists(ledger_path):
            with open(ledger_path) as f:
                ledger = [line.strip() for line in f if line.strip()]
        expected = {task_input(i): task_output(i) for i in range(tasks)}
        found, checked = check(final, snapshots, ledger, expected)
        violations += found
        checked.violations = len(violations)
        checked.trials, checked.kills, checked.missed_kills = (
            counts.trials,
            counts.kills,
            counts.missed_kills,
        )
        return violations, checked
    finally:
        log.close()
        shutil.rmtree(workdir, ignore_errors=True)
        if schema is not None:
            with contextlib.suppress(Exception):
                drop_schema(schema)


def available_stores() -> dict[str, str | None]:
    """Each backend, and why it cannot be tortured here (None = available)."""
    out: dict[str, str | None] = {"sqlite": None}
    try:
        import duragent.store._jsonl

        out["jsonl"] = None
    except ImportError as exc:
        out["jsonl"] = f"no jsonl store in this build ({exc})"
    pg = postgres_unreachable(PG_URL)
    if pg is None:
        try:
            import duragent.store._postgres  # noqa: F401
        except ImportError as exc:
            pg = f"no postgres store in this build ({exc})"
    out["postgres"] = pg
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.torture", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--kills", type=int, default=3, help="SIGKILLs per trial before the final run")
    ap.add_argument("--tasks", type=int, default=6, help="tasks per trial")
    ap.add_argument(
        "--store",
        default="sqlite",
        help="sqlite, jsonl, postgres, or all (every backend present); memory:// is refused",
    )
    ap.add_argument("--window", type=float, default=0.25, help="kill within this many s of work")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args(argv)
    if a.store == "memory":
        ap.error("memory:// loses everything when its process dies; there is nothing to check")
    present = available_stores()
    if a.store == "all":
        kinds = [k for k, why in present.items() if why is None]
        for k, why in present.items():
            if why is not None:
                print(f"skipping {k}: {why}")
    elif a.store in present:
        if present[a.store] is not None:
            print(f"cannot torture {a.store}: {present[a.store]}", file=sys.stderr)
            return 2
        kinds = [a.store]
    else:
        ap.error(f"unknown store {a.store!r}; use one of {', '.join(STORES)} or all")
    seed = a.seed if a.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    print(
        f"seed {seed}; stores {', '.join(kinds)}; "
        f"{a.trials} trials x {a.kills} kills x {a.tasks} tasks"
    )
    failed = False
    with tempfile.TemporaryDirectory(prefix="duragent-torture-") as root:
        for kind in kinds:
            total = Counts()
            t0 = time.monotonic()
            for n in range(a.trials):
                violations, counts = run_trial(kind, a.kills, a.tasks, a.window, rng, root)
                total.add(counts)
                for line in violations:
                    print(f"  VIOLATION [{kind} trial {n + 1}] {line}")
                if a.verbose:
                    print(f"  {kind} trial {n + 1}: {counts}", flush=True)
                elif (n + 1) % 25 == 0 and n + 1 < a.trials:
                    print(
                        f"  {kind}: {n + 1} trials, {total.kills} kills, "
                        f"{total.violations} violations so far",
                        flush=True,
                    )
            failed |= total.violations > 0
            print(
                f"{kind}: trials {total.trials}, kills {total.kills} "
                f"(missed {total.missed_kills}), tasks {total.tasks}, tool runs {total.tool_runs}, "
                f"unsafe runs {total.unsafe_runs} = unique unsafe intents run {total.unsafe_keys}, "
                f"safe re-runs {total.safe_reruns}, interrupted results {total.interrupted}, "
                f"violations {total.violations} ({time.monotonic() - t0:.0f} s)",
                flush=True,
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
