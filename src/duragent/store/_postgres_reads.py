"""PostgresStore's reads of one task's log: its entries, heads, views, and the
two reads a runner starts with, in one round trip.

A runner starts (runtime/_recovery.py) with the entries of its open round and
the model's view. Read as two calls they took two pooled connections, each for
a round trip: over a slow link, the start-up reads of a wave of claimed tasks
queued for connections behind one another. `start_reads` sends both statements
in one pipeline on one connection: one round trip, one connection.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from datetime import UTC
from typing import TYPE_CHECKING, Any, TypeVar

from psycopg.rows import tuple_row

from duragent.store._codec import MAX_SEQ, entry_kind, entry_range, unpacked
from duragent.store._commits import EntryHead
from duragent.store._postgres_queries import model_view_text, task_rows, view_from, view_statement
from duragent.store._postgres_schema import ENTRY_RANGE, Conn
from duragent.store._views import build_ui_view, parse_messages, view_data
from duragent.types import ApiMessage, Entry, EntryKind, UIMessage

_T = TypeVar("_T")


def entries_statement(
    task_id: str, after_seq: int, kinds: Iterable[EntryKind] | None, limit: int | None
) -> tuple[str, list[Any]]:
    """The statement reading a task's entries after `after_seq`, and its parameters."""
    text = f"SELECT * FROM entry_rows WHERE {ENTRY_RANGE}"
    # No seq is above MAX_SEQ: a larger cursor gives the empty range past it.
    params: list[Any] = list(entry_range(task_id, min(after_seq, MAX_SEQ) + 1))
    if kinds is not None:
        text += " AND kind = ANY(%s)"
        params.append([EntryKind(k).value for k in kinds])
    text += " ORDER BY eid"
    if limit is not None:
        text += " LIMIT %s"
        params.append(limit)
    return text, params


def entry_objects(task_id: str, rows: Iterable[Any]) -> list[Entry]:
    return [
        Entry(
            task_id=task_id,
            seq=r["seq"],
            kind=(kind := entry_kind(task_id, r["seq"], r["kind"])),
            round=r["round"],
            payload=unpacked(kind, json.loads(r["payload"])),
            created_at=r["created_at"].astimezone(UTC),
        )
        for r in rows
    ]


class PgReads:
    """The Store protocol's reads of one task's log, for PostgresStore."""

    if TYPE_CHECKING:

        async def _read(self, job: Callable[[Conn], _T]) -> _T: ...

    async def entries(
        self,
        task_id: str,
        *,
        after_seq: int = 0,
        kinds: Iterable[EntryKind] | None = None,
        limit: int | None = None,
    ) -> list[Entry]:
        text, params = entries_statement(task_id, after_seq, kinds, limit)
        return await self._read(lambda conn: entry_objects(task_id, conn.execute(text, params)))

    async def start_reads(
        self, task_id: str, after_seq: int
    ) -> tuple[list[Entry], list[dict[str, Any]]]:
        text, params = entries_statement(task_id, after_seq, None, None)

        def read(conn: Conn) -> tuple[list[Entry], str]:
            with conn.cursor(row_factory=tuple_row) as view:
                with conn.pipeline():  # both statements, then one Sync: one round trip
                    rows = conn.execute(text, params)
                    view.execute(*view_statement(task_id))
                return entry_objects(task_id, rows), view_from(conn, task_id, view.fetchone())

        entries, view = await self._read(read)
        return entries, view_data(view)

    async def entry_heads(self, task_id: str, *, kinds: Iterable[EntryKind]) -> list[EntryHead]:
        columns = "seq, kind, round, payload::json ->> 'role'"
        codes = [EntryKind(k).value for k in kinds]
        return await self._read(
            lambda conn: [
                EntryHead(seq, EntryKind(kind), rnd, role)
                for seq, kind, rnd, role in task_rows(conn, task_id, columns, codes)
            ]
        )

    async def model_view(self, task_id: str) -> list[ApiMessage]:
        return parse_messages(await self._read(lambda conn: model_view_text(conn, task_id)))

    async def model_view_data(self, task_id: str) -> list[dict[str, Any]]:
        return view_data(await self._read(lambda conn: model_view_text(conn, task_id)))

    async def ui_messages(self, task_id: str) -> list[UIMessage]:
        code = [EntryKind.UI_MESSAGE.value]
        return await self._read(
            lambda conn: build_ui_view(task_rows(conn, task_id, "seq, payload", code))
        )
