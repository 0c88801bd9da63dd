"""The PostgreSQL writer's copies of its rows, read again after one went stale.

The writer runs a batch on this process's copies of its task rows, each UPDATE
guarded by the row's stamp (_postgres_writer.py). A lease renewal, which runs
beside the writer on a connection of its own, moves a row's lease end: a batch
sent between the renewal's commit on the server and its answer here misses its
guard. Run again reading every row under its lock, job by job, such a batch
costs round trips in proportion to its jobs (a savepoint, a read, the writes):
on a slow link, seconds for every heartbeat. Instead the copies are read again
in one query and the batch runs again on them, as one message, up to three
times (a renewal's second pass, for rows the failed batch held, can race the
retry the same way); a copy is only ever a guess the guard checks, so a fresh
one that is stale again merely sends the batch down the row-lock path after all.
The renewal hands its rows to the writer after each of its passes, not once
at its end, which keeps the window small.
"""

from __future__ import annotations

from duragent.store._postgres_schema import Conn
from duragent.store._postgres_tx import row_task
from duragent.types import Task

MAX_COPIES = 2000  # past this many, the batch reads its rows under their locks instead


def refresh_copies(conn: Conn, rows: dict[str, Task]) -> bool:
    """Replace `rows` (task id -> copy) with the rows as stored now, in one read;
    a row gone is dropped. False, and `rows` cleared, when there are too many."""
    if not rows or len(rows) > MAX_COPIES:
        rows.clear()
        return False
    found = conn.execute(
        "SELECT data, input FROM tasks WHERE id = ANY(%s)", (list(rows),)
    ).fetchall()
    rows.clear()
    rows.update((task.id, task) for task in map(row_task, found))
    return True
