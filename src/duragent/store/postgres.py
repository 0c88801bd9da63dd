"""The PostgreSQL store: many workers on many machines share one database.

Every write is one transaction on a pooled connection, running the shared
commit algorithm (store/tx.py) over `_PgTx`. Row locks do the coordination:
`load_task` takes `FOR UPDATE`, so the fencing check and the write happen
under the same lock; claims use `FOR UPDATE SKIP LOCKED`, so workers never
queue behind each other; each committed change sends a NOTIFY so waiters on
any machine wake without polling. Psycopg is synchronous here and runs in
worker threads; concurrency is bounded by the pool, not by a store-wide lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
import psycopg_pool
from psycopg import sql
from psycopg.rows import DictRow, dict_row

from duragent.errors import (
    Conflict,
    StoreError,
    StoreUnavailable,
    StoreVersionError,
    TaskNotFound,
)
from duragent.store.base import (
    SCHEMA_VERSION,
    VIEW_KINDS,
    ChangeSignal,
    Commit,
    CommitResult,
    TaskPage,
    TaskQuery,
    build_model_view,
    build_ui_view,
    decode_cursor,
    encode_cursor,
)
from duragent.store.tx import apply_claim, apply_commit, apply_create, apply_release, apply_renew
from duragent.types import ApiMessage, Document, Entry, EntryKind, NewEntry, Task, UiMessage, utcnow

Conn = psycopg.Connection[DictRow]
_T = TypeVar("_T")

CHANNEL = "duragent_changes"

# Forward-only: MIGRATIONS[n] takes a schema from version n-1 to n.
# Ids and keys sort byte-wise (COLLATE "C") so every backend lists in the same order.
MIGRATIONS: dict[int, list[str]] = {
    1: [
        """CREATE TABLE tasks (
            id text COLLATE "C" PRIMARY KEY,
            owner text, request_id text, session_id text, parent_id text, root_id text,
            agent text NOT NULL, status text NOT NULL, status_reason text,
            created_at timestamptz NOT NULL, updated_at timestamptz NOT NULL,
            wake_at timestamptz, lease_owner text, lease_expires timestamptz,
            lease_epoch bigint NOT NULL DEFAULT 0, last_seq bigint NOT NULL DEFAULT 0,
            version bigint NOT NULL DEFAULT 0, data text NOT NULL, input text NOT NULL
        )""",
        "CREATE UNIQUE INDEX tasks_request ON tasks (coalesce(owner, ''), request_id)"
        " WHERE request_id IS NOT NULL",
        "CREATE INDEX tasks_runnable ON tasks (status, created_at)",
        "CREATE INDEX tasks_owner ON tasks (owner, created_at)",
        "CREATE INDEX tasks_parent ON tasks (parent_id)",
        "CREATE INDEX tasks_session ON tasks (session_id, created_at)",
        """CREATE TABLE entries (
            task_id text NOT NULL, seq bigint NOT NULL, kind text NOT NULL,
            round integer NOT NULL, payload text NOT NULL, created_at timestamptz NOT NULL,
            PRIMARY KEY (task_id, seq)
        )""",
        """CREATE TABLE documents (
            scope text NOT NULL, key text COLLATE "C" NOT NULL, value text NOT NULL,
            version bigint NOT NULL, updated_at timestamptz NOT NULL,
            PRIMARY KEY (scope, key)
        )""",
    ],
}
assert max(MIGRATIONS) == SCHEMA_VERSION

# PostgresStore options that are ours, not libpq's, when given in the URL query.
_OWN_OPTIONS = ("schema", "min_size", "max_size", "retries")


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def lock_key(*parts: str) -> int:
    """A stable signed 64-bit advisory-lock key for a name."""
    digest = hashlib.blake2b("\x00".join(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def _row_task(row: DictRow) -> Task:
    task = Task.model_validate_json(row["data"])
    task.input = json.loads(row["input"])
    return task


def _row_document(row: DictRow) -> Document:
    return Document(
        scope=row["scope"],
        key=row["key"],
        value=json.loads(row["value"]),
        version=row["version"],
        updated_at=row["updated_at"].astimezone(UTC),
    )


class _PgTx:
    """The shared algorithm's view of one open PostgreSQL transaction."""

    def __init__(self, conn: Conn, namespace: str) -> None:
        self.conn = conn
        self.namespace = namespace
        self.inputs: dict[str, Any] = {}
        self.changed = False

    def _task(self, row: DictRow | None) -> Task | None:
        if row is None:
            return None
        task = _row_task(row)
        self.inputs[task.id] = task.input
        return task

    def load_task(self, task_id: str) -> Task | None:
        # FOR UPDATE: the fence check in apply_commit reads the row it will write,
        # and no other writer can change the epoch until this transaction ends.
        row = self.conn.execute(
            "SELECT data, input FROM tasks WHERE id = %s FOR UPDATE", (task_id,)
        ).fetchone()
        return self._task(row)

    def find_by_request(self, owner: str | None, request_id: str) -> Task | None:
        # Two creators of the same request take turns here; the second then sees
        # the first one's committed row instead of failing on the unique index.
        key = lock_key(self.namespace, "request", owner or "", request_id)
        self.conn.execute("SELECT pg_advisory_xact_lock(%s)", (key,))
        row = self.conn.execute(
            "SELECT data, input FROM tasks WHERE coalesce(owner, '') = %s AND request_id = %s",
            (owner or "", request_id),
        ).fetchone()
        return self._task(row)

    @staticmethod
    def _columns(task: Task) -> dict[str, Any]:
        return {
            "id": task.id,
            "status": task.status.value,
            "status_reason": task.status_reason,
            "updated_at": task.updated_at,
            "wake_at": task.wake_at,
            "lease_owner": task.lease.owner,
            "lease_expires": task.lease.expires_at,
            "lease_epoch": task.lease.epoch,
            "last_seq": task.last_seq,
            "version": task.version,
            "data": task.model_dump_json(exclude={"input"}),
        }

    def insert_task(self, task: Task) -> None:
        cols = self._columns(task)
        cols.update(
            owner=task.owner,
            request_id=task.request_id,
            session_id=task.session_id,
            parent_id=task.parent_id,
            root_id=task.root_id,
            agent=task.agent,
            created_at=task.created_at,
            input=_dumps(task.input),
        )
        query = sql.SQL("INSERT INTO tasks ({}) VALUES ({})").format(
            sql.SQL(", ").join(map(sql.Identifier, cols)),
            sql.SQL(", ").join(map(sql.Placeholder, cols)),
        )
        self.conn.execute(query, cols)
        self.changed = True

    def update_task(self, task: Task) -> None:
        cols = self._columns(task)
        # The input is written once at creation; re-sending it on every step would
        # make each commit cost the size of the input.
        if task.id not in self.inputs or self.inputs[task.id] != task.input:
            cols["input"] = _dumps(task.input)
        query = sql.SQL("UPDATE tasks SET {} WHERE id = %(id)s").format(
            sql.SQL(", ").join(
                sql.SQL("{} = {}").format(sql.Identifier(k), sql.Placeholder(k))
                for k in cols
                if k != "id"
            )
        )
        self.conn.execute(query, cols)
        self.changed = True

    def append(self, entries: list[Entry]) -> None:
        with self.conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO entries (task_id, seq, kind, round, payload, created_at)"
                " VALUES (%s, %s, %s, %s, %s, %s)",
                [
                    (e.task_id, e.seq, e.kind.value, e.round, _dumps(e.payload), e.created_at)
                    for e in entries
                ],
            )
        self.changed = True

    def load_document(self, scope: str, key: str) -> Document | None:
        # A document that does not exist yet has no row to lock, so writers of one
        # (scope, key) take turns on an advisory lock instead; the version check
        # in apply_commit then reads what the previous writer committed.
        lock = lock_key(self.namespace, "document", scope, key)
        self.conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock,))
        row = self.conn.execute(
            "SELECT * FROM documents WHERE scope = %s AND key = %s", (scope, key)
        ).fetchone()
        return None if row is None else _row_document(row)

    def put_document(self, doc: Document) -> None:
        self.conn.execute(
            "INSERT INTO documents (scope, key, value, version, updated_at)"
            " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (scope, key) DO UPDATE SET"
            " value = excluded.value, version = excluded.version, updated_at = excluded.updated_at",
            (doc.scope, doc.key, _dumps(doc.value), doc.version, doc.updated_at),
        )
        self.changed = True

    def delete_document(self, scope: str, key: str) -> None:
        self.conn.execute("DELETE FROM documents WHERE scope = %s AND key = %s", (scope, key))
        self.changed = True

    def find_claimable(
        self, now: datetime, agents: Sequence[str] | None, task_id: str | None
    ) -> Task | None:
        # SKIP LOCKED: a row another worker is claiming (or committing to) is
        # passed over rather than waited for; the row returned stays locked
        # until this transaction writes the claim.
        if agents is not None and not agents:
            return None
        query = (
            "SELECT data, input FROM tasks WHERE (status = 'pending'"
            " OR (status = 'running' AND (lease_expires IS NULL OR lease_expires <= %(now)s))"
            " OR (status = 'waiting' AND status_reason = 'timer' AND wake_at <= %(now)s))"
        )
        params: dict[str, Any] = {"now": now}
        if agents is not None:
            query += " AND agent = ANY(%(agents)s)"
            params["agents"] = list(agents)
        if task_id is not None:
            query += " AND id = %(id)s"
            params["id"] = task_id
        query += " ORDER BY created_at LIMIT 1 FOR UPDATE SKIP LOCKED"
        return self._task(self.conn.execute(query, params).fetchone())


def migrate(conn: Conn, schema: str | None, where: str) -> tuple[int, str]:
    """Bring the schema to SCHEMA_VERSION; return (version found, schema name).

    An advisory lock makes concurrent openers take turns: the first migrates,
    the rest find the work done. A newer version is refused untouched.
    """
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key("migrate", schema or ""),))
        if schema is not None:
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        conn.execute(
            "CREATE TABLE IF NOT EXISTS duragent_meta (key text PRIMARY KEY, value text NOT NULL)"
        )
        row = conn.execute(
            "SELECT value FROM duragent_meta WHERE key = 'schema_version'"
        ).fetchone()
        found = int(row["value"]) if row else 0
        if found > SCHEMA_VERSION:
            raise StoreVersionError(where, found, SCHEMA_VERSION)
        for version in range(found + 1, SCHEMA_VERSION + 1):
            for ddl in MIGRATIONS[version]:
                conn.execute(ddl)
        conn.execute(
            "INSERT INTO duragent_meta (key, value) VALUES ('schema_version', %s)"
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (str(SCHEMA_VERSION),),
        )
        current = conn.execute("SELECT current_schema() AS name").fetchone()
    return found, str(current["name"] if current else "")


class PostgresStore:
    """`PostgresStore("postgresql://user@host/db", schema=None, max_size=10)`.

    The schema is created and migrated on construction; `schema` keeps several
    independent stores in one database.
    """

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
        conninfo, own = split_url(url)
        schema = own.get("schema", schema)
        self.url = url
        self.schema = schema
        self.retries = int(own.get("retries", retries))
        self._conninfo = conninfo
        self._where = f"PostgreSQL store {redact(url)}" + (f" (schema {schema})" if schema else "")
        try:
            with psycopg.connect(
                conninfo,
                autocommit=True,
                row_factory=dict_row,
                connect_timeout=max(1, round(connect_timeout)),
            ) as conn:
                self._configure(conn)
                self.migrated_from, self.namespace = migrate(conn, schema, self._where)
        except psycopg.Error as exc:
            raise _translate(exc, self._where) from exc
        self._pool: psycopg_pool.ConnectionPool[Conn] = psycopg_pool.ConnectionPool(
            conninfo,
            connection_class=psycopg.Connection[DictRow],
            kwargs={"autocommit": True, "row_factory": dict_row},
            configure=self._configure,
            min_size=int(own.get("min_size", min_size)),
            max_size=int(own.get("max_size", max_size)),
            open=False,
            name="duragent",
            timeout=connect_timeout,
        )
        try:
            self._pool.open(wait=True, timeout=connect_timeout)
        except psycopg_pool.PoolTimeout as exc:
            self._pool.close()
            raise StoreUnavailable(f"{self._where}: could not open connections: {exc}") from exc
        self._signal: ChangeSignal | None = None
        self._signal_loop: asyncio.AbstractEventLoop | None = None
        self._listener: _Listener | None = None
        self._closed = False

    def _configure(self, conn: Conn) -> None:
        conn.execute("SET TIME ZONE 'UTC'")
        if self.schema is not None:
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(self.schema)))

    # --- lifecycle ---

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._listener is not None:
            await self._listener.stop()
            self._listener = None
        await asyncio.to_thread(self._pool.close)

    async def __aenter__(self) -> PostgresStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- running work: one retry policy for everything ---

    def _execute(self, job: Callable[[Any], _T], write: bool) -> tuple[_T, bool]:
        """Run `job` on a pooled connection (inside a transaction if `write`).

        Retried: anything that failed before COMMIT was sent. A lost connection
        aborts the server-side transaction, and a deadlock or serialization
        failure is rolled back by the server, so nothing of the attempt remains
        and running the job again is the same as running it once.
        Not retried: a connection lost *while* COMMIT was in flight. The server
        may have committed before the connection died, and a second attempt
        could apply the commit twice, so the caller gets StoreUnavailable saying
        the outcome is unknown and must re-read to find out.
        """
        attempt = 0
        while True:
            attempt += 1
            committing = False
            try:
                with self._pool.connection() as conn:
                    if not write:
                        return job(conn), False
                    tx = _PgTx(conn, self.namespace)
                    with conn.transaction():
                        result = job(tx)
                        if tx.changed:
                            # Delivered by the server only if and when this commits.
                            conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, self.namespace))
                        committing = True
                    return result, tx.changed
            except psycopg_pool.PoolTimeout as exc:
                raise StoreUnavailable(f"{self._where}: no connection available: {exc}") from exc
            except psycopg.Error as exc:
                lost = _connection_lost(exc)
                if committing and lost:
                    raise StoreUnavailable(
                        f"{self._where}: the connection was lost while committing; the commit "
                        "may or may not have been applied, re-read the task to find out"
                    ) from exc
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

    async def _write(self, job: Callable[[_PgTx], _T]) -> _T:
        self._check_open()
        result, changed = await asyncio.to_thread(self._execute, job, True)
        if changed:
            self._changed().notify()  # local waiters need not wait for the round trip
        return result

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"store {redact(self.url)} is closed")

    # --- writes ---

    async def commit(self, commit: Commit) -> CommitResult:
        return await self._write(lambda tx: apply_commit(tx, commit, utcnow()))

    async def create_task(self, task: Task, entries: Sequence[NewEntry] = ()) -> tuple[Task, bool]:
        return await self._write(lambda tx: apply_create(tx, task, entries, utcnow()))

    async def claim_task(
        self,
        worker_id: str,
        *,
        agents: Iterable[str] | None = None,
        ttl: float = 30.0,
        task_id: str | None = None,
    ) -> Task | None:
        names = None if agents is None else list(agents)
        return await self._write(
            lambda tx: apply_claim(tx, worker_id, names, ttl, task_id, utcnow())
        )

    async def renew_lease(self, task_id: str, worker_id: str, epoch: int, ttl: float) -> Task:
        return await self._write(
            lambda tx: apply_renew(tx, task_id, worker_id, epoch, ttl, utcnow())
        )

    async def release_lease(self, task_id: str, epoch: int) -> None:
        await self._write(lambda tx: apply_release(tx, task_id, epoch, utcnow()))

    async def delete_task(self, task_id: str) -> None:
        def delete(tx: _PgTx) -> None:
            rows = tx.conn.execute(
                "WITH RECURSIVE tree(id) AS (SELECT id FROM tasks WHERE id = %s"
                " UNION ALL SELECT t.id FROM tasks t JOIN tree ON t.parent_id = tree.id)"
                " SELECT id FROM tree",
                (task_id,),
            ).fetchall()
            doomed = [r["id"] for r in rows]
            if not doomed:
                raise TaskNotFound(task_id)
            tx.conn.execute("DELETE FROM entries WHERE task_id = ANY(%s)", (doomed,))
            scopes = [f"task:{tid}" for tid in doomed]
            tx.conn.execute("DELETE FROM documents WHERE scope = ANY(%s)", (scopes,))
            tx.conn.execute("DELETE FROM tasks WHERE id = ANY(%s)", (doomed,))
            tx.changed = True

        await self._write(delete)

    # --- reads ---

    async def get_task(self, task_id: str) -> Task:
        def read(conn: Conn) -> Task:
            row = conn.execute("SELECT data, input FROM tasks WHERE id = %s", (task_id,)).fetchone()
            if row is None:
                raise TaskNotFound(task_id)
            return _row_task(row)

        return await self._read(read)

    async def list_tasks(self, query: TaskQuery | None = None) -> TaskPage:
        q = query or TaskQuery()
        where: list[str] = []
        params: list[Any] = []
        for column, value in (
            ("owner", q.owner),
            ("session_id", q.session_id),
            ("parent_id", q.parent_id),
            ("root_id", q.root_id),
            ("agent", q.agent),
        ):
            if value is not None:
                where.append(f"{column} = %s")
                params.append(value)
        statuses = q.statuses()
        if statuses is not None:
            where.append("status = ANY(%s)")
            params.append(statuses)
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
            tasks = [_row_task(r) for r in conn.execute(text, params)]  # type: ignore[arg-type]
            more = len(tasks) > q.limit
            tasks = tasks[: q.limit]
            return TaskPage(tasks, encode_cursor(tasks[-1]) if more and tasks else None)

        return await self._read(read)

    async def entries(
        self,
        task_id: str,
        *,
        after_seq: int = 0,
        kinds: Iterable[EntryKind] | None = None,
        limit: int | None = None,
    ) -> list[Entry]:
        text = "SELECT * FROM entries WHERE task_id = %s AND seq > %s"
        params: list[Any] = [task_id, after_seq]
        if kinds is not None:
            text += " AND kind = ANY(%s)"
            params.append([EntryKind(k).value for k in kinds])
        text += " ORDER BY seq"
        if limit is not None:
            text += " LIMIT %s"
            params.append(limit)

        def read(conn: Conn) -> list[Entry]:
            return [
                Entry(
                    task_id=r["task_id"],
                    seq=r["seq"],
                    kind=EntryKind(r["kind"]),
                    round=r["round"],
                    payload=json.loads(r["payload"]),
                    created_at=r["created_at"].astimezone(UTC),
                )
                for r in conn.execute(text, params)  # type: ignore[arg-type]
            ]

        return await self._read(read)

    async def model_view(self, task_id: str) -> list[ApiMessage]:
        def read(conn: Conn) -> list[ApiMessage]:
            rows = conn.execute(
                "SELECT seq, kind, payload FROM entries WHERE task_id = %s AND kind = ANY(%s)"
                " ORDER BY seq",
                (task_id, list(VIEW_KINDS)),
            )
            return build_model_view((r["seq"], r["kind"], r["payload"]) for r in rows)

        return await self._read(read)

    async def ui_messages(self, task_id: str) -> list[UiMessage]:
        def read(conn: Conn) -> list[UiMessage]:
            rows = conn.execute(
                "SELECT seq, payload FROM entries WHERE task_id = %s AND kind = %s ORDER BY seq",
                (task_id, EntryKind.UI_MESSAGE.value),
            )
            return build_ui_view((r["seq"], r["payload"]) for r in rows)

        return await self._read(read)

    async def get_document(self, scope: str, key: str) -> Document | None:
        def read(conn: Conn) -> Document | None:
            row = conn.execute(
                "SELECT * FROM documents WHERE scope = %s AND key = %s", (scope, key)
            ).fetchone()
            return None if row is None else _row_document(row)

        return await self._read(read)

    async def list_documents(self, scope: str) -> list[Document]:
        def read(conn: Conn) -> list[Document]:
            rows = conn.execute("SELECT * FROM documents WHERE scope = %s ORDER BY key", (scope,))
            return [_row_document(r) for r in rows]

        return await self._read(read)

    async def next_wake_at(self, agents: Iterable[str] | None = None) -> datetime | None:
        names = None if agents is None else list(agents)

        def read(conn: Conn) -> datetime | None:
            row = conn.execute(
                "SELECT min(t) AS t FROM ("
                " SELECT wake_at AS t FROM tasks WHERE status = 'waiting'"
                " AND status_reason = 'timer' AND (%(all)s OR agent = ANY(%(names)s))"
                " UNION ALL SELECT lease_expires FROM tasks WHERE status = 'running'"
                " AND (%(all)s OR agent = ANY(%(names)s))) AS wakes",
                {"all": names is None, "names": names or []},
            ).fetchone()
            value = None if row is None else row["t"]
            return None if value is None else value.astimezone(UTC)  # type: ignore[no-any-return]

        return await self._read(read)

    # --- change notification ---

    def _changed(self) -> ChangeSignal:
        loop = asyncio.get_running_loop()
        if self._signal is None or self._signal_loop is not loop:
            self._signal = ChangeSignal()
            self._signal_loop = loop
        return self._signal

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
        self._check_open()
        signal = self._changed()
        loop = asyncio.get_running_loop()
        if self._listener is None or self._listener.loop is not loop:
            self._listener = _Listener(self._conninfo, self.namespace, self._changed, loop)
        if not self._listener.ready.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._listener.ready.wait(), timeout)
            return
        await signal.wait(timeout)


class _Listener:
    """One connection per store doing LISTEN; reconnects with backoff if it drops."""

    def __init__(
        self,
        conninfo: str,
        namespace: str,
        signal: Callable[[], ChangeSignal],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.conninfo = conninfo
        self.namespace = namespace
        self.signal = signal
        self.loop = loop
        self.ready = asyncio.Event()
        self.task = loop.create_task(self._run())

    async def _run(self) -> None:
        delay = 0.1
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True)
                async with conn:
                    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL)))
                    self.ready.set()
                    delay = 0.1
                    async for note in conn.notifies():
                        if note.payload == self.namespace:
                            self.signal().notify()
            except psycopg.Error:
                pass
            # Not listening: whatever changed meanwhile was unheard, so wake everyone.
            self.ready.clear()
            self.signal().notify()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    async def stop(self) -> None:
        if self.loop is not asyncio.get_running_loop():
            if not self.loop.is_closed():
                self.loop.call_soon_threadsafe(self.task.cancel)
            return
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


def _connection_lost(exc: psycopg.Error) -> bool:
    """True when the failure was the connection itself, not an error the server reported."""
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = exc.sqlstate
    return state is None or state.startswith("08") or state in ("57P01", "57P02", "57P03")


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
    return urlunsplit((scheme, parts.netloc, parts.path, urlencode(rest), parts.fragment)), own


def redact(url: str) -> str:
    """The URL without its password, for error messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))
