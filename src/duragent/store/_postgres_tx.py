"""The shared commit algorithm's view of one open PostgreSQL transaction.

Row locks do the coordination: `load_task` takes `FOR UPDATE`, so the fencing
check and the write happen under the same lock; claims use `FOR UPDATE SKIP
LOCKED`, so workers never queue behind each other.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from psycopg.rows import DictRow
from psycopg.types.json import Jsonb

from duragent.errors import StoreError
from duragent.store._codec import MAX_SEQ, SEQ_BITS, dumps, entry_range, packed
from duragent.store._commits import CopyEntries
from duragent.store._postgres_message import Statement, send
from duragent.store._postgres_schema import ENTRY_RANGE, Conn, lock_key
from duragent.store._queues import QUEUES_SCOPE, Candidate
from duragent.store._tx import HeldRows, Notes, hold_row, task_columns
from duragent.types import Document, Entry, Task


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
        self.pending: list[Statement] = []  # writes not sent yet: see `conn`
        self.conn = conn
        self.namespace = namespace
        self.inputs: dict[str, Any] = {}
        self.notes = Notes()
        self.changed = False
        self.written: dict[str, Task] = {}  # rows as this transaction left them
        # Rows taken from the writer's cache instead of read under a lock: their
        # UPDATE carries the row's stamp and must match exactly one row.
        self.based_on: dict[str, Task] = {}
        self.server_now: datetime | None = None  # see lease_now

    @property
    def work(self) -> bool:
        return self.notes.work

    @property
    def conn(self) -> Conn:
        """The connection, once the writes queued so far are sent: a read sees them.

        Writes wait in `pending` until a read or `flush`, so a job's writes (a
        claim's row updates and status entries, say) go in one message.
        """
        self.flush()
        return self._conn

    @conn.setter
    def conn(self, value: Conn) -> None:
        self._conn = value

    def flush(self) -> None:
        """Send the queued writes (one round trip)."""
        if self.pending:
            statements, self.pending = self.pending, []
            send(self._conn, statements)

    def take_pending(self) -> list[Statement]:
        """The queued writes, for the caller to send with its own statements."""
        statements, self.pending = self.pending, []
        return statements

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

    # --- writes: queued until the next read here; BufferedPgTx sends none itself ---

    def _run(self, query: str, params: Any, *, guard: bool = False, prepare: bool = False) -> None:
        self.pending.append(Statement(query, params, guard, prepare))

    def insert_task(self, task: Task) -> None:
        cols = task_columns(task, _same, created=True)
        cols["input"] = dumps(task.input)
        cols["metadata"] = Jsonb(task.metadata) if task.metadata else None
        self._run(_insert_sql(tuple(cols)), cols)
        self.written[task.id] = task
        self.changed = True
        self.notes.wrote(task, created=True)

    def update_task(self, task: Task) -> None:
        # The input is written once at creation; re-sending it on every step would
        # make each commit cost the size of the input.
        same_input = task.id in self.inputs and self.inputs[task.id] == task.input
        st = update_statement(self.based_on.get(task.id), task, same_input)
        self._run(st.query, st.params, guard=st.guard, prepare=True)
        self.written[task.id] = task
        self.changed = True
        self.notes.wrote(task)

    def append(self, entries: list[Entry]) -> None:
        self._run(_append_sql(len(entries)), entry_params(entries), prepare=True)
        self.changed = True

    def copy_entries(self, copy: CopyEntries, task_id: str, after_seq: int, now: datetime) -> int:
        # The tasks whose entries the copy will reference, when they are not the
        # source itself (a fork of a fork): held, like the source, until this
        # commits, so a purge of one of them waits and gives these entries back
        # their payloads (PostgresStore._delete_trees). After a purge that went
        # first, they are found holding their payloads: the copy references them.
        source = entry_range(copy.source_id, copy.first_seq, copy.last_seq)
        self.conn.execute(
            f"SELECT 1 FROM tasks WHERE num IN (SELECT DISTINCT src >> {SEQ_BITS} FROM entries"
            f" WHERE {ENTRY_RANGE} AND src IS NOT NULL) ORDER BY id FOR SHARE",
            source,
        )
        # One statement, and no payload is copied: each new entry references the
        # entry that holds its payload (a fork of a fork, the first source). On
        # the connection, not buffered: the number copied is checked before the commit.
        cur = self.conn.execute(
            "INSERT INTO entries (eid, created_at, src, round, kind, payload)"
            f" SELECT ((SELECT num FROM tasks WHERE id = %s) << {SEQ_BITS}) + %s"
            " + row_number() OVER (ORDER BY eid), %s, coalesce(src, eid), round, kind, ''"
            f" FROM entries WHERE {ENTRY_RANGE} AND round <= %s AND kind = ANY(%s)",
            (
                task_id,
                after_seq,
                now,
                *source,
                copy.max_round,
                [k.value for k in copy.kinds],
            ),
        )
        self.changed = True
        return cur.rowcount

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

    def renew_leases(
        self, worker_id: str, held: dict[str, int], ttl: float
    ) -> tuple[dict[str, Task], set[str], set[str]]:
        """Renew every lease in `held` (task id -> epoch) whose row is free now,
        to `ttl` seconds past the server's `now()` (see lease_now).

        The same rule as _rules.renewed (the lease is still ours: same owner,
        same epoch), applied by the server to all rows at once: a busy worker's
        thirty leases cost one round trip, not sixty, so the renewal does not
        drift past the lease when the database is slow to answer.

        Rows another transaction holds (a task commit in flight on the
        writer's connection) are skipped, never waited for: a renewal waiting
        for rows while the writer waits for rows the renewal holds is a
        deadlock, which PostgreSQL resolves after a second by failing one of
        them, and two failed renewals in a row let a 2 s lease lapse. Returns
        (renewed, lost, busy): `busy` are the skipped ones, to try again.
        """
        ids = list(held)
        free = {
            row["id"]
            for row in self.conn.execute(
                "SELECT id FROM tasks WHERE id = ANY(%(ids)s) FOR UPDATE SKIP LOCKED",
                {"ids": ids},
            ).fetchall()
        }
        mine = [i for i in ids if i in free]
        rows = (
            self.conn.execute(
                "UPDATE tasks SET lease_expires = lease.ends, data = jsonb_set(data::jsonb,"
                " '{lease,expires_at}', to_jsonb(to_char(lease.ends AT TIME ZONE 'UTC',"
                ' \'YYYY-MM-DD"T"HH24:MI:SS.US"Z"\')))::text'
                " FROM unnest(%(ids)s::text[], %(epochs)s::bigint[]) AS held(id, epoch),"
                " (SELECT now() + make_interval(secs => %(ttl)s) AS ends) AS lease"
                " WHERE tasks.id = held.id AND tasks.lease_epoch = held.epoch"
                " AND tasks.lease_owner = %(worker)s"
                " RETURNING tasks.data, tasks.input",
                {
                    "ttl": float(ttl),
                    "ids": mine,
                    "epochs": [held[i] for i in mine],
                    "worker": worker_id,
                },
            ).fetchall()
            if mine
            else []
        )
        kept = {t.id: t for t in map(row_task, rows)}
        if kept:
            self.changed = True
        busy = set(ids) - free
        # A row that is free and not renewed is no longer ours; one that is not
        # there at all (deleted) is not ours either: neither is busy.
        there = (
            {
                row["id"]
                for row in self.conn.execute(
                    "SELECT id FROM tasks WHERE id = ANY(%(ids)s)", {"ids": list(busy)}
                ).fetchall()
            }
            if busy
            else set()
        )
        gone = busy - there
        return kept, (free - set(kept)) | gone, busy - gone

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
        agent versions in `versions`, or none, when given), in one statement,
        each source on its own index.

        Ready tasks: per open queue (found by a skip scan of `tasks_ready`), the
        first `limit` of `tasks_ready`, already in claim order; due timers and
        delayed starts: `tasks_due`; expired leases: `tasks_leases`. SKIP
        LOCKED: a row another worker is claiming is passed over rather than
        waited for; the rows returned stay locked until this transaction ends.
        A candidate's JSON is parsed only if admitted.
        """
        if (agents is not None and not agents) or (queues is not None and not queues):
            return []
        params: dict[str, Any] = {"now": now, "limit": limit, "closed": sorted(closed)}
        agent_clause = ""
        if agents is not None:
            agent_clause = " AND agent = ANY(%(agents)s)"
            params["agents"] = list(agents)
        if versions is not None:
            # A filter on the rows each index gives, like the agent's: no new seek;
            # arrays, so the statement's text (and its plan) is the same for any pairs.
            agent_clause += (
                " AND (agent_version IS NULL OR (agent, agent_version) IN"
                " (SELECT * FROM unnest(%(vnames)s::text[], %(vversions)s::text[])))"
            )
            params["vnames"] = list(versions)
            params["vversions"] = [versions[k] for k in versions]
        # The queues with ready tasks: a skip scan of `tasks_ready`, or the ones named.
        ready_queues = (
            "WITH RECURSIVE q(name) AS ("
            " SELECT (SELECT min(queue) FROM tasks WHERE status = 'pending' AND wake_at IS NULL)"
            " UNION ALL SELECT (SELECT min(queue) FROM tasks WHERE status = 'pending'"
            " AND wake_at IS NULL AND queue > q.name) FROM q WHERE q.name IS NOT NULL),"
        )
        if queues is not None:
            agent_clause += " AND queue = ANY(%(queues)s)"
            params["queues"] = list(queues)
            ready_queues = "WITH q(name) AS (SELECT unnest(%(queues)s::text[])),"
        lock = " FOR UPDATE SKIP LOCKED"
        if task_id is not None:
            params["id"] = task_id
            query = f"{_CANDIDATE} WHERE id = %(id)s AND ({_RUNNABLE}){agent_clause}{lock}"
            return [Candidate.from_row(r, self._task) for r in self.conn.execute(query, params)]
        # Locking reads cannot be UNIONed; as CTEs they can be, in one round trip.
        query = (
            f"{ready_queues} expired AS ({_CANDIDATE} WHERE status = 'running'"
            " AND coalesce(lease_expires, 'epoch'::timestamptz) <= %(now)s"
            f"{agent_clause} LIMIT %(limit)s{lock}),"
            f" timers AS ({_CANDIDATE} WHERE status = 'waiting' AND wake_at <= %(now)s"
            f"{agent_clause} ORDER BY wake_at LIMIT %(limit)s{lock}),"
            f" delayed AS ({_CANDIDATE} WHERE status = 'pending' AND wake_at <= %(now)s"
            f"{agent_clause} ORDER BY wake_at LIMIT %(limit)s{lock}),"
            " ready AS (SELECT r.* FROM q CROSS JOIN LATERAL"
            f" ({_CANDIDATE} WHERE status = 'pending' AND wake_at IS NULL AND queue = q.name"
            f"{agent_clause} ORDER BY priority DESC, created_at LIMIT %(limit)s{lock}) AS r"
            " WHERE q.name IS NOT NULL AND NOT q.name = ANY(%(closed)s))"
            " SELECT * FROM expired UNION ALL SELECT * FROM timers"
            " UNION ALL SELECT * FROM delayed UNION ALL SELECT * FROM ready"
        )
        rows = self.conn.execute(query, params).fetchall()
        return sorted((Candidate.from_row(r, self._task) for r in rows), key=Candidate.order)

    def lease_now(self) -> datetime:
        """The server's `now()`: the start of this transaction, the same value for
        every statement in it, so the claimable rows the server picks and the
        lease ends written here agree; and never later than the moment a
        worker sent it, so a lease is never longer than its TTL as the worker
        counts it (PostgresStore.renew_leases relies on that)."""
        if self.server_now is None:
            row = self.conn.execute("SELECT now() AS now").fetchone()
            assert row is not None
            self.server_now = row["now"].astimezone(UTC)
        return self.server_now

    def load_queues(self) -> list[Document]:
        # FOR UPDATE: claims from limited queues take turns here, so each one
        # counts the running tasks after the previous one committed its claims.
        # The server's time comes along (a claim's next question), with no
        # round trip of its own: one row even when there is no queue.
        return self.took_queues(self.conn.execute(QUEUES_QUERY, (QUEUES_SCOPE,)).fetchall())

    def took_queues(self, rows: list[DictRow]) -> list[Document]:
        """The queue documents of `QUEUES_QUERY`'s rows; the server's time kept."""
        self.server_now = rows[0]["server_now"].astimezone(UTC)
        return [row_document(r) for r in rows if r["scope"] is not None]

    def running_counts(
        self, queues: Sequence[str]
    ) -> list[tuple[str, str | None, str | None, int]]:
        rows = self.conn.execute(
            "SELECT queue, owner, lease_owner, count(*) AS n FROM tasks WHERE status = 'running'"
            " AND queue = ANY(%s) GROUP BY queue, owner, lease_owner",
            (list(queues),),
        ).fetchall()
        return [(r["queue"], r["owner"], r["lease_owner"], r["n"]) for r in rows]


# The queue documents, locked, and the server's now(): a claim's first question.
QUEUES_QUERY = (
    "WITH q AS (SELECT * FROM documents WHERE scope = %s ORDER BY key FOR UPDATE)"
    " SELECT now() AS server_now, q.* FROM (SELECT) AS one LEFT JOIN q ON true"
    " ORDER BY q.key"
)
_CANDIDATE = "SELECT id, status, queue, owner, priority, created_at, data, input FROM tasks"
_RUNNABLE = (
    "status = 'pending' AND (wake_at IS NULL OR wake_at <= %(now)s)"
    " OR (status = 'running' AND coalesce(lease_expires, 'epoch'::timestamptz) <= %(now)s)"
    " OR (status = 'waiting' AND wake_at <= %(now)s)"
)


class NeedsServer(Exception):
    """A buffered job asked for something only the server knows (a read)."""


def update_statement(base: Task | None, task: Task, same_input: bool) -> Statement:
    """The UPDATE that writes `task` over its row; with `base`, the row as this
    process knows it, guarded by its stamp and leaving out what it holds."""
    cols = task_columns(task, _same, stored=base)
    if not same_input:
        cols["input"] = dumps(task.input)
    if base is not None:  # the guard proves the row is `base`
        cols.update(zip(_GUARD_PARAMS, row_stamp(base), strict=True))
    return Statement(_update_sql(tuple(cols), base is not None), cols, base is not None, True)


def entry_params(entries: list[Entry]) -> list[Any]:
    """The parameters of `entries` for `_append_sql`, six per entry."""
    if max(e.seq for e in entries) > MAX_SEQ:
        raise StoreError(f"a task of this PostgreSQL store holds at most {MAX_SEQ:,} entries")
    params: list[Any] = []
    for e in entries:
        params += (
            e.task_id,
            e.seq,
            e.created_at,
            e.round,
            e.kind.value,
            dumps(packed(e.kind, e.payload)),
        )
    return params


class Deferred:
    """The task-row updates and entries of a batch's jobs run on cached rows,
    sent together where the batch's statements go next: a task that several
    commits of the batch change (a round's result and the next answer) gets
    one UPDATE, guarded by the row as it was before the batch, and the batch's
    entries one INSERT. A job whose writes are taken in adds them to those
    before it, in job order. A row a job judged on its copy but that no job
    of the batch writes (a lease fenced, a log's length checked, by a commit
    that only writes other rows) gets a guard of its own: the judgement holds
    only if the row is still as copied."""

    def __init__(self) -> None:
        self.rows: HeldRows = {}
        self.params: list[Any] = []
        self.read: dict[str, Task] = {}  # rows judged on their copy, first copy kept

    def take_in(self, tx: BufferedPgTx) -> None:
        for base, task in tx.updates.values():
            hold_row(self.rows, base, task)
        for task_id, base in tx.based_on.items():
            if task_id not in tx.updates:
                self.read.setdefault(task_id, base)
        self.params += tx.entry_params

    def statements(self) -> list[Statement]:
        """Its writes as statements, to send now; it is left empty."""
        out = [
            update_statement(base, task, base is not None and base.input == task.input)
            for base, task in self.rows.values()
        ]
        out += [still_as(base) for tid, base in self.read.items() if tid not in self.rows]
        if self.params:
            out.append(Statement(_append_sql(len(self.params) // 6), self.params, False, True))
        self.rows, self.params, self.read = {}, [], {}
        return out


def still_as(base: Task) -> Statement:
    """A guard that the row is still `base`: an UPDATE that writes nothing new
    (and holds the row's lock to the commit), matching one row only if so."""
    cols: dict[str, Any] = {"id": base.id, "version": base.version}
    cols.update(zip(_GUARD_PARAMS, row_stamp(base), strict=True))
    return Statement(_update_sql(tuple(cols), True), cols, True, True)


class BufferedPgTx(PgTx):
    """A job's writes queued, not sent: the writer sends the writes of a whole
    batch in one message. Task rows come from the rows this process last
    committed; each UPDATE is guarded by the row's stamp, so a row another
    process changed meanwhile matches nothing and the batch is run again with
    reads under row locks. A job that needs any other read raises NeedsServer
    and runs on the connection instead. Its task-row updates and entries wait
    in `updates` and `entry_params` for the batch's Deferred.
    """

    def __init__(self, namespace: str, rows: Callable[[str], Task | None]) -> None:
        super().__init__(None, namespace)  # type: ignore[arg-type]
        self.rows = rows
        self.statements: list[Statement] = []
        self.updates: HeldRows = {}
        self.entry_params: list[Any] = []

    def update_task(self, task: Task) -> None:
        hold_row(self.updates, self.based_on.get(task.id), task)
        self.written[task.id] = task
        self.changed = True
        self.notes.wrote(task)

    def append(self, entries: list[Entry]) -> None:
        self.entry_params += entry_params(entries)
        self.changed = True

    @property
    def conn(self) -> Conn:
        raise NeedsServer

    @conn.setter
    def conn(self, value: Conn) -> None:
        pass

    def _run(self, query: str, params: Any, *, guard: bool = False, prepare: bool = False) -> None:
        self.statements.append(Statement(query, params, guard, prepare))

    def load_task(self, task_id: str) -> Task | None:
        task = self.rows(task_id)
        if task is None:
            raise NeedsServer
        # Not copied: the commit algorithm never changes a row in place.
        self.based_on[task_id] = task
        self.inputs[task_id] = task.input
        self.notes.read(task)
        return task

    def find_by_request(self, owner: str | None, request_id: str) -> Task | None:
        raise NeedsServer

    def load_document(self, scope: str, key: str) -> Document | None:
        raise NeedsServer

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
        raise NeedsServer

    def load_queues(self) -> list[Document]:
        raise NeedsServer

    def lease_now(self) -> datetime:
        raise NeedsServer

    def running_counts(
        self, queues: Sequence[str]
    ) -> list[tuple[str, str | None, str | None, int]]:
        raise NeedsServer


def row_stamp(task: Task) -> tuple[Any, ...]:
    """What every write of a task row changes: matching it proves the row is as cached."""
    lease = task.lease
    return (task.version, task.last_seq, lease.epoch, lease.owner, lease.expires_at)


_GUARD_PARAMS = ("_version", "_last_seq", "_epoch", "_owner", "_expires")


# An entry's key from its task's id (the task's number, looked up by the server)
# and its seq.
_KEY = f"((SELECT num FROM tasks WHERE id = %s) << {SEQ_BITS}) + %s"


@functools.lru_cache(maxsize=64)
def _append_sql(rows: int) -> str:
    return "INSERT INTO entries (eid, created_at, round, kind, payload) VALUES " + (
        ", ".join([f"({_KEY}, %s, %s, %s, %s)"] * rows)
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
