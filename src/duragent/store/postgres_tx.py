"""The shared commit algorithm's view of one open PostgreSQL transaction.

Row locks do the coordination: `load_task` takes `FOR UPDATE`, so the fencing
check and the write happen under the same lock; claims use `FOR UPDATE SKIP
LOCKED`, so workers never queue behind each other.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from psycopg.rows import DictRow

from duragent.store.base import dumps
from duragent.store.postgres_schema import Conn, lock_key
from duragent.store.tx import task_columns
from duragent.types import Document, Entry, Task, TaskStatus


def row_task(row: DictRow) -> Task:
    task = Task.model_validate_json(row["data"])
    task.input = json.loads(row["input"])
    return task


def row_document(row: DictRow) -> Document:
    return Document(
        scope=row["scope"],
        key=row["key"],
        value=json.loads(row["value"]),
        version=row["version"],
        updated_at=row["updated_at"].astimezone(UTC),
    )


def schedule_key(task: Task) -> tuple[Any, ...]:
    """What decides whether, and from when, a worker may claim the task."""
    return (task.status, task.status_reason, task.wake_at, task.lease.owner, task.lease.epoch)


def may_become_claimable(task: Task) -> bool:
    """Pending; waiting on a timer; or running, so claimable once its lease expires."""
    status = task.status
    return (
        status is TaskStatus.PENDING
        or status is TaskStatus.RUNNING
        or (status is TaskStatus.WAITING and task.status_reason == "timer")
    )


def _same(value: Any) -> Any:
    """psycopg sends datetimes as timestamptz: no conversion."""
    return value


class PgTx:
    """The shared algorithm's view of one open PostgreSQL transaction.

    `changed`: something was written. `work`: a task row was written in a way
    that may make it claimable or move when it becomes claimable (created,
    claimed, released, resumed, waiting on a timer), which is all a worker
    needs to hear about; renewing a lease, appending entries, finishing or
    pausing a task is not.
    """

    def __init__(self, conn: Conn, namespace: str) -> None:
        self.conn = conn
        self.namespace = namespace
        self.inputs: dict[str, Any] = {}
        self.schedules: dict[str, tuple[Any, ...]] = {}
        self.changed = False
        self.work = False
        self.written: dict[str, Task] = {}  # rows as this transaction left them
        # Rows taken from the writer's cache instead of read under a lock: their
        # UPDATE carries the row's stamp and must match exactly one row.
        self.based_on: dict[str, Task] = {}

    def _task(self, row: DictRow | None) -> Task | None:
        if row is None:
            return None
        task = row_task(row)
        self.inputs[task.id] = task.input
        self.schedules[task.id] = schedule_key(task)
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

    # --- writes: run at once here; BufferedPgTx queues them for one message ---

    def _run(self, query: str, params: Any, *, guard: bool = False) -> None:
        self.conn.execute(query, params)

    def insert_task(self, task: Task) -> None:
        cols = task_columns(task, _same, created=True)
        cols["input"] = dumps(task.input)
        self._run(_insert_sql(tuple(cols)), cols)
        self.written[task.id] = task
        self.changed = self.work = True

    def update_task(self, task: Task) -> None:
        cols = task_columns(task, _same)
        # The input is written once at creation; re-sending it on every step would
        # make each commit cost the size of the input.
        if task.id not in self.inputs or self.inputs[task.id] != task.input:
            cols["input"] = dumps(task.input)
        base = self.based_on.get(task.id)
        if base is not None:
            cols.update(zip(_GUARD_PARAMS, row_stamp(base), strict=True))
        self._run(_update_sql(tuple(cols), base is not None), cols, guard=base is not None)
        self.written[task.id] = task
        self.changed = True
        if self.schedules.get(task.id) != schedule_key(task) and may_become_claimable(task):
            self.work = True

    def append(self, entries: list[Entry]) -> None:
        params: list[Any] = []
        for e in entries:
            params += (e.task_id, e.seq, e.kind.value, e.round, dumps(e.payload), e.created_at)
        self._run(_append_sql(len(entries)), params)
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
        return None if row is None else row_document(row)

    def put_document(self, doc: Document) -> None:
        self._run(
            "INSERT INTO documents (scope, key, value, version, updated_at)"
            " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (scope, key) DO UPDATE SET"
            " value = excluded.value, version = excluded.version, updated_at = excluded.updated_at",
            (doc.scope, doc.key, dumps(doc.value), doc.version, doc.updated_at),
        )
        self.changed = True

    def delete_document(self, scope: str, key: str) -> None:
        self._run("DELETE FROM documents WHERE scope = %s AND key = %s", (scope, key))
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


class NeedsServer(Exception):
    """A buffered job asked for something only the server knows (a read)."""


@dataclass(slots=True)
class Statement:
    query: str
    params: Any
    guard: bool  # an UPDATE that must match exactly one row


class BufferedPgTx(PgTx):
    """A job's writes queued, not sent: the writer sends the writes of a whole
    batch in one message. Task rows come from the rows this process last
    committed; each UPDATE is guarded by the row's stamp, so a row another
    process changed meanwhile matches nothing and the batch is run again with
    reads under row locks. A job that needs any other read raises NeedsServer
    and runs on the connection instead.
    """

    def __init__(self, namespace: str, rows: Callable[[str], Task | None]) -> None:
        super().__init__(None, namespace)  # type: ignore[arg-type]
        self.rows = rows
        self.statements: list[Statement] = []

    @property  # type: ignore[override]
    def conn(self) -> Conn:
        raise NeedsServer

    @conn.setter
    def conn(self, value: Conn) -> None:
        pass

    def _run(self, query: str, params: Any, *, guard: bool = False) -> None:
        self.statements.append(Statement(query, params, guard))

    def load_task(self, task_id: str) -> Task | None:
        task = self.rows(task_id)
        if task is None:
            raise NeedsServer
        # Not copied: the commit algorithm never changes a row in place.
        self.based_on[task_id] = task
        self.inputs[task_id] = task.input
        self.schedules[task_id] = schedule_key(task)
        return task

    def find_by_request(self, owner: str | None, request_id: str) -> Task | None:
        raise NeedsServer

    def load_document(self, scope: str, key: str) -> Document | None:
        raise NeedsServer

    def find_claimable(
        self, now: datetime, agents: Sequence[str] | None, task_id: str | None
    ) -> Task | None:
        raise NeedsServer


def row_stamp(task: Task) -> tuple[Any, ...]:
    """What every write of a task row changes: matching it proves the row is as cached."""
    lease = task.lease
    return (task.version, task.last_seq, lease.epoch, lease.owner, lease.expires_at)


_GUARD_PARAMS = ("_version", "_last_seq", "_epoch", "_owner", "_expires")


@functools.lru_cache(maxsize=64)
def _append_sql(rows: int) -> str:
    return "INSERT INTO entries (task_id, seq, kind, round, payload, created_at) VALUES " + (
        ", ".join(["(%s, %s, %s, %s, %s, %s)"] * rows)
    )


@functools.cache
def _insert_sql(cols: tuple[str, ...]) -> str:
    return f"INSERT INTO tasks ({', '.join(cols)}) VALUES ({', '.join(f'%({k})s' for k in cols)})"


@functools.cache
def _update_sql(cols: tuple[str, ...], guarded: bool) -> str:
    sets = ", ".join(f"{k} = %({k})s" for k in cols if k != "id" and k not in _GUARD_PARAMS)
    text = f"UPDATE tasks SET {sets} WHERE id = %(id)s"
    if guarded:
        text += (
            " AND version = %(_version)s AND last_seq = %(_last_seq)s"
            " AND lease_epoch = %(_epoch)s AND lease_owner IS NOT DISTINCT FROM %(_owner)s"
            " AND lease_expires IS NOT DISTINCT FROM %(_expires)s"
        )
    return text
