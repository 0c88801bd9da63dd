"""The SQLite store's file: connection settings, schema and forward-only migrations."""

from __future__ import annotations

import os
import resource
import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Literal

from duragent.errors import StoreCorrupt, StoreError, StoreUnavailable, StoreVersionError
from duragent.store._codec import SEQ_BITS
from duragent.store._files import (
    absolute_hint,
    create_private_file,
    free_bytes,
    full_error,
    is_full,
    require_parent,
)
from duragent.store._session_scopes import LEGACY_PREFIX, UNCLAIMED_PREFIX, migrated_scope
from duragent.types import EntryKind

Durability = Literal["normal", "full"]

# Entry kinds as small integers on disk (version 2 on). Append only: a code,
# once given, never changes meaning.
KIND_CODES: dict[EntryKind, int] = {
    EntryKind.API_MESSAGE: 1,
    EntryKind.UI_MESSAGE: 2,
    EntryKind.TOOL_INTENT: 3,
    EntryKind.TOOL_RESULT: 4,
    EntryKind.PROGRESS: 5,
    EntryKind.ROLLBACK: 6,
    EntryKind.STATUS: 7,
    EntryKind.CHECKPOINT: 8,
    EntryKind.COMPACTION: 9,
    EntryKind.HANDOFF: 10,
}
KINDS_BY_CODE: dict[int, EntryKind] = {code: kind for kind, code in KIND_CODES.items()}
_KIND_CASE = " ".join(f"WHEN '{k.value}' THEN {c}" for k, c in KIND_CODES.items())

# An entry's time on disk (version 7 on): whole milliseconds since the epoch,
# rounded down.
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)


def to_ms(dt: datetime) -> int:
    # In integers: exact, with no float rounding to reason about.
    return (dt.astimezone(UTC) - _EPOCH) // _MS


def ms_to_dt(ms: int) -> datetime:
    return _EPOCH + ms * _MS


_TASK_COLUMNS = (
    "id, owner, request_id, session_id, parent_id, root_id, agent, status, status_reason,"
    " created_at, updated_at, wake_at, lease_owner, lease_expires, lease_epoch, last_seq,"
    " version, data, input"
)
_TASK_INDEXES = [
    "CREATE UNIQUE INDEX tasks_request ON tasks(coalesce(owner, ''), request_id)"
    " WHERE request_id IS NOT NULL",
    "CREATE INDEX tasks_runnable ON tasks(status, created_at)",
    "CREATE INDEX tasks_owner ON tasks(owner, created_at)",
    "CREATE INDEX tasks_parent ON tasks(parent_id)",
    "CREATE INDEX tasks_session ON tasks(session_id, created_at)",
]

# A migration step: a statement, or a function for what SQL alone cannot say.
Step = str | Callable[[sqlite3.Connection], None]

# Forward-only: MIGRATIONS[n] takes a store from version n-1 to n.
MIGRATIONS: dict[int, list[Step]] = {
    1: [
        """CREATE TABLE tasks (
            id TEXT PRIMARY KEY,
            owner TEXT, request_id TEXT, session_id TEXT, parent_id TEXT, root_id TEXT,
            agent TEXT NOT NULL, status TEXT NOT NULL, status_reason TEXT,
            created_at REAL NOT NULL, updated_at REAL NOT NULL, wake_at REAL,
            lease_owner TEXT, lease_expires REAL, lease_epoch INTEGER NOT NULL DEFAULT 0,
            last_seq INTEGER NOT NULL DEFAULT 0, version INTEGER NOT NULL DEFAULT 0,
            data TEXT NOT NULL, input TEXT NOT NULL
        )""",
        *_TASK_INDEXES,
        """CREATE TABLE entries (
            task_id TEXT NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL,
            round INTEGER NOT NULL, payload TEXT NOT NULL, created_at REAL NOT NULL,
            PRIMARY KEY (task_id, seq)
        ) WITHOUT ROWID""",
        """CREATE TABLE documents (
            scope TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL,
            version INTEGER NOT NULL, updated_at REAL NOT NULL,
            PRIMARY KEY (scope, key)
        ) WITHOUT ROWID""",
    ],
}
# Version 2: entries keyed by a task's small integer number instead of its
# 34-character id, and kinds as integers: a third less disk per round.
MIGRATIONS[2] = [
    """CREATE TABLE tasks_v2 (
        num INTEGER PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        owner TEXT, request_id TEXT, session_id TEXT, parent_id TEXT, root_id TEXT,
        agent TEXT NOT NULL, status TEXT NOT NULL, status_reason TEXT,
        created_at REAL NOT NULL, updated_at REAL NOT NULL, wake_at REAL,
        lease_owner TEXT, lease_expires REAL, lease_epoch INTEGER NOT NULL DEFAULT 0,
        last_seq INTEGER NOT NULL DEFAULT 0, version INTEGER NOT NULL DEFAULT 0,
        data TEXT NOT NULL, input TEXT NOT NULL
    )""",
    f"INSERT INTO tasks_v2 ({_TASK_COLUMNS}) SELECT {_TASK_COLUMNS} FROM tasks"
    " ORDER BY created_at, id",
    """CREATE TABLE entries_v2 (
        task_num INTEGER NOT NULL, seq INTEGER NOT NULL, kind INTEGER NOT NULL,
        round INTEGER NOT NULL, payload TEXT NOT NULL, created_at REAL NOT NULL,
        PRIMARY KEY (task_num, seq)
    ) WITHOUT ROWID""",
    f"INSERT INTO entries_v2 SELECT t.num, e.seq, CASE e.kind {_KIND_CASE} END, e.round,"
    " e.payload, e.created_at FROM entries e JOIN tasks_v2 t ON t.id = e.task_id",
    "DROP TABLE entries",
    "DROP TABLE tasks",
    "ALTER TABLE tasks_v2 RENAME TO tasks",
    "ALTER TABLE entries_v2 RENAME TO entries",
    *_TASK_INDEXES,
]


def _scope_sessions_per_owner(conn: sqlite3.Connection) -> None:
    """Version 3: `session:<id>` documents go to their session's one owner (_session_scopes.py).

    First every one is set aside under the unclaimed prefix, so that renaming
    one can never collide with another not yet renamed.
    """
    conn.execute(
        "UPDATE documents SET scope = ? || substr(scope, ?) WHERE substr(scope, 1, ?) = ?",
        (UNCLAIMED_PREFIX, len(LEGACY_PREFIX) + 1, len(LEGACY_PREFIX), LEGACY_PREFIX),
    )
    scopes = conn.execute(
        "SELECT DISTINCT scope FROM documents WHERE substr(scope, 1, ?) = ?",
        (len(UNCLAIMED_PREFIX), UNCLAIMED_PREFIX),
    ).fetchall()
    for row in scopes:
        session_id = row["scope"][len(UNCLAIMED_PREFIX) :]
        owners = conn.execute(
            "SELECT DISTINCT owner FROM tasks WHERE session_id = ?", (session_id,)
        ).fetchall()
        scope = migrated_scope(session_id, [o["owner"] for o in owners])
        if scope != row["scope"]:
            conn.execute("UPDATE documents SET scope = ? WHERE scope = ?", (scope, row["scope"]))


MIGRATIONS[3] = [_scope_sessions_per_owner]

# Queues: every task has a queue and a priority; claims are served
# by indexes instead of a sort of the table: ready tasks per queue in claim
# order, timers and delayed starts by due time. Metadata labels are rows of
# their own, indexed for equality filters.
QUEUES_MIGRATION: list[Step] = [
    "ALTER TABLE tasks ADD COLUMN queue TEXT",
    "ALTER TABLE tasks ADD COLUMN priority INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE tasks ADD COLUMN metadata TEXT",
    "UPDATE tasks SET queue = agent",
    "CREATE INDEX tasks_ready ON tasks(queue, priority DESC, created_at)"
    " WHERE status = 'pending' AND wake_at IS NULL",
    "CREATE INDEX tasks_due ON tasks(status, wake_at) WHERE wake_at IS NOT NULL",
    "CREATE INDEX tasks_leases ON tasks(coalesce(lease_expires, 0)) WHERE status = 'running'",
    "CREATE INDEX tasks_queue ON tasks(queue, status)",
    """CREATE TABLE task_labels (
        key TEXT NOT NULL, value TEXT NOT NULL, task_num INTEGER NOT NULL,
        PRIMARY KEY (key, value, task_num)
    ) WITHOUT ROWID""",
    "CREATE INDEX task_labels_task ON task_labels(task_num)",
]
MIGRATIONS[4] = QUEUES_MIGRATION

# Version 5: a fork's copied entries reference their source's payload instead
# of holding a copy (`src_num`, `src_seq`, the payload left empty). A reference
# always names an entry that holds its payload (a fork of a fork names the
# first source), and a task is purged only after its referrers got their
# payloads back (`SQLiteStore._delete_trees`). Readers take entries through
# `entry_rows`, which resolves references; only writers touch `entries`.
FORK_REFERENCES: list[Step] = [
    "ALTER TABLE entries ADD COLUMN src_num INTEGER",
    "ALTER TABLE entries ADD COLUMN src_seq INTEGER",
    "CREATE INDEX entries_src ON entries(src_num) WHERE src_num IS NOT NULL",
    """CREATE VIEW entry_rows AS SELECT e.task_num, e.seq, e.kind, e.round, e.created_at,
        CASE WHEN e.src_num IS NULL THEN e.payload ELSE (SELECT s.payload FROM entries s
            WHERE s.task_num = e.src_num AND s.seq = e.src_seq) END AS payload
        FROM entries e""",
]
MIGRATIONS[5] = FORK_REFERENCES


def _entry_rows(created: str) -> list[Step]:
    """What versions 6 and 7 build over a new entries table, whose time column is
    `created`: the index a purge finds a fork's references by, and the view
    readers select rows from."""
    return [
        "CREATE INDEX entries_src ON entries(src) WHERE src IS NOT NULL",
        f"""CREATE VIEW entry_rows AS SELECT e.eid, e.eid >> 32 AS task_num,
        e.eid & 4294967295 AS seq, e.kind, e.round, e.{created},
        CASE WHEN e.src IS NULL THEN e.payload
            ELSE (SELECT s.payload FROM entries s WHERE s.eid = e.src) END AS payload
        FROM entries e""",
    ]


# Version 6: entries keyed by one integer, `eid` = task number << 32 | seq, in
# a rowid table. Keyed by (task_num, seq) WITHOUT ROWID, each interior page held
# whole rows (17 children a page), and a full last leaf was rebalanced with its
# two left siblings, leaving leaves 12% empty and writing four pages every few
# rounds; a rowid table appends a task's entries to the last leaf, and a new
# leaf when it is full. A fork's reference is one `src` key too. The view still
# gives `task_num` and `seq`; readers select a task's entries by an `eid` range
# (`entry_range`), which SQLite serves from the table's own key.
ENTRY_KEYS: list[Step] = [
    "DROP VIEW entry_rows",
    "DROP INDEX entries_src",
    """CREATE TABLE entries_v6 (
        eid INTEGER PRIMARY KEY,
        kind INTEGER NOT NULL, round INTEGER NOT NULL, payload TEXT NOT NULL,
        created_at REAL NOT NULL, src INTEGER
    )""",
    "INSERT INTO entries_v6 (eid, kind, round, payload, created_at, src)"
    " SELECT (task_num << 32) | seq, kind, round, payload, created_at,"
    " CASE WHEN src_num IS NULL THEN NULL ELSE (src_num << 32) | src_seq END"
    " FROM entries ORDER BY task_num, seq",
    "DROP TABLE entries",
    "ALTER TABLE entries_v6 RENAME TO entries",
    *_entry_rows("created_at"),
]
MIGRATIONS[6] = ENTRY_KEYS

# Version 7: an entry's time in integer milliseconds (`to_ms`), six bytes on
# disk, instead of a REAL of seconds, eight: two bytes on each of a round's
# three rows. The microseconds of the datetime a REAL was made from are
# recovered exactly (a float of today's seconds is finer than one), then
# rounded down to the millisecond as `to_ms` rounds the datetime. The column
# has a new name, `created_ms`, so that a process of an older version still
# running is refused on its next write (no column `created_at`) instead of
# writing seconds where milliseconds are read.
ENTRY_MILLISECONDS: list[Step] = [
    "DROP VIEW entry_rows",
    "DROP INDEX entries_src",
    """CREATE TABLE entries_v7 (
        eid INTEGER PRIMARY KEY,
        kind INTEGER NOT NULL, round INTEGER NOT NULL, payload TEXT NOT NULL,
        created_ms INTEGER NOT NULL, src INTEGER
    )""",
    "INSERT INTO entries_v7 (eid, kind, round, payload, created_ms, src)"
    " SELECT eid, kind, round, payload, CAST(round(created_at * 1000000) AS INTEGER) / 1000, src"
    " FROM entries ORDER BY eid",
    "DROP TABLE entries",
    "ALTER TABLE entries_v7 RENAME TO entries",
    *_entry_rows("created_ms"),
]
MIGRATIONS[7] = ENTRY_MILLISECONDS

# Version 8: the agent version a task runs on (`Task.agent_version`), a column
# so that a claim filters by it; NULL for the tasks of before (any version).
MIGRATIONS[8] = ["ALTER TABLE tasks ADD COLUMN agent_version TEXT"]
# Version 9: listing and counting that do not grow with the store. Indexes
# that give a filtered page in list order (newest first) by a range seek, and
# `task_counts`: how many tasks each (owner, agent, queue, status) holds, kept
# by triggers in the transaction of every write of a task row (creation,
# transition, deletion, purge, fork), so a failed commit leaves it as it was.
# SQLite has one writer at a time: one row per key costs no contention. The
# owner is a key column as `okey` (COUNT_OWNER_KEY): '' for no owner, '.' and
# the owner's name otherwise, so that no owner and the empty owner stay two.
# Zero rows stay (their keys are few); readers leave them out.
COUNT_OWNER_KEY = "CASE WHEN {t}.owner IS NULL THEN '' ELSE '.' || {t}.owner END"


def _count_step(t: str, n: int) -> str:
    return (
        "INSERT INTO task_counts (okey, agent, queue, status, n) VALUES"
        f" ({COUNT_OWNER_KEY.format(t=t)}, {t}.agent, {t}.queue, {t}.status, {n})"
        f" ON CONFLICT (okey, agent, queue, status) DO UPDATE SET n = n + {n};"
    )


COUNTS_AND_LIST_INDEXES: list[Step] = [
    """CREATE TABLE task_counts (
        okey TEXT NOT NULL, agent TEXT NOT NULL, queue TEXT NOT NULL, status TEXT NOT NULL,
        n INTEGER NOT NULL, PRIMARY KEY (okey, agent, queue, status)
    ) WITHOUT ROWID""",
    f"INSERT INTO task_counts (okey, agent, queue, status, n)"
    f" SELECT {COUNT_OWNER_KEY.format(t='tasks')}, agent, queue, status, count(*) FROM tasks"
    " GROUP BY 1, 2, 3, 4",
    f"CREATE TRIGGER tasks_counted_in AFTER INSERT ON tasks BEGIN {_count_step('new', 1)} END",
    f"CREATE TRIGGER tasks_counted_out AFTER DELETE ON tasks BEGIN {_count_step('old', -1)} END",
    "CREATE TRIGGER tasks_counted_moves AFTER UPDATE OF owner, agent, queue, status ON tasks"
    " WHEN old.status IS NOT new.status OR old.queue IS NOT new.queue"
    " OR old.agent IS NOT new.agent OR old.owner IS NOT new.owner"
    f" BEGIN {_count_step('old', -1)} {_count_step('new', 1)} END",
    # Newest first with no filter or a time range; by agent; by owner and status.
    "CREATE INDEX tasks_created ON tasks(created_at, id)",
    "CREATE INDEX tasks_agent ON tasks(agent, created_at)",
    "CREATE INDEX tasks_owner_status ON tasks(owner, status, created_at)",
    # By queue and status in list order (it serves what `tasks_queue` served).
    "DROP INDEX tasks_queue",
    "CREATE INDEX tasks_queue ON tasks(queue, status, created_at)",
]
MIGRATIONS[9] = COUNTS_AND_LIST_INDEXES

# Version 10: a page filtered by metadata in list order by a range seek. Each
# label row holds its task's `created_at` as `task_created` (a task's time and
# metadata never change after it is made), keyed (key, value, task_created,
# task_num): the list query reads a label's rows newest first from the key, the
# cursor a range of it, and joins each to its task, instead of reading and
# sorting every task with the label. The column is NOT NULL, so a process of
# an older version still running is refused on its next labelled insert.
LABEL_TIMES: list[Step] = [
    """CREATE TABLE task_labels_v10 (
        key TEXT NOT NULL, value TEXT NOT NULL, task_created REAL NOT NULL,
        task_num INTEGER NOT NULL, PRIMARY KEY (key, value, task_created, task_num)
    ) WITHOUT ROWID""",
    "INSERT INTO task_labels_v10 (key, value, task_created, task_num)"
    " SELECT l.key, l.value, t.created_at, l.task_num FROM task_labels l"
    " JOIN tasks t ON t.num = l.task_num",
    "DROP TABLE task_labels",
    "ALTER TABLE task_labels_v10 RENAME TO task_labels",
    "CREATE INDEX task_labels_task ON task_labels(task_num)",
]
MIGRATIONS[10] = LABEL_TIMES
SCHEMA_VERSION = max(MIGRATIONS)

# A task's entries with seqs in a range, by `eid`: served by the table's key.
# Its parameters come from `entry_range(task_id, first, last)`.
ENTRY_RANGE = (
    f"eid BETWEEN (SELECT num << {SEQ_BITS} FROM tasks WHERE id=?) + ?"
    f" AND (SELECT num << {SEQ_BITS} FROM tasks WHERE id=?) + ?"
)


# At FULL every commit syncs the WAL. While the WAL grows, each sync also
# makes the file system journal the file's new size (the bench's disk table:
# an fsync after an append against one after a rewrite in place); on the test
# machine's ext4 a raw SQLite commit of two pages took 0.33 ms on a growing
# WAL against 0.27 on one written over in place (through the store, where
# other costs add to it, bench/wal_growth.py). A checkpoint every
# FULL_WAL_PAGES pages instead of SQLite's 1,000 restarts the WAL from its
# start sooner after the store opens, and keeps the file under 1 MB. At NORMAL
# commits do not sync, and a longer WAL spares the checkpoints' syncs.
FULL_WAL_PAGES = 200

# SQLite deletes the WAL when its last connection closes, so a store opened
# again at FULL would grow it anew for its first couple of hundred commits: on
# the test machine, 0.41 ms per commit over the first 100 against 0.31 once
# the file had its length (bench/wal_growth.py). The first write transaction
# extends the log to this many frames at once, with one sync (`ready_wal`),
# and every commit after writes over it in place; under 1 MB with the store's
# 4 KiB pages.
WAL_READY_FRAMES = FULL_WAL_PAGES + 48
_WAL_HEADER, _WAL_FRAME_HEADER = 32, 24  # bytes (SQLite's WAL file format)


def ready_wal(conn: sqlite3.Connection) -> None:
    """Extend the WAL of `conn`'s database to WAL_READY_FRAMES frames of zeros.

    Call it with the write lock held (inside `BEGIN IMMEDIATE`, before the
    transaction writes): no connection, of any process, appends to the log
    meanwhile, and its open connections keep SQLite from deleting it. Only
    past the log's end is written, and zeros are no frame (none has SQLite's
    checksums), so SQLite reads them as the log's end: a log holding commits
    of a process that died keeps them, and nothing changes on recovery. Best
    effort: if it cannot (no such file, a full disk), the commits grow the
    log as before.

    The log is named after the database file as SQLite resolved it when it
    opened it (`database_list`), not after the path the store was given: a
    relative path read after the process changed directory, or a symbolic
    link, could name another database's log, which this lock does not guard.
    """
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    size = _WAL_HEADER + WAL_READY_FRAMES * (page_size + _WAL_FRAME_HEADER)
    main = conn.execute("SELECT file FROM pragma_database_list WHERE name = 'main'").fetchone()
    if not main or not main[0]:
        return  # an in-memory or temporary database: no log file
    try:
        fd = os.open(f"{main[0]}-wal", os.O_WRONLY)  # never creates it: SQLite's to make
    except OSError:
        return
    try:
        end = os.fstat(fd).st_size
        if end < size:
            os.pwrite(fd, bytes(size - end), end)
            os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def connect(path: str, durability: Durability) -> sqlite3.Connection:
    if path != ":memory:" and not path.startswith("file:"):
        require_parent(path, absolute_hint("sqlite", path))
        try:
            create_private_file(path)  # 0600; SQLite gives -wal and -shm the same mode
        except OSError as exc:
            if is_full(exc):
                raise full_error(path, exc) from None
            raise StoreUnavailable(f"cannot create the SQLite store {path}: {exc}") from None
    try:
        conn = sqlite3.connect(path, timeout=30.0, isolation_level=None, check_same_thread=False)
        conn.row_factory = sqlite3.Row
        # Before anything else touches a new file: pages freed by a purge can be
        # given back (store.reclaim_space); an existing file keeps its mode. Only
        # on a new one: on a file with tables, the pragma costs a write lock and
        # more than the rest of opening put together.
        if conn.execute("PRAGMA page_count").fetchone()[0] == 0:
            conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={'FULL' if durability == 'full' else 'NORMAL'}")
        if durability == "full":
            conn.execute(f"PRAGMA wal_autocheckpoint={FULL_WAL_PAGES}")
        conn.execute("PRAGMA busy_timeout=30000")
        conn.execute("PRAGMA foreign_keys=OFF")
    except sqlite3.DatabaseError as exc:
        raise open_error(path, exc) from exc
    return conn


# Primary result codes (the low byte of an extended code).
_SQLITE_CORRUPT, _SQLITE_FULL, _SQLITE_NOTADB = 11, 13, 26
_SQLITE_IOERR = 10
# Out-of-room below this: SQLite reports a full disk while it grows the WAL
# index as a plain I/O error, so the free space decides.
_LOW_ROOM = 1 << 20


def _out_of_room(path: str) -> bool:
    free = free_bytes(path)
    if free is not None and free < _LOW_ROOM:
        return True
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]  # the process's file-size cap
    if limit == resource.RLIM_INFINITY:
        return False
    sizes = [os.path.getsize(p) for p in (path, f"{path}-wal") if os.path.exists(p)]
    return max(sizes, default=0) + _LOW_ROOM >= limit


def open_error(path: str, exc: sqlite3.DatabaseError) -> StoreError:
    """What a failure while opening a SQLite file means for the user.

    Only a file SQLite finds malformed is `StoreCorrupt`; a full disk is
    `StoreFull`, and other I/O or permission failures `StoreUnavailable`.
    """
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    if primary == _SQLITE_FULL or (primary == _SQLITE_IOERR and _out_of_room(path)):
        return full_error(path, exc)
    if primary in (_SQLITE_CORRUPT, _SQLITE_NOTADB) or not isinstance(
        exc, sqlite3.OperationalError
    ):
        return StoreCorrupt(f"{path} is not a readable duragent SQLite store: {exc}")
    return StoreUnavailable(f"cannot open the SQLite store {path}: {exc}")


def _current_version(conn: sqlite3.Connection) -> int | None:
    """The file's schema version, read without a lock; None when that read fails
    (a new file; a damaged one, which `migrate` then reports)."""
    try:
        row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        return int(row["value"]) if row else None
    except (sqlite3.DatabaseError, ValueError):
        return None


def migrate(conn: sqlite3.Connection, path: str) -> int:
    """Bring the file to SCHEMA_VERSION; refuse a file written by a newer duragent.

    A file already at this version is only read: opening it takes no write
    lock, so it never waits for another process's write transaction.
    """
    if _current_version(conn) == SCHEMA_VERSION:
        return SCHEMA_VERSION
    try:
        conn.execute("BEGIN IMMEDIATE")
        # Without a rowid, a text key needs no index of its own: one page less
        # in every new file (an older file keeps its meta table as it is).
        conn.execute(
            "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
            " WITHOUT ROWID"
        )
        row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        found = int(row["value"]) if row else 0
        if found > SCHEMA_VERSION:
            conn.execute("ROLLBACK")
            raise StoreVersionError(path, found, SCHEMA_VERSION)
        for version in range(found + 1, SCHEMA_VERSION + 1):
            for step in MIGRATIONS[version]:
                if isinstance(step, str):
                    conn.execute(step)
                else:
                    step(conn)
        conn.execute(
            "INSERT INTO meta(key, value) VALUES('schema_version', ?)"
            " ON CONFLICT(key) DO UPDATE SET value=excluded.value",
            (str(SCHEMA_VERSION),),
        )
        conn.execute("COMMIT")
        return found
    except sqlite3.DatabaseError as exc:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise open_error(path, exc) from exc
