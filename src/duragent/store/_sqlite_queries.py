"""The SQL of task queries on SQLite: the WHERE terms of a filter, and a page's
statement read in list order from an index (newest first)."""

from __future__ import annotations

from typing import Any

from duragent.store._codec import decode_cursor
from duragent.store._commits import TaskQuery
from duragent.store._sqlite_tx import label_value


def list_sql(q: TaskQuery) -> tuple[str, list[Any]]:
    """The statement and parameters of a page of `q` (one row past it: more follow)."""
    where, params = task_filters(q, joined=bool(q.metadata))
    sql, time = "SELECT data, input FROM tasks", "created_at"
    if q.metadata:
        # A label's rows newest first from its key (migration 10), each
        # joined to its task; the other labels filter as in `task_filters`.
        key, value = next(iter(q.metadata.items()))
        sql = "SELECT data, input FROM task_labels l CROSS JOIN tasks ON num = l.task_num"
        where[:0] = ["l.key=?", "l.value=?"]
        params[:0] = [key, label_value(value)]
        time = "l.task_created"
    if q.cursor:
        ts, cid = decode_cursor(q.cursor)
        # The first term lets an index seek; the second decides on the
        # cursor's rounded time (a REAL's last digits are not the cursor's).
        where.append(f"{time} < ? AND (round(created_at, 6), id) < (?, ?)")
        params.extend([ts + 1e-6, ts, cid])
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += f" ORDER BY {time} DESC, id DESC LIMIT ?"
    params.append(q.limit + 1)
    return sql, params


def task_filters(q: TaskQuery, joined: bool = False) -> tuple[list[str], list[Any]]:
    """The WHERE terms and parameters of a task query (metadata through `task_labels`);
    `joined` leaves out the first label, which the caller reads tasks through."""
    where: list[str] = []
    params: list[Any] = []
    for column, value in q.equal_filters():
        where.append(f"{column}=?")
        params.append(value)
    where += [f"{column} IS NULL" for column in q.null_filters()]
    statuses = q.statuses()
    if statuses is not None:
        where.append("status IN (" + ", ".join("?" * len(statuses)) + ")")
        params.extend(statuses)
    for column, op, bound in q.range_filters():
        where.append(f"{column} {op} ?")
        params.append(bound.timestamp())
    for key, value in list((q.metadata or {}).items())[1 if joined else 0 :]:
        where.append("num IN (SELECT task_num FROM task_labels WHERE key=? AND value=?)")
        params.extend([key, label_value(value)])
    if q.id_prefix is not None:  # a parameter, never LIKE: % and _ are plain characters
        # A range of the id index, then the exact test. SQLite keeps no statistics
        # here: a prefix of 6 characters or more is said to be rare (likelihood),
        # so the id index serves it, not the owner's (every task of theirs read);
        # a shorter one ("t", "t_" as the search box is typed in) reads the owner's
        # index newest first and stops at the page's end.
        low, high = q.id_range()
        rare = 0.001 if len(q.id_prefix) >= 6 else 0.5
        where.append(f"likelihood(id >= ?, {rare})")
        params.append(low)
        if high is not None:
            where.append(f"likelihood(id < ?, {rare})")
            params.append(high)
        where.append("substr(id, 1, ?) = ?")
        params.extend([len(q.id_prefix), q.id_prefix])
    return where, params
