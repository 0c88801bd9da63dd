"""The PostgreSQL store's reads and deletes that are more than one statement.

A task's model view joined on the server, its entries as rows, a task query's
WHERE terms, and the deletion of task trees (with the forks that reference
them given their payloads back first).
"""

from __future__ import annotations

from datetime import UTC, datetime
from operator import itemgetter
from typing import Any

from psycopg.rows import tuple_row
from psycopg.types.json import Jsonb

from duragent.store._codec import MAX_SEQ, SEQ_BITS, decode_cursor, entry_range
from duragent.store._commits import TaskQuery, counted_filters
from duragent.store._postgres_schema import ENTRY_RANGE, Conn
from duragent.store._postgres_tx import PgTx
from duragent.store._views import VIEW_KINDS, view_text
from duragent.types import EntryKind


def task_rows(
    conn: Conn, task_id: str, columns: str, kinds: list[str], first: int = 0
) -> list[Any]:
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
            (*entry_range(task_id, first), kinds),
        )
        rows = cur.fetchall()
    rows.sort(key=itemgetter(0))
    return rows


# The view's payloads joined by the server, and whether a rollback marker is
# among them. One value instead of a row per message: a 10,000-entry task's
# view took 14 ms read as rows and joined here, 10.6 as this (the server's
# part grows from 3.4 to 7.6 ms; this process's shrinks from 10.6 to 3).
# Where a compacted task's view starts (see view_start): its last compaction's
# `upto` + 1, a JSON integer, else 0; read in the same statement as the entries
# (one snapshot, one round trip), before them in the task's row.
_VIEW_START = (
    "(SELECT CASE WHEN jsonb_typeof(u) = 'number' AND u::numeric = trunc(u::numeric)"
    " AND u::numeric BETWEEN 0 AND %s THEN u::bigint + 1 ELSE 0 END"
    " FROM (SELECT data::jsonb #> '{config,compacted,upto}' AS u FROM tasks WHERE id = %s) s)"
)
_JOINED_VIEW = (
    "SELECT '[' || coalesce(string_agg(payload, ',' ORDER BY eid), '') || ']',"
    f" coalesce(bool_or(kind IN ('{EntryKind.ROLLBACK.value}', '{EntryKind.COMPACTION.value}')),"
    f" false), {_VIEW_START} FROM entry_rows WHERE "
    + ENTRY_RANGE.replace(" + %s", f" + {_VIEW_START}", 1)
    + " AND kind = ANY(%s)"
)


def view_statement(task_id: str) -> tuple[str, tuple[Any, ...]]:
    """The statement reading a task's model view (`_JOINED_VIEW`), and its parameters."""
    task, _, _, last = entry_range(task_id)
    return _JOINED_VIEW, (MAX_SEQ, task, task, MAX_SEQ, task, task, last, list(VIEW_KINDS))


def view_from(conn: Conn, task_id: str, row: Any) -> str:
    """The view's JSON array text from `view_statement`'s row (a tuple): that row's
    text, unless a rollback or compaction is among the entries it joined, when the
    view is built from the rows read again (from the last compaction on)."""
    start = int(row[2]) if row is not None and row[2] is not None else 0
    if row is not None and not row[1]:
        return str(row[0])  # nothing voided (the common case): that is the view
    return view_text(task_rows(conn, task_id, "seq, kind, payload", list(VIEW_KINDS), start))


def model_view_text(conn: Conn, task_id: str) -> str:
    """The payloads of the task's model view as one JSON array text, read from the
    last compaction on (`_VIEW_START`), in one round trip."""
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(*view_statement(task_id))
        return view_from(conn, task_id, cur.fetchone())


def delete_trees(tx: PgTx, roots: list[str]) -> int:
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
        tx.notes.tasks.update(doomed)
    return len(doomed)


def task_filters(q: TaskQuery) -> tuple[list[str], list[Any]]:
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
    if q.id_prefix is not None:  # a parameter, never LIKE: % and _ are plain characters
        low, high = q.id_range()  # a range of the primary key (COLLATE "C"), then exact
        where.append("id >= %s" if high is None else "id >= %s AND id < %s")
        params.extend([low] if high is None else [low, high])
        where.append("left(id, %s) = %s")
        params.extend([len(q.id_prefix), q.id_prefix])
    return where, params


def count_text(q: TaskQuery) -> tuple[str, list[Any]]:
    """A task count's statement and parameters: from the counts kept (summed
    over their shards, migration 6) when they answer it (`TaskQuery.counted`),
    else from the tasks themselves."""
    if q.counted():
        where, params = counted_filters(q, "%s")
        text = "SELECT queue, status, sum(n)::bigint AS n FROM task_counts"
        if where:
            text += " WHERE " + " AND ".join(where)
        return text + " GROUP BY queue, status HAVING sum(n) <> 0", params
    where, params = task_filters(q)
    text = "SELECT queue, status, count(*) AS n FROM tasks"
    if where:
        text += " WHERE " + " AND ".join(where)
    return text + " GROUP BY queue, status", params


def list_text(q: TaskQuery) -> tuple[str, list[Any]]:
    """A page of tasks' statement and parameters: newest first, after the cursor.

    With a metadata filter the tasks holding the labels are found through the
    GIN index first and then sorted (OFFSET 0 keeps the planner from walking
    the list's index instead, filtering every task on the way: 1 s for a label
    of 1,000 tasks deep in a 1,000,000-task store, bench/list_scale.py); the
    cost is that of the tasks holding the label, as on SQLite (`task_labels`).
    """
    where, params = task_filters(q)
    if q.cursor:
        ts, cid = decode_cursor(q.cursor)
        where.append("(created_at, id) < (%s, %s)")
        params.extend([datetime.fromtimestamp(ts, UTC), cid])
    source = "tasks"
    if where:
        source += " WHERE " + " AND ".join(where)
    if q.metadata:
        source = f"(SELECT data, input, created_at, id FROM {source} OFFSET 0) t"
    params.append(q.limit + 1)
    return f"SELECT data, input FROM {source} ORDER BY created_at DESC, id DESC LIMIT %s", params
