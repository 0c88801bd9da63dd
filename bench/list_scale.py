"""Listing and counting as the store grows (issue 43, item 5).

    python -m bench.list_scale [--sizes 0,10000,100000,1000000] [--reps 15]
                               [--stores sqlite,postgres] [--out FILE]

One store of each kind grows through `sizes` tasks, built by direct batched
inserts of rows in the store's own format (the columns `insert_task` writes, the
kept counts maintained by the store's own triggers as the rows go in), in a
scratch SQLite file and a scratch PostgreSQL schema, both removed afterwards.
At each size, through the store's API: a page of 50 under several filters, a
page deep in the list through a cursor, counts, `GET /v1/counts` through the
app (in process), and paging through every waiting task. Each figure is the
median (min–max) of `reps` timings, in ms. At the largest size the query plans
are printed (EXPLAIN), to show each read is served by an index.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.common import PG_URL, drop_schema, fmt, new_schema

OWNERS, AGENTS, BATCH = 100, 5, 1000  # tasks share a `batch` label value per BATCH
# One task in 100 of each status but the last: 80% of tasks are completed.
STATUSES = ["pending"] * 10 + ["running"] * 2 + ["waiting"] * 3 + ["failed"] * 5
BASE = datetime(2026, 1, 1, tzinfo=UTC)
TOKEN = "list-scale-token-0123456789abcdef"


def status_of(i: int) -> str:
    return STATUSES[i % 100] if i % 100 < len(STATUSES) else "completed"


def make_task(i: int) -> Any:
    from duragent.types import Task, TaskStatus

    status = TaskStatus(status_of(i))
    at = BASE + timedelta(seconds=i)
    return Task(
        agent=f"agent{i % AGENTS}",
        owner=f"user{i % OWNERS}",
        status=status,
        status_reason="tool" if status is TaskStatus.WAITING else None,
        created_at=at,
        updated_at=at,
        metadata={"batch": f"b{i // BATCH}"},
        input={"n": i},
    )


def batches(start: int, stop: int, size: int = 5000) -> Iterator[list[Any]]:
    for lo in range(start, stop, size):
        yield [make_task(i) for i in range(lo, min(stop, lo + size))]


# --- building the stores: rows as `insert_task` writes them --------------------


def sqlite_insert(path: str, tasks: list[Any], first_num: int) -> None:
    import sqlite3

    from duragent.store._codec import dumps, to_ts
    from duragent.store._sqlite_tx import label_value
    from duragent.store._tx import task_columns

    rows, labels = [], []
    for k, task in enumerate(tasks):
        cols = task_columns(task, to_ts, created=True)
        cols.update(num=first_num + k, input=dumps(task.input), metadata=dumps(task.metadata))
        rows.append(cols)
        labels += [
            (key, label_value(v), cols["created_at"], first_num + k)
            for key, v in task.metadata.items()
        ]
    names = list(rows[0])
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    conn.executemany(
        f"INSERT INTO tasks ({', '.join(names)}) VALUES ({', '.join(':' + n for n in names)})",
        rows,
    )
    conn.executemany(
        "INSERT INTO task_labels (key, value, task_created, task_num) VALUES (?, ?, ?, ?)", labels
    )
    conn.execute("COMMIT")
    conn.close()


def pg_insert(schema: str, tasks: list[Any]) -> None:
    import psycopg
    from psycopg import sql

    from duragent.store._codec import dumps
    from duragent.store._tx import task_columns

    rows = []
    for task in tasks:
        cols = task_columns(task, lambda v: v, created=True)
        cols.update(input=dumps(task.input), metadata=dumps(task.metadata))
        rows.append(cols)
    names = list(rows[0])
    with psycopg.connect(PG_URL) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        copy = sql.SQL("COPY tasks ({}) FROM STDIN").format(
            sql.SQL(", ").join(map(sql.Identifier, names))
        )
        with conn.cursor().copy(copy) as cp:
            for r in rows:
                cp.write_row([r[n] for n in names])


# --- what is measured ---------------------------------------------------------


@dataclass
class Probe:
    name: str
    run: Callable[[], Awaitable[Any]]


def probes(store: Any, client: Any, n: int, deep_cursor: str | None) -> list[Probe]:
    from duragent.store import TaskQuery
    from duragent.types import TaskStatus

    mid = max(n // 2, 0)
    window = BASE + timedelta(seconds=mid)

    def page(**kw: Any) -> Callable[[], Awaitable[Any]]:
        return lambda: store.list_tasks(TaskQuery(limit=50, **kw))

    out = [
        Probe("page of 50, no filter", page()),
        Probe("page of 50, status=pending", page(status=TaskStatus.PENDING)),
        Probe("page of 50, owner + status=pending", page(owner="user7", status=TaskStatus.PENDING)),
        Probe("page of 50, agent", page(agent="agent3")),
        Probe(
            "page of 50, queue + status=waiting", page(queue="agent2", status=TaskStatus.WAITING)
        ),
        Probe("page of 50, metadata batch=…", page(metadata={"batch": f"b{mid // BATCH}"})),
        Probe(
            "page of 50, created in a 1 h window",
            page(created_after=window, created_before=window + timedelta(hours=1)),
        ),
        Probe(
            "page of 50 via cursor, mid-list", page(status=TaskStatus.COMPLETED, cursor=deep_cursor)
        ),
        Probe("counts(), every task", lambda: store.count_tasks(TaskQuery())),
        Probe("counts(owner)", lambda: store.count_tasks(TaskQuery(owner="user7"))),
        Probe("REST GET /v1/counts", lambda: rest_counts(client)),
    ]
    return out


async def rest_counts(client: Any) -> Any:
    r = await client.get("/v1/counts", headers={"Authorization": f"Bearer {TOKEN}"})
    r.raise_for_status()
    return r.json()


async def page_all_waiting(store: Any) -> int:
    """Every waiting task, page after page of 50: how many."""
    from duragent.store import TaskQuery
    from duragent.types import TaskStatus

    seen, cursor = 0, None
    while True:
        got = await store.list_tasks(TaskQuery(limit=50, status=TaskStatus.WAITING, cursor=cursor))
        seen += len(got.tasks)
        if (cursor := got.next_cursor) is None:
            return seen


async def timed(fn: Callable[[], Awaitable[Any]], reps: int) -> list[float]:
    await fn()  # warm: caches, prepared statements
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        await fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


async def deep_cursor(store: Any, n: int) -> str | None:
    """A cursor at the completed task made halfway through the store's life."""
    from duragent.store import TaskQuery
    from duragent.store._codec import encode_cursor

    i = n // 2 - (n // 2) % 100 + 50  # a completed one (see status_of)
    if i >= n:
        return None
    at = BASE + timedelta(seconds=i)
    page = await store.list_tasks(
        TaskQuery(limit=1, created_after=at, created_before=at + timedelta(seconds=1))
    )
    return encode_cursor(page.tasks[0]) if page.tasks else None


async def measure(url: str, n: int, reps: int) -> dict[str, list[float]]:
    import httpx

    from duragent import Runtime
    from duragent.server import TokenStore, create_app

    async with Runtime(url, [], run_worker=False) as rt:
        app = create_app(rt, TokenStore([("user7", TOKEN)]))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            cursor = await deep_cursor(rt.store, n)
            out = {}
            for p in probes(rt.store, client, n, cursor):
                out[p.name] = await timed(p.run, reps)
            waiting = await page_all_waiting(rt.store)
            out[f"every waiting task, pages of 50 ({waiting:,} tasks), total"] = await timed(
                lambda: page_all_waiting(rt.store), max(3, reps // 5)
            )
    return out


# --- query plans ----------------------------------------------------------------


def sqlite_plans(path: str) -> list[str]:
    import sqlite3

    from duragent.store._sqlite_queries import list_sql

    conn = sqlite3.connect(path)
    out = []
    for label, q in plan_queries():
        text, params = list_sql(q)
        plan = conn.execute("EXPLAIN QUERY PLAN " + text, params).fetchall()
        out.append(f"{label}: " + "; ".join(r[3] for r in plan))
    conn.close()
    return out


def pg_plans(schema: str) -> list[str]:
    import psycopg
    from psycopg import sql

    from duragent.store._postgres_queries import task_filters

    out = []
    with psycopg.connect(PG_URL) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        for label, q in plan_queries():
            where, params = task_filters(q)
            text = "SELECT data, input FROM tasks"
            text += (" WHERE " + " AND ".join(where)) if where else ""
            text += " ORDER BY created_at DESC, id DESC LIMIT 51"
            rows = conn.execute("EXPLAIN " + text, params).fetchall()
            nodes = [r[0].strip().split("  (")[0].lstrip("-> ") for r in rows]
            out.append(f"{label}: " + " / ".join(x for x in nodes if x))
    return out


def plan_queries() -> list[tuple[str, Any]]:
    from duragent.store._commits import TaskQuery
    from duragent.types import TaskStatus

    mid = BASE + timedelta(days=5)
    return [
        ("no filter", TaskQuery()),
        ("status", TaskQuery(status=TaskStatus.PENDING)),
        ("owner+status", TaskQuery(owner="user7", status=TaskStatus.PENDING)),
        ("agent", TaskQuery(agent="agent3")),
        ("queue+status", TaskQuery(queue="agent2", status=TaskStatus.WAITING)),
        ("metadata", TaskQuery(metadata={"batch": "b500"})),
        ("created range", TaskQuery(created_after=mid, created_before=mid + timedelta(hours=1))),
    ]


# --- the run ----------------------------------------------------------------------


async def run_store(
    kind: str, sizes: list[int], reps: int, workdir: str
) -> dict[int, dict[str, list[float]]]:
    from duragent.store import open_store

    schema = new_schema("bench_list") if kind == "postgres" else ""
    path = f"{workdir}/list.db"
    url = f"{PG_URL}?schema={schema}" if kind == "postgres" else f"sqlite:///{path}"
    store = open_store(url)
    await store.open()  # creates and migrates
    await store.close()
    results: dict[int, dict[str, list[float]]] = {}
    built = 0
    try:
        for size in sizes:
            t0 = time.perf_counter()
            for tasks in batches(built, size):
                if kind == "postgres":
                    pg_insert(schema, tasks)
                else:
                    sqlite_insert(path, tasks, built + 1)
                built += len(tasks)
            if kind == "postgres":
                analyze(schema)
            print(f"{kind}: {size:,} tasks (built in {time.perf_counter() - t0:.0f} s)", flush=True)
            results[size] = await measure(url, size, reps)
            for name, ms in results[size].items():
                print(f"  {name}: {fmt(ms)} ms", flush=True)
        plans = pg_plans(schema) if kind == "postgres" else sqlite_plans(path)
        print(f"{kind} plans at {built:,} tasks:\n  " + "\n  ".join(plans), flush=True)
    finally:
        if kind == "postgres":
            drop_schema(schema)
    return results


def analyze(schema: str) -> None:
    """What autovacuum does after a bulk load, done at once."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        for table in ("tasks", "task_counts"):
            name = sql.Identifier(schema, table)
            conn.execute(sql.SQL("VACUUM ANALYZE {}").format(name))


def table(results: dict[str, dict[int, dict[str, list[float]]]], sizes: list[int]) -> str:
    head = "| store | read | " + " | ".join(f"{s:,} tasks" for s in sizes) + " |"
    lines = [head, "| --- | --- |" + " ---: |" * len(sizes)]
    for kind, by_size in results.items():
        names = list(by_size[sizes[-1]])
        for name in names:
            cells = []
            for s in sizes:
                got = {k.split(" (")[0]: v for k, v in by_size[s].items()}
                cells.append(fmt(got.get(name.split(" (")[0]), 2))
            lines.append(f"| {kind} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.list_scale", description=__doc__)
    ap.add_argument("--sizes", default="0,10000,100000,1000000")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--stores", default="sqlite,postgres")
    ap.add_argument("--out", type=Path, default=None, help="where to write the markdown table")
    args = ap.parse_args(argv)
    sizes = sorted(int(s) for s in args.sizes.split(","))
    workdir = tempfile.mkdtemp(prefix="list_scale_")
    results = {}
    try:
        for kind in args.stores.split(","):
            results[kind] = asyncio.run(run_store(kind, sizes, args.reps, workdir))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    text = table(results, sizes)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
