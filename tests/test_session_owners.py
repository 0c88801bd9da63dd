"""Sessions are per owner through the live HTTP service (issue 12, item 1).

Bob naming Alice's session id gets a session of his own: he reads none of her
session documents or history and changes none of them.
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import drop_schema, require_postgres
from duragent.store import Store, open_store
from duragent.store._jsonl import JSONLStore
from duragent.store._memory import SCHEMA_VERSION as MEMORY_SCHEMA_VERSION
from duragent.store._sqlite import SQLiteStore
from duragent.store._sqlite_schema import (
    MIGRATIONS as SQLITE_MIGRATIONS,
    SCHEMA_VERSION as SQLITE_SCHEMA_VERSION,
)
from duragent.types import Task, session_scope, task_scope
from support.server_live import LiveServer, live_server


def start(server: LiveServer, user: str, text: str, **body: Any) -> dict[str, Any]:
    """Start a notebook task in session "shared" and wait for it to finish."""
    r = httpx.post(
        f"{server.url}/v1/tasks",
        json={"agent": "notebook", "input": text, "session_id": "shared", **body},
        headers=server.headers(user),
        timeout=30,
    )
    assert r.status_code == 201, r.text
    task_id = r.json()["id"]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        task: dict[str, Any] = httpx.get(
            f"{server.url}/v1/tasks/{task_id}", headers=server.headers(user), timeout=30
        ).json()
        if task["status"] in ("completed", "failed", "aborted", "blocked"):
            assert task["status"] == "completed", task
            return task
        time.sleep(0.05)
    raise TimeoutError(f"task {task_id} did not finish: {task}")


def model_texts(server: LiveServer, user: str, task_id: str) -> list[str]:
    r = httpx.get(
        f"{server.url}/v1/tasks/{task_id}/messages", headers=server.headers(user), timeout=30
    )
    assert r.status_code == 200, r.text
    return [str(m.get("content")) for m in r.json()["messages"]]


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/owners.db"
        return
    schema = f"test_owners_{uuid.uuid4().hex[:12]}"
    yield f"{require_postgres()}?schema={schema}"
    drop_schema(schema)


@pytest.mark.slow
def test_another_owners_session_id_behaves_like_a_new_session(
    tmp_path: Path, store_url: str
) -> None:
    with live_server(tmp_path, workers=2, store_url=store_url) as server:
        alice = start(server, "alice", "alice's secret plan")
        assert alice["output"] == "notes before: []"

        bob = start(server, "bob", "bob overwrites", continue_session=True)
        assert bob["output"] == "notes before: []"  # nothing of Alice's document
        assert not any("alice" in t for t in model_texts(server, "bob", bob["id"]))

        listed = httpx.get(
            f"{server.url}/v1/tasks?session_id=shared", headers=server.headers("bob"), timeout=30
        ).json()["tasks"]
        assert [t["id"] for t in listed] == [bob["id"]]

        again = start(server, "alice", "alice again", continue_session=True)
        assert again["output"] == """notes before: ["alice's secret plan"]"""
        texts = model_texts(server, "alice", again["id"])
        assert "alice's secret plan" in texts
        assert not any("bob" in t for t in texts)


# --- stores written before session scopes were per owner ----------------------

# (task owner, session id) of the tasks in the old store, and the old store's
# session documents: `session:<id>` with the id alone.
OLD_TASKS = [
    ("alice", "plans"),
    ("alice", "x"),
    ("bob", "alice:x"),  # its old scope `session:alice:x` is alice's new one for "x"
    ("alice", "mixed"),
    ("bob", "mixed"),
    (None, "anon"),
]
OLD_DOCS = {
    "session:plans": "alice's plans",
    "session:x": "alice's x",
    "session:alice:x": "bob's alice:x",
    "session:mixed": "written by alice or bob",
    "session:orphan": "no task uses this session",
    "session:anon": "ownerless",
}
# Where each old document must be after the migration.
MIGRATED = {
    session_scope("alice", "plans"): "alice's plans",
    session_scope("alice", "x"): "alice's x",
    session_scope("bob", "alice:x"): "bob's alice:x",
    "legacy-session:mixed": "written by alice or bob",  # whose? nobody gets it
    "legacy-session:orphan": "no task uses this session",
    session_scope(None, "anon"): "ownerless",
}


def old_tasks() -> list[Task]:
    return [Task(agent="a", owner=o, session_id=s, input="in") for o, s in OLD_TASKS]


async def check_migrated(store: Store, tasks: list[Task]) -> None:
    for scope, value in MIGRATED.items():
        docs = await store.list_documents(scope)
        assert [(d.key, d.value, d.scope) for d in docs] == [("notes", value, scope)], scope
    for old in OLD_DOCS:
        if old not in MIGRATED:
            assert await store.list_documents(old) == [], old
    assert (await store.list_documents("session:bob:mixed")) == []
    task_doc = await store.get_document(task_scope(tasks[0].id), "plan")
    assert task_doc is not None and task_doc.value == "untouched"
    for t in tasks:
        assert (await store.get_task(t.id)).session_id == t.session_id


def doc_row(scope: str, value: str) -> tuple[str, str, str, int, float]:
    return (scope, "notes", json.dumps(value), 1, 1000.0)


async def test_a_version_2_sqlite_store_gets_per_owner_session_scopes(tmp_path: Path) -> None:
    """A real file of the previous schema (its DDL, its rows), opened by this code."""
    path = tmp_path / "v2.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    for version in (1, 2):
        for ddl in SQLITE_MIGRATIONS[version]:
            assert isinstance(ddl, str)
            conn.execute(ddl)
    conn.execute("INSERT INTO meta VALUES ('schema_version', '2')")
    tasks = old_tasks()
    for i, t in enumerate(tasks):
        conn.execute(
            "INSERT INTO tasks (id, owner, session_id, agent, status, created_at, updated_at,"
            " data, input) VALUES (?, ?, ?, ?, 'pending', ?, ?, ?, ?)",
            (
                t.id,
                t.owner,
                t.session_id,
                t.agent,
                1000.0 + i,
                1000.0 + i,
                t.model_dump_json(exclude={"input"}),
                '"in"',
            ),
        )
    docs = [doc_row(s, v) for s, v in OLD_DOCS.items()]
    docs.append((task_scope(tasks[0].id), "plan", '"untouched"', 1, 1000.0))
    conn.executemany("INSERT INTO documents VALUES (?, ?, ?, ?, ?)", docs)
    conn.commit()
    conn.close()

    store = open_store(f"sqlite:///{path}")
    await store.open()
    assert isinstance(store, SQLiteStore) and store.migrated_from == 2
    await check_migrated(store, tasks)
    await store.close()
    again = open_store(f"sqlite:///{path}")
    await again.open()
    assert isinstance(again, SQLiteStore) and again.migrated_from == SQLITE_SCHEMA_VERSION
    await check_migrated(again, tasks)
    await again.close()


async def test_a_version_1_postgres_schema_gets_per_owner_session_scopes() -> None:
    import psycopg
    from psycopg import sql

    from duragent.store._postgres import PostgresStore
    from duragent.store._postgres_schema import MIGRATIONS as PG_MIGRATIONS

    url = require_postgres()
    schema = f"test_v1_{uuid.uuid4().hex[:12]}"
    tasks = old_tasks()
    try:
        with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            conn.execute("CREATE TABLE duragent_meta (key text PRIMARY KEY, value text NOT NULL)")
            for ddl in PG_MIGRATIONS[1]:
                assert isinstance(ddl, str)
                conn.execute(ddl)
            conn.execute("INSERT INTO duragent_meta VALUES ('schema_version', '1')")
            for t in tasks:
                conn.execute(
                    "INSERT INTO tasks (id, owner, session_id, agent, status, created_at,"
                    " updated_at, data, input) VALUES (%s, %s, %s, %s, 'pending', now(), now(),"
                    " %s, %s)",
                    (t.id, t.owner, t.session_id, t.agent, t.model_dump_json(), '"in"'),
                )
            docs = [doc_row(s, v) for s, v in OLD_DOCS.items()]
            docs.append((task_scope(tasks[0].id), "plan", '"untouched"', 1, 1000.0))
            for scope, key, value, version, _at in docs:
                conn.execute(
                    "INSERT INTO documents VALUES (%s, %s, %s, %s, now())",
                    (scope, key, value, version),
                )
        store = PostgresStore(url, schema=schema)
        await store.open()
        assert store.migrated_from == 1
        await check_migrated(store, tasks)
        await store.close()
        again = PostgresStore(url, schema=schema)
        await again.open()
        assert again.migrated_from == again.schema_version
        await check_migrated(again, tasks)
        await again.close()
    finally:
        drop_schema(schema)


async def test_a_version_1_jsonl_log_gets_per_owner_session_scopes(tmp_path: Path) -> None:
    """A log as version 1 wrote it: header, task and document records, a commit marker."""
    directory = tmp_path / "old"
    directory.mkdir()
    tasks = old_tasks()
    records = [{"t": "task", "v": json.loads(t.model_dump_json())} for t in tasks]
    docs = [(s, v) for s, v in OLD_DOCS.items()]
    docs.append((task_scope(tasks[0].id), "untouched"))
    for scope, value in docs:
        key = "plan" if scope.startswith("task:") else "notes"
        doc = {"scope": scope, "key": key, "value": value, "version": 1}
        doc["updated_at"] = "2026-01-01T00:00:00Z"
        records.append({"t": "doc", "v": doc})
    lines = [{"format": "duragent-jsonl", "schema_version": 1}, *records]
    lines.append({"t": "commit", "records": len(records)})
    (directory / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))

    store = open_store(f"jsonl:///{directory}")
    await store.open()
    assert isinstance(store, JSONLStore) and store.migrated_from == 1
    await check_migrated(store, tasks)
    await store.close()
    header = json.loads((directory / "log.jsonl").read_text().split("\n", 1)[0])
    assert header["schema_version"] == MEMORY_SCHEMA_VERSION  # rewritten once, not on every open
    again = open_store(f"jsonl:///{directory}")
    await again.open()
    assert isinstance(again, JSONLStore) and again.migrated_from == MEMORY_SCHEMA_VERSION
    await check_migrated(again, tasks)
    await again.close()
