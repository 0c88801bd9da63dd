"""Retention: purge and erase really delete tasks with their entries, documents,
labels and sub-tasks, on every store; nothing is left behind (checked with SQL)."""

from __future__ import annotations

import os
import sqlite3
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from conftest import drop_schema, require_postgres
from duragent.errors import TaskNotFound
from duragent.store import Commit, DocumentWrite, Store, TaskPatch, open_store
from duragent.store._purge import erase_owner, expire_by_ttl, purge
from duragent.store._queues import Queue, define_queue
from duragent.types import EntryKind, NewEntry, Task, task_scope


async def finished_tree(store: Store, owner: str = "alice", queue: str | None = None) -> list[str]:
    """A completed parent with a completed child, each with entries, a document and labels."""
    parent, _ = await store.create_task(
        Task(agent="a", owner=owner, queue=queue, metadata={"k": "v"})
    )
    (claimed,) = await store.claim_tasks("w", 1, ttl=60, task_id=parent.id)
    child = Task(agent="a", owner=owner, parent_id=parent.id, metadata={"k": "v"})
    await store.commit(
        Commit(
            fence={parent.id: claimed.lease.epoch},
            new_tasks=[child],
            entries=[
                NewEntry(task_id=parent.id, kind=EntryKind.CHECKPOINT, payload={"i": i})
                for i in range(5)
            ],
            documents=[DocumentWrite(task_scope(parent.id), "plan", {"a": 1})],
        )
    )
    (c,) = await store.claim_tasks("w", 1, ttl=60, task_id=child.id)
    await store.commit(
        Commit(
            fence={c.id: c.lease.epoch},
            patches=[TaskPatch(c.id, {"status": "completed"})],
            documents=[DocumentWrite(task_scope(c.id), "plan", {"b": 2})],
        )
    )
    await store.commit(
        Commit(
            fence={parent.id: claimed.lease.epoch},
            patches=[TaskPatch(parent.id, {"status": "completed"})],
        )
    )
    return [parent.id, child.id]


async def test_purge_deletes_finished_trees_and_keeps_the_rest(store: Store) -> None:
    doomed = await finished_tree(store)
    kept, _ = await store.create_task(Task(agent="a", owner="alice"))
    other = await finished_tree(store, owner="bob")
    result = await purge(store, owner="alice", before=datetime.now(UTC) + timedelta(seconds=1))
    assert result.tasks == 2
    for tid in doomed:
        with pytest.raises(TaskNotFound):
            await store.get_task(tid)
        assert await store.entries(tid) == []
        assert await store.list_documents(task_scope(tid)) == []
    assert (await store.get_task(kept.id)).status.value == "pending"
    assert (await store.get_task(other[0])).status.value == "completed"
    assert len(await store.list_documents(task_scope(other[1]))) == 1


async def test_purge_respects_before_and_refuses_unfinished(store: Store) -> None:
    await finished_tree(store)
    assert (await purge(store, before=datetime.now(UTC) - timedelta(hours=1))).tasks == 0
    with pytest.raises(ValueError, match="finished tasks only"):
        await purge(store, status="running")
    assert (await purge(store, before=timedelta(0), batch=1)).batches >= 1


async def test_erase_owner_deletes_every_status(store: Store) -> None:
    await finished_tree(store, owner="carol")
    pending, _ = await store.create_task(Task(agent="a", owner="carol"))
    mine, _ = await store.create_task(Task(agent="a", owner="dave"))
    result = await erase_owner(store, "carol")
    assert result.tasks == 3
    with pytest.raises(TaskNotFound):
        await store.get_task(pending.id)
    assert (await store.get_task(mine.id)).owner == "dave"


async def test_queue_ttl_expires_its_finished_tasks(store: Store) -> None:
    await define_queue(store, Queue("short", ttl=60))
    doomed = await finished_tree(store, queue="short")
    kept = await finished_tree(store)  # another queue, no ttl
    later = datetime.now(UTC) + timedelta(seconds=120)
    assert await expire_by_ttl(store, now=datetime.now(UTC)) == 0
    assert await expire_by_ttl(store, now=later) == 2  # the parent, with its sub-task
    with pytest.raises(TaskNotFound):
        await store.get_task(doomed[0])
    assert (await store.get_task(kept[0])).status.value == "completed"


# --- no orphan rows, checked with SQL ---------------------------------------


async def test_sqlite_purge_leaves_no_orphans_and_the_file_shrinks(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = open_store(f"sqlite:///{path}")
    await store.open()
    trees = [await finished_tree(store, owner=f"o{i % 3}") for i in range(60)]
    for tid, *_ in trees[:3]:  # fat logs, so freed pages are many
        task = await store.get_task(tid)
        await store.commit(
            Commit(
                entries=[
                    NewEntry(task_id=tid, kind=EntryKind.CHECKPOINT, payload={"pad": "x" * 4000})
                    for _ in range(50)
                ]
            )
        )
        assert task.status.value == "completed"
    kept, _ = await store.create_task(Task(agent="a", metadata={"k": "v"}))
    conn = sqlite3.connect(path)
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    result = await purge(store, before=timedelta(seconds=-1), batch=7)
    assert result.tasks == 120 and result.batches >= 9
    orphans = {
        "entries": "SELECT count(*) FROM entries WHERE eid >> 32 NOT IN (SELECT num FROM tasks)",
        "labels": "SELECT count(*) FROM task_labels WHERE task_num NOT IN (SELECT num FROM tasks)",
        "documents": "SELECT count(*) FROM documents WHERE scope LIKE 'task:%'"
        " AND substr(scope, 6) NOT IN (SELECT id FROM tasks)",
        "children": "SELECT count(*) FROM tasks WHERE parent_id IS NOT NULL"
        " AND parent_id NOT IN (SELECT id FROM tasks)",
    }
    for name, sql in orphans.items():
        assert conn.execute(sql).fetchone()[0] == 0, name
    assert conn.execute("SELECT count(*) FROM tasks").fetchone()[0] == 1
    assert conn.execute("SELECT count(*) FROM task_labels").fetchone()[0] == 1
    assert conn.execute("PRAGMA page_count").fetchone()[0] < pages * 0.5
    conn.close()
    assert (await store.get_task(kept.id)).metadata == {"k": "v"}
    await store.close()
    assert os.path.getsize(path) < pages * 4096 * 0.5


@pytest.mark.slow
async def test_postgres_purge_leaves_no_orphans() -> None:
    import psycopg

    url = require_postgres()
    schema = f"test_{uuid.uuid4().hex[:12]}"
    store = open_store(f"{url}?schema={schema}")
    await store.open()
    try:
        for i in range(30):
            await finished_tree(store, owner=f"o{i % 3}")
        kept, _ = await store.create_task(Task(agent="a"))
        result = await purge(store, before=timedelta(seconds=-1), batch=4)
        assert result.tasks == 60 and result.batches >= 8
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"SET search_path TO {schema}")
            for sql in (
                "SELECT count(*) FROM entries WHERE eid >> 32 NOT IN (SELECT num FROM tasks)",
                "SELECT count(*) FROM documents WHERE scope LIKE 'task:%'"
                " AND substr(scope, 6) NOT IN (SELECT id FROM tasks)",
                "SELECT count(*) FROM tasks WHERE parent_id IS NOT NULL"
                " AND parent_id NOT IN (SELECT id FROM tasks)",
            ):
                row = conn.execute(sql).fetchone()
                assert row is not None and row[0] == 0, sql
            row = conn.execute("SELECT count(*) FROM tasks").fetchone()
            assert row is not None and row[0] == 1
        assert (await store.get_task(kept.id)).status.value == "pending"
    finally:
        await store.close()
        drop_schema(schema)
