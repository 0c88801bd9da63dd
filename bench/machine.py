"""What machine the numbers come from, and how fast its disk makes data durable."""

from __future__ import annotations

import os
import platform
import sqlite3
import subprocess
import sys
import time
from importlib import metadata
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

PACKAGES = (
    "duragent",
    "pydantic",
    "langgraph",
    "langgraph-checkpoint",
    "langgraph-checkpoint-sqlite",
    "langgraph-checkpoint-postgres",
    "langchain-core",
    "aiosqlite",
    "dbos",
    "sqlalchemy",
    "psycopg",
)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _ram_gb() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / 1024 / 1024
    except OSError:
        pass
    return 0.0


def _filesystem(path: str) -> str:
    try:
        out = subprocess.run(
            ["df", "-T", path], capture_output=True, text=True, timeout=5, check=False
        ).stdout.splitlines()
        dev, fstype = out[1].split()[:2]
        return f"{fstype} on {dev}"
    except Exception:
        return "unknown"


def _show(conn: psycopg.Connection[tuple[Any, ...]], name: str) -> str:
    row = conn.execute(f"SHOW {name}").fetchone()
    assert row is not None, name
    return str(row[0])


def _postgres(url: str) -> str:
    try:
        import psycopg

        with psycopg.connect(url, connect_timeout=3) as conn:
            version, sync, fsync = (
                _show(conn, name) for name in ("server_version", "synchronous_commit", "fsync")
            )
            return f"PostgreSQL {version} (local, fsync={fsync}, synchronous_commit={sync})"
    except Exception as exc:
        return f"unreachable ({type(exc).__name__})"


def source_revision() -> str:
    """Which duragent was measured: DURAGENT_BENCH_REV, else the git commit of this tree."""
    if os.environ.get("DURAGENT_BENCH_REV"):
        return os.environ["DURAGENT_BENCH_REV"]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        rev = subprocess.run(
            ["git", "-C", root, "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", root, "status", "--porcelain", "src"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
    except Exception:
        return "unknown"
    return rev + (" + uncommitted changes in src/" if dirty else "")


def describe(workdir: str, pg_url: str) -> dict[str, Any]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    versions["sqlite (library)"] = sqlite3.sqlite_version
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count() or 0,
        "ram_gb": round(_ram_gb(), 1),
        "os": f"{platform.system()} {platform.release()}",
        "python": sys.version.split()[0],
        "filesystem": _filesystem(workdir),
        "postgres": _postgres(pg_url),
        "packages": versions,
        "revision": source_revision(),
        "loadavg": os.getloadavg(),
    }


# --- how fast can this disk make a write durable? -------------------------------


def _rate(step: Any, seconds: float) -> float:
    n = 0
    t0 = time.perf_counter()
    while True:
        step(n)
        n += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            return n / elapsed


def fsync_rates(workdir: str, seconds: float = 1.0) -> dict[str, float]:
    """Operations per second: fsync after appending to a file, fsync after rewriting a
    block in place, and single-row SQLite WAL transactions at synchronous FULL and NORMAL."""
    os.makedirs(workdir, exist_ok=True)
    out: dict[str, float] = {}
    path = os.path.join(workdir, "fsync.bin")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:

        def append(_: int) -> None:
            os.write(fd, b"x" * 100)
            os.fsync(fd)

        out["fsync_append"] = _rate(append, seconds)

        def overwrite(n: int) -> None:
            os.pwrite(fd, b"y" * 100, 0)
            os.fsync(fd)

        out["fsync_overwrite"] = _rate(overwrite, seconds)
    finally:
        os.close(fd)
        os.unlink(path)
    db = os.path.join(workdir, "fsync.db")
    for mode in ("FULL", "NORMAL"):
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(db + suffix):
                os.unlink(db + suffix)
        conn = sqlite3.connect(db, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={mode}")
        conn.execute("CREATE TABLE t (n INTEGER, payload TEXT)")

        def tx(n: int, conn: sqlite3.Connection = conn) -> None:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO t VALUES (?, ?)", (n, "x" * 200))
            conn.execute("COMMIT")

        out[f"sqlite_wal_{mode.lower()}_tx"] = _rate(tx, seconds)
        conn.close()
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(db + suffix):
            os.unlink(db + suffix)
    return out
