"""The PostgreSQL store: many workers on many machines share one database.

Every write runs in a transaction its process's writer thread shares among
the commits waiting at that moment (postgres_writer.py), running the shared
commit algorithm (store/tx.py) over `PgTx` (postgres_tx.py); the tables and
migrations are in postgres_schema.py. Each committed change sends a NOTIFY
(postgres_notify.py), so waiters on any machine wake without polling. Reads
run on pooled connections in worker threads, and so do lease renewals, on a
thread of their own (`renew_leases`), so they never queue behind task commits.
Writes and reads retry after a lost connection or a deadlock (`PgWriter.run_batch`,
`_execute`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from operator import itemgetter
from typing import Any, TypeVar
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
import psycopg_pool
from psycopg import conninfo as pg_conninfo
from psycopg import sql
from psycopg.rows import DictRow, dict_row, tuple_row
from psycopg.types.json import Jsonb

from duragent.errors import (
    CommitOutcomeUnknown,
    Conflict,
    StoreError,
    StoreUnavailable,
    TaskNotFound,
)
from duragent.store.base import (
    MAX_SEQ,
    SEQ_BITS,
    VIEW_KINDS,
    ControlCallback,
    ControlWatchers,
    EntryHead,
    LeaseRenewal,
    PendingCommit,
    TaskPage,
    TaskQuery,
    build_ui_view,
    decode_cursor,
    encode_cursor,
    entry_kind,
    entry_range,
    parse_messages,
    unpacked,
    view_data,
    view_text,
)
from duragent.store.postgres_notify import (
    CHANNEL,
    CONTROL_CHANNEL,
    WORK_CHANNEL,
    Listener,
    Signals,
    control_payload,
)
from duragent.store.postgres_schema import ENTRY_RANGE, MIGRATIONS, Conn, lock_key, migrate
from duragent.store.postgres_tx import (
    PREPARED_GONE,
    PgTx,
    Statement,
    row_document,
    row_task,
)
from duragent.store.postgres_writer import PgWriter
from duragent.store.tx import TxWrites
from duragent.types import ApiMessage, Document, Entry, EntryKind, Task, UiMessage, utcnow

__all__ = [
    "CHANNEL",
    "MIGRATIONS",
    "WORK_CHANNEL",
    "PostgresStore",
    "lock_key",
    "migrate",
    "redact",
    "split_url",
]

_T = TypeVar("_T")

# PostgresStore options that are ours, not libpq's, when given in the URL query.
_OWN_OPTIONS = ("schema", "min_size", "max_size", "retries")

# How every connection of the store is opened. `prepare_threshold=None`: psycopg
# never prepares a query itself. Once it has (after a query's fifth run), it
# answers every ROLLBACK, a savepoint's too, with `DEALLOCATE ALL`, which drops
# the statements the writer prepared (postgres_tx.py) while its list of them
# still names them; and rollbacks are routine here (a refused commit in a batch).
_CONNECTION: dict[str, Any] = {
    "autocommit": True,
    "row_factory": dict_row,
    "prepare_threshold": None,
}


class _Connection(psycopg.Connection[DictRow]):
    """The pool's connections. Its first is the one the store opened with (given
    as `handed`): opening a store starts one server backend, not two (a
    backend's start-up is most of what opening a store costs, 4-6 ms here;
    two at once on a 2-core host took 9-11)."""

    @classmethod
    def connect(  # type: ignore[override]
        cls, conninfo: str = "", *, handed: list[_Connection] | None = None, **kwargs: Any
    ) -> _Connection:
        if handed:
            return handed.pop()
        return super().connect(conninfo, **kwargs)


class PostgresStore(TxWrites):
    """`PostgresStore("postgresql://user@host/db", schema=None, max_size=10)`.

    The schema is created and migrated on construction; `schema` keeps several
    independent stores in one database. Every connection carries an
    `application_name` (`duragent-<pid>` unless the URL or $PGAPPNAME names
    one), so an operator can tell in `pg_stat_activity` which process holds it.
    """

    # wait_for_change (and wait_for_work) hear other processes' commits through
    # LISTEN/NOTIFY, so a worker can sleep on them instead of polling.
    notifies_across_processes = True

    def __init__(
        self,
        url: str,
        *,
        schema: str | None = None,
        min_size: int = 1,
        max_size: int = 10,
        retries: int = 3,
        connect_timeout: float = 10.0,
    ) -> None:
        _quiet_pool_reconnects()
        conninfo, own = split_url(url)
        conninfo, self.application_name = _with_application_name(conninfo)
        schema = own.get("schema", schema)
        self.url = url
        self.schema = schema
        self.retries = int(own.get("retries", retries))
        self._conninfo = conninfo
        self._connect_timeout = connect_timeout
        self._where = f"PostgreSQL store {redact(url)}" + (f" (schema {schema})" if schema else "")
        try:
            # Connected here, not by the pool, so a server that refuses (a wrong
            # password, an unknown database) says why at once instead of after
            # the pool's timeout; migrated on; then the pool's first connection.
            first = _Connection.connect(
                conninfo, connect_timeout=max(1, round(connect_timeout)), **_CONNECTION
            )
        except psycopg.Error as exc:
            if _turned_away(exc):  # not worth waiting for: say what to fix
                raise StoreError(
                    f"{self._where}: the server refused the connection: {exc}"
                ) from exc
            raise _translate(exc, self._where) from exc
        handed = [first]
        self._pool: psycopg_pool.ConnectionPool[Conn] = psycopg_pool.ConnectionPool(
            conninfo,
            connection_class=_Connection,
            kwargs={**_CONNECTION, "handed": handed},
            configure=lambda conn: None if conn is first else self._configure(conn),
            min_size=int(own.get("min_size", min_size)),
            max_size=int(own.get("max_size", max_size)),
            open=False,
            name=_POOL,
            timeout=connect_timeout,
        )
        try:
            try:
                self._configure(first)
                self.migrated_from, self.namespace = migrate(first, schema, self._where)
            except psycopg.Error as exc:
                raise _translate(exc, self._where) from exc
            self._pool.open(wait=False)
            try:
                self._pool.wait(timeout=connect_timeout)
            except psycopg_pool.PoolTimeout as exc:
                raise StoreUnavailable(f"{self._where}: could not open connections: {exc}") from exc
        except BaseException:
            self._pool.close()
            raise
        finally:
            with contextlib.suppress(IndexError):  # not taken: a failure, or min_size=0
                handed.pop().close()
        self._signals: Signals | None = None
        self._listener: Listener | None = None
        self._controls = ControlWatchers()
        self._leases: ThreadPoolExecutor | None = None
        self._lease_conn: Conn | None = None  # the lease thread's own (see renew_leases)
        self._closed = False
        self._shut = False  # closed, all of it (see close)
        self._writer = PgWriter(
            self._pool,
            self.namespace,
            where=self._where,
            retries=self.retries,
            translate=lambda exc: (
                _translate(exc, self._where) if isinstance(exc, psycopg.Error) else exc
            ),
            lost=_connection_lost,
            on_commit=self._committed,
        )

    def _configure(self, conn: Conn) -> None:
        # One round trip: without parameters both go as one simple query.
        setup: list[sql.Composable] = [sql.SQL("SET TIME ZONE 'UTC'")]
        if self.schema is not None:
            setup.append(sql.SQL("SET search_path TO {}").format(sql.Identifier(self.schema)))
        conn.execute(sql.SQL("; ").join(setup))

    # --- lifecycle ---

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        """Land the commits already asked for, then let go of the connections and
        threads. A close that was cancelled (a timeout around it) is finished by
        the next; each step can run again."""
        self._closed = True  # no new work from here on
        if self._shut:
            return
        await self._writer.finish()  # commits already asked for still land
        await asyncio.to_thread(self._writer.close)
        if self._listener is not None:
            await self._listener.stop()
            self._listener = None
        await asyncio.to_thread(self._pool.close)
        leases, self._leases = self._leases, None
        if leases is not None:
            # On the lease thread, after any renewal still running there.
            leases.submit(self._drop_lease_connection)
            leases.shutdown(wait=False)
        self._shut = True

    async def __aenter__(self) -> PostgresStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- running work: one retry policy for everything ---

    def _execute(
        self,
        job: Callable[[Any], _T],
        write: bool,
        connection: Callable[[], contextlib.AbstractContextManager[Conn]] | None = None,
    ) -> tuple[_T, PgTx | None]:
        """Run `job` on a pooled connection, or `connection()`'s (inside a transaction if `write`).

        Retried: anything that failed before COMMIT was sent. A lost connection
        aborts the server-side transaction, and a deadlock or serialization
        failure is rolled back by the server, so nothing of the attempt remains
        and running the job again is the same as running it once. A prepared
        statement the connection lost is prepared again on an immediate retry
        that the `retries` budget does not count.
        Not retried: a connection lost *while* COMMIT was in flight. The server
        may have committed before the connection died, and a second attempt
        could apply the commit twice, so the caller gets StoreUnavailable saying
        the outcome is unknown and must re-read to find out.
        """
        attempt = 0
        reprepared = False
        while True:
            attempt += 1
            committing = False
            try:
                with (connection or self._pool.connection)() as conn:
                    if not write:
                        return job(conn), None
                    tx = PgTx(conn, self.namespace)
                    with conn.transaction():
                        result = job(tx)
                        notify = "SELECT pg_notify(%s, %s)"
                        if tx.changed:
                            # Delivered by the server only if and when this commits.
                            channel = WORK_CHANNEL if tx.work else CHANNEL
                            tx.pending.append(Statement(notify, (channel, self.namespace), False))
                        for task_id in tx.notes.controlled:
                            payload = control_payload(self.namespace, task_id)
                            tx.pending.append(Statement(notify, (CONTROL_CHANNEL, payload), False))
                        tx.flush()  # the job's writes and the notifications: one message
                        committing = True
                    return result, tx
            except psycopg_pool.PoolTimeout as exc:
                raise StoreUnavailable(f"{self._where}: no connection available: {exc}") from exc
            except psycopg_pool.PoolClosed as exc:  # a read from another thread met the close
                raise StoreError(f"{self._where} is closed") from exc
            except psycopg.Error as exc:
                lost = _connection_lost(exc)
                if committing and lost:
                    raise CommitOutcomeUnknown(
                        f"{self._where}: the connection was lost while committing; the commit "
                        "may or may not have been applied, re-read the task to find out"
                    ) from exc
                if exc.sqlstate == PREPARED_GONE and not reprepared:
                    # The connection lost the statements prepared on it; they
                    # are prepared again on this try (postgres_tx.py), at once.
                    reprepared = True
                    attempt -= 1
                    continue
                retryable = lost or exc.sqlstate in ("40001", "40P01")
                if not retryable or attempt > self.retries:
                    raise _translate(exc, self._where) from exc
                if lost:
                    # The pool may hold more connections the server dropped.
                    with contextlib.suppress(Exception):
                        self._pool.check()
                if attempt > 1:
                    time.sleep(min(0.05 * 2**attempt, 1.0))

    async def _read(self, job: Callable[[Conn], _T]) -> _T:
        self._check_open()
        result, _ = await asyncio.to_thread(self._execute, job, False)
        return result

    async def _write(self, job: Callable[[PgTx], _T]) -> _T:
        """Run `job` in the next group transaction (see postgres_writer.py)."""
        self._check_open()
        return await self._writer.submit(job, None)  # type: ignore[no-any-return]

    def _enqueue(self, job: Callable[[PgTx], _T], link: PendingCommit) -> asyncio.Future[_T]:
        self._check_open()
        return self._writer.submit(job, link)

    def _committed(self, loop: asyncio.AbstractEventLoop, work: bool) -> None:
        # Local waiters need not wait for the round trip through the server.
        # Control requests are not fired here: the listener hears them from
        # the server, once each, in commit order (a watcher always listens).
        if self._signals is not None and self._signals.loop is loop:
            self._signals.fire(work=work)

    @property
    def batches(self) -> int:
        """Transactions the writer ran (commits / batches = commits per transaction)."""
        return self._writer.batches

    @property
    def jobs_done(self) -> int:
        return self._writer.jobs_done

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"store {redact(self.url)} is closed")

    # --- writes ---

    async def renew_leases(
        self, worker_id: str, leases: Mapping[str, int], ttl: float
    ) -> LeaseRenewal:
        """Renew all of a worker's leases in one transaction, on a thread of its own.

        Task commits queue for the shared worker threads; a renewal waiting
        behind them would drift past the lease on a busy worker.
        """
        self._check_open()
        held = dict(leases)
        if not held:
            return LeaseRenewal(kept={}, lost=set())
        if self._leases is None:
            self._leases = ThreadPoolExecutor(1, thread_name_prefix="duragent-leases")

        kept: dict[str, Task] = {}
        lost: set[str] = set()
        loop = asyncio.get_running_loop()
        # Rows a task commit holds are skipped, not waited for (see PgTx.renew_leases),
        # and tried again a moment later: a commit holds its rows for milliseconds.
        # Whatever is still busy after a third of the lease waits for the next beat.
        give_up = loop.time() + ttl / 3
        while held:
            at = utcnow() + timedelta(seconds=ttl)

            def renew(tx: PgTx, held: dict[str, int] = held, at: datetime = at) -> Any:
                return tx.renew_leases(worker_id, held, at)

            (renewed, gone, busy), tx = await loop.run_in_executor(
                self._leases, self._execute, renew, True, self._lease_connection
            )
            kept.update(renewed)
            lost |= gone
            if tx is not None and tx.changed:
                self._local_signals().fire(work=tx.work)
            held = {task_id: held[task_id] for task_id in busy}
            if not held or loop.time() >= give_up:
                break
            await asyncio.sleep(0.005)
        self._writer.renewed(kept)
        return LeaseRenewal(kept=kept, lost=lost)

    @contextlib.contextmanager
    def _lease_connection(self) -> Iterator[Conn]:
        """The lease thread's own connection, made again once lost.

        Not from the pool: with every pooled connection held by task commits, a
        renewal would wait behind them and a pool timeout would skip a heartbeat.
        """
        conn = self._lease_conn
        if conn is None or conn.closed or conn.broken:
            self._drop_lease_connection()
            conn = _Connection.connect(
                self._conninfo,
                connect_timeout=max(1, round(self._connect_timeout)),
                **_CONNECTION,
            )
            try:
                self._configure(conn)
            except BaseException:
                conn.close()
                raise
            self._lease_conn = conn
        try:
            yield conn
        except BaseException:
            if conn.broken:
                self._drop_lease_connection()
            raise

    def _drop_lease_connection(self) -> None:
        conn, self._lease_conn = self._lease_conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    async def delete_task(self, task_id: str) -> None:
        def delete(tx: PgTx) -> None:
            if not _delete_trees(tx, [task_id]):
                raise TaskNotFound(task_id)

        await self._write(delete)

    async def purge_tasks(self, query: TaskQuery) -> int:
        """Delete up to `query.limit` matching tasks (and their sub-tasks) in one transaction.

        The space is reused by new rows once autovacuum has seen the deletions.
        """
        where, params = _task_filters(query)
        text = "SELECT id FROM tasks" + (" WHERE " + " AND ".join(where) if where else "")
        text += " LIMIT %s FOR UPDATE SKIP LOCKED"

        def purge(tx: PgTx) -> int:
            rows = tx.conn.execute(text, [*params, query.limit]).fetchall()
            return _delete_trees(tx, [r["id"] for r in rows]) if rows else 0

        return await self._write(purge)

    async def reclaim_space(self) -> None:
        """Nothing to do here: autovacuum makes deleted rows' space reusable."""

    # --- reads ---

    async def get_task(self, task_id: str) -> Task:
        def read(conn: Conn) -> Task:
            row = conn.execute("SELECT data, input FROM tasks WHERE id = %s", (task_id,)).fetchone()
            if row is None:
                raise TaskNotFound(task_id)
            return row_task(row)

        return await self._read(read)

    async def list_tasks(self, query: TaskQuery | None = None) -> TaskPage:
        q = query or TaskQuery()
        where, params = _task_filters(q)
        if q.cursor:
            ts, cid = decode_cursor(q.cursor)
            where.append("(created_at, id) < (%s, %s)")
            params.extend([datetime.fromtimestamp(ts, UTC), cid])
        text = "SELECT data, input FROM tasks"
        if where:
            text += " WHERE " + " AND ".join(where)
        text += " ORDER BY created_at DESC, id DESC LIMIT %s"
        params.append(q.limit + 1)

        def read(conn: Conn) -> TaskPage:
            tasks = [row_task(r) for r in conn.execute(text, params)]
            more = len(tasks) > q.limit
            tasks = tasks[: q.limit]
            return TaskPage(tasks, encode_cursor(tasks[-1]) if more and tasks else None)

        return await self._read(read)

    async def count_tasks(self, query: TaskQuery | None = None) -> dict[tuple[str, str], int]:
        where, params = _task_filters(query or TaskQuery())
        text = "SELECT queue, status, count(*) AS n FROM tasks"
        if where:
            text += " WHERE " + " AND ".join(where)
        text += " GROUP BY queue, status"

        def read(conn: Conn) -> dict[tuple[str, str], int]:
            rows = conn.execute(text, params)
            return {(r["queue"], r["status"]): r["n"] for r in rows}

        return await self._read(read)

    async def entries(
        self,
        task_id: str,
        *,
        after_seq: int = 0,
        kinds: Iterable[EntryKind] | None = None,
        limit: int | None = None,
    ) -> list[Entry]:
        text = f"SELECT * FROM entry_rows WHERE {ENTRY_RANGE}"
        # No seq is above MAX_SEQ: a larger cursor gives the empty range past it.
        params: list[Any] = list(entry_range(task_id, min(after_seq, MAX_SEQ) + 1))
        if kinds is not None:
            text += " AND kind = ANY(%s)"
            params.append([EntryKind(k).value for k in kinds])
        text += " ORDER BY eid"
        if limit is not None:
            text += " LIMIT %s"
            params.append(limit)

        def read(conn: Conn) -> list[Entry]:
            return [
                Entry(
                    task_id=task_id,
                    seq=r["seq"],
                    kind=(kind := entry_kind(task_id, r["seq"], r["kind"])),
                    round=r["round"],
                    payload=unpacked(kind, json.loads(r["payload"])),
                    created_at=r["created_at"].astimezone(UTC),
                )
                for r in conn.execute(text, params)
            ]

        return await self._read(read)

    async def entry_heads(self, task_id: str, *, kinds: Iterable[EntryKind]) -> list[EntryHead]:
        columns = "seq, kind, round, payload::json ->> 'role'"
        codes = [EntryKind(k).value for k in kinds]
        return await self._read(
            lambda conn: [
                EntryHead(seq, EntryKind(kind), rnd, role)
                for seq, kind, rnd, role in _task_rows(conn, task_id, columns, codes)
            ]
        )

    async def model_view(self, task_id: str) -> list[ApiMessage]:
        return parse_messages(await self._read(lambda conn: _view_text(conn, task_id)))

    async def model_view_data(self, task_id: str) -> list[dict[str, Any]]:
        return view_data(await self._read(lambda conn: _view_text(conn, task_id)))

    async def ui_messages(self, task_id: str) -> list[UiMessage]:
        code = [EntryKind.UI_MESSAGE.value]
        return await self._read(
            lambda conn: build_ui_view(_task_rows(conn, task_id, "seq, payload", code))
        )

    async def get_document(self, scope: str, key: str) -> Document | None:
        def read(conn: Conn) -> Document | None:
            row = conn.execute(
                "SELECT * FROM documents WHERE scope = %s AND key = %s", (scope, key)
            ).fetchone()
            return None if row is None else row_document(row)

        return await self._read(read)

    async def list_documents(self, scope: str) -> list[Document]:
        def read(conn: Conn) -> list[Document]:
            rows = conn.execute("SELECT * FROM documents WHERE scope = %s ORDER BY key", (scope,))
            return [row_document(r) for r in rows]

        return await self._read(read)

    async def next_wake_at(
        self, agents: Iterable[str] | None = None, queues: Iterable[str] | None = None
    ) -> datetime | None:
        names = None if agents is None else list(agents)
        only = None if queues is None else list(queues)

        mine = (
            "AND (%(all)s OR agent = ANY(%(names)s)) AND (%(any_queue)s OR queue = ANY(%(queues)s))"
        )

        def read(conn: Conn) -> datetime | None:
            # Each part is a min() the planner reads off its index (tasks_due,
            # tasks_leases), not a scan of every waiting or running row. A running
            # task without a lease end counts as expired (the epoch), as in the claim.
            row = conn.execute(
                "SELECT min(t) AS t FROM ("
                " SELECT min(wake_at) AS t FROM tasks WHERE status = 'waiting'"
                f" AND wake_at IS NOT NULL {mine}"
                " UNION ALL SELECT min(coalesce(lease_expires, 'epoch'::timestamptz))"
                f" FROM tasks WHERE status = 'running' {mine}"
                " UNION ALL SELECT min(wake_at) FROM tasks WHERE status = 'pending'"
                f" AND wake_at IS NOT NULL {mine}) AS wakes",
                {
                    "all": names is None,
                    "names": names or [],
                    "any_queue": only is None,
                    "queues": only or [],
                },
            ).fetchone()
            value = None if row is None else row["t"]
            return None if value is None else value.astimezone(UTC)

        return await self._read(read)

    # --- change notification ---

    def _local_signals(self) -> Signals:
        loop = asyncio.get_running_loop()
        if self._signals is None or self._signals.loop is not loop:
            self._signals = Signals(loop)
        return self._signals

    @property
    def listening(self) -> bool:
        """True while other processes' commits reach wait_for_change (LISTEN is active)."""
        return self._listener is not None and self._listener.ready.is_set()

    async def wait_for_change(self, timeout: float) -> None:
        """Return after a commit by any process (via LISTEN/NOTIFY) or after `timeout`.

        While the listening connection is (re)connecting, changes could go
        unheard, so the call returns as soon as it listens again: callers re-read
        after every return, which makes an early return harmless.
        """
        await self._wait(timeout, work=False)

    async def wait_for_work(self, timeout: float) -> None:
        """Like wait_for_change, for the commits that may make a task claimable.

        What a worker waits on: lease renewals and appended entries, most of
        the commits of a busy cluster, do not wake it.
        """
        await self._wait(timeout, work=True)

    def watch_controls(self, callback: ControlCallback) -> Callable[[], None]:
        """Call `callback(task_id)` when a control request is committed on a task,
        by any process (LISTEN/NOTIFY), and `callback(None)` whenever listening
        (re)starts. Returns the function that stops the calls."""
        self._check_open()
        remove = self._controls.add(callback)
        self._listen(changes=False)
        return remove

    def _listen(self, *, changes: bool) -> Listener:
        signals = self._local_signals()
        listener = self._listener
        if listener is None or listener.loop is not signals.loop:
            listener = Listener(
                self._conninfo,
                self.namespace,
                self._local_signals,
                changes=changes,
                on_control=self._controls.fire,
            )
        elif changes and not listener.changes:
            # The first wait for any change: listen to every channel from now on.
            # Waiting callers are woken (re-read, wait again) as after a lost
            # connection, since the new one may miss what is committed meanwhile.
            listener.task.cancel()
            listener = Listener(
                self._conninfo,
                self.namespace,
                self._local_signals,
                changes=True,
                on_control=self._controls.fire,
            )
            signals.fire(work=True)
        self._listener = listener
        return listener

    async def _wait(self, timeout: float, *, work: bool) -> None:
        self._check_open()
        signals = self._local_signals()
        signal = signals.work if work else signals.change
        listener = self._listen(changes=not work)
        if not listener.ready.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(listener.ready.wait(), timeout)
            return
        await signal.wait(timeout)


def _task_rows(conn: Conn, task_id: str, columns: str, kinds: list[str]) -> list[Any]:
    """A task's entries of `kinds` as tuples of `columns` (the seq first), in seq order.

    Read without ORDER BY and sorted here: the range's bounds come from a
    subquery, so the planner cannot size it, and on a table without fresh
    statistics it chose a bitmap scan and a sort on the server (6.8 ms for
    10,000 rows, against 3.6 for the index in order). The rows come in the
    table's order, nearly sorted already: a few comparisons each here. Tuples,
    not dicts: a long task's view is 10,000 rows.
    """
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(
            f"SELECT {columns} FROM entry_rows WHERE {ENTRY_RANGE} AND kind = ANY(%s)",
            (*entry_range(task_id), kinds),
        )
        rows = cur.fetchall()
    rows.sort(key=itemgetter(0))
    return rows


# The view's payloads joined by the server, and whether a rollback marker is
# among them. One value instead of a row per message: a 10,000-entry task's
# view took 14 ms read as rows and joined here, 10.6 as this (the server's
# part grows from 3.4 to 7.6 ms; this process's shrinks from 10.6 to 3).
_JOINED_VIEW = (
    "SELECT '[' || coalesce(string_agg(payload, ',' ORDER BY eid), '') || ']',"
    f" coalesce(bool_or(kind = '{EntryKind.ROLLBACK.value}'), false)"
    f" FROM entry_rows WHERE {ENTRY_RANGE} AND kind = ANY(%s)"
)


def _view_text(conn: Conn, task_id: str) -> str:
    """The payloads of the task's model view as one JSON array text."""
    kinds = list(VIEW_KINDS)
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(_JOINED_VIEW, (*entry_range(task_id), kinds))
        row = cur.fetchone()
    if row is not None and not row[1]:
        return str(row[0])  # nothing voided (the common case): that is the view
    return view_text(_task_rows(conn, task_id, "seq, kind, payload", kinds))


def _delete_trees(tx: PgTx, roots: list[str]) -> int:
    """Delete tasks with their sub-tasks, entries and documents; return how many."""
    rows = tx.conn.execute(
        "WITH RECURSIVE tree(id) AS (SELECT id FROM tasks WHERE id = ANY(%s)"
        " UNION SELECT t.id FROM tasks t JOIN tree ON t.parent_id = tree.id)"
        " SELECT id FROM tree",
        (roots,),
    ).fetchall()
    doomed = [r["id"] for r in rows]
    if doomed:
        # Forks that reference these tasks' payloads get them back first. The
        # rows are locked before: a fork of one of them holds its row (FOR UPDATE
        # in `apply_fork`) until it commits, so its references are seen here.
        tx.conn.execute("SELECT 1 FROM tasks WHERE id = ANY(%s) ORDER BY id FOR UPDATE", (doomed,))
        # A doomed task's entries: the keys from its number << 32 on.
        span = f"BETWEEN d.num << {SEQ_BITS} AND (d.num << {SEQ_BITS}) + {MAX_SEQ}"
        tx.conn.execute(
            "UPDATE entries e SET payload = s.payload, src = NULL FROM entries s, tasks d"
            f" WHERE d.id = ANY(%s) AND e.src {span} AND s.eid = e.src",
            (doomed,),
        )
        tx.conn.execute(
            f"DELETE FROM entries e USING tasks d WHERE d.id = ANY(%s) AND e.eid {span}",
            (doomed,),
        )
        scopes = [f"task:{tid}" for tid in doomed]
        tx.conn.execute("DELETE FROM documents WHERE scope = ANY(%s)", (scopes,))
        tx.conn.execute("DELETE FROM tasks WHERE id = ANY(%s)", (doomed,))
        tx.changed = True
    return len(doomed)


def _task_filters(q: TaskQuery) -> tuple[list[str], list[Any]]:
    """The WHERE terms and parameters of a task query (metadata through its GIN index)."""
    where: list[str] = []
    params: list[Any] = []
    for column, value in q.equal_filters():
        where.append(f"{column} = %s")
        params.append(value)
    where += [f"{column} IS NULL" for column in q.null_filters()]
    statuses = q.statuses()
    if statuses is not None:
        where.append("status = ANY(%s)")
        params.append(statuses)
    for column, op, bound in q.range_filters():
        where.append(f"{column} {op} %s")
        params.append(bound)
    if q.metadata:
        where.append("metadata @> %s")
        params.append(Jsonb(q.metadata))
    return where, params


def _connection_lost(exc: psycopg.Error) -> bool:
    """True when the failure was the connection itself, not an error the server reported."""
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = exc.sqlstate
    return state is None or state.startswith("08") or state in ("57P01", "57P02", "57P03")


class _ReconnectsAtDebug(logging.Filter):
    """psycopg's pool logs every failed attempt to connect as a warning: a line a
    second or more while the server is out of reach. The store's callers say
    once that they wait for it (runtime/outage.py); the pool's attempts are
    demoted to DEBUG, kept only where that logger is enabled for DEBUG."""

    def __init__(self, logger: logging.Logger) -> None:
        super().__init__()
        self.logger = logger

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if (
            record.msg == "error connecting in %r: %s"
            and isinstance(args, tuple)
            and args[0] == _POOL
        ):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return self.logger.isEnabledFor(logging.DEBUG)
        return True


_POOL = "duragent"  # the name of the store's connection pool


def _quiet_pool_reconnects() -> None:
    pool_log = logging.getLogger("psycopg.pool")
    if not any(isinstance(f, _ReconnectsAtDebug) for f in pool_log.filters):
        pool_log.addFilter(_ReconnectsAtDebug(pool_log))


# What a server says when it turns a connection away for a while (starting,
# stopping, full), unlike a wrong role, password or database, which stay wrong.
_BUSY_SERVER = ("the database system is", "too many clients", "connection slots are reserved")


def _turned_away(exc: psycopg.Error) -> bool:
    """Whether the server answered the connection with a refusal that waiting will
    not change. libpq gives such a refusal as text only: the server's FATAL."""
    text = str(exc)
    return "FATAL:" in text and not any(busy in text for busy in _BUSY_SERVER)


def _translate(exc: psycopg.Error, where: str) -> StoreError:
    if isinstance(exc, psycopg.errors.UniqueViolation):
        return Conflict(f"{where}: {exc.diag.message_primary or exc}")
    if _connection_lost(exc):
        return StoreUnavailable(f"{where} cannot be reached: {exc}")
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


def _with_application_name(conninfo: str) -> tuple[str, str]:
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
