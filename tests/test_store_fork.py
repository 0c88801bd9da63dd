"""What every store does for a fork: entry heads to plan it, and a copy made inside the store."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, closing
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from pydantic import BaseModel

from conftest import drop_schema, opened_store, require_postgres
from duragent.errors import Conflict, TaskNotFound
from duragent.store import Commit, Store, TaskPatch, TaskQuery, open_store
from duragent.store._commits import CopyEntries, EntryHead
from duragent.store._jsonl import JSONLStore
from duragent.store._postgres import PostgresStore
from duragent.store._purge import purge
from duragent.store._sqlite import SQLiteStore
from duragent.types import (
    AssistantMessage,
    EntryKind,
    NewEntry,
    Task,
    TaskStatus,
    ToolMessage,
    UIText,
    UserMessage,
    dump_message,
)

COPIED = (EntryKind.API_MESSAGE, EntryKind.TOOL_RESULT)


def api(task_id: str, message: BaseModel, rnd: int) -> NewEntry:
    return NewEntry(
        task_id=task_id, kind=EntryKind.API_MESSAGE, round=rnd, payload=dump_message(message)
    )


async def source(store: Store, owner: str | None = None) -> Task:
    """seq 1 user, 2 ui, 3 assistant, 4 tool result, 5 assistant, 6 user."""
    task = Task(agent="a", owner=owner)
    result = ToolMessage(tool_call_id="c1", content="42")
    await store.create_task(
        task,
        [
            api(task.id, UserMessage(content="question"), 1),
            NewEntry(
                task_id=task.id, kind=EntryKind.UI_MESSAGE, payload=dump_message(UIText(text="ui"))
            ),
            api(task.id, AssistantMessage(content="thinking"), 1),
            NewEntry(
                task_id=task.id,
                kind=EntryKind.TOOL_RESULT,
                round=1,
                payload={**dump_message(result), "outcome": "ok"},
            ),
            api(task.id, AssistantMessage(content="answer"), 2),
            api(task.id, UserMessage(content="more"), 3),
        ],
    )
    return task


async def test_entry_heads_give_seq_kind_round_and_role_in_order(store: Store) -> None:
    src = await source(store)
    assert await store.entry_heads(src.id, kinds=COPIED) == [
        EntryHead(1, EntryKind.API_MESSAGE, 1, "user"),
        EntryHead(3, EntryKind.API_MESSAGE, 1, "assistant"),
        EntryHead(4, EntryKind.TOOL_RESULT, 1, "tool"),
        EntryHead(5, EntryKind.API_MESSAGE, 2, "assistant"),
        EntryHead(6, EntryKind.API_MESSAGE, 3, "user"),
    ]
    ui_role = dump_message(UIText(text="ui")).get("role")  # any payload's role, whatever its kind
    assert await store.entry_heads(src.id, kinds=(EntryKind.UI_MESSAGE,)) == [
        EntryHead(2, EntryKind.UI_MESSAGE, 0, ui_role)
    ]
    assert await store.entry_heads("nope", kinds=COPIED) == []


async def test_fork_copies_runs_in_log_order_with_their_payloads(store: Store) -> None:
    src = await source(store)
    fork = Task(agent="a")
    marker = NewEntry(task_id=fork.id, kind=EntryKind.CHECKPOINT, payload={"type": "fork"})
    between = api(fork.id, UserMessage(content="between"), 1)
    after = api(fork.id, UserMessage(content="after"), 3)
    log: list[NewEntry | CopyEntries] = [
        marker,
        CopyEntries(src.id, 1, 4, COPIED, max_round=9, count=3),  # skips the UI entry at seq 2
        between,
        CopyEntries(src.id, 5, 5, COPIED, max_round=9, count=1),
        after,
    ]
    stored, created = await store.create_fork(fork, log)
    assert created and stored.id == fork.id and stored.last_seq == 7
    assert (await store.get_task(fork.id)).last_seq == 7
    got = await store.entries(fork.id)
    assert [(e.seq, e.kind, e.round) for e in got] == [
        (1, EntryKind.CHECKPOINT, 0),
        (2, EntryKind.API_MESSAGE, 1),
        (3, EntryKind.API_MESSAGE, 1),
        (4, EntryKind.TOOL_RESULT, 1),
        (5, EntryKind.API_MESSAGE, 1),
        (6, EntryKind.API_MESSAGE, 2),
        (7, EntryKind.API_MESSAGE, 3),
    ]
    originals = {e.seq: e.payload for e in await store.entries(src.id)}
    assert [e.payload for e in got] == [
        marker.payload,
        originals[1],
        originals[3],
        originals[4],
        between.payload,
        originals[5],
        after.payload,
    ]
    view = await store.model_view(fork.id)
    assert [m.content for m in view] == ["question", "thinking", "42", "between", "answer", "after"]
    # The source is untouched.
    assert (await store.get_task(src.id)).last_seq == 6
    assert len(await store.entries(src.id)) == 6


async def test_uncounted_copy_takes_rounds_up_to_max_and_the_store_sets_round_seq(
    store: Store,
) -> None:
    src = await source(store)
    fork = Task(agent="a", iterations=1)
    marker = NewEntry(task_id=fork.id, kind=EntryKind.CHECKPOINT, payload={"type": "fork"})
    next_round = api(fork.id, UserMessage(content="next"), 2)
    stored, _ = await store.create_fork(
        fork,
        [
            marker,
            CopyEntries(src.id, 1, 3, COPIED, 1),
            CopyEntries(src.id, 4, 6, COPIED, 1),
            next_round,
        ],
    )
    # Rounds 2 and 3 of the source (seqs 5, 6) are past max_round: not copied.
    assert [m.content for m in await store.model_view(fork.id)] == [
        "question",
        "thinking",
        "42",
        "next",
    ]
    assert (stored.last_seq, stored.round_seq) == (5, 4)
    again = await store.get_task(fork.id)
    assert (again.last_seq, again.round_seq, again.iterations) == (5, 4, 1)


async def test_fork_is_idempotent_per_request_id(store: Store) -> None:
    src = await source(store)
    log = [CopyEntries(src.id, 1, 6, COPIED, max_round=9, count=5)]
    first, created = await store.create_fork(Task(agent="a", owner="o", request_id="r"), log)
    again, created_again = await store.create_fork(Task(agent="a", owner="o", request_id="r"), log)
    assert created and not created_again and again.id == first.id
    assert len(await store.entries(first.id)) == 5
    page = await store.list_tasks(TaskQuery(owner="o"))
    assert [t.id for t in page.tasks] == [first.id]


async def test_concurrent_forks_of_one_request_create_one_task(store: Store) -> None:
    src = await source(store)
    log = [CopyEntries(src.id, 1, 6, COPIED, max_round=9, count=5)]
    results = await asyncio.gather(
        *(store.create_fork(Task(agent="a", owner="o", request_id="same"), log) for _ in range(5))
    )
    assert len({t.id for t, _ in results}) == 1
    assert sum(created for _, created in results) == 1


async def test_fork_of_a_changed_source_is_refused_and_leaves_no_trace(store: Store) -> None:
    src = await source(store)
    fork = Task(agent="a")
    # The planner saw 4 entries where the source has 3: it changed in between.
    with pytest.raises(Conflict, match="changed while it was being forked"):
        await store.create_fork(fork, [CopyEntries(src.id, 1, 4, COPIED, max_round=9, count=4)])
    with pytest.raises(TaskNotFound):
        await store.get_task(fork.id)
    assert await store.entries(fork.id) == []
    await store.delete_task(src.id)
    gone = Task(agent="a")
    with pytest.raises(TaskNotFound, match=src.id):
        await store.create_fork(gone, [CopyEntries(src.id, 1, 6, COPIED, max_round=9)])
    with pytest.raises(TaskNotFound):
        await store.get_task(gone.id)


async def test_fork_stays_whole_when_its_source_is_deleted_or_purged(store: Store) -> None:
    src = await source(store)
    fork = Task(agent="a")
    await store.create_fork(fork, [CopyEntries(src.id, 1, 6, COPIED, max_round=9, count=5)])
    before = await store.model_view(fork.id)
    await store.delete_task(src.id)
    assert await store.model_view(fork.id) == before

    finished = await source(store, owner="gone")
    (claimed,) = await store.claim_tasks("w", 1, ttl=60, task_id=finished.id)
    await store.commit(
        Commit(
            fence={finished.id: claimed.lease.epoch},
            patches=[TaskPatch(finished.id, {"status": "completed"})],
        )
    )
    fork2 = Task(agent="a", owner="kept")
    await store.create_fork(fork2, [CopyEntries(finished.id, 1, 6, COPIED, max_round=9, count=5)])
    before2 = await store.model_view(fork2.id)
    result = await purge(store, owner="gone", before=datetime.now(UTC) + timedelta(seconds=1))
    assert result.tasks == 1
    with pytest.raises(TaskNotFound):
        await store.get_task(finished.id)
    assert await store.model_view(fork2.id) == before2
    assert [e.seq for e in await store.entries(fork2.id)] == [1, 2, 3, 4, 5]


async def test_fork_survives_reopening_a_file_store(file_store: Store) -> None:
    store = file_store
    if isinstance(store, JSONLStore):
        url = f"jsonl:///{store.directory}"  # the directory is absolute: four slashes
    else:
        assert isinstance(store, SQLiteStore)
        url = store.url
    src = await source(store)
    fork = Task(agent="a")
    await store.create_fork(fork, [CopyEntries(src.id, 1, 6, COPIED, max_round=9, count=5)])
    view = await store.model_view(fork.id)
    await store.close()
    again = open_store(url)
    await again.open()
    try:
        assert await again.model_view(fork.id) == view
        assert (await again.get_task(fork.id)).status is TaskStatus.PENDING
    finally:
        await again.close()
        await store.open()


def _stored_payloads(store: Store, task_id: str) -> tuple[int, int, set[str]]:
    """Of a task's stored rows, read with SQL: payload bytes, rows holding a
    reference, and the tasks they reference."""
    if isinstance(store, SQLiteStore):
        with closing(sqlite3.connect(store.path)) as conn:
            rows = conn.execute(
                "SELECT length(e.payload), s.id FROM entries e"
                " LEFT JOIN tasks s ON s.num = e.src >> 32"
                " WHERE e.eid >> 32 = (SELECT num FROM tasks WHERE id = ?)",
                (task_id,),
            ).fetchall()
    else:
        assert isinstance(store, PostgresStore)
        with psycopg.connect(require_postgres()) as conn:
            rows = conn.execute(
                sql.SQL(
                    "SELECT octet_length(e.payload), s.id FROM {0}.entries e"
                    " LEFT JOIN {0}.tasks s ON s.num = e.src >> 32"
                    " WHERE e.eid >> 32 = (SELECT num FROM {0}.tasks WHERE id = %s)"
                ).format(sql.Identifier(store.namespace)),
                (task_id,),
            ).fetchall()
    return (
        sum(n for n, _ in rows),
        sum(1 for _, s in rows if s is not None),
        {s for _, s in rows if s is not None},
    )


@pytest.fixture(params=["sqlite", "sqlite-full", "postgres"])
async def sql_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """The stores that can reference a payload instead of copying it."""
    async with opened_store(request.param, tmp_path) as s:
        yield s


async def test_a_fork_references_its_source_payloads_instead_of_copying_them(
    sql_store: Store,
) -> None:
    store = sql_store
    src = await source(store)
    fork = Task(agent="a")
    own = api(fork.id, UserMessage(content="after"), 3)
    await store.create_fork(fork, [CopyEntries(src.id, 1, 6, COPIED, 9, count=5), own])
    size, refs, targets = _stored_payloads(store, fork.id)
    assert refs == 5 and targets == {src.id}
    assert size == len(json.dumps(own.payload, separators=(",", ":")))  # its own entry only
    # A fork of the fork references the entry that holds each payload: the
    # first source's for the copied ones, the fork's for its own; never a reference.
    again = Task(agent="a")
    await store.create_fork(again, [CopyEntries(fork.id, 1, 6, COPIED, 9, count=6)])
    assert _stored_payloads(store, again.id) == (0, 6, {src.id, fork.id})
    # Every reader resolves the references.
    originals = {e.seq: e.payload for e in await store.entries(src.id)}
    assert [e.payload for e in await store.entries(fork.id)] == [
        originals[s] for s in (1, 3, 4, 5, 6)
    ] + [own.payload]
    assert [m.content for m in await store.model_view(again.id)] == [
        "question",
        "thinking",
        "42",
        "answer",
        "more",
        "after",
    ]
    assert [h.role for h in await store.entry_heads(again.id, kinds=COPIED)] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
        "user",
    ]


async def test_purging_a_source_gives_every_fork_its_payloads_back(sql_store: Store) -> None:
    store = sql_store
    src = await source(store)
    fork, again = Task(agent="a"), Task(agent="a")
    await store.create_fork(fork, [CopyEntries(src.id, 1, 6, COPIED, 9, count=5)])
    await store.create_fork(again, [CopyEntries(fork.id, 1, 5, COPIED, 9, count=5)])
    views = {t.id: await store.model_view(t.id) for t in (fork, again)}
    await store.delete_task(src.id)
    for t in (fork, again):
        size, refs, _ = _stored_payloads(store, t.id)
        assert refs == 0 and size > 0
        assert await store.model_view(t.id) == views[t.id]
    # Deleting a fork leaves its own fork whole too (it holds its payloads now).
    await store.delete_task(fork.id)
    assert await store.model_view(again.id) == views[again.id]


async def _waiting_on_locks() -> int:
    """How many of this process's store connections wait on a lock."""
    with psycopg.connect(require_postgres(), autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE application_name = %s AND wait_event_type = 'Lock'",
            (f"duragent-{os.getpid()}",),
        ).fetchone()
    return 0 if row is None else int(row[0])


async def _backends_waiting_on_locks(n: int) -> None:
    """Until `n` of this process's store connections wait on a lock (30 s at most)."""
    for _ in range(3000):
        if await _waiting_on_locks() >= n:
            return
        await asyncio.sleep(0.01)
    pytest.fail(f"{n} store connections never waited on a lock")


# The model view of `source`'s copied entries (seqs 1-6 less the UI entry).
SOURCE_VIEW = ["question", "thinking", "42", "answer", "more"]


@asynccontextmanager
async def two_stores() -> AsyncIterator[tuple[Store, Store, str]]:
    """Two PostgreSQL stores on one new schema, as two processes would have: a
    forker and a purger (and the schema's name)."""
    schema = f"test_{uuid.uuid4().hex[:12]}"
    url = f"{require_postgres()}?schema={schema}"
    forker, purger = open_store(url), open_store(url)
    await forker.open()
    await purger.open()
    try:
        yield forker, purger, schema
    finally:
        await forker.close()
        await purger.close()
        drop_schema(schema)


async def test_a_purge_racing_a_fork_of_its_task_on_postgres_leaves_no_reference_behind() -> None:
    """Two processes' stores: one forks a task while the other purges it. The
    fork holds the source's row until it commits; the purge waits for it and
    then gives the fork its payloads back, instead of deleting them under it."""
    async with two_stores() as (forker, purger, schema):
        src = await source(forker)
        with psycopg.connect(require_postgres()) as holder:  # a fork that came first
            holder.execute(
                sql.SQL("SELECT 1 FROM {}.tasks WHERE id = %s FOR UPDATE").format(
                    sql.Identifier(schema)
                ),
                (src.id,),
            )
            fork = Task(agent="a")
            forking = asyncio.create_task(
                forker.create_fork(fork, [CopyEntries(src.id, 1, 6, COPIED, 9, count=5)])
            )
            await _backends_waiting_on_locks(1)
            purging = asyncio.create_task(purger.delete_task(src.id))
            await _backends_waiting_on_locks(2)
            holder.rollback()
        await forking
        await purging
        with pytest.raises(TaskNotFound):
            await purger.get_task(src.id)
        size, refs, _ = _stored_payloads(forker, fork.id)
        assert refs == 0 and size > 0
        assert [m.content for m in await forker.model_view(fork.id)] == SOURCE_VIEW


async def test_postgres_resolves_a_reference_through_the_primary_key() -> None:
    """The view's lookup of a referenced payload is an index lookup, not a scan of
    every entry per reference (a reference column of another collation than
    `task_id` left only `seq` to the primary key: each reference read that seq
    of every task)."""
    schema = f"test_{uuid.uuid4().hex[:12]}"
    store = open_store(f"{require_postgres()}?schema={schema}")
    await store.open()
    try:
        src = await source(store)
        fork = Task(agent="a")
        await store.create_fork(fork, [CopyEntries(src.id, 1, 6, COPIED, 9, count=5)])
        with psycopg.connect(require_postgres()) as conn:
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            conn.execute("SET enable_seqscan = off")  # only a usable index avoids a scan
            plan = conn.execute(
                "EXPLAIN SELECT payload FROM entry_rows"
                " WHERE eid BETWEEN (SELECT num << 32 FROM tasks WHERE id = %s)"
                " AND (SELECT num << 32 FROM tasks WHERE id = %s) + 4294967295",
                (fork.id, fork.id),
            ).fetchall()
        text = "\n".join(r[0] for r in plan)
        # The key in the index condition: one entry read per reference.
        assert "Index Cond: (eid = e.src)" in text, text
    finally:
        await store.close()
        drop_schema(schema)


async def test_a_purge_of_the_first_source_waits_for_a_fork_of_its_fork_on_postgres() -> None:
    """A fork of a fork references the first source, which its transaction must
    hold too: the fork of F1 is held at its COMMIT (a deferred trigger waits on an
    advisory lock) while another store purges S, F1's source. The purge waits for
    it and gives the new fork its payloads back; it used to go first and leave
    the fork referencing deleted entries."""
    async with two_stores() as (forker, purger, schema):
        src = await source(forker)
        first, second = Task(agent="a"), Task(agent="a")
        await forker.create_fork(first, [CopyEntries(src.id, 1, 6, COPIED, 9, count=5)])
        with psycopg.connect(require_postgres(), autocommit=True) as setup:
            setup.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            setup.execute(
                "CREATE FUNCTION held_commit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
                f" IF NEW.id = '{second.id}' THEN PERFORM pg_advisory_xact_lock(4242); END IF;"
                " RETURN NULL; END $$"
            )
            setup.execute(
                "CREATE CONSTRAINT TRIGGER held_commit AFTER INSERT ON tasks"
                " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION held_commit()"
            )
        with psycopg.connect(require_postgres(), autocommit=True) as holder:
            holder.execute("SELECT pg_advisory_lock(4242)")
            forking = asyncio.create_task(
                forker.create_fork(second, [CopyEntries(first.id, 1, 5, COPIED, 9, count=5)])
            )
            await _backends_waiting_on_locks(1)  # the fork, at its COMMIT
            purging = asyncio.create_task(purger.delete_task(src.id))
            # The purge either waits for the fork (2 waiting) or, without the
            # fork holding S, is done before the fork commits.
            for _ in range(3000):
                if purging.done() or await _waiting_on_locks() >= 2:
                    break
                await asyncio.sleep(0.01)
            holder.execute("SELECT pg_advisory_unlock(4242)")
        await forking
        await purging
        size, refs, targets = _stored_payloads(forker, second.id)
        assert src.id not in targets and size > 0, (size, refs, targets)
        assert [m.content for m in await forker.model_view(second.id)] == SOURCE_VIEW
