"""The SQLite store: one file, WAL, many processes on one host.

All writes of a process go through one writer thread that groups whatever
commits are waiting into a single transaction (one fsync for many commits);
a refused commit (stale lease, conflict) leaves its batch-mates untouched.
Reads use per-thread connections and never wait for the writer. Other
processes on the same file hear of commits through the wake-ups of
_sqlite_wake.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

from duragent.errors import (
    IncompatibleEntry,
    InvalidOption,
    InvalidStoreURL,
    StoreCorrupt,
    StoreError,
    TaskNotFound,
)
from duragent.store._codec import (
    MAX_SEQ,
    encode_cursor,
    entry_key,
    entry_range,
    from_ts,
    unpacked,
)
from duragent.store._commits import (
    EntryHead,
    PendingCommit,
    TaskPage,
    TaskQuery,
    counted_filters,
)
from duragent.store._open_files import Held, hold, sqlite_paths
from duragent.store._signals import (
    ChangeSignal,
    ControlCallback,
    ControlWatchers,
    TasksCallback,
    TaskWatchers,
)
from duragent.store._sqlite_queries import list_sql, task_filters
from duragent.store._sqlite_schema import (
    ENTRY_RANGE,
    KIND_CODES,
    KINDS_BY_CODE,
    SCHEMA_VERSION,
    Durability,
    connect,
    migrate,
    ms_to_dt,
)
from duragent.store._sqlite_tx import (
    RowCache,
    SqliteTx,
    TaskNumbers,
    row_document,
    row_task,
)
from duragent.store._sqlite_wake import WakeUps
from duragent.store._sqlite_writer import BatchNotes, SqliteWriter, translate
from duragent.store._tx import TxWrites
from duragent.store._views import (
    VIEW_KINDS,
    build_ui_view,
    parse_messages,
    view_data,
    view_start,
    view_text,
)
from duragent.types import (
    ApiMessage,
    Document,
    Entry,
    EntryKind,
    Task,
    UIMessage,
    utcnow,
)


class SQLiteStore(TxWrites):
    """Writes are grouped: every commit asked for while a transaction is in
    flight (or in the same event-loop tick) shares the next transaction (one
    fsync). At FULL, transactions run on one writer thread, so the loop never
    waits for an fsync or for another process's write lock.
    """

    def __init__(
        self,
        path: str = "duragent.db",
        *,
        durability: Durability = "normal",
        poll_interval: float = 0.1,
        max_batch: int = 1024,
    ) -> None:
        if durability not in ("normal", "full"):
            raise InvalidOption(f"durability must be 'normal' or 'full', not {durability!r}")
        self.path = path
        self.url = f"sqlite:///{path}"
        self.durability: Durability = durability
        self.poll_interval = poll_interval
        self.max_batch = max_batch
        self.schema_version = SCHEMA_VERSION
        self.migrated_from: int | None = None  # the version the file had, once open
        self._rows = RowCache()
        self._nums = TaskNumbers()  # task id -> its number in the entries table
        # Made by `open`: the file's connections, its writer, its hold.
        self._writer_conn: sqlite3.Connection
        self._reader_conn: sqlite3.Connection
        self._writer: SqliteWriter
        self._held: Held
        self._signal: ChangeSignal | None = None
        self._work_signal: ChangeSignal | None = None
        self._controls = ControlWatchers()
        self._moved = TaskWatchers()
        self._polling: asyncio.Task[None] | None = None  # watch_tasks without wake-ups
        self._wake = WakeUps(path)
        self._opened = False
        self._closed = False
        self._shut = False  # closed, all of it (see close)
        self._claims_were_full = False  # the last claim got all it asked for

    # --- lifecycle ---

    async def open(self) -> None:
        """Open the file (creating it), migrate it, start the writer; again, nothing."""
        if self._opened:
            return
        if self._closed:
            raise StoreError(f"store {self.url} is closed")
        # From before the file exists until close: no tool of ours touches it.
        held = hold(sqlite_paths(self.path))
        try:
            writer_conn = connect(self.path, self.durability)
            try:
                self.migrated_from = migrate(writer_conn, self.path)
                self._reader_conn = connect(self.path, self.durability)
            except BaseException:
                writer_conn.close()
                raise
        except BaseException:
            held.release()
            raise
        self._held = held
        self._writer_conn = writer_conn
        self._writer = SqliteWriter(
            writer_conn,
            where=f"store {self.url}",
            full=self.durability == "full",
            rows=self._rows,
            nums=self._nums,
            announce=self._batch_landed,
            max_batch=self.max_batch,
        )
        self._opened = True

    async def close(self) -> None:
        """Land the commits already asked for, then close the files. A close that
        was cancelled (a timeout around it) is finished by the next."""
        # No new work from here on, as on PostgreSQL: a steady stream of commits
        # from other loops cannot keep the store open. The writer refuses them
        # under the lock it queues with, so a commit from another thread was
        # queued before that (and lands) or is refused.
        self._closed = True
        if self._shut or not self._opened:
            self._shut = True
            return
        await self._writer.finish()  # commits already asked for still land
        if self._polling is not None:
            self._polling.cancel()
        self._wake.close()
        self._writer_conn.close()
        self._reader_conn.close()
        self._held.release()
        self._shut = True

    async def __aenter__(self) -> SQLiteStore:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- the writer ---

    def _changed(self) -> ChangeSignal:
        if self._signal is None:
            self._signal = ChangeSignal()
        return self._signal

    def _work(self) -> ChangeSignal:
        if self._work_signal is None:
            self._work_signal = ChangeSignal()
        return self._work_signal

    async def _write(self, fn: Callable[[SqliteTx], Any]) -> Any:
        if not self._opened:
            raise self._not_open()
        return await self._writer.submit(fn, None)

    def _enqueue(
        self, fn: Callable[[SqliteTx], Any], link: PendingCommit | None
    ) -> asyncio.Future[Any]:
        if not self._opened:
            raise self._not_open()
        return self._writer.submit(fn, link)

    def _not_open(self) -> StoreError:
        if self._closed:
            return StoreError(f"store {self.url} is closed")
        return StoreError(
            f"store {self.url} is not open: use `async with store:` or `await store.open()`"
        )

    def rescue(self) -> None:
        """Hand a turn held by a loop that is not running to the writer thread
        (store/_turns.py, `GroupCommit.rescue`)."""
        if self._opened:
            self._writer.rescue()

    @property
    def batches(self) -> int:
        """Transactions the writer ran: commits / batches = group size."""
        return self._writer.batches if self._opened else 0

    @property
    def jobs_done(self) -> int:
        return self._writer.jobs_done if self._opened else 0

    def _batch_landed(self, notes: BatchNotes | None, ok: bool) -> None:
        """A batch's callers were answered (it is durable): wake the waiters of
        this process and, with `notes`, once, of the other processes on the file."""
        if notes is not None and not notes.announced:
            notes.announced = True
            self._announce(notes.work, notes.controlled, frozenset(notes.tasks))
        elif ok:
            self._changed().notify()

    # --- reads: inline; WAL readers never wait for writers ---

    async def _read(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        if self._closed or not self._opened:
            raise self._not_open()
        try:
            return fn(self._reader_conn)
        except sqlite3.Error as exc:
            if self._closed:  # a read from another thread that met the close
                raise StoreError(f"store {self.url} is closed") from exc
            raise translate(exc) from exc

    # --- the protocol ---

    async def get_task(self, task_id: str) -> Task:
        def read(conn: sqlite3.Connection) -> Task:
            row = conn.execute("SELECT data, input FROM tasks WHERE id=?", (task_id,)).fetchone()
            if row is None:
                raise TaskNotFound(task_id)
            return row_task(row)

        return await self._read(read)  # type: ignore[no-any-return]

    async def list_tasks(self, query: TaskQuery | None = None) -> TaskPage:
        q = query or TaskQuery()
        sql, params = list_sql(q)

        def read(conn: sqlite3.Connection) -> TaskPage:
            tasks = [row_task(r) for r in conn.execute(sql, params)]
            more = len(tasks) > q.limit
            tasks = tasks[: q.limit]
            return TaskPage(tasks, encode_cursor(tasks[-1]) if more and tasks else None)

        return await self._read(read)  # type: ignore[no-any-return]

    async def count_tasks(self, query: TaskQuery | None = None) -> dict[tuple[str, str], int]:
        q = query or TaskQuery()
        if q.counted():  # from the counts kept (migration 8), not the tasks
            where, params = counted_filters(q, "?")
            sql = "SELECT queue, status, sum(n) FROM task_counts"
            if where:
                sql += " WHERE " + " AND ".join(where)
            sql += " GROUP BY queue, status HAVING sum(n) <> 0"
        else:
            where, params = task_filters(q)
            sql = "SELECT queue, status, count(*) FROM tasks"
            if where:
                sql += " WHERE " + " AND ".join(where)
            sql += " GROUP BY queue, status"
        return await self._read(  # type: ignore[no-any-return]
            lambda conn: {(r[0], r[1]): r[2] for r in conn.execute(sql, params)}
        )

    async def entries(
        self,
        task_id: str,
        *,
        after_seq: int = 0,
        kinds: Iterable[EntryKind] | None = None,
        limit: int | None = None,
    ) -> list[Entry]:
        sql = f"SELECT * FROM entry_rows WHERE {ENTRY_RANGE}"
        # No seq is above MAX_SEQ: a larger cursor gives the empty range past it.
        params: list[Any] = list(entry_range(task_id, min(after_seq, MAX_SEQ) + 1))
        if kinds is not None:
            codes = [KIND_CODES[EntryKind(k)] for k in kinds]
            sql += " AND kind IN (" + ", ".join("?" * len(codes)) + ")"
            params.extend(codes)
        sql += " ORDER BY eid"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)

        def read(conn: sqlite3.Connection) -> list[Entry]:
            # Every row first: a row that cannot be decoded (a later version's
            # kind) must not leave the statement open, holding the reader's snapshot.
            rows = conn.execute(sql, params).fetchall()
            return [
                Entry(
                    task_id=task_id,
                    seq=r["seq"],
                    kind=(kind := _kind(task_id, r["seq"], r["kind"])),
                    round=r["round"],
                    payload=unpacked(kind, json.loads(r["payload"])),
                    created_at=ms_to_dt(r["created_ms"]),
                )
                for r in rows
            ]

        return await self._read(read)  # type: ignore[no-any-return]

    async def entry_heads(self, task_id: str, *, kinds: Iterable[EntryKind]) -> list[EntryHead]:
        codes = [KIND_CODES[EntryKind(k)] for k in kinds]
        sql = (
            "SELECT seq, kind, round, json_extract(payload, '$.role') FROM entry_rows"
            f" WHERE {ENTRY_RANGE} AND kind IN ({', '.join('?' * len(codes))}) ORDER BY eid"
        )
        return await self._read(  # type: ignore[no-any-return]
            lambda conn: [
                EntryHead(r[0], KINDS_BY_CODE[r[1]], r[2], r[3])
                for r in conn.execute(sql, (*entry_range(task_id), *codes))
            ]
        )

    async def model_view(self, task_id: str) -> list[ApiMessage]:
        return parse_messages(await self._read(lambda conn: _view_text(conn, task_id)))

    async def model_view_data(self, task_id: str) -> list[dict[str, Any]]:
        return view_data(await self._read(lambda conn: _view_text(conn, task_id)))

    async def start_reads(
        self, task_id: str, after_seq: int
    ) -> tuple[list[Entry], list[dict[str, Any]]]:
        # One after the other on the reader's connection (reads are synchronous here:
        # nothing to overlap, no round trip to save).
        return await self.entries(task_id, after_seq=after_seq), await self.model_view_data(task_id)

    async def ui_messages(self, task_id: str) -> list[UIMessage]:
        sql = f"SELECT seq, payload FROM entry_rows WHERE {ENTRY_RANGE} AND kind=? ORDER BY eid"
        params = (*entry_range(task_id), KIND_CODES[EntryKind.UI_MESSAGE])
        return await self._read(  # type: ignore[no-any-return]
            lambda conn: build_ui_view((r[0], r[1]) for r in conn.execute(sql, params))
        )

    async def get_document(self, scope: str, key: str) -> Document | None:
        def read(conn: sqlite3.Connection) -> Document | None:
            row = conn.execute(
                "SELECT * FROM documents WHERE scope=? AND key=?", (scope, key)
            ).fetchone()
            return None if row is None else row_document(row)

        return await self._read(read)  # type: ignore[no-any-return]

    async def list_documents(self, scope: str) -> list[Document]:
        return await self._read(  # type: ignore[no-any-return]
            lambda conn: [
                row_document(r)
                for r in conn.execute(
                    "SELECT * FROM documents WHERE scope=? ORDER BY key", (scope,)
                )
            ]
        )

    async def next_wake_at(
        self, agents: Iterable[str] | None = None, queues: Iterable[str] | None = None
    ) -> datetime | None:
        # Each part is a min() over its index (tasks_due, tasks_leases): one seek,
        # not a read of every waiting or running row. A running task without a
        # lease end counts as expired (0), as in the claim.
        sql = (
            "SELECT min(t) FROM (SELECT min(wake_at) AS t FROM tasks WHERE status='waiting'"
            " AND wake_at IS NOT NULL {a} UNION ALL SELECT min(coalesce(lease_expires, 0))"
            " FROM tasks INDEXED BY tasks_leases WHERE status='running' {a}"
            " UNION ALL SELECT min(wake_at) FROM tasks"
            " WHERE status='pending' AND wake_at IS NOT NULL {a})"
        )
        params: list[Any] = []
        clause = ""
        for column, values in (("agent", agents), ("queue", queues)):
            if values is not None:
                names = list(values)
                clause += f" AND {column} IN (" + ", ".join("?" * len(names)) + ")"
                params += names
        sql = sql.format(a=clause)
        params *= 3
        return await self._read(lambda conn: from_ts(conn.execute(sql, params).fetchone()[0]))  # type: ignore[no-any-return]

    async def claim_tasks(
        self,
        worker_id: str,
        n: int = 1,
        *,
        agents: Iterable[str] | None = None,
        ttl: float = 30.0,
        task_id: str | None = None,
        queues: Iterable[str] | None = None,
        versions: Mapping[str, str] | None = None,
    ) -> list[Task]:
        """Look first without the write lock: an idle worker polling for work then
        never holds the file's one write lock (which would stall every other
        process's commits, for as long as a stopped or slow poller holds it).
        Right after a claim that got all it asked for, the look is skipped: there
        is likely more, and the claim reads the same candidates again anyway."""
        names = None if agents is None else list(agents)
        only = None if queues is None else sorted(set(queues))
        pins = None if versions is None else dict(versions)
        if n < 1:
            return []
        if not self._claims_were_full and not await self._read(
            lambda conn: bool(
                SqliteTx(conn).find_claimable(utcnow(), names, task_id, 1, set(), only, pins)
            )
        ):
            return []
        claimed = await super().claim_tasks(
            worker_id, n, agents=names, ttl=ttl, task_id=task_id, queues=only, versions=pins
        )
        self._claims_were_full = task_id is None and len(claimed) == n
        return claimed

    async def delete_task(self, task_id: str) -> None:
        def delete(tx: SqliteTx) -> None:
            if not self._delete_trees(tx, [task_id]):
                raise TaskNotFound(task_id)

        await self._write(delete)

    def _delete_trees(self, tx: SqliteTx, roots: list[str]) -> int:
        """Delete tasks with their sub-tasks, entries, documents and labels; return how many."""
        conn = tx.conn
        marks = ", ".join("?" * len(roots))
        doomed = conn.execute(
            f"WITH RECURSIVE tree(num, id) AS (SELECT num, id FROM tasks WHERE id IN ({marks}) "
            " UNION SELECT t.num, t.id FROM tasks t JOIN tree ON t.parent_id=tree.id)"
            " SELECT num, id FROM tree",
            roots,
        ).fetchall()
        for num, tid in doomed:
            # Forks that reference this task's payloads get them back first.
            keys = (entry_key(num, 0), entry_key(num, MAX_SEQ))
            conn.execute(
                "UPDATE entries SET payload=(SELECT s.payload FROM entries s"
                " WHERE s.eid=entries.src), src=NULL WHERE src BETWEEN ? AND ?",
                keys,
            )
            conn.execute("DELETE FROM entries WHERE eid BETWEEN ? AND ?", keys)
            conn.execute("DELETE FROM task_labels WHERE task_num=?", (num,))
            conn.execute("DELETE FROM documents WHERE scope=?", (f"task:{tid}",))
            conn.execute("DELETE FROM tasks WHERE num=?", (num,))
            self._nums.forget(tid)
            self._rows.rows.pop(tid, None)
            tx.batch_rows.pop(tid, None)  # later jobs of this batch find it gone
            tx.notes.tasks.add(tid)
        return len(doomed)

    async def purge_tasks(self, query: TaskQuery) -> int:
        """Delete up to `query.limit` matching tasks (and their sub-tasks) in one transaction."""
        where, params = task_filters(query)
        sql = "SELECT id FROM tasks" + (" WHERE " + " AND ".join(where) if where else "")
        sql += " LIMIT ?"

        def purge(tx: SqliteTx) -> int:
            roots = [r[0] for r in tx.conn.execute(sql, [*params, query.limit])]
            return self._delete_trees(tx, roots) if roots else 0

        return await self._write(purge)  # type: ignore[no-any-return]

    async def reclaim_space(self, pages_per_batch: int = 2000) -> None:
        """Give freed pages back to the file system (files made with auto_vacuum=INCREMENTAL).

        Inside a transaction each run of the pragma frees one page, so it runs
        once per page, a bounded number per transaction. A file made before
        incremental vacuum (auto_vacuum=NONE) needs a one-off `VACUUM` instead.
        """

        def vacuum(tx: SqliteTx) -> int:
            free = int(tx.conn.execute("PRAGMA freelist_count").fetchone()[0])
            mode = int(tx.conn.execute("PRAGMA auto_vacuum").fetchone()[0])
            if mode != 2:  # not INCREMENTAL: nothing this pragma can do
                return 0
            for _ in range(min(free, pages_per_batch)):
                tx.conn.execute("PRAGMA incremental_vacuum(1)")
            return max(0, free - pages_per_batch)

        while await self._write(vacuum):
            pass

    # --- change notification ---

    @property
    def notifies_across_processes(self) -> bool:
        """Whether other processes' commits wake wait_for_change (see _sqlite_wake.py)."""
        return self._wake.possible

    @property
    def listening(self) -> bool:
        """True once this store hears other processes' commits (after the first wait)."""
        return self._wake.listening

    def _announce(
        self, work: bool, controlled: list[str], tasks: frozenset[str] = frozenset()
    ) -> None:
        """A batch committed: wake this process's waiters, then the other processes'."""
        self._heard(work, True, controlled, tasks)
        self._wake.announce(work=work, controlled=controlled, tasks=tasks)

    def _heard(
        self, work: bool, change: bool, controlled: list[str], tasks: frozenset[str] | None
    ) -> None:
        if change:
            self._changed().notify()
            self._moved.fire(tasks)
        if work:
            self._work().notify()
        for task_id in controlled:
            self._controls.fire(task_id)

    def _listen(self, *, changes: bool) -> bool:
        if self._closed or not self._opened:
            raise self._not_open()
        return self._wake.listen(self._heard, changes=changes)

    async def wait_for_change(self, timeout: float) -> None:
        """Return after a commit by this or any other process on the file, or after `timeout`."""
        if not self._listen(changes=True):
            timeout = min(timeout, self.poll_interval)  # no wake-ups here: poll
        await self._changed().wait(timeout)

    async def wait_for_work(self, timeout: float) -> None:
        """Like wait_for_change, for the commits that may make a task claimable."""
        if not self._listen(changes=False):
            timeout = min(timeout, self.poll_interval)
        await self._work().wait(timeout)

    def watch_tasks(self, callback: TasksCallback) -> Callable[[], None]:
        """Call `callback(task_ids)` after each commit of any process on the file.

        Without wake-ups (they could not be registered) nothing tells of other
        processes' commits: the callbacks are told None every `poll_interval`.
        """
        remove = self._moved.add(callback)
        self._listen(changes=True)
        if self._polling is None or self._polling.done():
            self._polling = asyncio.create_task(self._poll_moved(), name="duragent-sqlite-poll")
        return remove

    async def _poll_moved(self) -> None:
        made = self._wake.registrations
        while self._moved and not self._closed:
            await asyncio.sleep(self.poll_interval)
            # Listening again each time re-creates a registration someone removed;
            # what was sent meanwhile went unheard, as without wake-ups.
            if self._moved and not self._closed:
                hears = self._listen(changes=True)
                if not hears or self._wake.registrations != made:
                    made = self._wake.registrations
                    self._moved.fire(None)

    def watch_controls(self, callback: ControlCallback) -> Callable[[], None]:
        """Call `callback(task_id)` when any process commits a control request on a task."""
        remove = self._controls.add(callback)
        self._listen(changes=False)
        return remove


# The payloads of a task's view in seq order, a rollback marker's as NULL.
_VIEW_START = "SELECT json_extract(data, '$.config.compacted.upto') FROM tasks WHERE id=?"
_VIEW_PAYLOADS = (
    "SELECT CASE WHEN kind IN (?, ?) THEN NULL ELSE payload END FROM entry_rows"
    f" WHERE {ENTRY_RANGE} AND kind IN ({{marks}}) ORDER BY eid"
)


def _view_text(conn: sqlite3.Connection, task_id: str) -> str:
    """The payloads of the task's model view as one JSON array text."""
    marks = ", ".join("?" * len(VIEW_KINDS))
    codes = [KIND_CODES[EntryKind(k)] for k in VIEW_KINDS]
    markers = (KIND_CODES[EntryKind.ROLLBACK], KIND_CODES[EntryKind.COMPACTION])
    # A compacted task's view is read from its last compaction on (resume stays
    # flat); the row is read first, so a compaction since is among what follows.
    row = conn.execute(_VIEW_START, (task_id,)).fetchone()
    bounds = entry_range(task_id, view_start({"compacted": {"upto": row[0]}}) if row else 0)
    # With nothing voided (the common case; resume stays fast) the payloads
    # joined are the view: read in one statement (one snapshot) and joined
    # here, which takes two thirds of the time SQLite's group_concat takes.
    # A rollback or compaction marker reads as NULL and stops the join.
    rows = conn.execute(_VIEW_PAYLOADS.format(marks=marks), (*markers, *bounds, *codes))
    payloads = [r[0] for r in rows]
    with contextlib.suppress(TypeError):
        return "[" + ",".join(payloads) + "]"
    sql = (
        f"SELECT seq, kind, payload FROM entry_rows WHERE {ENTRY_RANGE}"
        f" AND kind IN ({marks}) ORDER BY eid"
    )
    rows = conn.execute(sql, (*bounds, *codes))
    try:
        return view_text((r[0], KINDS_BY_CODE[r[1]], r[2]) for r in rows)
    except TypeError as exc:  # not written by duragent, or a fork's source gone
        raise StoreCorrupt(
            f"a payload in the view of task {task_id} is missing or no text"
        ) from exc


def sqlite_path_from_url(url: str) -> str:
    """sqlite:///rel.db -> rel.db; sqlite:////abs/x.db -> /abs/x.db."""
    rest = url.split("://", 1)[1]
    path = rest[1:] if rest.startswith("/") else rest
    path = path.split("?", 1)[0]
    if not path:
        raise InvalidStoreURL(f"no file in store URL {url!r}; use sqlite:///path/to/file.db")
    return os.path.expanduser(path)


def _kind(task_id: str, seq: int, code: int) -> EntryKind:
    """The kind coded `code`, or IncompatibleEntry: a later version's kind."""
    kind = KINDS_BY_CODE.get(code)
    if kind is None:
        raise IncompatibleEntry(task_id, seq, f"code {code}")
    return kind
