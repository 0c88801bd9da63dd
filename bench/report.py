"""Markdown tables of a bench run, and the RESULTS.md around them."""

from __future__ import annotations

import os
import statistics
from typing import Any

from bench.common import fmt, human_bytes, spread
from bench.suite import BY_KEY, CONCURRENT_KEYS, RESUME_KEYS, ROUND_SYSTEMS, STORAGE_KEYS, Results

# The targets of issue 15 (each a figure from one run; met when the median is within).
GOAL_PG_OVERHEAD_MS = 1.2
GOAL_PG_CPU_PER_COMMIT_MS = 0.3
GOAL_PG_WORKERS_SCALE = 2.0  # 4 worker processes vs 1
GOAL_FULL_OVERHEAD_MS = 0.45
GOAL_PY_PER_COMMIT_US = 80.0
GOAL_CONCURRENT_ROUNDS = 4000.0
GOAL_RESUME_MS = {"duragent/sqlite-normal": 12.0, "duragent/postgres": 30.0}
GOAL_STORAGE_RATIO = {"duragent/sqlite-normal": 1.5, "duragent/postgres": 2.0}
PREVIOUS = {"LangGraph": 6.8, "DBOS": 5.4}  # ms/round from an earlier measurement


def _by_run(rows: list[dict[str, Any]], field: str) -> dict[int, float]:
    return {r["run"]: r[field] for r in rows if field in r}


def _paired(res: Results, a: str, b: str, field: str, op: Any) -> list[float]:
    """op(a_run, b_run) for every run in which both a and b were measured."""
    ra, rb = _by_run(res.rounds.get(a, []), field), _by_run(res.rounds.get(b, []), field)
    return [op(ra[i], rb[i]) for i in sorted(ra) if i in rb]


def _values(res: Results, key: str, field: str) -> list[float]:
    return [r[field] for r in res.rounds.get(key, []) if field in r]


def overhead(res: Results, key: str) -> list[float]:
    s = BY_KEY[key]
    if s.baseline is None:
        return []
    return _paired(res, key, s.baseline, "ms_per_round", lambda x, y: x - y)


def rounds_table(res: Results) -> str:
    n = res.settings.rounds
    lines = [
        f"| system | store | ms per round | rounds 1–50 | rounds {n - 49}–{n} "
        "| persistence overhead ms/round | process CPU ms/round | time vs duragent (same run) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for s in ROUND_SYSTEMS:
        if s.key in res.unavailable:
            lines.append(f"| {s.label} | {s.store} | n/a | | | | | {res.unavailable[s.key]} |")
            continue
        if s.key not in res.rounds:
            lines.append(f"| {s.label} | {s.store} | failed | | | | | see errors |")
            continue
        ratio = ""
        if s.compare and s.compare in res.rounds:
            ratios = _paired(res, s.key, s.compare, "ms_per_round", lambda x, y: x / y)
            ratio = f"{fmt(ratios, 1, '×')} vs {BY_KEY[s.compare].store}"
        over = overhead(res, s.key)
        lines.append(
            f"| {s.label} | {s.store} | {fmt(_values(res, s.key, 'ms_per_round'))} "
            f"| {fmt(_values(res, s.key, 'ms_first50'))} "
            f"| {fmt(_values(res, s.key, 'ms_last50'))} "
            f"| {fmt(over) if over else '—'} "
            f"| {fmt(_values(res, s.key, 'cpu_ms_per_round')) if 'duragent' in s.system else '—'} "
            f"| {ratio} |"
        )
    return "\n".join(lines)


def storage_table(res: Results) -> str:
    sizes = [str(n) for n in res.settings.storage_rounds]
    raw = res.storage.get("raw", {})
    head = " | ".join(f"after {int(n):,} rounds" for n in sizes)
    # What each further round costs, the tables' fixed pages left out: the
    # growth between the last two sizes over the raw messages' growth.
    grows = len(sizes) > 1
    first, last = sizes[-2:] if grows else ("", "")
    growth = f" growth from {int(first):,} to {int(last):,} rounds |" if grows else ""
    width = len(sizes) + grows
    lines = [f"| system | store | {head} |{growth}", "| --- | --- |" + " ---: |" * width]
    raw_growth = f" {human_bytes(raw[last] - raw[first])} |" if grows and raw else ""
    lines.append(
        "| raw message JSON | Σ len(json.dumps(m)) | "
        + " | ".join(human_bytes(raw.get(n, 0)) for n in sizes)
        + " |"
        + raw_growth
    )
    for key in STORAGE_KEYS:
        s = BY_KEY[key]
        if key in res.unavailable:
            lines.append(f"| {s.label} | {s.store} |" + " n/a |" * width)
            continue
        got = res.storage.get(key)
        if not got:
            lines.append(f"| {s.label} | {s.store} |" + " failed |" * width)
            continue
        cells = []
        for n in sizes:
            b = got.get(n)
            cells.append(f"{human_bytes(b)} ({b / raw[n]:.1f}× raw)" if b else "—")
        if grows:
            a, b = got.get(first), got.get(last)
            grew = b - a if a and b else None
            cells.append(
                f"{human_bytes(grew)} ({grew / (raw[last] - raw[first]):.2f}× raw)"
                if grew is not None
                else "—"
            )
        store = s.store if s.system != "duragent" else "SQLite WAL" if "sqlite" in key else s.store
        lines.append(f"| {s.label} | {store} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def resume_table(res: Results) -> str:
    e = res.settings.resume_entries
    lines = [
        "| system | store | history | reopen + ready to call the model, ms | model view only, ms |",
        "| --- | --- | --- | ---: | ---: |",
    ]
    for key in RESUME_KEYS:
        s = BY_KEY[key]
        store = "SQLite WAL" if s.config == "sqlite-normal" else s.store
        if key in res.unavailable:
            lines.append(f"| {s.label} | {store} | | n/a | n/a |")
            continue
        runs = res.resume.get(key, [])
        if not runs:
            lines.append(f"| {s.label} | {store} | | failed | |")
            continue
        msgs = runs[0]["messages"]
        history = (
            f"{runs[0]['entries']:,} entries, {msgs:,} messages"
            if s.system.startswith("duragent")
            else f"{msgs:,} messages (same conversation)"
        )
        view = fmt([r["view_ms"] for r in runs], 1) if "view_ms" in runs[0] else "—"
        lines.append(
            f"| {s.label} | {store} | {history} | {fmt([r['resume_ms'] for r in runs], 1)} "
            f"| {view} |"
        )
    lines.append("")
    lines.append(
        "duragent: a fresh store object, `get_task`, then `TaskRunner.recovery.start()` "
        f"(model view of {e:,} entries + the last round's entries + the recovery decision). "
        "LangGraph: a fresh checkpointer connection, compile the graph, `aget_state`. "
        "Each figure is the median of repeated reopenings within a run; the table shows "
        "the median (min–max) over runs."
    )
    return "\n".join(lines)


def concurrent_table(res: Results) -> str:
    st = res.settings
    lines = [
        "| system | store | tasks × rounds | commits/s | rounds/s | commits per fsync "
        "| fsyncs/s | raw SQLite FULL tx/s (same run) | share of the disk's FULL rate "
        "| process CPU per round, ms | one core's ceiling, rounds/s | in the garbage collector |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for key in CONCURRENT_KEYS:
        s = BY_KEY[key]
        runs = res.concurrent.get(key, [])
        if not runs:
            lines.append(f"| {s.label} | {s.store} | | failed | | | | | | | | |")
            continue
        timed = [r for r in runs if "cpu_ms_per_round" in r]  # duragent's: LangGraph's have none
        cpu = fmt([r["cpu_ms_per_round"] for r in timed], 3) if timed else "—"
        ceiling = fmt([1e3 / r["cpu_ms_per_round"] for r in timed], 0) if timed else "—"
        in_gc = fmt([100 * r["gc_share"] for r in timed], 0, "%") if timed else "—"
        raw = [r["fsync"]["sqlite_wal_full_tx"] for r in runs]
        rounds = runs[0].get("rounds", st.concurrent_rounds // 2)
        if "commits_per_s" in runs[0]:  # duragent (either revision)
            commits = fmt([r["commits_per_s"] for r in runs], 0)
            per_fsync = fmt([r["commits_per_tx"] for r in runs], 1)
            tps = [r.get("transactions_per_s", 0.0) for r in runs]
            fsyncs = fmt(tps, 0)
            raws = [r["fsync"]["sqlite_wal_full_tx"] for r in runs]
            share = fmt([100 * t / w for t, w in zip(tps, raws, strict=True)], 2, "%")
        else:
            commits, per_fsync, fsyncs, share = "—", "1 (one per checkpoint)", "—", "—"
        lines.append(
            f"| {s.label} | {s.store} | {st.concurrent_tasks} × {rounds} | {commits} "
            f"| {fmt([r['rounds_per_s'] for r in runs], 0)} | {per_fsync} | {fsyncs} "
            f"| {fmt(raw, 0)} | {share} | {cpu} | {ceiling} | {in_gc} |"
        )
    return "\n".join(lines)


def streaming_table(res: Results) -> str:
    base = {r["run"]: r["ms_per_round"] for r in res.streaming.get("duragent/memory", [])}
    lines = [
        "| store | ms per round | overhead vs memory:// (same run), ms/round "
        "| progress commits per round |",
        "| --- | ---: | ---: | ---: |",
    ]
    for key, runs in res.streaming.items():
        over = [r["ms_per_round"] - base[r["run"]] for r in runs if r["run"] in base]
        lines.append(
            f"| {BY_KEY[key].store} | {fmt([r['ms_per_round'] for r in runs], 1)} "
            f"| {fmt(over) if key != 'duragent/memory' else '—'} "
            f"| {fmt([r['progress_per_round'] for r in runs], 1)} |"
        )
    return "\n".join(lines)


def pg_workers_table(res: Results) -> str:
    lines = [
        "| worker processes | rounds/s | rounds per worker CPU-second | worker CPU, s "
        "| server CPU, s | CPU per round, workers + server, ms | the cores' ceiling, rounds/s "
        "| rounds/s ÷ ceiling | load average before |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for n, runs in sorted(res.pg_workers.items()):
        # A ceiling of 0: no CPU time could be read (/proc), so none to show.
        full = [r for r in runs if r["ceiling"]]
        lines.append(
            f"| {n} | {fmt([r['rounds_per_s'] for r in runs], 0)} "
            f"| {fmt([r['rounds_per_cpu_s'] for r in runs], 0)} "
            f"| {fmt([r['cpu_s'] for r in runs], 1)} "
            f"| {fmt([r['server_cpu_s'] for r in full], 1)} "
            f"| {fmt([r['cpu_ms_per_round'] for r in full], 3)} "
            f"| {fmt([r['ceiling'] for r in full], 0)} "
            f"| {fmt([100 * r['rounds_per_s'] / r['ceiling'] for r in full], 0, '%')} "
            f"| {fmt([r['load'] for r in runs], 2)} |"
        )
    return "\n".join(lines)


COMMIT_CPU_STORES = {
    "sqlite-normal": "SQLite WAL, synchronous=NORMAL",
    "sqlite-full": "SQLite WAL, synchronous=FULL",
    "postgres": "PostgreSQL (the server's CPU is in other processes)",
}


def commit_cpu_table(res: Results) -> str:
    lines = [
        "| store | process CPU, µs | inside SQLite's calls, µs "
        "| duragent's Python (the rest), µs |",
        "| --- | ---: | ---: | ---: |",
    ]
    for config, label in COMMIT_CPU_STORES.items():
        runs = res.commit_cpu.get(config)
        if not runs:
            continue
        cols = [
            fmt([r[k] for r in runs], 0) if k in runs[0] else "—"
            for k in ("cpu_us", "sqlite_us", "python_us")
        ]
        lines.append(f"| {label} | " + " | ".join(cols) + " |")
    return "\n".join(lines)


def failover_table(res: Results) -> str:
    lines = [
        "| lease_ttl | heartbeat | trials | SIGKILL → takeover commit, s "
        "| bound (ttl − heartbeat … ttl) |",
        "| --- | --- | ---: | ---: | --- |",
    ]
    for ttl, trials in res.settings.failover.items():
        lease = 30.0 if ttl == "default" else float(ttl)
        got = res.failover.get(ttl, [])
        label = f"{lease:g} s (default)" if ttl == "default" else f"{lease:g} s"
        lines.append(
            f"| {label} | {lease / 3:.2f} s | {len(got)}/{trials} | {fmt(got, 2)} "
            f"| {lease * 2 / 3:.1f}–{lease:.1f} s |"
        )
    return "\n".join(lines)


def fsync_table(res: Results) -> str:
    rows = (
        ("fsync after a 100-byte append (file grows)", "fsync_append"),
        ("fsync after rewriting 100 bytes in place", "fsync_overwrite"),
        ("SQLite WAL synchronous=FULL, 1-row transactions", "sqlite_wal_full_tx"),
        ("SQLite WAL synchronous=NORMAL, 1-row transactions", "sqlite_wal_normal_tx"),
    )
    lines = ["| operation | per second, median (min–max) |", "| --- | ---: |"]
    samples = res.fsync + [r["fsync"] for rs in res.concurrent.values() for r in rs]
    for label, field in rows:
        lines.append(f"| {label} | {fmt([f[field] for f in samples], 0)} |")
    return "\n".join(lines)


def _verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def targets(res: Results) -> list[str]:
    out = []
    pg = overhead(res, "duragent/postgres")
    if pg:
        med = statistics.median(pg)
        out.append(
            f"- PostgreSQL persistence overhead per round: {fmt(pg)} ms "
            f"(goal ≤ {GOAL_PG_OVERHEAD_MS} ms) — {_verdict(med <= GOAL_PG_OVERHEAD_MS)}."
        )
    cpu = [r["cpu_us"] / 1e3 for r in res.commit_cpu.get("postgres", [])]
    if cpu:
        med = statistics.median(cpu)
        out.append(
            f"- PostgreSQL client CPU per commit (duragent's process, one commit after "
            f"another; see 'CPU per commit'): {fmt(cpu, 3)} ms (goal ≤ "
            f"{GOAL_PG_CPU_PER_COMMIT_MS} ms) — {_verdict(med <= GOAL_PG_CPU_PER_COMMIT_MS)}."
        )
    one, four = res.pg_workers.get(1), res.pg_workers.get(4)
    if one and four:
        ratio = statistics.median(r["rounds_per_s"] for r in four) / statistics.median(
            r["rounds_per_s"] for r in one
        )
        line = (
            f"- PostgreSQL, 4 worker processes vs 1: {ratio:.2f}× the rounds/s (goal ≥ "
            f"{GOAL_PG_WORKERS_SCALE:.0f}×) — {_verdict(ratio >= GOAL_PG_WORKERS_SCALE)}."
        )
        measured = [r for r in four if r["ceiling"]]  # see pg_workers_table
        if measured:
            most = statistics.median(r["ceiling"] for r in measured) / statistics.median(
                r["rounds_per_s"] for r in one
            )
            reached = statistics.median(100 * r["rounds_per_s"] / r["ceiling"] for r in measured)
            line += (
                f" At the CPU per round measured (workers and server together), this "
                f"machine's {os.cpu_count()} cores allow at most {most:.2f}× one worker's "
                f"rate; 4 workers reach {reached:.0f}% of that ceiling."
            )
        out.append(line)
    full = overhead(res, "duragent/sqlite-full")
    if full:
        med = statistics.median(full)
        out.append(
            f"- SQLite FULL persistence overhead per round: {fmt(full)} ms "
            f"(goal ≤ {GOAL_FULL_OVERHEAD_MS} ms) — {_verdict(med <= GOAL_FULL_OVERHEAD_MS)}."
        )
        first = _values(res, "duragent/sqlite-full", "ms_first50")
        last = _values(res, "duragent/sqlite-full", "ms_last50")
        if first and last:
            out.append(
                f"- Flat as history grows (FULL): rounds 1–50 {fmt(first)} ms, last 50 rounds "
                f"{fmt(last)} ms."
            )
    py = [r["python_us"] for r in res.commit_cpu.get("sqlite-normal", [])]
    if py:
        med = statistics.median(py)
        out.append(
            f"- Python per commit, SQLite NORMAL (process CPU per commit minus the CPU "
            f"inside SQLite's calls; see 'CPU per commit'): {fmt(py, 0)} µs (goal ≤ "
            f"{GOAL_PY_PER_COMMIT_US:.0f} µs) — {_verdict(med <= GOAL_PY_PER_COMMIT_US)}."
        )
    runs = res.concurrent.get("duragent/sqlite-full")
    if runs:
        rps = [r["rounds_per_s"] for r in runs]
        out.append(
            f"- {res.settings.concurrent_tasks} concurrent tasks at FULL: {fmt(rps, 0)} rounds/s "
            f"(goal ≥ {GOAL_CONCURRENT_ROUNDS:.0f}) — "
            f"{_verdict(statistics.median(rps) >= GOAL_CONCURRENT_ROUNDS)}; "
            f"{fmt([r['commits_per_tx'] for r in runs], 1)} commits per fsync; "
            f"CPU-bound: {fmt([r['cpu_ms_per_round'] for r in runs], 3)} ms of process "
            f"CPU per round, so one core allows "
            f"{fmt([1e3 / r['cpu_ms_per_round'] for r in runs], 0)} rounds/s; "
            f"{fmt([100 * r['gc_share'] for r in runs], 0, '%')} of the time in the "
            "garbage collector."
        )
    for key, goal in GOAL_RESUME_MS.items():
        got = res.resume.get(key)
        if got:
            med = statistics.median(r["resume_ms"] for r in got)
            out.append(
                f"- Resume of {res.settings.resume_entries:,} entries, {BY_KEY[key].store}: "
                f"{fmt([r['resume_ms'] for r in got], 1)} ms (goal ≤ {goal:.0f} ms) — "
                f"{_verdict(med <= goal)}."
            )
    raw = res.storage.get("raw", {})
    for key, goal in GOAL_STORAGE_RATIO.items():
        stored = res.storage.get(key)
        if stored:
            ratios = [stored[n] / raw[n] for n in stored if n in raw]
            last = ratios[-1]
            out.append(
                f"- Storage, {BY_KEY[key].store}: {', '.join(f'{r:.2f}×' for r in ratios)} raw "
                f"(goal at the largest size ≤ {goal}×) — {_verdict(last <= goal)}."
            )
    if "duragent/sqlite-full" in res.streaming:
        out.append(
            "- Streaming model (0.3 s answers, progress every 0.1 s): see the table above "
            "(reported, no goal)."
        )
    bare = res.rounds.get("duragent/none")
    if bare:
        for key in ("duragent/memory", "duragent/sqlite-full", "duragent/postgres"):
            vs = _paired(res, key, "duragent/none", "ms_per_round", lambda x, y: x - y)
            if vs:
                out.append(
                    f"- duragent {BY_KEY[key].store} over the bare loop (same run): "
                    f"{fmt(vs)} ms/round."
                )
    for config in ("sqlite-normal", "sqlite-full", "postgres"):
        after, before = f"duragent/{config}", f"before/{config}"
        if before in res.rounds and after in res.rounds:
            out.append(
                f"- Before/after, same run, {BY_KEY[after].store}: persistence overhead "
                f"{fmt(overhead(res, before))} → {fmt(overhead(res, after))} ms/round; process "
                f"CPU {fmt(_values(res, before, 'cpu_ms_per_round'))} → "
                f"{fmt(_values(res, after, 'cpu_ms_per_round'))} ms/round."
            )
    if "before/sqlite-full" in res.concurrent and "duragent/sqlite-full" in res.concurrent:
        b, a = res.concurrent["before/sqlite-full"], res.concurrent["duragent/sqlite-full"]
        out.append(
            f"- Before/after, same run, {res.settings.concurrent_tasks} tasks at FULL: "
            f"{fmt([r['rounds_per_s'] for r in b], 0)} → {fmt([r['rounds_per_s'] for r in a], 0)}"
            " rounds/s."
        )
    for label, key in (("LangGraph", "langgraph/sqlite"), ("DBOS", "dbos/sqlite")):
        v = _values(res, key, "ms_per_round")
        if v:
            out.append(
                f"- {label} on SQLite: {fmt(v)} ms/round (earlier measurement: "
                f"{PREVIOUS[label]} ms/round)."
            )
    return out


def machine_section(res: Results) -> str:
    m = res.machine
    pk = ", ".join(f"{k} {v}" for k, v in m.get("packages", {}).items())
    load0 = " ".join(f"{x:.2f}" for x in m.get("loadavg", ()))
    load1 = " ".join(f"{x:.2f}" for x in m.get("loadavg_end", ()))
    return "\n".join(
        [
            f"- CPU: {m.get('cpu')} — {m.get('cores')} cores; RAM {m.get('ram_gb')} GB; "
            f"{m.get('os')}",
            f"- Python {m.get('python')}; disk: {m.get('filesystem')}",
            f"- duragent source measured: {m.get('revision')}",
            f"- {m.get('postgres')}",
            f"- Packages: {pk}",
            f"- Load average at start: {load0}; at end: {load1} (a shared machine: other "
            "jobs ran during the benchmark)",
        ]
    )


def _spreads(res: Results) -> str:
    """The relative spread (max−min)/median of each timed row: the machine's noise."""
    parts = []
    for s in ROUND_SYSTEMS:
        v = _values(res, s.key, "ms_per_round")
        if len(v) > 1:
            med, lo, hi = spread(v)
            parts.append(f"{s.label} {s.config} ±{(hi - lo) / med * 50:.0f}%")
    return ", ".join(parts)


def compaction_table(res: Results) -> str:
    rows = [
        "| task | ms per round | resume ms | view messages | entries | compactions "
        "| largest request (tokens) |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for label, name in (("windowed", "16k-token window"), ("whole", "no window")):
        runs = [r[label] for r in res.compaction]
        last = runs[-1]
        rows.append(
            f"| {name} | {fmt([r['ms_per_round'] for r in runs])} "
            f"| {fmt([r['resume_ms'] for r in runs])} | {last['view_messages']:,} "
            f"| {last['entries']:,} | {last['compactions']} "
            f"| {max(r['max_request_tokens'] for r in runs):,} |"
        )
    return "\n".join(rows)


def render(res: Results, command: str, started: str, elapsed: float, only: list[str]) -> str:
    st = res.settings
    out = [
        "# duragent benchmarks",
        "",
        f"Command: `{command}`  ",
        f"Run at {started}; took {elapsed / 60:.1f} min."
        + (f" Only: {', '.join(only)}." if only else ""),
        "",
        "Every figure is the median of several runs with the min–max in parentheses; "
        "ratios are taken between measurements of the same run (interleaved, each in a "
        "fresh process). The model and the tools answer instantly, so what is measured is "
        "the cost of making each step durable.",
        "",
        "## Machine",
        "",
        machine_section(res),
        "",
        "### How fast this disk makes a write durable",
        "",
        fsync_table(res),
        "",
    ]
    if res.rounds:
        out += [
            f"## Per-round overhead: one task of {st.rounds} rounds ({st.runs} runs × "
            f"{st.repeats} tasks)",
            "",
            "A round = one assistant message with one tool call + one tool result, each "
            "durable before anything depends on it (duragent: 2 commits per round; the "
            "tool result's commit may still be syncing while the next model call starts, "
            "and the answer's commit follows it, in the same transaction when the model "
            "answers at once; no tool runs before both are durable. LangGraph: a "
            'checkpoint after the agent node and after the tool node, `durability="sync"`; '
            "DBOS: one step per model call and per tool call). Persistence overhead = the "
            "same loop minus its in-memory run (same system, same run). A run is one fresh "
            f"process running {st.repeats} task(s) one after another; its figure is their "
            "median; the table shows the median (min–max) over runs. duragent learns of the "
            "task's end from the status hook (no polling observer).",
            "",
            rounds_table(res),
            "",
            f"Spread of ms/round across runs (±half the min–max range): {_spreads(res)}.",
            "",
        ]
    if res.storage:
        out += [
            "## Storage growth",
            "",
            "Bytes in the store after N rounds: SQLite db + WAL files after "
            "`wal_checkpoint(TRUNCATE)` (DBOS: db + rollback journal); PostgreSQL: "
            "`pg_total_relation_size` of every table of the store's schema (heap, TOAST, "
            "indexes). Raw = Σ len(json.dumps(message)) of the OpenAI-format messages. The "
            "last column is what the later rounds added, over their messages' raw growth: the "
            "cost of each further round, without the tables' and indexes' first pages (which "
            "the figures after N rounds include; the target is on those).",
            "",
            storage_table(res),
            "",
        ]
    if res.resume:
        out += [f"## Resume latency ({st.resume_runs} runs)", "", resume_table(res), ""]
    if res.compaction:
        out += [
            f"## A {st.compaction_rounds:,}-round task through a 16k-token window "
            f"({len(res.compaction)} runs, SQLite)",
            "",
            "One task of tool rounds (each result ~1,500 characters) with compaction "
            "(`ContextPolicy(window=16_000)`; the summariser is a ScriptedModel too), and the "
            "same task with compaction off and no window, in the same run. Per round: wall "
            "time over the task; resume: `Recovery.start` on the finished task (its model "
            "view and last round), median of 5; the compacted task reads its view from its "
            "last compaction on.",
            "",
            compaction_table(res),
            "",
        ]
    if res.concurrent:
        out += [
            f"## Many concurrent tasks ({st.concurrent_runs} runs)",
            "",
            f"{st.concurrent_tasks} tasks at once in one process at FULL durability. duragent: "
            "one Runtime with concurrency="
            f"{st.concurrent_tasks}; every store write (create, claim, round commits, "
            "completion) counts as a commit; each transaction the store runs ends in one WAL "
            "fsync, so commits per fsync = the store's `jobs_done` / `batches` (counted by the "
            "store, stable from run to run) and fsyncs/s = `batches` / elapsed. Share of the "
            "disk's FULL rate = fsyncs/s ÷ the single-row SQLite WAL FULL transaction rate "
            "measured right after each run (how much of the disk's sync capacity was used). "
            "LangGraph: the same number of threads `ainvoke`d together on one AsyncSqliteSaver "
            "(half the rounds per thread). Process CPU per round: user + system time of the "
            "process (event loop and writer thread) ÷ rounds; Python runs on one core at a "
            "time, so one core's ceiling = 1,000 ÷ that is the most rounds/s this process "
            "could give. In the garbage collector: the share of the wall time spent in "
            "Python's cyclic collections (timed with `gc.callbacks`).",
            "",
            concurrent_table(res),
            "",
        ]
    if res.streaming:
        out += [
            f"## A streaming model ({st.streaming_runs} runs × {st.streaming_rounds} rounds)",
            "",
            "The model streams each answer in 12 text deltas 25 ms apart (0.3 s), then the "
            "tool call; progress is committed at most every 0.1 s (`progress_interval`), so a "
            "round makes ~3 progress commits + the assistant commit + the result commit.",
            "",
            streaming_table(res),
            "",
        ]
    if res.pg_workers:
        out += [
            "## PostgreSQL worker processes",
            "",
            "`duragent worker` processes sharing one schema (bench/pg_workers.py: 400 tasks × "
            "5 tool rounds + a final answer, zero-latency model and tool, concurrency 32 per "
            "worker). Rounds/s from the store's own timestamps; worker CPU = user + system "
            "time of the worker processes from the tasks' creation to the last completion; "
            "server CPU = the same of every PostgreSQL server process over that span. "
            f"The machine has {os.cpu_count()} cores, shared with the PostgreSQL server: "
            "the cores' ceiling is cores × 1,000 ÷ CPU per round (ms), the rounds/s they "
            "could give if nothing but CPU limited them.",
            "",
            pg_workers_table(res),
            "",
        ]
    if res.commit_cpu:
        out += [
            f"## CPU per commit ({st.commit_cpu_runs} runs × {st.commit_cpu_commits:,} commits)",
            "",
            "bench/commit_cpu.py: a claimed task takes one commit after another, each one "
            "entry and a task patch, fenced by its lease (what a round's model-message commit "
            "writes). Process CPU = user + system time of the process per commit. On SQLite "
            "the CPU inside the writer connection's `execute`/`executemany` calls is measured "
            "too (SQLite's C code and the kernel's work for its writes; a wait for the disk "
            "is not CPU), in a second pass of as many commits, since the clock reads around "
            "each call cost CPU of their own (what an empty timed interval measures is taken "
            "off each call's); the rest is duragent's Python, an upper bound "
            "(the event loop counts in it). On PostgreSQL the server runs "
            "in other processes: the process CPU is the client's alone.",
            "",
            commit_cpu_table(res),
            "",
        ]
    if res.failover:
        out += [
            "## Failover",
            "",
            "A worker process runs a long task (20 ms tool per round) on SQLite; a standby "
            "worker process waits on the same store. The owner is SIGKILLed at a random "
            "moment within a heartbeat period; the figure is the standby's takeover commit "
            "time minus the kill time.",
            "",
            failover_table(res),
            "",
        ]
    out += ["## Targets", "", *targets(res), ""]
    if res.errors:
        out += ["## Errors", "", *[f"- {e}" for e in res.errors], ""]
    out += [
        "## Time per workload",
        "",
        ", ".join(f"{k} {v:.0f} s" for k, v in res.seconds.items()),
        "",
    ]
    return "\n".join(out)
