"""The SQLite store's rows inside one transaction: the `Tx` the commit algorithm runs on."""

from __future__ import annotations

import functools
import json
import sqlite3
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from duragent._model_internals import set_field
from duragent.errors import StoreError
from duragent.store._codec import MAX_SEQ, dumps, entry_key, packed, to_ts, ts_to_dt
from duragent.store._commits import CopyEntries
from duragent.store._queues import QUEUES_SCOPE, Candidate
from duragent.store._sqlite_schema import KIND_CODES, ms_to_dt, to_ms
from duragent.store._tx import HeldRows, Notes, hold_row, task_columns
from duragent.types import Document, Entry, Task, utcnow


def row_task(row: sqlite3.Row) -> Task:
    task = Task.model_validate_json(row["data"])
    task.input = json.loads(row["input"])
    return task


_Stamp = tuple[int, int, int, float | None]  # version, last_seq, lease epoch, lease expiry


class RowCache:
    """Task rows this process last wrote, reused when the row's stamp still matches.

    Parsing a task's JSON is the costliest part of a small commit; a matching
    stamp (read from indexed columns) proves nobody, in any process, changed
    the row since, so the parsed object can be reused. Each row also keeps the
    writer connection's `PRAGMA data_version` at which it was last known to be
    the file's: while that value has not moved (no other connection committed),
    the row needs no stamp read at all.
    """

    def __init__(self) -> None:
        self.rows: dict[str, tuple[_Stamp, Task, int | None]] = {}

    def get(self, task_id: str, stamp: _Stamp) -> Task | None:
        """The cached row if its stamp is `stamp`."""
        hit = self.rows.get(task_id)
        # Not copied: the commit algorithm never changes a row in place.
        return hit[1] if hit is not None and hit[0] == stamp else None

    def fresh(self, task_id: str, data_version: int | None) -> Task | None:
        """The cached row if it was the file's at `data_version`, which has not moved."""
        hit = self.rows.get(task_id)
        if hit is None or data_version is None or hit[2] != data_version:
            return None
        return hit[1]

    def confirm(self, task_id: str, data_version: int | None) -> None:
        """The cached row was just proved the file's (its stamp matched) at `data_version`."""
        hit = self.rows.get(task_id)
        if hit is not None:
            self.rows[task_id] = (hit[0], hit[1], data_version)

    def put(self, task: Task, data_version: int | None = None) -> None:
        if len(self.rows) > 10_000:
            self.rows.clear()
        self.rows[task.id] = (_stamp(task), task, data_version)


class TaskNumbers:
    """Task ids and their numbers (a task's entry keys start at its number),
    as far as this process has met them. A number never changes, so an entry
    kept is right however old; a task not here has its number read from the
    file. Bounded like RowCache: a long-lived worker meets every task it ever
    ran, and a million ids would hold ~150 MB."""

    limit = 10_000  # ids kept; at the limit, all are forgotten before the next

    def __init__(self) -> None:
        self.nums: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.nums)

    def get(self, task_id: str) -> int | None:
        return self.nums.get(task_id)

    def put(self, task_id: str, num: int) -> None:
        if len(self.nums) >= self.limit and task_id not in self.nums:
            self.nums.clear()
        self.nums[task_id] = num

    def update(self, numbered: dict[str, int]) -> None:
        for task_id, num in numbered.items():
            self.put(task_id, num)

    def forget(self, task_id: str) -> None:
        self.nums.pop(task_id, None)

    def clear(self) -> None:
        self.nums.clear()


def _stamp(task: Task) -> _Stamp:
    return (task.version, task.last_seq, task.lease.epoch, to_ts(task.lease.expires_at))


@functools.lru_cache(maxsize=256)  # the columns left out vary (task_columns)
def _update_sql(columns: tuple[str, ...]) -> str:
    sets = ", ".join(f"{k}=:{k}" for k in columns if k != "id")
    return f"UPDATE tasks SET {sets} WHERE id=:id"


_INSERT_ENTRIES = (
    "INSERT INTO entries (eid, kind, round, payload, created_ms) VALUES (?, ?, ?, ?, ?)"
)


def _update_row(conn: sqlite3.Connection, before: Task | None, task: Task) -> None:
    """Write `task` over its row, which holds `before` (None: not known)."""
    cols = task_columns(task, to_ts, stored=before)
    if before is None or before.input != task.input:
        cols["input"] = dumps(task.input)
    conn.execute(_update_sql(tuple(cols)), cols)


class Deferred:
    """The task-row updates and entry rows of a batch's commits, written together
    at its end: a task that several commits of the batch change (a round's
    result and the next answer) is written once, and the batch's entries go in
    one statement. Any other statement of the batch writes them first
    (`SqliteTx.conn`), so whatever it reads shows what the batch did before it.
    """

    def __init__(self) -> None:
        self.rows: HeldRows = {}
        self.entries: list[tuple[Any, ...]] = []

    def write(self, conn: sqlite3.Connection) -> None:
        for before, task in self.rows.values():
            _update_row(conn, before, task)
        self.rows.clear()
        if self.entries:
            conn.executemany(_INSERT_ENTRIES, self.entries)
            self.entries = []


class SqliteTx:
    def __init__(
        self,
        conn: sqlite3.Connection,
        cache: RowCache | None = None,
        nums: TaskNumbers | None = None,
        batch_rows: dict[str, Task] | None = None,
        deferred: Deferred | None = None,
        *,
        data_version: int | None = None,
    ) -> None:
        self._conn = conn
        self.deferred = deferred  # where updates and entries wait for the batch's end
        self.cache = cache
        # The writer connection's `PRAGMA data_version` in this transaction: a
        # cached row confirmed at this value is the file's (RowCache.fresh).
        self.data_version = data_version
        # Rows as earlier jobs of this transaction left them: what the file holds
        # now, since no other process writes while it is open.
        self.batch_rows = batch_rows if batch_rows is not None else {}
        self.nums = nums if nums is not None else TaskNumbers()  # committed ones
        self.new_nums: dict[str, int] = {}  # numbers given in this transaction
        # Each row this transaction read or wrote, as the file now holds it: an
        # update writes only the input and indexed columns that differ from it.
        self.stored: dict[str, Task] = {}
        self.written: dict[str, Task] = {}  # handed to the cache once the batch commits
        self.notes = Notes()  # what other processes' waiters must hear of (_sqlite_wake.py)

    @property
    def conn(self) -> sqlite3.Connection:
        """The connection, with what waits in `deferred` written: for any statement
        but the few that know what waits there."""
        if self.deferred is not None:
            self.deferred.write(self._conn)
        return self._conn

    def task_num(self, task_id: str) -> int:
        num = self.new_nums.get(task_id) or self.nums.get(task_id)
        if num is None:  # a number never changes: what waits in `deferred` is no matter
            row = self._conn.execute("SELECT num FROM tasks WHERE id=?", (task_id,)).fetchone()
            num = row[0]
            self.nums.put(task_id, num)
        return num

    def _task(self, row: sqlite3.Row | None) -> Task | None:
        if row is None:
            return None
        task = row_task(row)
        self._seen(task)
        return task

    def _seen(self, task: Task) -> None:
        self.stored[task.id] = task
        self.notes.read(task)

    def load_task(self, task_id: str) -> Task | None:
        mine = self.batch_rows.get(task_id)
        if mine is not None:
            self._seen(mine)
            return mine
        # A row with an update waiting in `deferred` is in batch_rows, found above
        # (no job reads a row again after writing it): the file's row is current.
        if self.cache is not None:
            cached = self.cache.fresh(task_id, self.data_version)
            if cached is None:
                stamp = self._conn.execute(
                    "SELECT version, last_seq, lease_epoch, lease_expires FROM tasks WHERE id=?",
                    (task_id,),
                ).fetchone()
                if stamp is None:
                    return None
                cached = self.cache.get(task_id, tuple(stamp))
                if cached is not None:
                    self.cache.confirm(task_id, self.data_version)
            if cached is not None:
                self._seen(cached)
                return cached
        row = self._conn.execute("SELECT data, input FROM tasks WHERE id=?", (task_id,)).fetchone()
        return self._task(row)

    def find_by_request(self, owner: str | None, request_id: str) -> Task | None:
        row = self.conn.execute(
            "SELECT data, input FROM tasks WHERE coalesce(owner, '')=? AND request_id=?",
            (owner or "", request_id),
        ).fetchone()
        return self._task(row)

    def insert_task(self, task: Task) -> None:
        cols = task_columns(task, to_ts, created=True)
        cols["input"] = dumps(task.input)
        cols["metadata"] = dumps(task.metadata) if task.metadata else None
        names = ", ".join(cols)
        marks = ", ".join(f":{k}" for k in cols)
        cur = self.conn.execute(f"INSERT INTO tasks ({names}) VALUES ({marks})", cols)
        num = self.new_nums[task.id] = int(cur.lastrowid or 0)
        if task.metadata:
            self.conn.executemany(
                "INSERT INTO task_labels (key, value, task_created, task_num) VALUES (?, ?, ?, ?)",
                [(k, label_value(v), cols["created_at"], num) for k, v in task.metadata.items()],
            )
        self.written[task.id] = task
        self.notes.wrote(task, created=True)

    def update_task(self, task: Task) -> None:
        before = self.stored.get(task.id)
        if self.deferred is not None:
            hold_row(self.deferred.rows, before, task)
        else:
            _update_row(self._conn, before, task)
        self.stored[task.id] = task
        self.written[task.id] = task
        self.notes.wrote(task)

    def append(self, entries: list[Entry]) -> None:
        if max(e.seq for e in entries) > MAX_SEQ:
            raise StoreError(f"a task of this SQLite store holds at most {MAX_SEQ:,} entries")
        rows = []
        at, ms = None, 0
        for e in entries:
            if e.created_at is not at:  # a commit's entries share one time
                at, ms = e.created_at, to_ms(e.created_at)
                kept = ms_to_dt(ms)
            # The file keeps an entry's time to the millisecond; so does the entry
            # the commit hands back (made for this transaction alone), so that
            # it equals the entry read later.
            set_field(e, "created_at", kept)
            row = (entry_key(self.task_num(e.task_id), e.seq), KIND_CODES[e.kind], e.round)
            rows.append((*row, dumps(packed(e.kind, e.payload)), ms))
        if self.deferred is not None:
            self.deferred.entries += rows
        else:
            self._conn.executemany(_INSERT_ENTRIES, rows)

    def copy_entries(self, copy: CopyEntries, task_id: str, after_seq: int, now: datetime) -> int:
        # One statement, and no payload is copied: each new entry references the
        # entry that holds its payload (a fork of a fork, the first source).
        row = self.conn.execute("SELECT num FROM tasks WHERE id=?", (copy.source_id,)).fetchone()
        if row is None:
            return 0
        codes = [KIND_CODES[k] for k in copy.kinds]
        cur = self.conn.execute(
            "INSERT INTO entries (eid, kind, round, payload, created_ms, src)"
            " SELECT ? + row_number() OVER (ORDER BY eid), kind, round, '', ?, coalesce(src, eid)"
            " FROM entries WHERE eid BETWEEN ? AND ? AND round <= ?"
            f" AND kind IN ({', '.join('?' * len(codes))})",
            (
                entry_key(self.task_num(task_id), after_seq),
                to_ms(now),
                entry_key(row[0], copy.first_seq),
                entry_key(row[0], copy.last_seq),
                copy.max_round,
                *codes,
            ),
        )
        return cur.rowcount

    # Documents are written at once, never deferred: their statements need not
    # write what waits in `deferred` first.

    def load_document(self, scope: str, key: str) -> Document | None:
        row = self._conn.execute(
            "SELECT * FROM documents WHERE scope=? AND key=?", (scope, key)
        ).fetchone()
        return None if row is None else row_document(row)

    def put_document(self, doc: Document) -> None:
        self._conn.execute(
            "INSERT INTO documents (scope, key, value, version, updated_at) VALUES (?,?,?,?,?)"
            " ON CONFLICT(scope, key) DO UPDATE SET value=excluded.value,"
            " version=excluded.version, updated_at=excluded.updated_at",
            (doc.scope, doc.key, dumps(doc.value), doc.version, to_ts(doc.updated_at)),
        )

    def delete_document(self, scope: str, key: str) -> None:
        self._conn.execute("DELETE FROM documents WHERE scope=? AND key=?", (scope, key))

    def find_claimable(
        self,
        now: datetime,
        agents: Sequence[str] | None,
        task_id: str | None,
        limit: int,
        closed: set[str],
        queues: Sequence[str] | None = None,
        versions: Mapping[str, str] | None = None,
    ) -> list[Candidate]:
        """Runnable tasks in claim order (of `queues` only, when given; of the
        agent versions in `versions`, or none, when given), each source read
        through its own index.

        Ready tasks: per open queue, the first `limit` of `tasks_ready` (already
        in claim order); due timers and delayed starts: `tasks_due`; expired
        leases: `tasks_leases`. Nothing sorts the table, so a claim costs the
        same at any queue length; a candidate's JSON is parsed only if admitted.
        """
        params: dict[str, Any] = {"now": now.timestamp(), "limit": limit}
        agent_clause = ""
        if agents is not None:
            if not agents:
                return []
            agent_clause = " AND agent IN (" + ", ".join(f":a{i}" for i in range(len(agents))) + ")"
            params.update({f"a{i}": n for i, n in enumerate(agents)})
        if queues is not None:
            if not queues:
                return []
            agent_clause += " AND queue IN (" + ", ".join(f":q{i}" for i in range(len(queues)))
            agent_clause += ")"
            params.update({f"q{i}": n for i, n in enumerate(queues)})
        if versions is not None:
            # A filter on the rows the index gives, like the agent's: no new seek.
            pairs = ", ".join(f"(:vn{i}, :vv{i})" for i in range(len(versions)))
            agent_clause += " AND (agent_version IS NULL"
            agent_clause += f" OR (agent, agent_version) IN (VALUES {pairs}))" if pairs else ")"
            for i, (name, version) in enumerate(sorted(versions.items())):
                params[f"vn{i}"], params[f"vv{i}"] = name, version
        cols = "SELECT id, status, queue, owner, priority, created_at, data, input FROM tasks"
        if task_id is not None:
            params["id"] = task_id
            sql = f"{cols} WHERE id=:id AND ({_RUNNABLE}){agent_clause}"
            return [Candidate.from_row(r, self._task) for r in self.conn.execute(sql, params)]
        rows = self.conn.execute(
            # INDEXED BY: the planner prefers tasks_runnable(status), which reads
            # every running row (measured: 2.2 ms per claim with 1,500 running).
            f"{cols} INDEXED BY tasks_leases WHERE status='running'"
            f" AND coalesce(lease_expires, 0) <= :now{agent_clause} LIMIT :limit",
            params,
        ).fetchall()
        rows += self.conn.execute(
            f"{cols} WHERE status='waiting' AND wake_at <= :now"
            f"{agent_clause} ORDER BY wake_at LIMIT :limit",
            params,
        ).fetchall()
        rows += self.conn.execute(
            f"{cols} WHERE status='pending' AND wake_at <= :now{agent_clause}"
            " ORDER BY wake_at LIMIT :limit",
            params,
        ).fetchall()
        for queue in self._ready_queues() if queues is None else queues:
            if queue in closed:
                continue
            rows += self.conn.execute(
                f"{cols} INDEXED BY tasks_ready WHERE status='pending' AND wake_at IS NULL"
                f" AND queue=:queue{agent_clause} ORDER BY priority DESC, created_at LIMIT :limit",
                {**params, "queue": queue},
            ).fetchall()
        return sorted((Candidate.from_row(r, self._task) for r in rows), key=Candidate.order)

    def _ready_queues(self) -> list[str]:
        """The queues with ready tasks: a skip scan of `tasks_ready`, one seek per queue."""
        return [
            r[0]
            for r in self.conn.execute(
                # INDEXED BY: without it the planner may pick tasks_runnable and
                # read every pending row (measured: 18 ms at 20,000 pending).
                "WITH RECURSIVE q(name) AS ("
                " SELECT (SELECT min(queue) FROM tasks INDEXED BY tasks_ready"
                " WHERE status='pending' AND wake_at IS NULL)"
                " UNION ALL SELECT (SELECT min(queue) FROM tasks INDEXED BY tasks_ready"
                " WHERE status='pending' AND wake_at IS NULL AND queue > q.name)"
                " FROM q WHERE q.name IS NOT NULL)"
                " SELECT name FROM q WHERE name IS NOT NULL"
            )
        ]

    def lease_now(self) -> datetime:
        return utcnow()  # one machine: the host's clock

    def load_queues(self) -> list[Document]:
        rows = self.conn.execute("SELECT * FROM documents WHERE scope=?", (QUEUES_SCOPE,))
        return [row_document(r) for r in rows]

    def running_counts(
        self, queues: Sequence[str]
    ) -> list[tuple[str, str | None, str | None, int]]:
        marks = ", ".join("?" * len(queues))
        rows = self.conn.execute(
            "SELECT queue, owner, lease_owner, count(*) FROM tasks WHERE status='running'"
            f" AND queue IN ({marks}) GROUP BY queue, owner, lease_owner",
            list(queues),
        )
        return [(r[0], r[1], r[2], r[3]) for r in rows]


_RUNNABLE = (
    "status='pending' AND (wake_at IS NULL OR wake_at <= :now)"
    " OR (status='running' AND coalesce(lease_expires, 0) <= :now)"
    " OR (status='waiting' AND wake_at <= :now)"
)


def label_value(value: Any) -> str:
    """A metadata value as the text its equality filter compares: strings as they are."""
    return value if isinstance(value, str) else dumps(value)


def row_document(row: sqlite3.Row) -> Document:
    return Document(
        scope=row["scope"],
        key=row["key"],
        value=json.loads(row["value"]),
        version=row["version"],
        updated_at=ts_to_dt(row["updated_at"]),
    )
