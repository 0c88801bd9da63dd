"""The statements the PostgreSQL writer prepares stay usable whatever happens
to its connection: a rollback, `DEALLOCATE ALL`, a killed backend.

The store under test has one connection (max_size=1), so its reads, its
writer and the test all use the same server session; a second store on the
same schema plays another worker.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest

from conftest import drop_schema, require_postgres
from duragent.errors import StaleLease
from duragent.store import Commit
from duragent.store._postgres import PostgresStore
from duragent.store._postgres_tx import PgTx
from duragent.types import EntryKind, NewEntry, Task

pytestmark = pytest.mark.postgres


def progress(task_id: str, text: str) -> NewEntry:
    return NewEntry(task_id=task_id, kind=EntryKind.PROGRESS, payload={"text": text})


@pytest.fixture
async def pair() -> AsyncIterator[tuple[PostgresStore, PostgresStore]]:
    url = require_postgres()
    schema = f"test_{uuid.uuid4().hex[:12]}"
    # retries=0: a statement prepared again must not need a retry of the budget
    # meant for lost connections and deadlocks.
    one = PostgresStore(url, schema=schema, min_size=1, max_size=1, retries=0)
    await one.open()
    other = PostgresStore(url, schema=schema)
    await other.open()
    try:
        yield one, other
    finally:
        await one.close()
        await other.close()
        drop_schema(schema)


def on_its_connection(store: PostgresStore, query: str) -> list[dict[str, Any]]:
    """Run `query` on the store's only connection, idle between its jobs."""
    with store._pool.connection() as conn:
        cur = conn.execute(query)
        return cur.fetchall() if cur.description else []


def prepared_names(store: PostgresStore) -> set[str]:
    rows = on_its_connection(store, "SELECT name FROM pg_prepared_statements")
    return {r["name"] for r in rows}


async def written_in_two_processes(
    one: PostgresStore, other: PostgresStore
) -> tuple[Task, list[Task]]:
    """A task `one` claimed and wrote (its shapes now prepared on its connection),
    and two tasks created by `other`, which `one` knows nothing of."""
    await other.create_task(Task(agent="a"))
    mine = await one.claim_task("w1")
    assert mine is not None
    await one.commit(Commit(entries=[progress(mine.id, "1")], fence={mine.id: 1}))
    theirs = [(await other.create_task(Task(agent="a")))[0] for _ in range(2)]
    return mine, theirs


async def a_refused_commit_beside_two_claims(one: PostgresStore, mine: Task) -> list[Any]:
    """One batch (asked for in one tick): a commit refused on the server, which
    rolls back to its savepoint, then two claims that each run on the server."""
    outcomes = await asyncio.gather(
        one.commit(Commit(entries=[progress(mine.id, "late")], fence={mine.id: 7})),
        one.claim_task("w1"),
        one.claim_task("w1"),
        return_exceptions=True,
    )
    return list(outcomes)


async def test_a_rollback_after_repeated_reads_keeps_the_writers_statements(
    pair: tuple[PostgresStore, PostgresStore],
) -> None:
    """psycopg prepares a query it ran five times, and from then on answers a
    ROLLBACK with DEALLOCATE ALL; the writer's statements must outlive both."""
    one, other = pair
    mine, theirs = await written_in_two_processes(one, other)
    before = prepared_names(one)
    assert before  # the writer's shapes, prepared on the connection
    for _ in range(6):
        await one.get_task(mine.id)
    refused, *claims = await a_refused_commit_beside_two_claims(one, mine)
    assert isinstance(refused, StaleLease)
    assert not any(isinstance(c, BaseException) for c in claims), claims
    assert sorted(c.id for c in claims) == sorted(t.id for t in theirs)
    assert before <= prepared_names(one)  # nothing was deallocated behind the writer
    for task in theirs:
        assert (await other.get_task(task.id)).lease.owner == "w1"


async def test_statements_deallocated_on_the_server_are_prepared_again_on_every_path(
    pair: tuple[PostgresStore, PostgresStore],
) -> None:
    """`DEALLOCATE ALL` (or a pooler's reset) on the connection: each path that
    sends a prepared statement prepares it again, and its caller never hears."""
    one, other = pair
    mine, theirs = await written_in_two_processes(one, other)
    on_its_connection(one, "DEALLOCATE ALL")
    # Jobs that each run on the server, in one batch, under savepoints.
    refused, *claims = await a_refused_commit_beside_two_claims(one, mine)
    assert isinstance(refused, StaleLease)
    assert not any(isinstance(c, BaseException) for c in claims), claims
    assert sorted(c.id for c in claims) == sorted(t.id for t in theirs)
    # A commit on this process's copy of the row: the whole transaction in one message.
    on_its_connection(one, "DEALLOCATE ALL")
    done = await one.commit(Commit(entries=[progress(mine.id, "2")], fence={mine.id: 1}))
    assert [e.payload["text"] for e in done.entries] == ["2"]
    # A write run outside the writer (as lease renewals are) that updates a task row.
    on_its_connection(one, "DEALLOCATE ALL")

    def bump(tx: PgTx) -> None:
        row = tx.load_task(mine.id)
        assert row is not None
        tx.update_task(row.model_copy(update={"iterations": 5}))

    await asyncio.to_thread(one._execute, bump, True)
    assert (await other.get_task(mine.id)).iterations == 5


async def test_after_its_backend_is_killed_the_new_connection_keeps_the_writers_statements(
    pair: tuple[PostgresStore, PostgresStore],
) -> None:
    """A server restart, as one connection sees it: the store connects again,
    and the new connection is opened like the first (no statement dropped by
    a rollback there either)."""
    one, other = pair
    url = require_postgres()
    mine, theirs = await written_in_two_processes(one, other)
    (killed,) = on_its_connection(one, "SELECT pg_backend_pid() AS pid")
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (killed["pid"],))
    # The next reads reconnect (the store retries a lost connection once it
    # sees it; retries=0 here, so the pool is checked first).
    one._pool.check()
    (now,) = on_its_connection(one, "SELECT pg_backend_pid() AS pid")
    assert now["pid"] != killed["pid"]
    # The reconnected store's first write prepares its shapes on the new connection.
    await one.commit(Commit(entries=[progress(mine.id, "2")], fence={mine.id: 1}))
    before = prepared_names(one)
    assert before
    for _ in range(6):
        await one.get_task(mine.id)
    refused, *claims = await a_refused_commit_beside_two_claims(one, mine)
    assert isinstance(refused, StaleLease)
    assert not any(isinstance(c, BaseException) for c in claims), claims
    assert sorted(c.id for c in claims) == sorted(t.id for t in theirs)
    assert before <= prepared_names(one)
    texts = [e.payload["text"] for e in await other.entries(mine.id, kinds=[EntryKind.PROGRESS])]
    assert texts == ["1", "2"]
