"""Markdown tables of a bench run, and the RESULTS.md around them."""

from __future__ import annotations

import statistics
from typing import Any

from bench.common import fmt, human_bytes, spread
from bench.suite import BY_KEY, CONCURRENT_KEYS, RESUME_KEYS, ROUND_SYSTEMS, STORAGE_KEYS, Results

GOAL_OVERHEAD_MS = 0.6
GOAL_STORAGE_RATIO = 1.5
GOAL_RESUME_MS = 20.0
GOAL_GROUP_COMMIT = 5.0
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
        "| persistence overhead ms/round | time vs duragent (same run) |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for s in ROUND_SYSTEMS:
        if s.key in res.unavailable:
            lines.append(f"| {s.label} | {s.store} | n/a | | | | {res.unavailable[s.key]} |")
            continue
        if s.key not in res.rounds:
            lines.append(f"| {s.label} | {s.store} | failed | | | | see errors |")
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
            f"| {fmt(over) if over else '—'} | {ratio} |"
        )
    return "\n".join(lines)


def storage_table(res: Results) -> str:
    sizes = [str(n) for n in res.settings.storage_rounds]
    raw = res.storage.get("raw", {})
    head = " | ".join(f"after {int(n):,} rounds" for n in sizes)
    lines = [f"| system | store | {head} |", "| --- | --- |" + " ---: |" * len(sizes)]
    lines.append(
        "| raw message JSON | Σ len(json.dumps(m)) | "
        + " | ".join(human_bytes(raw.get(n, 0)) for n in sizes)
        + " |"
    )
    for key in STORAGE_KEYS:
        s = BY_KEY[key]
        if key in res.unavailable:
            lines.append(f"| {s.label} | {s.store} |" + " n/a |" * len(sizes))
            continue
        got = res.storage.get(key)
        if not got:
            lines.append(f"| {s.label} | {s.store} |" + " failed |" * len(sizes))
            continue
        cells = []
        for n in sizes:
            b = got.get(n)
            cells.append(f"{human_bytes(b)} ({b / raw[n]:.1f}× raw)" if b else "—")
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
        store = "SQLite WAL" if key == "duragent/sqlite-normal" else s.store
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
            if s.system == "duragent"
            else f"{msgs:,} messages (same conversation)"
        )
        view = fmt([r["view_ms"] for r in runs], 1) if "view_ms" in runs[0] else "—"
        lines.append(
            f"| {s.label} | {store} | {history} | {fmt([r['resume_ms'] for r in runs], 1)} "
            f"| {view} |"
        )
    lines.append("")
    lines.append(
        f"duragent: a fresh store object, `get_task`, then `TaskRunner._start()` (model view of "
        f"{e:,} entries + the last round's entries + the recovery decision). LangGraph: a "
        "fresh checkpointer connection, compile the graph, `aget_state`. Each figure is the "
        "median of repeated reopenings within a run; the table shows the median (min–max) "
        "over runs."
    )
    return "\n".join(lines)


def concurrent_table(res: Results) -> str:
    st = res.settings
    lines = [
        "| system | store | tasks × rounds | commits/s | rounds/s | commits per transaction "
        "| raw SQLite FULL tx/s (same run) | commits/s ÷ raw |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for key in CONCURRENT_KEYS:
        s = BY_KEY[key]
        runs = res.concurrent.get(key, [])
        if not runs:
            lines.append(f"| {s.label} | {s.store} | | failed | | | | |")
            continue
        raw = [r["fsync"]["sqlite_wal_full_tx"] for r in runs]
        rounds = runs[0].get("rounds", st.concurrent_rounds // 2)
        if "commits_per_s" in runs[0]:
            cps = [r["commits_per_s"] for r in runs]
            per_tx = fmt([r["commits_per_tx"] for r in runs], 1)
            vs_raw = fmt([r["commits_per_s"] / r["fsync"]["sqlite_wal_full_tx"] for r in runs], 2)
            commits = fmt(cps, 0)
        else:
            per_tx, vs_raw, commits = "1 (one per checkpoint)", "—", "—"
        lines.append(
            f"| {s.label} | {s.store} | {st.concurrent_tasks} × {rounds} | {commits} "
            f"| {fmt([r['rounds_per_s'] for r in runs], 0)} | {per_tx} | {fmt(raw, 0)} "
            f"| {vs_raw} |"
        )
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


def targets(res: Results) -> list[str]:
    out = []
    full = overhead(res, "duragent/sqlite-full")
    if full:
        med = statistics.median(full)
        out.append(
            f"- Persistence overhead per round at FULL: {fmt(full)} ms "
            f"(goal < {GOAL_OVERHEAD_MS} ms) — {'met' if med < GOAL_OVERHEAD_MS else 'MISSED'}."
        )
        first = _values(res, "duragent/sqlite-full", "ms_first50")
        last = _values(res, "duragent/sqlite-full", "ms_last50")
        if first and last:
            out.append(
                f"- Flat as history grows (FULL): rounds 1–50 {fmt(first)} ms, last 50 rounds "
                f"{fmt(last)} ms."
            )
    for label, key in (("LangGraph", "langgraph/sqlite"), ("DBOS", "dbos/sqlite")):
        v = _values(res, key, "ms_per_round")
        if v:
            out.append(
                f"- {label} on SQLite: {fmt(v)} ms/round (earlier measurement: "
                f"{PREVIOUS[label]} ms/round)."
            )
    raw = res.storage.get("raw", {})
    for key in ("duragent/sqlite-normal", "duragent/postgres"):
        got = res.storage.get(key)
        if got:
            ratios = [got[n] / raw[n] for n in got if n in raw]
            worst = max(ratios)
            out.append(
                f"- Storage, {BY_KEY[key].store}: {', '.join(f'{r:.2f}×' for r in ratios)} raw "
                f"(goal within {GOAL_STORAGE_RATIO}×) — "
                f"{'met' if worst <= GOAL_STORAGE_RATIO else 'MISSED'}."
            )
    runs = res.resume.get("duragent/sqlite-normal")
    if runs:
        med = statistics.median(r["resume_ms"] for r in runs)
        out.append(
            f"- Resume of {res.settings.resume_entries:,} entries: "
            f"{fmt([r['resume_ms'] for r in runs], 1)} ms (goal < {GOAL_RESUME_MS:.0f} ms) — "
            f"{'met' if med < GOAL_RESUME_MS else 'MISSED'}."
        )
    runs = res.concurrent.get("duragent/sqlite-full")
    if runs:
        ratios = [r["commits_per_s"] / r["fsync"]["sqlite_wal_full_tx"] for r in runs]
        med = statistics.median(ratios)
        out.append(
            f"- Group commit: {fmt(ratios, 2)}× the raw FULL transaction rate (goal ≥ "
            f"{GOAL_GROUP_COMMIT:.0f}×) — {'met' if med >= GOAL_GROUP_COMMIT else 'MISSED'}."
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
            "durable before the next step (duragent: 2 commits per round; LangGraph: a "
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
            "indexes). Raw = Σ len(json.dumps(message)) of the OpenAI-format messages.",
            "",
            storage_table(res),
            "",
        ]
    if res.resume:
        out += [f"## Resume latency ({st.resume_runs} runs)", "", resume_table(res), ""]
    if res.concurrent:
        out += [
            f"## Many concurrent tasks ({st.concurrent_runs} runs)",
            "",
            f"{st.concurrent_tasks} tasks at once in one process at FULL durability. duragent: "
            "one Runtime with concurrency="
            f"{st.concurrent_tasks}; every store write (create, claim, round commits, "
            "completion) counts as a commit; commits per transaction = the store's `jobs_done`"
            " / `batches`. LangGraph: the same number of threads `ainvoke`d together on one "
            "AsyncSqliteSaver (half the rounds per thread). Raw = the single-row SQLite WAL "
            "FULL transaction rate measured right after each run.",
            "",
            concurrent_table(res),
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
