"""What every benchmarked system shares: the scripted conversation, sizes, stats, Postgres.

Every system runs the same agent task: round r is one assistant message with
one tool call and one tool result, the model and the tool answer instantly
(zero latency), so what is measured is the cost of making each round durable.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import statistics
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repo: bench/..


def child_env() -> dict[str, str]:
    """Environment for `python -m bench.*` children, wherever the parent was started."""
    path = os.environ.get("PYTHONPATH", "")
    return {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": ROOT + (os.pathsep + path if path else ""),
    }


PG_URL = os.environ.get("DURAGENT_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
TOOL_NAME = "work"
USER_TEXT = "Run the benchmark task: call the work tool once per step until every step is done."


def assistant_text(r: int) -> str:
    return f"Step {r}: I will call the work tool to fetch and process the next batch of records."


def tool_args(r: int) -> dict[str, Any]:
    return {"n": r}


def tool_output(n: int) -> str:
    return f"batch {n} processed: 25 records read, 25 records written, 0 errors, checksum {n:08x}."


def final_text(rounds: int) -> str:
    return f"All {rounds} steps are done."


def call_id(r: int) -> str:
    return f"call_{r}"


def openai_messages(rounds: int) -> list[dict[str, Any]]:
    """The task's conversation in the OpenAI chat format: what a system must at least keep."""
    out: list[dict[str, Any]] = [{"role": "user", "content": USER_TEXT}]
    for r in range(1, rounds + 1):
        out.append(
            {
                "role": "assistant",
                "content": assistant_text(r),
                "tool_calls": [
                    {
                        "id": call_id(r),
                        "type": "function",
                        "function": {"name": TOOL_NAME, "arguments": json.dumps(tool_args(r))},
                    }
                ],
            }
        )
        out.append({"role": "tool", "tool_call_id": call_id(r), "content": tool_output(r)})
    out.append({"role": "assistant", "content": final_text(rounds)})
    return out


def raw_json_size(rounds: int) -> int:
    """Sum of len(json.dumps(message)) over the conversation's messages."""
    return sum(len(json.dumps(m)) for m in openai_messages(rounds))


@dataclass
class RoundClock:
    """Timestamps of each model call; call i+1 starts when round i is durably done."""

    stamps: list[float] = field(default_factory=list)
    hooks: dict[int, Callable[[], None]] = field(default_factory=dict)

    def tick(self) -> int:
        """Record a model call; returns how many rounds were complete before it."""
        done = len(self.stamps)
        hook = self.hooks.get(done)
        if hook is not None:
            hook()  # e.g. measure the store after `done` rounds (excluded from the timing)
        self.stamps.append(time.perf_counter())
        return done

    def summary(self) -> dict[str, float]:
        """ms per round overall, for rounds 1-50 and for the last 50 rounds."""
        s = self.stamps
        gaps = [b - a for a, b in itertools.pairwise(s)]
        n = len(gaps)
        out = {"rounds": n, "ms_per_round": (s[-1] - s[0]) / n * 1e3}
        if n >= 100:
            out["ms_first50"] = statistics.mean(gaps[:50]) * 1e3
            out["ms_last50"] = statistics.mean(gaps[-50:]) * 1e3
        return out


# --- numbers -----------------------------------------------------------------


def repeated(fn: Callable[[int], dict[str, Any]], repeats: int) -> dict[str, Any]:
    """Run a measurement `repeats` times in this process; the median of every number.

    Short bursts of load from other jobs on a shared machine hit one repeat, not
    the run's figure."""
    results = [fn(i) for i in range(repeats)]
    out = dict(results[0])
    for key, value in results[0].items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = statistics.median(r[key] for r in results)
    out["repeats"] = [r.get("ms_per_round") for r in results]
    return out


def spread(values: Sequence[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def fmt(values: Sequence[float] | None, digits: int = 2, unit: str = "") -> str:
    """`median (min–max)` of several runs."""
    if not values:
        return "n/a"
    med, lo, hi = spread(values)
    if len(values) == 1:
        return f"{med:.{digits}f}{unit}"
    return f"{med:.{digits}f}{unit} ({lo:.{digits}f}–{hi:.{digits}f})"


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


# --- files -------------------------------------------------------------------


def sqlite_bytes(path: str) -> int:
    """Size of a SQLite database after folding its WAL back in: db + wal (+ shm) files."""
    import sqlite3

    with contextlib.suppress(sqlite3.Error):
        conn = sqlite3.connect(path, timeout=30)
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            conn.close()
    return sum(
        os.path.getsize(p) for p in (path, path + "-wal", path + "-journal") if os.path.exists(p)
    )


def dir_bytes(path: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.path.getsize(os.path.join(root, f))
    return total


# --- Postgres ----------------------------------------------------------------


def postgres_unreachable(url: str = PG_URL) -> str | None:
    try:
        import psycopg
    except ImportError as exc:
        return f"psycopg is not installed ({exc}); pip install -e '.[postgres]'"
    try:
        psycopg.connect(url, connect_timeout=3).close()
    except psycopg.Error as exc:
        return f"PostgreSQL at {url} is unreachable: {str(exc).strip()}"
    return None


def new_schema(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def drop_schema(schema: str, url: str = PG_URL) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def create_schema(schema: str, url: str = PG_URL) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))


def schema_bytes(schema: str, url: str = PG_URL) -> int:
    """Heap + TOAST + indexes of every table in a schema (after VACUUM, so dead rows count)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT c.oid::regclass::text AS name FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relkind = 'r'",
            (schema,),
        ).fetchall()
        total = 0
        for (name,) in rows:
            size = conn.execute("SELECT pg_total_relation_size(%s::regclass)", (name,)).fetchone()
            assert size is not None
            total += size[0]
        return int(total)


@contextlib.contextmanager
def throwaway_schema(prefix: str, url: str = PG_URL) -> Iterator[str]:
    schema = new_schema(prefix)
    try:
        yield schema
    finally:
        with contextlib.suppress(Exception):
            drop_schema(schema, url)


def with_search_path(url: str, schema: str) -> str:
    """A libpq URL whose sessions use `schema` first (for libraries without a schema option)."""
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options=-csearch_path%3D{schema}"
