"""A PostgreSQL primary and its streaming-replication standby, made on this machine.

Two clusters of the Debian tools (`pg_createcluster`, `pg_ctlcluster`), on free
ports, run as the `postgres` user: the primary with `trust` authentication and
a database `test`, the standby a `pg_basebackup -R` of it. Synchronous
(`synchronous_standby_names = '*'`: a commit is acknowledged once the standby
has flushed it) or asynchronous. `upstream` names the port the standby
streams from: a proxy the caller runs in front of the primary, to cut the
replication link and so make commits the standby never receives. `fail_over`
stops the primary as a crash would (`-m immediate`) and promotes the standby.
`drop` removes both clusters, whatever state they are in. Needs root (the data
directories are made for `postgres`); the 5432 cluster is never touched.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg

ROOT = Path("/var/lib/postgresql")


def missing() -> str | None:
    """Why a pair cannot be made here, or None."""
    if shutil.which("pg_createcluster") is None or shutil.which("pg_ctlcluster") is None:
        return "pg_createcluster (postgresql-common) is not installed"
    if os.geteuid() != 0:
        return "making clusters needs root"
    if not versions():
        return "no PostgreSQL server under /usr/lib/postgresql"
    return None


def versions() -> list[str]:
    base = Path("/usr/lib/postgresql")
    found = [p.name for p in base.glob("*") if (p / "bin" / "pg_basebackup").exists()]
    return sorted(found, key=int)


def free_port() -> int:
    """A port nothing listens on, below the ephemeral range (32768 and up), so that
    no connection's own end, or a proxy bound to port 0, takes it before the
    cluster does."""
    while True:
        port = random.randrange(20_000, 32_000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


def _run(*cmd: str) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


class Cluster:
    def __init__(self, version: str, name: str, port: int) -> None:
        self.version, self.name, self.port = version, name, port

    @property
    def data(self) -> Path:
        return ROOT / self.version / self.name

    def ctl(self, action: str, *args: str) -> None:
        _run("pg_ctlcluster", self.version, self.name, action, *args)

    def connect(self, dbname: str = "postgres") -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname=dbname, autocommit=True
        )

    def drop(self) -> None:
        subprocess.run(
            ["pg_dropcluster", "--stop", self.version, self.name],
            capture_output=True,
            timeout=120,
        )


class Pair:
    """`Pair(sync=True).create()`; `url(schema)` names both hosts; `drop()` always."""

    def __init__(self, *, sync: bool, upstream: int | None = None) -> None:
        self.sync = sync
        version = versions()[-1]
        tag = uuid.uuid4().hex[:8]
        self.primary = Cluster(version, f"duragent_a_{tag}", free_port())
        self.standby = Cluster(version, f"duragent_b_{tag}", free_port())
        self.upstream = upstream  # the port the standby streams from (the primary's by default)
        self.promoted_at: float | None = None  # time.time() when the promotion began

    def create(self) -> Pair:
        p, s = self.primary, self.standby
        _run("pg_createcluster", p.version, p.name, "--port", str(p.port), "--", "--auth=trust")
        p.ctl("start")
        with p.connect() as conn:
            conn.execute("CREATE DATABASE test")
            if self.sync:
                # In the primary's own configuration (not ALTER SYSTEM, which the base
                # backup would copy): a promoted standby with it, and no standby of
                # its own, would wait for ever at every commit, holding its locks.
                conf = Path(f"/etc/postgresql/{p.version}/{p.name}/conf.d/sync.conf")
                conf.write_text("synchronous_standby_names = '*'\n")
                conn.execute("SELECT pg_reload_conf()")
        s.data.parent.mkdir(parents=True, exist_ok=True)
        _run("install", "-d", "-o", "postgres", "-g", "postgres", "-m", "700", str(s.data))
        upstream = self.upstream or p.port
        backup = (
            f"pg_basebackup -D {s.data} -h 127.0.0.1 -p {upstream} -U postgres -R"
            f" -X stream -c fast -d 'application_name={s.name}'"
        )
        for attempt in range(3):  # it empties the directory again when it fails
            try:
                _run("su", "postgres", "-c", backup)
                break
            except RuntimeError:
                if attempt == 2:
                    raise
        # pg_createcluster adopts an existing data directory that holds its configuration.
        for name in ("postgresql.conf", "pg_hba.conf", "pg_ident.conf"):
            _run(
                *("install", "-o", "postgres", "-g", "postgres", "-m", "600"),
                f"/etc/postgresql/{p.version}/{p.name}/{name}",
                str(s.data / name),
            )
        _run("pg_createcluster", s.version, s.name, "--port", str(s.port), "-d", str(s.data))
        s.ctl("start")
        self.wait_streaming()
        return self

    def wait_streaming(self, timeout: float = 30) -> None:
        """Until the primary sees its standby stream (and, if sync, as synchronous)."""
        want = "sync" if self.sync else "async"
        deadline = time.monotonic() + timeout
        with self.primary.connect() as conn:
            while True:
                row = conn.execute(
                    "SELECT sync_state FROM pg_stat_replication WHERE state = 'streaming'"
                ).fetchone()
                if row is not None and row[0] == want:
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the standby is not streaming ({want}) after {timeout}s")
                time.sleep(0.05)

    def url(self, schema: str | None = None, db: str = "test") -> str:
        """Both hosts, the writable one chosen by libpq (`target_session_attrs`)."""
        hosts = f"127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}"
        query = "target_session_attrs=read-write" + (f"&schema={schema}" if schema else "")
        return f"postgresql://postgres@{hosts}/{db}?{query}"

    def fail_over(self) -> float:
        """Crash the primary, promote the standby; the seconds the promotion took."""
        self.primary.ctl("stop", "-m", "immediate")
        self.promoted_at = time.time()
        started = time.monotonic()
        self.standby.ctl("promote")
        return time.monotonic() - started

    def drop(self) -> None:
        for cluster in (self.standby, self.primary):
            with contextlib.suppress(Exception):
                cluster.drop()


@contextlib.contextmanager
def pair(*, sync: bool, upstream: int | None = None) -> Iterator[Pair]:
    made = Pair(sync=sync, upstream=upstream)
    try:
        yield made.create()
    finally:
        made.drop()
