"""The PostgreSQL store: many workers on many machines share one database.

Every write runs in a transaction its process's writer thread shares among
the commits waiting at that moment (_postgres_writer.py), running the shared
commit algorithm (store/_tx.py) over `PgTx` (_postgres_tx.py); the tables and
migrations are in _postgres_schema.py. Each committed change sends a NOTIFY
(_postgres_notify.py), so waiters on any machine wake without polling. Reads
run on pooled connections in worker threads, and so do lease renewals, on a
thread of their own (`renew_leases`), so they never queue behind task commits.
Writes and reads retry after a lost connection or a deadlock (`PgWriter.run_batch`,
`_execute`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any, TypeVar

import psycopg
import psycopg_pool
from psycopg import sql

from duragent.errors import (
    CommitOutcomeUnknown,
    StoreError,
    StoreUnavailable,
    TaskNotFound,
)
from duragent.store._codec import (
    encode_cursor,
)
from duragent.store._commits import LeaseRenewal, PendingCommit, TaskPage, TaskQuery
from duragent.store._postgres_bounds import (
    DEFAULT_LEASE_TTL,
    LeaseConnection,
    WaitBounds,
    bounded_conninfo,
    session_setup,
)
from duragent.store._postgres_claims import PgClaims
from duragent.store._postgres_connect import (
    CONNECTION_OPTIONS,
    POOL_NAME,
    PooledConnection,
    connection_lost,
    quiet_pool_reconnects,
    redact,
    split_url,
    translate,
    turned_away,
    with_application_name,
    writable,
)
from duragent.store._postgres_message import PREPARED_GONE, use_wire, wire_mode
from duragent.store._postgres_notify import (
    CHANNEL,
    WORK_CHANNEL,
    Listener,
    Signals,
)
from duragent.store._postgres_queries import count_text, delete_trees, list_text, task_filters
from duragent.store._postgres_reads import PgReads
from duragent.store._postgres_schema import (
    MIGRATIONS,
    SCHEMA_VERSION,
    Conn,
    lock_key,
    migrate,
)
from duragent.store._postgres_tx import PgTx, row_document, row_task
from duragent.store._postgres_writer import PgWriter, notifications
from duragent.store._signals import ControlCallback, ControlWatchers, TasksCallback, TaskWatchers
from duragent.store._tx import TxWrites
from duragent.types import Document, Task, utcnow

__all__ = ["CHANNEL", "MIGRATIONS", "WORK_CHANNEL", "PostgresStore", "lock_key", "migrate"]

_T = TypeVar("_T")


class PostgresStore(PgClaims, PgReads, TxWrites):
    """`PostgresStore("postgresql://user@host/db", schema=None, max_size=10)`.

    Nothing is connected until `open()` (or `async with store:`), which
    creates or migrates the schema; `schema` keeps several
    independent stores in one database. Every connection carries an
    `application_name` (`duragent-<pid>` unless the URL or $PGAPPNAME names
    one), so an operator can tell in `pg_stat_activity` which process holds it.
    """

    # wait_for_change (and wait_for_work) hear other processes' commits through
    # LISTEN/NOTIFY, so a worker can sleep on them instead of polling.
    notifies_across_processes = True
    schema_version = SCHEMA_VERSION

    def __init__(
        self,
        url: str,
        *,
        schema: str | None = None,
        min_size: int = 1,
        max_size: int = 10,
        retries: int = 3,
        connect_timeout: float = 10.0,
        lease_ttl: float | None = None,
    ) -> None:
        quiet_pool_reconnects()
        conninfo, own = split_url(url)
        conninfo, self.application_name = with_application_name(conninfo)
        schema = own.get("schema", schema)
        self.url = url
        self.schema = schema
        self.retries = int(own.get("retries", retries))
        self.wire = wire_mode(own.get("wire"))  # _postgres_message.py
        self._connect_timeout = connect_timeout
        # Every wait over the network is bounded by the workers' lease (_postgres_bounds.py).
        ttl = own.get("lease_ttl", lease_ttl)
        self._ttl_given, self._given_conninfo = ttl is not None, conninfo
        self._bound(float(ttl or DEFAULT_LEASE_TTL))
        self._where = f"PostgreSQL store {redact(url)}" + (f" (schema {schema})" if schema else "")
        self._min_size = int(own.get("min_size", min_size))
        self._max_size = int(own.get("max_size", max_size))
        self.migrated_from: int | None = None  # the schema version found, once open
        self.namespace = ""  # the NOTIFY namespace, once open
        # Made by `open`: the pool and the writer.
        self._pool: psycopg_pool.ConnectionPool[Conn]
        self._writer: PgWriter
        self._signals: Signals | None = None
        self._listener: Listener | None = None
        self._controls = ControlWatchers()
        self._moved = TaskWatchers()
        self._leases: ThreadPoolExecutor | None = None
        self._lease_conn = LeaseConnection(lambda: self._conninfo, self._configure)
        self._opened = False
        self._closed = False
        self._shut = False  # closed, all of it (see close)

    # --- lifecycle ---

    async def open(self) -> None:
        """Connect, create or migrate the schema, open the pool; again, nothing."""
        if self._opened:
            return
        self._check_open()
        conninfo, connect_timeout = self._conninfo, self._connect_timeout
        try:
            # Connected here, not by the pool, so a server that refuses (a wrong
            # password, an unknown database) says why at once instead of after
            # the pool's timeout; migrated on; then the pool's first connection.
            first = PooledConnection.connect(conninfo, **CONNECTION_OPTIONS)
        except psycopg.Error as exc:
            if turned_away(exc):  # not worth waiting for: say what to fix
                raise StoreError(
                    f"{self._where}: the server refused the connection: {exc}"
                ) from exc
            raise translate(exc, self._where) from exc
        handed = [first]
        pool: psycopg_pool.ConnectionPool[Conn] = psycopg_pool.ConnectionPool(
            conninfo,
            connection_class=PooledConnection,
            kwargs={**CONNECTION_OPTIONS, "handed": handed},
            configure=lambda conn: None if conn is first else self._configure(conn),
            min_size=self._min_size,
            max_size=self._max_size,
            open=False,
            name=POOL_NAME,
            timeout=connect_timeout,
        )
        try:
            try:
                self._configure(first, bounded=False)
                self.migrated_from, self.namespace = migrate(first, self.schema, self._where)
                if bounds := session_setup(first, conninfo, self.bounds):
                    first.execute(sql.SQL("; ").join(bounds))
            except psycopg.Error as exc:
                raise translate(exc, self._where) from exc
            pool.open(wait=False)
            try:
                pool.wait(timeout=connect_timeout)
            except psycopg_pool.PoolTimeout as exc:
                raise StoreUnavailable(f"{self._where}: could not open connections: {exc}") from exc
        except BaseException:
            pool.close()
            raise
        finally:
            with contextlib.suppress(IndexError):  # not taken: a failure, or min_size=0
                handed.pop().close()
        self._pool = pool
        self._writer = PgWriter(
            pool,
            self.namespace,
            where=self._where,
            retries=self.retries,
            translate=lambda exc: (
                translate(exc, self._where) if isinstance(exc, psycopg.Error) else exc
            ),
            lost=connection_lost,
            on_commit=self._committed,
        )
        self._opened = True

    def expect_lease_ttl(self, ttl: float) -> None:
        """Bound the store's waits by workers' leases of `ttl` seconds (a Runtime's
        `lease_ttl`): before `open`, unless the URL or the constructor named one."""
        if not self._opened and not self._ttl_given:
            self._bound(ttl)

    def _bound(self, ttl: float) -> None:
        self.bounds = WaitBounds(ttl)
        given = writable(self._given_conninfo)
        self._conninfo = bounded_conninfo(given, self.bounds, self._connect_timeout)

    def _configure(self, conn: Conn, *, bounded: bool = True) -> None:
        # One round trip: without parameters all go as one simple query (and one
        # more for the wire's checks of the session, use_wire).
        setup: list[sql.Composable] = [sql.SQL("SET TIME ZONE 'UTC'")]
        if self.schema is not None:
            setup.append(sql.SQL("SET search_path TO {}").format(sql.Identifier(self.schema)))
        if bounded:
            setup += session_setup(conn, self._conninfo, self.bounds)
        conn.execute(sql.SQL("; ").join(setup))
        use_wire(conn, self.wire, self._where)

    async def close(self) -> None:
        """Land the commits already asked for, then let go of the connections and
        threads. A close that was cancelled (a timeout around it) is finished by
        the next; each step can run again."""
        self._closed = True  # no new work from here on
        if self._shut or not self._opened:
            self._shut = True
            return
        await self._writer.finish()  # commits already asked for still land
        await asyncio.to_thread(self._writer.close)
        if self._listener is not None:
            await self._listener.stop()
            self._listener = None
        await asyncio.to_thread(self.close_threads)  # before the pool: their work lands
        await asyncio.to_thread(self._pool.close)
        leases, self._leases = self._leases, None
        if leases is not None:
            # On the lease thread, after any renewal still running there.
            leases.submit(self._lease_conn.drop)
            leases.shutdown(wait=False)
        self._shut = True

    async def __aenter__(self) -> PostgresStore:
        await self.open()
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
                        # Delivered by the server only if and when this commits.
                        tx.pending += notifications(self.namespace, [tx])
                        tx.flush()  # the job's writes and the notifications: one message
                        committing = True
                    return result, tx
            except psycopg_pool.PoolTimeout as exc:
                raise StoreUnavailable(f"{self._where}: no connection available: {exc}") from exc
            except psycopg_pool.PoolClosed as exc:  # a read from another thread met the close
                raise StoreError(f"{self._where} is closed") from exc
            except psycopg.Error as exc:
                lost = connection_lost(exc)
                if committing and lost:
                    raise CommitOutcomeUnknown(
                        f"{self._where}: the connection was lost while committing; the commit "
                        "may or may not have been applied, re-read the task to find out"
                    ) from exc
                if exc.sqlstate == PREPARED_GONE and not reprepared:
                    # The connection lost the statements prepared on it; they
                    # are prepared again on this try (_postgres_wire.py), at once.
                    reprepared = True
                    attempt -= 1
                    continue
                retryable = lost or exc.sqlstate in ("40001", "40P01")
                if not retryable or attempt > self.retries:
                    raise translate(exc, self._where) from exc
                if lost:
                    # The pool may hold more connections the server dropped.
                    with contextlib.suppress(Exception):
                        self._pool.check()
                if attempt > 1:
                    time.sleep(min(0.05 * 2**attempt, 1.0))

    async def _read(self, job: Callable[[Conn], _T]) -> _T:
        self._check_opened()
        readers = self.readers()  # as many threads as pooled connections (_postgres_claims.py)
        result, _ = await asyncio.get_running_loop().run_in_executor(
            readers, self._execute, job, False
        )
        return result

    async def _write(self, job: Callable[[PgTx], _T]) -> _T:
        """Run `job` in the next group transaction (see _postgres_writer.py)."""
        self._check_opened()
        return await self._writer.submit(job, None)  # type: ignore[no-any-return]

    def _enqueue(self, job: Callable[[PgTx], _T], link: PendingCommit) -> asyncio.Future[_T]:
        self._check_opened()
        return self._writer.submit(job, link)

    def _committed(self, loop: asyncio.AbstractEventLoop, work: bool, *_: object) -> None:
        # Local waiters need not wait for the round trip through the server; control
        # requests and moved tasks come from the listener, once each, in commit order.
        if self._signals is not None and self._signals.loop is loop:
            self._signals.fire(work=work)

    @property
    def batches(self) -> int:
        """Transactions the writer ran (commits / batches = commits per transaction)."""
        return self._writer.batches if self._opened else 0

    @property
    def jobs_done(self) -> int:
        return self._writer.jobs_done if self._opened else 0

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"store {redact(self.url)} is closed")

    def _check_opened(self) -> None:
        self._check_open()
        if not self._opened:
            raise StoreError(
                f"store {redact(self.url)} is not open: use `async with store:` or"
                " `await store.open()`"
            )

    # --- writes ---

    async def renew_leases(
        self, worker_id: str, leases: Mapping[str, int], ttl: float
    ) -> LeaseRenewal:
        """`_renew_leases` within half of `ttl`: past that, the leases count as not
        renewed (StoreUnavailable) and the lease connection is cut, so the lease
        thread stops waiting on a link that may be dead."""
        bound = WaitBounds(ttl).renewal_bound
        try:
            return await asyncio.wait_for(self._renew_leases(worker_id, leases, ttl), bound)
        except TimeoutError:
            self._lease_conn.cut()
            raise StoreUnavailable(
                f"{self._where}: lease renewal did not finish within {bound:g}s; not renewed"
            ) from None

    async def _renew_leases(
        self, worker_id: str, leases: Mapping[str, int], ttl: float
    ) -> LeaseRenewal:
        """Renew all of a worker's leases in one transaction, on a thread of its own.

        Task commits queue for the shared worker threads; a renewal waiting
        behind them would drift past the lease on a busy worker.
        """
        self._check_opened()
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

            def renew(
                tx: PgTx, held: dict[str, int] = held
            ) -> tuple[dict[str, Task], set[str], set[str]]:
                return tx.renew_leases(worker_id, held, ttl)

            sent = loop.time()
            (renewed, gone, busy), tx = await loop.run_in_executor(
                self._leases, self._execute, renew, True, self._lease_conn
            )
            # The server set each lease to ttl past its now(), which is no earlier
            # than `sent`: once ttl has gone by here, the lease may be over.
            if loop.time() - sent < ttl:
                kept.update(renewed)
                self._writer.renewed(renewed)  # now: the next batch's guards match
            else:
                lost |= set(renewed)
            lost |= gone
            if tx is not None and tx.changed:
                self._local_signals().fire(work=tx.work)
            held = {task_id: held[task_id] for task_id in busy}
            if not held or loop.time() >= give_up:
                break
            await asyncio.sleep(0.005)
        return LeaseRenewal(kept=kept, lost=lost)

    async def delete_task(self, task_id: str) -> None:
        def delete(tx: PgTx) -> None:
            if not delete_trees(tx, [task_id]):
                raise TaskNotFound(task_id)

        await self._write(delete)

    async def purge_tasks(self, query: TaskQuery) -> int:
        """Delete up to `query.limit` matching tasks (and their sub-tasks) in one transaction.

        The space is reused by new rows once autovacuum has seen the deletions.
        """
        where, params = task_filters(query)
        text = "SELECT id FROM tasks" + (" WHERE " + " AND ".join(where) if where else "")
        text += " LIMIT %s FOR UPDATE SKIP LOCKED"

        def purge(tx: PgTx) -> int:
            rows = tx.conn.execute(text, [*params, query.limit]).fetchall()
            return delete_trees(tx, [r["id"] for r in rows]) if rows else 0

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
        text, params = list_text(q)

        def read(conn: Conn) -> TaskPage:
            tasks = [row_task(r) for r in conn.execute(text, params)]
            more = len(tasks) > q.limit
            tasks = tasks[: q.limit]
            return TaskPage(tasks, encode_cursor(tasks[-1]) if more and tasks else None)

        return await self._read(read)

    async def count_tasks(self, query: TaskQuery | None = None) -> dict[tuple[str, str], int]:
        text, params = count_text(query or TaskQuery())

        def read(conn: Conn) -> dict[tuple[str, str], int]:
            rows = conn.execute(text, params)
            return {(r["queue"], r["status"]): r["n"] for r in rows}

        return await self._read(read)

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
            # Each min() is read off an index (tasks_due, tasks_leases), not a scan; a
            # running task without a lease end counts as expired (epoch), as in claims.
            row = conn.execute(
                "SELECT (SELECT min(wake_at) FROM tasks WHERE status = 'waiting'"
                f" AND wake_at IS NOT NULL {mine}) AS waiting,"
                " (SELECT min(wake_at) FROM tasks WHERE status = 'pending'"
                f" AND wake_at IS NOT NULL {mine}) AS pending,"
                " (SELECT min(coalesce(lease_expires, 'epoch'::timestamptz))"
                f" FROM tasks WHERE status = 'running' {mine}) AS lease,"
                " now() AS server_now",
                {
                    "all": names is None,
                    "names": names or [],
                    "any_queue": only is None,
                    "queues": only or [],
                },
            ).fetchone()
            assert row is not None  # (scalar sub-selects: always one row)
            # Timers are set on their hosts' clocks and are given back as set; a lease
            # ends on the server's clock: its distance from now, on this host's.
            found = [t for t in (row["waiting"], row["pending"]) if t is not None]
            if row["lease"] is not None:
                found.append(utcnow() + (row["lease"] - row["server_now"]))
            return min(found) if found else None

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
        self._check_opened()
        remove = self._controls.add(callback)
        self._listen(changes=False)
        return remove

    def watch_tasks(self, callback: TasksCallback) -> Callable[[], None]:
        """`callback(task_ids)` after each commit by any process, None at each (re)listen."""
        self._check_opened()
        self._listen(changes=True)
        return self._moved.add(callback)

    def _listen(self, *, changes: bool) -> Listener:
        signals = self._local_signals()
        listener = self._listener
        if listener is None or listener.loop is not signals.loop:
            listener = self._listener_for(changes)
        elif changes and not listener.changes:
            # The first wait for any change: listen to every channel from now on.
            # Waiting callers are woken (re-read, wait again) as after a lost
            # connection, since the new one may miss what is committed meanwhile.
            listener.task.cancel()
            listener = self._listener_for(True)
            signals.fire(work=True)
        self._listener = listener
        return listener

    def _listener_for(self, changes: bool) -> Listener:
        return Listener(
            self._conninfo,
            self.namespace,
            self._local_signals,
            changes=changes,
            on_control=self._controls.fire,
            on_tasks=self._moved.fire,
            bounds=self.bounds,
        )

    async def _wait(self, timeout: float, *, work: bool) -> None:
        self._check_opened()
        signals = self._local_signals()
        signal = signals.work if work else signals.change
        listener = self._listen(changes=not work)
        if not listener.ready.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(listener.ready.wait(), timeout)
            return
        await signal.wait(timeout)
