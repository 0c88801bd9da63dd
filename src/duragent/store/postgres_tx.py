"""The shared commit algorithm's view of one open PostgreSQL transaction.

Row locks do the coordination: `load_task` takes `FOR UPDATE`, so the fencing
check and the write happen under the same lock; claims use `FOR UPDATE SKIP
LOCKED`, so workers never queue behind each other.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from psycopg import sql
from psycopg.rows import DictRow

from duragent.store.postgres_schema import Conn, lock_key
from duragent.store.tx import Notes, task_columns
from duragent.types import Document, Entry, Task


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


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


def _same(value: Any) -> Any:
    """psycopg sends datetimes as timestamptz: no conversion."""
    return value


class PgTx:
    """The shared algorithm's view of one open PostgreSQL transaction.

    `changed`: something was written. `notes.work`: a task row was written in
    a way that may make it claimable or move when it becomes claimable
    (created, claimed, released, resumed, waiting on a timer), which is all a
    worker needs to hear about; renewing a lease, appending entries, finishing
    or pausing a task is not. `notes.controlled`: tasks a control request was
    set on, which their owning worker must hear about at once.
    """

    def __init__(self, conn: Conn, namespace: str) -> None:
        self.conn = conn
        self.namespace = namespace
        self.inputs: dict[str, Any] = {}
        self.notes = Notes()
        self.changed = False

    @property
    def work(self) -> bool:
        return self.notes.work

    def _task(self, row: DictRow | None) -> Task | None:
        if row is None:
            return None
        task = row_task(row)
        self.inputs[task.id] = task.input
        self.notes.read(task)
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

    def insert_task(self, task: Task) -> None:
        cols = task_columns(task, _same, created=True)
        cols["input"] = _dumps(task.input)
        query = sql.SQL("INSERT INTO tasks ({}) VALUES ({})").format(
            sql.SQL(", ").join(map(sql.Identifier, cols)),
            sql.SQL(", ").join(map(sql.Placeholder, cols)),
        )
        self.conn.execute(query, cols)
        self.changed = True
        self.notes.wrote(task, created=True)

    def update_task(self, task: Task) -> None:
        cols = task_columns(task, _same)
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
        self.notes.wrote(task)

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
        return None if row is None else row_document(row)

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

    def renew_leases(
        self, worker_id: str, held: dict[str, int], expires: datetime
    ) -> tuple[dict[str, Task], set[str]]:
        """Renew every lease in `held` (task id -> epoch) in one statement.

        The same rule as base.renewed (the lease is still ours: same owner,
        same epoch), applied by the server to all rows at once: a busy worker's
        thirty leases cost one round trip, not sixty, so the renewal does not
        drift past the lease when the database is slow to answer.
        """
        stamp = expires.astimezone(UTC).isoformat().replace("+00:00", "Z")
        rows = self.conn.execute(
            "UPDATE tasks SET lease_expires = %(expires)s,"
            " data = jsonb_set(data::jsonb, '{lease,expires_at}', to_jsonb(%(stamp)s::text))::text"
            " FROM unnest(%(ids)s::text[], %(epochs)s::bigint[]) AS held(id, epoch)"
            " WHERE tasks.id = held.id AND tasks.lease_epoch = held.epoch"
            " AND tasks.lease_owner = %(worker)s"
            " RETURNING tasks.data, tasks.input",
            {
                "expires": expires,
                "stamp": stamp,
                "ids": list(held),
                "epochs": list(held.values()),
                "worker": worker_id,
            },
        ).fetchall()
        kept = {t.id: t for t in map(row_task, rows)}
        if kept:
            self.changed = True
        return kept, set(held) - set(kept)

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
