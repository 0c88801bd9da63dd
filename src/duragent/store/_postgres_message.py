"""A PostgreSQL transaction's statements as one message, sent straight to libpq.

The writer (_postgres_writer.py) and PgTx send the statements of a transaction
together, one round trip, with their parameters bound here as literals; the
shapes it sends most are PREPAREd once per connection and sent as `EXECUTE`.
A whole transaction on cached rows goes as one message, `BEGIN` to `COMMIT`,
its guarded UPDATEs checked on the server (`send_and_commit`).
"""

from __future__ import annotations

import functools
import itertools
import re
import weakref
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.errors import error_from_result
from psycopg.generators import execute
from psycopg.pq import ExecStatus

from duragent.store._postgres_schema import Conn


@dataclass(slots=True)
class Statement:
    query: str
    params: Any
    guard: bool  # an UPDATE that must match exactly one row
    prepare: bool = False  # a shape the writer sends often: prepared once per connection


class StaleRow(Exception):
    """A guarded UPDATE matched no row: the cached row was changed by someone else."""


def send(conn: Conn, statements: list[Statement]) -> None:
    """Send the statements as one message (one round trip, parameters bound on
    this side); a guarded UPDATE must have matched exactly one row."""
    if not statements:
        return
    message = _Message(conn, statements, select_guards=False)
    results = message.exchange(conn)
    counts = []
    for res in results:
        if res.status == ExecStatus.FATAL_ERROR:
            raise message.error(res)
        counts.append(res.command_tuples)
    if any(st.guard and n != 1 for st, n in zip(statements, counts, strict=False)):
        raise StaleRow


def send_and_commit(conn: Conn, statements: list[Statement]) -> None:
    """Send a whole transaction, `BEGIN` to `COMMIT`, as one message.

    A guarded UPDATE is checked on the server: wrapped so that matching no row
    divides by zero, which aborts the transaction, so the server skips the rest
    of the message and the `COMMIT` with it (`StaleRow` here; the caller rolls
    back). Any other failing statement raises its error the same way.
    """
    message = commit_message(conn, statements)
    check_commit(message, statements, message.exchange(conn))


def commit_message(conn: Conn, statements: list[Statement]) -> _Message:
    """The message of a whole transaction: `statements`, then `COMMIT` (see send_and_commit)."""
    return _Message(conn, [*statements, Statement("COMMIT", None, False)], select_guards=True)


def check_commit(message: _Message, statements: list[Statement], results: list[Any]) -> None:
    """Raise what the answer to a commit message says went wrong, if anything."""
    for st, res in zip(statements, results, strict=False):
        if res.status == ExecStatus.FATAL_ERROR:
            exc = message.error(res)
            if st.guard and exc.sqlstate == "22012":  # division_by_zero: no row matched
                raise StaleRow
            raise exc
    if len(results) != len(statements) + 1 or results[-1].command_status != b"COMMIT":
        # Not what PostgreSQL answers to such a message: it may or may not have
        # committed, as if the answer were lost (the writer looks at the rows).
        raise psycopg.OperationalError("unexpected answer to a transaction sent in one message")


# The statements the writer sends most (a task row's UPDATE, a batch's entries)
# come in few shapes, and the server parses and plans each text it is sent:
# on a table with a dozen indexes, a round's transaction replayed on the test
# machine took 0.66-0.76 ms sent as text and 0.48-0.50 ms prepared, and more
# of the server's CPU. Each shape is therefore PREPAREd once per
# connection, at the front of the first message that uses it, and sent as
# `EXECUTE name(literals)`. A prepared statement belongs to the session, not
# to a transaction: it outlives a rollback or an aborted transaction, so one
# is known to the connection once its PREPARE answered. (A pooler that moves
# a session between server connections, pgBouncer in transaction mode, cannot
# serve this store anyway: its wake-ups LISTEN on a session.) psycopg's own
# preparing is off on the store's connections: with it, a ROLLBACK made psycopg
# send DEALLOCATE ALL (_postgres_connect.py, CONNECTION_OPTIONS). Whatever still drops them
# fails the transaction with PREPARED_GONE, which is run again at once.
_PREPARED: weakref.WeakKeyDictionary[Conn, dict[str, str]] = weakref.WeakKeyDictionary()
_MAX_PREPARED = 200  # shapes per connection; past it, statements are sent as text
_names = itertools.count(1)
_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%s")


@functools.lru_cache(maxsize=1024)
def _numbered(query: str, keys: tuple[str, ...] | None, select_guard: bool) -> str:
    """`query` with its psycopg placeholders as `$1`, `$2`...: named ones in the
    order of `keys`, positional ones in order; a guarded UPDATE wrapped so that
    matching no row fails (see send_and_commit)."""
    position = itertools.count(1)
    if keys is None:
        text = _PLACEHOLDER.sub(lambda m: f"${next(position)}", query)
    else:
        index = {k: i for i, k in enumerate(keys, 1)}
        text = _PLACEHOLDER.sub(lambda m: f"${index[m.group(1)]}", query)
    return _select_guard(text) if select_guard else text


def _select_guard(update: str) -> str:
    """A guarded UPDATE as a statement that fails when it matches no row
    (dividing by zero, which aborts the transaction: see send_and_commit)."""
    return f"WITH g AS ({update} RETURNING 1) SELECT 1 / count(*)::int FROM g"


class _Message:
    """Statements as the text of one simple-query message, the PREPAREs it
    needs first; `exchange` sends it and takes their answers off the results."""

    def __init__(self, conn: Conn, statements: list[Statement], *, select_guards: bool) -> None:
        # Literals are written here only where the server reads '...' as plain text.
        plain = conn.pgconn.parameter_status(b"standard_conforming_strings") == b"on"
        known = _PREPARED.get(conn)
        if known is None:
            known = _PREPARED[conn] = {}
        self.known = known
        self.encoding = conn.info.encoding
        self.new: dict[str, str] = {}  # shape -> name, prepared by this message
        self.parts: list[str] = []
        for st in statements:
            guard = st.guard and select_guards
            text = self._execute(st, guard) if st.prepare and plain else None
            if text is None:
                text = _bind(conn, st, plain)
                if guard:
                    text = _select_guard(text)
            self.parts.append(text)

    def _execute(self, st: Statement, guard: bool) -> str | None:
        params = st.params
        named = isinstance(params, dict)
        try:
            values = params.values() if named else params
            args = ", ".join([_literal(v) for v in values])
        except _NotPlain:
            return None
        shape = _numbered(st.query, tuple(params) if named else None, guard)
        name = self.known.get(shape) or self.new.get(shape)
        if name is None:
            if len(self.known) + len(self.new) >= _MAX_PREPARED:
                return None
            name = self.new[shape] = f"duragent_{next(_names)}"
        return f"EXECUTE {name}({args})"

    def exchange(self, conn: Conn) -> list[Any]:
        """Send the message and return the statements' results (see `answered`)."""
        # Straight to libpq: psycopg's cursor machinery costs more than the commit.
        with conn.lock:
            self.send(conn)
            return self.answered(conn.wait(execute(conn.pgconn)))

    def send(self, conn: Conn) -> None:
        """Queue the message, its PREPAREs first, on the connection (holding its
        lock); libpq writes it out as its answer is waited for."""
        prepares = [f"PREPARE {name} AS {shape}" for shape, name in self.new.items()]
        conn.pgconn.send_query(";".join(prepares + self.parts).encode())

    def answered(self, results: list[Any]) -> list[Any]:
        """The statements' results, the PREPAREs' taken off: those that answered
        are known from now on, one that failed raises its error."""
        done = results[: len(self.new)]
        for (shape, name), res in zip(self.new.items(), done, strict=False):
            if res.status == ExecStatus.COMMAND_OK:
                self.known[shape] = name
        for res in done:
            if res.status == ExecStatus.FATAL_ERROR:
                raise self.error(res)
        return results[len(self.new) :]

    def error(self, res: Any) -> psycopg.Error:
        """The error a result reports. A prepared statement the connection no
        longer has (`DEALLOCATE` behind this store's back) makes every shape
        on it prepared again from the next message; the writer, and
        PostgresStore._execute, run the transaction again (PREPARED_GONE)."""
        exc = error_from_result(res, encoding=self.encoding)
        if exc.sqlstate == PREPARED_GONE:
            self.known.clear()
        return exc


PREPARED_GONE = "26000"  # invalid_sql_statement_name: EXECUTE of an unknown name


def _bind(conn: Conn, st: Statement, plain: bool) -> str:
    """The statement with its parameters as SQL literals.

    The writer's statements carry only str, int, bool, None and aware
    datetimes, written here directly (psycopg's general adaptation costs more
    than the rest of a commit); anything else goes through psycopg.
    """
    params = st.params
    if params is None:
        return st.query
    if not plain:
        return str(psycopg.ClientCursor(conn).mogrify(st.query, params))
    try:
        if isinstance(params, dict):
            return st.query % {k: _literal(v) for k, v in params.items()}
        return st.query % tuple(_literal(v) for v in params)
    except _NotPlain:
        return str(psycopg.ClientCursor(conn).mogrify(st.query, params))


class _NotPlain(Exception):
    pass


def _literal(value: Any) -> str:
    kind = type(value)
    if kind is str:
        if "\x00" in value:
            raise _NotPlain  # let psycopg refuse it with its own error
        # standard_conforming_strings is on (the default since PostgreSQL 9.1):
        # inside '...' only the quote itself is special.
        text: str = value
        return "'" + text.replace("'", "''") + "'"
    if value is None:
        return "NULL"
    if kind is int:
        return str(value)
    if kind is bool:
        return "true" if value else "false"
    if kind is datetime and value.tzinfo is not None:
        return "'" + str(value.isoformat()) + "'::timestamptz"
    raise _NotPlain
