"""How the PostgreSQL store reaches its server: URLs, connections, errors.

The store's URL split into libpq's conninfo and duragent's own options, each
connection's settings, the pool's quieter reconnect log, and psycopg's errors
translated into the store's (`translate`), so none escapes untranslated.
"""

from __future__ import annotations

import logging
import os
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import conninfo as pg_conninfo
from psycopg.rows import DictRow, dict_row

from duragent.errors import Conflict, StoreError, StoreUnavailable

# PostgresStore options that are ours, not libpq's, when given in the URL query.
_OWN_OPTIONS = ("schema", "min_size", "max_size", "retries", "lease_ttl", "wire")

# How every connection of the store is opened. `prepare_threshold=None`: psycopg
# never prepares a query itself. Once it has (after a query's fifth run), it
# answers every ROLLBACK, a savepoint's too, with `DEALLOCATE ALL`, which drops
# the statements the writer prepared (_postgres_wire.py) while its list of them
# still names them; and rollbacks are routine here (a refused commit in a batch).
CONNECTION_OPTIONS: dict[str, Any] = {
    "autocommit": True,
    "row_factory": dict_row,
    "prepare_threshold": None,
}


class PooledConnection(psycopg.Connection[DictRow]):
    """The pool's connections. Its first is the one the store opened with (given
    as `handed`): opening a store starts one server backend, not two (a
    backend's start-up is most of what opening a store costs, 4-6 ms here;
    two at once on a 2-core host took 9-11)."""

    @classmethod
    def connect(  # type: ignore[override]
        cls, conninfo: str = "", *, handed: list[PooledConnection] | None = None, **kwargs: Any
    ) -> PooledConnection:
        if handed:
            return handed.pop()
        return super().connect(conninfo, **kwargs)


def connection_lost(exc: psycopg.Error) -> bool:
    """True when the failure was the connection itself, not an error the server reported."""
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = exc.sqlstate
    return state is None or state.startswith("08") or state in ("57P01", "57P02", "57P03")


class _ReconnectsAtDebug(logging.Filter):
    """psycopg's pool logs every failed attempt to connect as a warning: a line a
    second or more while the server is out of reach. The store's callers say
    once that they wait for it (runtime/_outage.py); the pool's attempts are
    demoted to DEBUG, kept only where that logger is enabled for DEBUG."""

    def __init__(self, logger: logging.Logger) -> None:
        super().__init__()
        self.logger = logger

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if (
            record.msg == "error connecting in %r: %s"
            and isinstance(args, tuple)
            and args[0] == POOL_NAME
        ):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return self.logger.isEnabledFor(logging.DEBUG)
        return True


POOL_NAME = "duragent"  # the name of the store's connection pool


def quiet_pool_reconnects() -> None:
    pool_log = logging.getLogger("psycopg.pool")
    if not any(isinstance(f, _ReconnectsAtDebug) for f in pool_log.filters):
        pool_log.addFilter(_ReconnectsAtDebug(pool_log))


# What a server says when it turns a connection away for a while (starting,
# stopping, full), unlike a wrong role, password or database, which stay wrong.
_BUSY_SERVER = ("the database system is", "too many clients", "connection slots are reserved")


def turned_away(exc: psycopg.Error) -> bool:
    """Whether the server answered the connection with a refusal that waiting will
    not change. libpq gives such a refusal as text only: the server's FATAL."""
    text = str(exc)
    return "FATAL:" in text and not any(busy in text for busy in _BUSY_SERVER)


# A statement or a lock wait that ran past the session's bound (_postgres_bounds.py).
_WAIT_BOUNDED = ("57014", "55P03")


def translate(exc: psycopg.Error, where: str) -> StoreError:
    if isinstance(exc, psycopg.errors.UniqueViolation):
        return Conflict(f"{where}: {exc.diag.message_primary or exc}")
    if connection_lost(exc):
        return StoreUnavailable(f"{where} cannot be reached: {exc}")
    if exc.sqlstate in _WAIT_BOUNDED:  # a wait the store's bounds cut short: try again
        return StoreUnavailable(f"{where}: {exc} (see WaitBounds, _postgres_bounds.py)")
    if isinstance(exc, psycopg.OperationalError):
        return StoreUnavailable(f"{where}: {exc}")
    return StoreError(f"{where}: PostgreSQL error: {exc}")


def split_url(url: str) -> tuple[str, dict[str, str]]:
    """Separate duragent's own query options (schema, pool sizes) from libpq's."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    own = {k: v for k, v in query if k in _OWN_OPTIONS}
    rest = [(k, v) for k, v in query if k not in _OWN_OPTIONS]
    scheme = "postgresql" if parts.scheme in ("postgres", "postgresql") else parts.scheme
    # quote, not urlencode's default quote_plus: libpq decodes %20, not '+'.
    query_text = urlencode(rest, quote_via=quote)
    return urlunsplit((scheme, parts.netloc, parts.path, query_text, parts.fragment)), own


def with_application_name(conninfo: str) -> tuple[str, str]:
    """The conninfo with an application_name (the given one wins), and that name."""
    given = pg_conninfo.conninfo_to_dict(conninfo).get("application_name")
    if given is not None:
        return conninfo, str(given)
    if os.environ.get("PGAPPNAME"):
        return conninfo, os.environ["PGAPPNAME"]
    name = f"duragent-{os.getpid()}"
    return pg_conninfo.make_conninfo(conninfo, application_name=name), name


def redact(url: str) -> str:
    """The URL without its password, for error messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def writable(conninfo: str) -> str:
    """`conninfo` that, naming several hosts, connects only to the one taking writes.

    libpq's default (`target_session_attrs=any`) takes the first host that
    answers: during a failover, a standby still in recovery. There the store's
    reads are behind (a false `lost_commits`, a batch judged not landed) and its
    writes fail. A setting the URL or `$PGTARGETSESSIONATTRS` gives is kept."""
    given = pg_conninfo.conninfo_to_dict(conninfo)
    hosts = str(given.get("host") or given.get("hostaddr") or "")
    if "," not in hosts or "target_session_attrs" in given:
        return conninfo
    if os.environ.get("PGTARGETSESSIONATTRS"):
        return conninfo
    return pg_conninfo.make_conninfo(conninfo, target_session_attrs="read-write")
