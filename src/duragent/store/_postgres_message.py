"""A PostgreSQL transaction's statements sent together, by either of two wires.

The writer (_postgres_writer.py) and PgTx send the statements of a
transaction together, one round trip, and a whole transaction on cached
rows, `BEGIN` to `COMMIT`, in one go (`send_and_commit`), its guarded
UPDATEs (each must match exactly one row) checked: `StaleRow` when one
matched none. A store's connections all use one wire, chosen when it opens
(`wire_mode`: the URL's `wire` option, else $DURAGENT_PG_WIRE, else raw):

- `raw` (the default): straight to libpq, parameters bound as literals on
  this side, shapes prepared once per connection, the whole transaction one
  message with its guards checked on the server (_postgres_wire.py, which
  states its preconditions and holds every use of psycopg's internals);
- `psycopg`: psycopg's documented API only. The statements go in one
  pipeline (`Connection.pipeline()`, `Cursor.execute`, parameters bound by
  the server, psycopg's own preparing), guards checked by `rowcount`, so a
  transaction with guards takes a second round trip for its `COMMIT`.

Both give the same results and raise the same errors.
"""

from __future__ import annotations

import os
import weakref

from duragent.errors import StoreError
from duragent.store import _postgres_wire as wire
from duragent.store._postgres_schema import Conn
from duragent.store._postgres_wire import PREPARED_GONE, StaleRow, Statement

__all__ = [
    "PREPARED_GONE",
    "WIRES",
    "StaleRow",
    "Statement",
    "raw",
    "send",
    "send_and_commit",
    "use_wire",
    "wire_mode",
]

WIRES = ("raw", "psycopg")
WIRE_ENV = "DURAGENT_PG_WIRE"
_PIPELINED: weakref.WeakSet[Conn] = weakref.WeakSet()  # the psycopg wire's connections


def wire_mode(given: str | None) -> str:
    """The wire a store uses: `given` (the URL's `wire`), else $DURAGENT_PG_WIRE, else raw."""
    mode = given if given is not None else os.environ.get(WIRE_ENV) or "raw"
    if mode not in WIRES:
        where = "wire" if given is not None else f"${WIRE_ENV}"
        raise StoreError(f"{where}={mode!r}: the PostgreSQL wire is one of {', '.join(WIRES)}")
    return mode


def use_wire(conn: Conn, mode: str, where: str) -> None:
    """Set `conn` up for the `mode` wire; StoreError if the server does not meet
    its preconditions (_postgres_wire.py)."""
    problem = wire.refusal(conn, raw=mode == "raw")
    if problem is not None:
        raise StoreError(f"{where}: {problem}")
    if mode == "psycopg":
        _PIPELINED.add(conn)
        conn.prepare_threshold = 5  # psycopg's default: it prepares, and forgets, its own
    else:
        _PIPELINED.discard(conn)


def raw(conn: Conn) -> bool:
    """Whether `conn` uses the raw wire."""
    return conn not in _PIPELINED


def send(conn: Conn, statements: list[Statement]) -> None:
    """Send the statements together (one round trip); a guarded UPDATE must have
    matched exactly one row (`StaleRow`, the transaction left open)."""
    if not statements:
        return
    if conn not in _PIPELINED:
        wire.send(conn, statements)
    elif not _pipelined(conn, statements):
        raise StaleRow


def send_and_commit(conn: Conn, statements: list[Statement]) -> None:
    """Send a whole transaction, `BEGIN` to `COMMIT`: one message on the raw
    wire; on psycopg's, one pipeline, and a second round trip for the
    `COMMIT` if a guard must be checked first. A guarded UPDATE that matched
    no row raises `StaleRow` and commits nothing (the caller rolls back);
    any other failing statement raises its error the same way."""
    if conn not in _PIPELINED:
        wire.send_and_commit(conn, statements)
        return
    if not any(st.guard for st in statements):
        _pipelined(conn, [*statements, wire.COMMIT])
        return
    if not _pipelined(conn, statements):
        raise StaleRow
    conn.execute("COMMIT")


def _pipelined(conn: Conn, statements: list[Statement]) -> bool:
    """Run the statements in one pipeline (documented psycopg: one round trip);
    whether every guarded one matched exactly one row."""
    cursors = []
    with conn.pipeline():
        for st in statements:
            cur = conn.cursor()
            cur.execute(st.query, st.params)
            cursors.append(cur)
    return all(cur.rowcount == 1 for st, cur in zip(statements, cursors, strict=True) if st.guard)
