"""How long the PostgreSQL store waits over the network: every wait bounded by the lease.

A worker cut off from the server must lose its session, and the row locks a
commit in flight holds, well before another worker may take its tasks over,
which is a lease TTL after its last renewal (at least two thirds of a TTL
after the cut, with the default heartbeat of a third). So every wait of the
store, on both ends of the link, is bounded by one figure derived from the TTL:

    bound = max(lease_ttl / 6, 1 s)          (5 s for the default 30 s lease)

- on the client (libpq): `connect_timeout` = bound (at least 2 s, libpq's
  least); TCP keepalives after bound/2 idle, then 3 probes bound/6 apart
  (whole seconds, at least 1); `tcp_user_timeout` = bound;
- on each of the store's sessions (the server's side of the same link):
  `statement_timeout`, `lock_timeout` and `idle_in_transaction_session_timeout`
  = bound, and the server's own `tcp_keepalives_*` and `tcp_user_timeout` as above
  (the LISTEN session too, but for its `statement_timeout`);
- a lease renewal gets half the TTL (`renewal_bound`): one that has not
  finished by then counts as not renewed, and the lease connection under it is
  cut, so the next renewal starts on a new one.

A setting the URL names itself wins: a libpq keyword in the URL's query
(`?keepalives_idle=60`), or a session setting in its `options`
(`?options=-c%20statement_timeout%3D0`, or $PGOPTIONS when the URL has none);
$PGCONNECT_TIMEOUT as well. The store's schema migrations run before the
session bounds are set: a long migration is not cut off.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import conninfo as pg_conninfo, pq, sql

from duragent.store._postgres_connect import CONNECTION_OPTIONS, PooledConnection
from duragent.store._postgres_schema import Conn

DEFAULT_LEASE_TTL = 30.0  # WorkerOptions.lease_ttl's default

# A session setting in libpq's `options`: "-c name=value", "-cname=value" or "--name=value".
_OPTION_NAME = re.compile(r"(?:-c\s*|--)([A-Za-z_][A-Za-z0-9_.]*)\s*=")


@dataclass(frozen=True, slots=True)
class WaitBounds:
    """The bounds of a store whose workers hold leases of `lease_ttl` seconds."""

    lease_ttl: float = DEFAULT_LEASE_TTL

    @property
    def bound(self) -> float:
        """Seconds any one wait over the network may last (see the module's docstring)."""
        return max(self.lease_ttl / 6, 1.0)

    @property
    def renewal_bound(self) -> float:
        """Seconds a lease renewal may take before it counts as not renewed."""
        return self.lease_ttl / 2

    def _keepalives(self) -> tuple[int, int, int]:
        """Idle seconds, seconds between probes, probes: about `bound` in all."""
        return max(1, round(self.bound / 2)), max(1, round(self.bound / 6)), 3

    def client_settings(self) -> dict[str, int]:
        idle, interval, count = self._keepalives()
        return {
            "connect_timeout": max(2, math.ceil(self.bound)),
            "keepalives": 1,
            "keepalives_idle": idle,
            "keepalives_interval": interval,
            "keepalives_count": count,
            "tcp_user_timeout": round(self.bound * 1000),
        }

    def session_settings(self) -> dict[str, str]:
        idle, interval, count = self._keepalives()
        ms = f"{round(self.bound * 1000)}ms"
        return {
            "statement_timeout": ms,
            "lock_timeout": ms,
            "idle_in_transaction_session_timeout": ms,
            "tcp_keepalives_idle": str(idle),
            "tcp_keepalives_interval": str(interval),
            "tcp_keepalives_count": str(count),
            "tcp_user_timeout": ms,
        }


def bounded_conninfo(conninfo: str, bounds: WaitBounds, connect_timeout: float) -> str:
    """`conninfo` with the client's bounds it does not set itself; `connect_timeout`
    (the store's own argument) caps libpq's."""
    given = pg_conninfo.conninfo_to_dict(conninfo)
    settings = bounds.client_settings()
    settings["connect_timeout"] = max(2, min(settings["connect_timeout"], round(connect_timeout)))
    if os.environ.get("PGCONNECT_TIMEOUT"):
        given["connect_timeout"] = os.environ["PGCONNECT_TIMEOUT"]
    if pq.version() < 120000:  # a libpq without tcp_user_timeout
        given["tcp_user_timeout"] = None
    added = {key: value for key, value in settings.items() if key not in given}
    return pg_conninfo.make_conninfo(conninfo, **added) if added else conninfo


def session_setup(
    conn: psycopg.BaseConnection[Any], conninfo: str, bounds: WaitBounds, *, listening: bool = False
) -> list[sql.Composable]:
    """The SET statements bounding `conn`'s session, but for settings the URL's options name.

    A `listening` session (the LISTEN connection, _postgres_notify.py) sits idle
    between notifications: it gets all of them but `statement_timeout`, which
    bounds no wait of its own; the keepalives and `tcp_user_timeout` end it on
    the server when its worker is cut off, as they do the store's other sessions.
    """
    options = pg_conninfo.conninfo_to_dict(conninfo).get("options")
    if options is None:
        options = os.environ.get("PGOPTIONS", "")
    named = {name.lower() for name in _OPTION_NAME.findall(str(options))}
    if conn.info.server_version < 120000:  # no tcp_user_timeout before PostgreSQL 12
        named.add("tcp_user_timeout")
    return [
        sql.SQL("SET {} = {}").format(sql.Identifier(name), sql.Literal(value))
        for name, value in bounds.session_settings().items()
        if name not in named and not (listening and name == "statement_timeout")
    ]


class LeaseConnection:
    """The lease thread's own connection, made again once lost; `cut` ends a wait on it.

    Not from the pool: with every pooled connection held by task commits, a
    renewal would wait behind them and a pool timeout would skip a heartbeat.
    The connection's socket is kept as a duplicate of its own so that another
    thread can shut it down (`cut`) while the lease thread waits on it: the
    wait ends at once, as if the link had died, and the duplicate is never a
    descriptor number reused by some other file.
    """

    def __init__(self, conninfo: Callable[[], str], configure: Callable[[Conn], None]) -> None:
        self._conninfo = conninfo
        self._configure = configure
        self._lock = threading.Lock()
        self._conn: Conn | None = None
        self._socket: socket.socket | None = None

    @contextlib.contextmanager
    def __call__(self) -> Iterator[Conn]:
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            self.drop()
            conn = PooledConnection.connect(self._conninfo(), **CONNECTION_OPTIONS)
            try:
                self._configure(conn)
            except BaseException:
                conn.close()
                raise
            with self._lock:
                self._conn = conn
                self._socket = socket.socket(fileno=os.dup(conn.fileno()))
        try:
            yield conn
        except BaseException:
            if conn.broken:
                self.drop()
            raise

    def cut(self) -> None:
        """End whatever waits on the connection now (from any thread)."""
        with self._lock:
            if self._socket is not None:
                with contextlib.suppress(OSError):
                    self._socket.shutdown(socket.SHUT_RDWR)

    def drop(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
            sock, self._socket = self._socket, None
        if sock is not None:
            sock.close()
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()
