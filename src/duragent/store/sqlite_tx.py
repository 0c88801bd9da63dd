"""The SQLite store's rows inside one transaction: the `Tx` the commit algorithm runs on."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from duragent.store.base import to_ts, ts_to_dt
from duragent.store.sqlite_schema import KIND_CODES, dumps
from duragent.store.tx import task_columns
from duragent.types import Document, Entry, Task


def row_task(row: sqlite3.Row) -> Task:
    task = Task.model_validate_json(row["data"])
    task.input = json.loads(row["input"])
    return task


_Stamp = tuple[int, int, int, float | None]  # version, last_seq, lease epoch, lease expiry


class RowCache:
    """Task rows this process last wrote, reused when the row's stamp still matches.

    Parsing a task's JSON is the costliest part of a small commit; a matching
    stamp (read from indexed columns) proves nobody, in any process, changed
    the row since, so the parsed object can be reused.
    """

    def __init__(self) -> None:
        self.rows: dict[str, tuple[_Stamp, Task]] = {}

    def get(self, task_id: str, stamp: _Stamp) -> Task | None:
        hit = self.rows.get(task_id)
        # Not copied: the commit algorithm never changes a row in place.
        return hit[1] if hit is not None and hit[0] == stamp else None

    def put(self, task: Task) -> None:
        if len(self.rows) > 10_000:
            self.rows.clear()
        self.rows[task.id] = (_stamp(task), task)


def _stamp(task: Task) -> _Stamp:
    return (task.version, task.last_seq, task.lease.epoch, to_ts(task.lease.expires_at))


class SqliteTx:
    def __init__(
        self,
        conn: sqlite3.Connection,
        cache: RowCache | None = None,
        nums: dict[str, int] | None = None,
    ) -> None:
        self.conn = conn
        self.cache = cache
        self.nums = nums if nums is not None else {}  # task id -> its number, committed
        self.new_nums: dict[str, int] = {}  # numbers given in this transaction
        self.inputs: dict[str, Any] = {}
        self.written: dict[str, Task] = {}  # handed to the cache once the batch commits

    def task_num(self, task_id: str) -> int:
        num = self.new_nums.get(task_id) or self.nums.get(task_id)
        if num is None:
            row = self.conn.execute("SELECT num FROM tasks WHERE id=?", (task_id,)).fetchone()
            num = self.nums[task_id] = row[0]
        return num

    def _task(self, row: sqlite3.Row | None) -> Task | None:
        if row is None:
            return None
        task = row_task(row)
        self.inputs[task.id] = task.input
        return task

    def load_task(self, task_id: str) -> Task | None:
        if self.cache is not None:
            stamp = self.conn.execute(
                "SELECT version, last_seq, lease_epoch, lease_expires FROM tasks WHERE id=?",
                (task_id,),
            ).fetchone()
            if stamp is None:
                return None
            cached = self.cache.get(task_id, tuple(stamp))  # type: ignore[arg-type]
            if cached is not None:
                self.inputs[task_id] = cached.input
                return cached
        row = self.conn.execute("SELECT data, input FROM tasks WHERE id=?", (task_id,)).fetchone()
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
        names = ", ".join(cols)
        marks = ", ".join(f":{k}" for k in cols)
        cur = self.conn.execute(f"INSERT INTO tasks ({names}) VALUES ({marks})", cols)
        self.new_nums[task.id] = int(cur.lastrowid or 0)
        self.written[task.id] = task

    def update_task(self, task: Task) -> None:
        cols = task_columns(task, to_ts)
        if task.id not in self.inputs or self.inputs[task.id] != task.input:
            cols["input"] = dumps(task.input)
        sets = ", ".join(f"{k}=:{k}" for k in cols if k != "id")
        self.conn.execute(f"UPDATE tasks SET {sets} WHERE id=:id", cols)
        self.written[task.id] = task

    def append(self, entries: list[Entry]) -> None:
        self.conn.executemany(
            "INSERT INTO entries (task_num, seq, kind, round, payload, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            [
                (
                    self.task_num(e.task_id),
                    e.seq,
                    KIND_CODES[e.kind],
                    e.round,
                    dumps(e.payload),
                    to_ts(e.created_at),
                )
                for e in entries
            ],
        )

    def load_document(self, scope: str, key: str) -> Document | None:
        row = self.conn.execute(
            "SELECT * FROM documents WHERE scope=? AND key=?", (scope, key)
        ).fetchone()
        return None if row is None else row_document(row)

    def put_document(self, doc: Document) -> None:
        self.conn.execute(
            "INSERT INTO documents (scope, key, value, version, updated_at) VALUES (?,?,?,?,?)"
            " ON CONFLICT(scope, key) DO UPDATE SET value=excluded.value,"
            " version=excluded.version, updated_at=excluded.updated_at",
            (doc.scope, doc.key, dumps(doc.value), doc.version, to_ts(doc.updated_at)),
        )

    def delete_document(self, scope: str, key: str) -> None:
        self.conn.execute("DELETE FROM documents WHERE scope=? AND key=?", (scope, key))

    def find_claimable(
        self, now: datetime, agents: Sequence[str] | None, task_id: str | None
    ) -> Task | None:
        sql = (
            "SELECT data, input FROM tasks WHERE (status='pending'"
            " OR (status='running' AND (lease_expires IS NULL OR lease_expires <= :now))"
            " OR (status='waiting' AND status_reason='timer' AND wake_at <= :now))"
        )
        params: dict[str, Any] = {"now": now.timestamp()}
        if agents is not None:
            names = list(agents)
            if not names:
                return None
            sql += " AND agent IN (" + ", ".join(f":a{i}" for i in range(len(names))) + ")"
            params.update({f"a{i}": n for i, n in enumerate(names)})
        if task_id is not None:
            sql += " AND id=:id"
            params["id"] = task_id
        sql += " ORDER BY created_at LIMIT 1"
        return self._task(self.conn.execute(sql, params).fetchone())


def row_document(row: sqlite3.Row) -> Document:
    return Document(
        scope=row["scope"],
        key=row["key"],
        value=json.loads(row["value"]),
        version=row["version"],
        updated_at=ts_to_dt(row["updated_at"]),
    )
