"""The raw wire: a transaction's statements as one message, straight to libpq.

Every use of psycopg outside its documented API in the store is here, and
only here (the `raw` wire, the default; `?wire=psycopg` runs the store on
psycopg's documented API instead: _postgres_message.py). What it does:

- binds parameters on this side, as SQL literals (`literal`): str, int,
  bool, None and aware datetimes written directly, anything else through
  psycopg's documented `ClientCursor.mogrify`;
- PREPAREs the shapes the writer sends most once per connection and sends
  them as `EXECUTE name(literals)` (`RawMessage`);
- sends a whole transaction, `BEGIN` to `COMMIT`, as one simple-query
  message, a guarded UPDATE (one that must match exactly one row) wrapped so
  that matching no row divides by zero, which aborts the transaction on the
  server: the rest of the message, the `COMMIT` with it, is skipped;
- queues the message on libpq (`Connection.pgconn.send_query`, psycopg's
  documented low-level wrapper) and reads the answer with psycopg's internal
  generator `psycopg.generators.execute`: blocking, under the connection's
  internal `lock` and `wait` (`exchange`), or on an event loop's reader
  callbacks, `psycopg.waiting`'s states (`Flight`); a failed result becomes
  psycopg's error through the internal `psycopg.errors.error_from_result`.

Preconditions (`refusal` checks them when a connection is set up; the store
refuses to open otherwise):

- `standard_conforming_strings = on` (PostgreSQL's default since 9.1): inside
  '...' only the quote is special, which `literal` relies on. A message built
  while a session has it off falls back to `mogrify` for every statement.
- A session of its own on the server, no pooler in between: the prepared
  statements belong to the session, and so do LISTEN and the pid the writer
  ends to find out whether a commit in flight landed (_postgres_landed.py).
  A pooler is detected by the pid the connection was given at start-up
  (BackendKeyData) differing from the server's `pg_backend_pid()`: pgBouncer,
  in any mode, and the other poolers hand out keys of their own so that they
  can route cancel requests. Should one slip through anyway, a prepared
  statement gone (`PREPARED_GONE`) makes every shape prepared again and the
  transaction run again once (tests/test_postgres_prepared.py).
- psycopg in the versions pyproject.toml allows (tested on each): the
  internals named above may change in any minor release.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import re
import weakref
from collections.abc import Callable, Generator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.abc import PQGen
from psycopg.errors import error_from_result
from psycopg.generators import execute
from psycopg.pq import ExecStatus
from psycopg.waiting import READY_R, READY_W, WAIT_R, WAIT_W, Ready, Wait, wait

from duragent.store._postgres_schema import Conn


@dataclass(slots=True)
class Statement:
    query: str
    params: Any
    guard: bool  # an UPDATE that must match exactly one row
    prepare: bool = False  # a shape the writer sends often: prepared once per connection


class StaleRow(Exception):
    """A guarded UPDATE matched no row: the cached row was changed by someone else."""


COMMIT = Statement("COMMIT", None, False)
PREPARED_GONE = "26000"  # invalid_sql_statement_name: EXECUTE of an unknown name


def refusal(conn: Conn, raw: bool) -> str | None:
    """Why the store cannot run on `conn` (see the module's docstring), or None."""
    row = conn.execute("SELECT pg_backend_pid() AS pid").fetchone()
    if row is not None and row["pid"] != conn.info.backend_pid:
        return (
            "a connection pooler sits between the store and the server (the backend pid"
            " libpq was given is not the server's): connect to PostgreSQL directly"
        )
    if raw and conn.info.parameter_status("standard_conforming_strings") != "on":
        return (
            "standard_conforming_strings is off: set it on (ALTER ROLE or DATABASE ..."
            " SET standard_conforming_strings = on), or open the store with ?wire=psycopg"
        )
    return None


def send(conn: Conn, statements: list[Statement]) -> None:
    """Send the statements as one message (one round trip, parameters bound on
    this side); a guarded UPDATE must have matched exactly one row."""
    message = RawMessage(conn, statements, select_guards=False)
    results = message.exchange(conn)
    counts = []
    for res in results:
        if res.status == ExecStatus.FATAL_ERROR:
            raise message.error(res)
        counts.append(res.command_tuples)
    if any(st.guard and n != 1 for st, n in zip(statements, counts, strict=False)):
        raise StaleRow


def send_and_commit(conn: Conn, statements: list[Statement]) -> None:
    """Send a whole transaction, `BEGIN` to `COMMIT`, as one message: a guarded
    UPDATE that matches no row aborts it on the server (`StaleRow` here; the
    caller rolls back), and so does any other failing statement, with its error."""
    message = commit_message(conn, statements)
    check_commit(message, statements, message.exchange(conn))


def commit_message(conn: Conn, statements: list[Statement]) -> RawMessage:
    """The message of a whole transaction: `statements`, then `COMMIT` (see send_and_commit)."""
    return RawMessage(conn, [*statements, COMMIT], select_guards=True)


def check_commit(message: RawMessage, statements: list[Statement], results: list[Any]) -> None:
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


Landed = Callable[[Exception | None], None]  # how a flight ended: None, committed


def fly(
    loop: asyncio.AbstractEventLoop, conn: Conn, statements: list[Statement], landed: Landed
) -> Flight | None:
    """A whole transaction (as `send_and_commit`) sent from `loop`, its answer
    to be read there once the flight is started; `landed` is called with how
    it ended. None, with nothing sent, when the connection is in use."""
    if not conn.lock.acquire(blocking=False):
        return None
    try:
        message = commit_message(conn, statements)
        message.send(conn)
    except BaseException:  # nothing went out
        conn.lock.release()
        raise

    def answered(results: list[Any] | None, error: Exception | None) -> None:
        conn.lock.release()
        if error is None:
            assert results is not None
            try:
                check_commit(message, statements, message.answered(results))
            except Exception as exc:
                error = exc
        landed(error)

    return Flight(loop, conn.pgconn, answered)


# The statements the writer sends most (a task row's UPDATE, a batch's entries)
# come in few shapes, and the server parses and plans each text it is sent:
# on a table with a dozen indexes, a round's transaction replayed on the test
# machine took 0.66-0.76 ms sent as text and 0.48-0.50 ms prepared, and more
# of the server's CPU. Each shape is therefore PREPAREd once per
# connection, at the front of the first message that uses it, and sent as
# `EXECUTE name(literals)`. A prepared statement belongs to the session, not
# to a transaction: it outlives a rollback or an aborted transaction, so one
# is known to the connection once its PREPARE answered. psycopg's own
# preparing is off on the raw wire's connections: with it, a ROLLBACK made
# psycopg send DEALLOCATE ALL (_postgres_connect.py, CONNECTION_OPTIONS).
# Whatever still drops them fails the transaction with PREPARED_GONE, which is
# run again at once.
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


class RawMessage:
    """Statements as the text of one simple-query message, the PREPAREs it
    needs first; `exchange` sends it and takes their answers off the results."""

    def __init__(self, conn: Conn, statements: list[Statement], *, select_guards: bool) -> None:
        # Literals are written here only where the server reads '...' as plain text.
        plain = conn.info.parameter_status("standard_conforming_strings") == "on"
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
            args = ", ".join([literal(v) for v in values])
        except NotPlain:
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
            return st.query % {k: literal(v) for k, v in params.items()}
        return st.query % tuple(literal(v) for v in params)
    except NotPlain:
        return str(psycopg.ClientCursor(conn).mogrify(st.query, params))


class NotPlain(Exception):
    """A value `literal` leaves to psycopg."""


def literal(value: Any) -> str:
    """`value` as an SQL literal, where standard_conforming_strings is on."""
    kind = type(value)
    if kind is str:
        if "\x00" in value:
            raise NotPlain  # let psycopg refuse it with its own error
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
    raise NotPlain


# --- a message's answer read on the event loop --------------------------------
# The writer (_postgres_writer.py) sends a batch that runs on its cached rows,
# `BEGIN` to `COMMIT`, from the loop its commits came from, and reads the
# answer there: the same libpq calls its thread makes (psycopg's `execute`
# generator), driven by the loop's reader callbacks instead of a blocking
# wait. That spares each round two hand-offs between threads, the thread's
# wake-up and the loop's, about a tenth of a round on the test machine.
#
# A flight is callbacks, not a coroutine: no task's cancellation can stop it
# between sending and reading, so the connection never keeps half an answer.
# Should its loop close with the answer unread (its callbacks will never run),
# `finish` reads the rest on the calling thread instead.

Answer = Callable[[list[Any] | None, Exception | None], None]  # (results, or the error)


class Flight:
    """The answer to what was just queued on `pgconn` (`send_query`), read on `loop`."""

    __slots__ = ("_answer", "_fileno", "_gen", "_loop", "_waiting")

    def __init__(self, loop: asyncio.AbstractEventLoop, pgconn: Any, answer: Answer) -> None:
        self._loop = loop
        self._fileno: int = pgconn.socket
        self._gen = execute(pgconn)
        self._answer = answer
        self._waiting = 0

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def start(self) -> None:
        """Write the message out and wait for its answer; `answer` is called with it."""
        self._step(None)

    def finish(self) -> None:
        """Read the rest of the answer on this thread, blocking, then call `answer`:
        for a flight whose loop closed before reading it (the loop, closed, runs
        none of its callbacks again, and none is running)."""
        state, self._waiting = self._waiting, 0

        def rest() -> int:
            raise StopIteration(wait(_resumed(self._gen, Wait(state)), self._fileno))

        self._run(rest)

    def _ready(self, ready: Ready) -> None:
        if self._waiting & WAIT_R:
            self._loop.remove_reader(self._fileno)
        if self._waiting & WAIT_W:
            self._loop.remove_writer(self._fileno)
        self._waiting = 0
        self._step(ready)

    def _step(self, ready: Ready | None) -> None:
        state = self._run(lambda: next(self._gen) if ready is None else self._gen.send(ready))
        if state is None:
            return
        if state & WAIT_R:
            self._loop.add_reader(self._fileno, self._ready, READY_R)
        if state & WAIT_W:
            self._loop.add_writer(self._fileno, self._ready, READY_W)
        self._waiting = state

    def _run(self, advance: Callable[[], Any]) -> int | None:
        """The generator advanced: the state it waits for, or None once `answer`
        was called (with the results, or the error)."""
        try:
            state: int = advance()
        except StopIteration as stop:
            self._answer(stop.value, None)
            return None
        except OSError as exc:  # as psycopg's own waits report it
            lost = psycopg.OperationalError("connection socket closed")
            lost.__cause__ = exc
            self._answer(None, lost)
            return None
        except Exception as exc:
            self._answer(None, exc)
            return None
        return state


def _resumed(gen: Generator[Any, Any, Any], state: Wait) -> PQGen[Any]:
    """`gen`, which last asked to wait for `state`, as a generator psycopg's `wait`
    can drive from the start."""
    while True:
        ready = yield state
        try:
            state = gen.send(ready)
        except StopIteration as stop:
            return stop.value
