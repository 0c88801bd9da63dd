"""How long a fork of a long task takes (issue 13: target ≤ 50 ms for 10,000 entries on SQLite).

    python -m bench.fork [--entries 10000] [--runs 7] [--postgres]

The source task has rounds of (assistant message with one tool call, intent,
result); a fork at its last round copies every API entry of it. Timed end to
end through `Runtime.fork`, with its two parts also timed apart: the plan
(read the source's rollback markers, and its entry heads for an edit that
voids a copied message; build the fork's log)
and the commit (`Store.create_fork`: the new task, its own entries, and the
copy of the source's entries made inside the store, payloads never read into
Python). Prints median and min-max of the runs, and the payload bytes the
fork's rows hold against its source's (a copied entry references its source's
payload: near 0%).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import statistics
import tempfile
import time
from contextlib import closing

import psycopg
from psycopg import sql

from bench.common import (
    PG_URL,
    assistant_text,
    call_id,
    postgres_unreachable,
    throwaway_schema,
    tool_args,
    tool_output,
)
from duragent import Runtime
from duragent.runtime._steering import Edit, fork_log
from duragent.store import open_store
from duragent.store._commits import CopyEntries
from duragent.types import EntryKind, NewEntry, Task


def source(entries: int) -> tuple[Task, list[NewEntry]]:
    rounds = (entries - 1) // 3
    task = Task(agent="bench", iterations=rounds)
    out = [
        NewEntry(
            task_id=task.id,
            kind=EntryKind.API_MESSAGE,
            round=1,
            payload={"role": "user", "content": "start"},
        )
    ]

    for r in range(1, rounds + 1):
        cid = call_id(r)
        call = {
            "id": cid,
            "type": "function",
            "function": {"name": "lookup", "arguments": json.dumps(tool_args(r))},
        }
        message = {"role": "assistant", "content": assistant_text(r), "tool_calls": [call]}
        intent = {"call_id": cid, "name": "lookup", "replay": "never"}
        result = {"role": "tool", "tool_call_id": cid, "content": tool_output(r), "outcome": "ok"}
        out += [
            NewEntry(task_id=task.id, kind=EntryKind.API_MESSAGE, round=r, payload=message),
            NewEntry(task_id=task.id, kind=EntryKind.TOOL_INTENT, round=r, payload=intent),
            NewEntry(task_id=task.id, kind=EntryKind.TOOL_RESULT, round=r, payload=result),
        ]
    return task, out


def payload_bytes(url: str, task_id: str) -> int:
    """The payload bytes a task's rows hold, read with SQL (references count 0)."""
    if url.startswith("sqlite"):
        with closing(sqlite3.connect(url.split("///", 1)[1].split("?")[0])) as conn:
            row = conn.execute(
                "SELECT coalesce(sum(length(payload)), 0) FROM entries"
                " WHERE eid >> 32 = (SELECT num FROM tasks WHERE id = ?)",
                (task_id,),
            ).fetchone()
    else:
        schema = url.split("schema=", 1)[1]
        with psycopg.connect(PG_URL) as conn:
            query = sql.SQL(
                "SELECT coalesce(sum(octet_length(payload)), 0) FROM {0}.entries"
                " WHERE eid >> 32 = (SELECT num FROM {0}.tasks WHERE id = %s)"
            ).format(sql.Identifier(schema))
            row = conn.execute(query, (task_id,)).fetchone()
    assert row is not None
    return int(row[0])


Result = tuple[float, float, float, int, float]


async def once(url: str, entries: int, edit: Edit | None) -> Result:
    store = open_store(url)
    await store.open()
    try:
        task, rows = source(entries)
        await store.create_task(task, rows)
        src = await store.get_task(task.id)
        rt = Runtime(store, run_worker=False)
        t0 = time.perf_counter()
        sub = await rt.fork(task.id, at_round=src.iterations, edit=edit)
        total = time.perf_counter() - t0
        t0 = time.perf_counter()
        log = await fork_log(store, src, "t_probe", src.iterations, edit)
        read = time.perf_counter() - t0
        t0 = time.perf_counter()
        probe, _ = await store.create_fork(
            Task(id="t_probe", agent="bench", iterations=src.iterations), log
        )
        write = time.perf_counter() - t0
        assert (await store.get_task(sub.task_id)).last_seq == probe.last_seq
        copied = sum(p.count or 0 for p in log if isinstance(p, CopyEntries))
        copied = copied or probe.last_seq - sum(1 for p in log if not isinstance(p, CopyEntries))
        share = payload_bytes(url, sub.task_id) / payload_bytes(url, task.id)
        return total * 1e3, read * 1e3, write * 1e3, copied, share
    finally:
        await store.close()


async def main(entries: int, runs: int, postgres: bool) -> None:
    print(f"fork of a {entries:,}-entry task at its last round (ms: median, min–max of {runs})")
    print(
        "| store | copied entries | fork total | plan | commit (copy in store)"
        " | fork's payload bytes / source's |"
    )
    print("| --- | ---: | --- | --- | --- | ---: |")
    # An edit that voids a copied message plans from the source's entry heads.
    edit = Edit(replace_last_user="start over")
    rows: list[tuple[str, str, Edit | None]] = [
        ("sqlite NORMAL", "sqlite:normal", None),
        ("sqlite FULL", "sqlite:full", None),
        ("sqlite NORMAL, replace_last_user", "sqlite:normal", edit),
    ]
    if postgres:
        if (why := postgres_unreachable()) is None:
            rows += [("postgres", "postgres", None)]
        else:
            print(f"postgres skipped: {why}")
    for label, kind, with_edit in rows:
        results = []
        for _ in range(runs):
            if kind == "postgres":
                with throwaway_schema("bench_fork") as schema:
                    results.append(await once(f"{PG_URL}?schema={schema}", entries, with_edit))
                continue
            with tempfile.TemporaryDirectory() as d:
                url = f"sqlite:///{d}/f.db?durability={kind.partition(':')[2]}"
                results.append(await once(url, entries, with_edit))
        cols = []
        for i in range(3):
            vals = [r[i] for r in results]
            cols.append(f"{statistics.median(vals):.1f} ({min(vals):.1f}–{max(vals):.1f})")
        share = f"{max(r[4] for r in results):.2%}"
        print(f"| {label} | {results[0][3]:,} | " + " | ".join(cols) + f" | {share} |")
    print(f"load average: {os.getloadavg()[0]:.1f} (1 min), cpus: {os.cpu_count()}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--postgres", action="store_true", help="also fork on PostgreSQL (PG_URL)")
    args = ap.parse_args()
    asyncio.run(main(args.entries, args.runs, args.postgres))
