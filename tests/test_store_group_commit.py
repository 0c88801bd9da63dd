"""Commits grouped into shared transactions: what each caller sees is still its own commit.

The SQLite (FULL) and PostgreSQL writers run batches on a writer thread and
answer each caller once its batch is durable; the PostgreSQL writer writes
rows it committed last without reading them again, guarded by the row's
stamp. These tests hold the behaviour those shortcuts must keep.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from conftest import drop_schema, require_postgres
from duragent.errors import Conflict, StaleLease, StoreError, StoreUnavailable
from duragent.store import (
    Commit,
    DocumentWrite,
    TaskPatch,
    _postgres_wire as postgres_wire,
    _postgres_writer as postgres_writer,
)
from duragent.store._codec import SEQ_BITS
from duragent.store._postgres import PostgresStore
from duragent.store._protocol import Store
from duragent.store._rules import apply_patch
from duragent.store._sqlite import SQLiteStore
from duragent.store._sqlite_schema import Durability
from duragent.types import EntryKind, NewEntry, Task, TaskStatus, Usage, utcnow


def progress(task_id: str, text: str) -> NewEntry:
    return NewEntry(task_id=task_id, kind=EntryKind.PROGRESS, payload={"text": text})


async def texts_of(store: Store, task_id: str) -> list[str]:
    return [e.payload["text"] for e in await store.entries(task_id, kinds=[EntryKind.PROGRESS])]


async def claimed(store: Store, worker: str = "w1") -> Task:
    await store.create_task(Task(agent="a"))
    task = await store.claim_task(worker)
    assert task is not None
    return task


# --- every store -------------------------------------------------------------


async def test_commits_made_together_each_land_once_in_order(store: Store) -> None:
    tasks = [await claimed(store, f"w{i}") for i in range(5)]
    results = await asyncio.gather(
        *(
            store.commit(Commit(entries=[progress(t.id, f"{t.id} {n}")], fence={t.id: 1}))
            for n in range(4)
            for t in tasks
        )
    )
    assert len(results) == 20
    for t in tasks:
        texts = await texts_of(store, t.id)
        assert texts == [f"{t.id} {n}" for n in range(4)]
        assert (await store.get_task(t.id)).last_seq == 1 + 4  # the claim's status entry + 4


async def test_a_refused_commit_leaves_its_batch_mates_untouched(store: Store) -> None:
    good, bad = await claimed(store, "w1"), await claimed(store, "w2")
    ok, stale, conflict = await asyncio.gather(
        store.commit(Commit(entries=[progress(good.id, "kept")], fence={good.id: 1})),
        store.commit(Commit(entries=[progress(bad.id, "lost")], fence={bad.id: 7})),
        store.commit(
            Commit(
                entries=[progress(bad.id, "lost too")],
                patches=[TaskPatch(bad.id, {"iterations": 1}, expect_version=99)],
            )
        ),
        return_exceptions=True,
    )
    assert not isinstance(ok, BaseException)
    assert isinstance(stale, StaleLease)
    assert isinstance(conflict, Conflict)
    kept = await store.entries(good.id, kinds=[EntryKind.PROGRESS])
    assert [e.payload["text"] for e in kept] == ["kept"]
    assert kept == ok.entries  # the batch-mate landed once, as its caller was told
    assert await store.entries(bad.id, kinds=[EntryKind.PROGRESS]) == []
    assert (await store.get_task(bad.id)).iterations == 0
    # The rows this process keeps of both tasks are what the store holds.
    after = await store.commit(Commit(entries=[progress(good.id, "next")], fence={good.id: 1}))
    assert after.entries[0].seq == ok.entries[0].seq + 1
    assert (await store.get_task(good.id)).last_seq == after.entries[0].seq


async def test_a_commit_queued_soon_lands_before_the_commits_asked_for_after_it(
    store: Store,
) -> None:
    task = await claimed(store)
    pending = store.commit_soon(Commit(entries=[progress(task.id, "first")], fence={task.id: 1}))
    later = await store.commit(
        Commit(entries=[progress(task.id, "second")], fence={task.id: 1}, after=pending)
    )
    first = await pending
    assert first.entries[0].seq < later.entries[0].seq
    assert pending.failed is None
    texts = await texts_of(store, task.id)
    assert texts == ["first", "second"]


@pytest.mark.parametrize("together", [True, False], ids=["same-batch", "later-batch"])
async def test_a_commit_after_a_refused_one_is_refused_with_its_error(
    store: Store, together: bool
) -> None:
    task, other = await claimed(store, "w1"), await claimed(store, "w2")
    refused = store.commit_soon(Commit(entries=[progress(task.id, "lost")], fence={task.id: 7}))
    if not together:  # its batch is over before the next commit is asked for
        with pytest.raises(StaleLease):
            await refused
    # Nothing about this commit is wrong but the one it follows: it writes nothing.
    # Queued in the same tick, all three share a transaction where stores batch.
    follower = store.commit_soon(
        Commit(entries=[progress(other.id, "never")], fence={other.id: 1}, after=refused)
    )
    unrelated = store.commit_soon(Commit(entries=[progress(other.id, "kept")], fence={other.id: 1}))
    outcomes = await asyncio.gather(follower, unrelated, return_exceptions=True)
    assert isinstance(outcomes[0], StaleLease)
    assert not isinstance(outcomes[1], BaseException)
    assert isinstance(refused.failed, StaleLease)
    if together:
        with pytest.raises(StaleLease):
            await refused
    assert await store.entries(task.id, kinds=[EntryKind.PROGRESS]) == []
    kept = await store.entries(other.id, kinds=[EntryKind.PROGRESS])
    assert [e.payload["text"] for e in kept] == ["kept"]


async def test_text_with_quotes_backslashes_and_unicode_round_trips(store: Store) -> None:
    task = await claimed(store)
    tricky = "it's a \\'quote\\' \\\\ back\\slash; DROP TABLE tasks; --"
    tricky += " é 日本 \U0001f600 $$ %s %(x)s"
    await store.commit(
        Commit(
            entries=[progress(task.id, tricky)],
            patches=[TaskPatch(task.id, {"context": {"k'": tricky}, "error": tricky})],
            fence={task.id: 1},
        )
    )
    [entry] = await store.entries(task.id, kinds=[EntryKind.PROGRESS])
    assert entry.payload["text"] == tricky
    row = await store.get_task(task.id)
    assert row.context == {"k'": tricky}
    assert row.error == tricky


async def test_patch_values_are_stored_as_their_field_types(store: Store) -> None:
    task = await claimed(store)
    result = await store.commit(
        Commit(
            patches=[
                TaskPatch(
                    task.id,
                    {
                        "status": "waiting",
                        "status_reason": "input",
                        "usage": {"input_tokens": 3, "output_tokens": 4},
                        "wake_at": "2030-01-01T00:00:00+00:00",
                    },
                )
            ],
            fence={task.id: 1},
        )
    )
    row = result.tasks[task.id]
    assert row.status is TaskStatus.WAITING
    assert row.usage == Usage(input_tokens=3, output_tokens=4)
    assert row.wake_at is not None and row.wake_at.year == 2030
    again = await store.get_task(task.id)
    assert again.status is TaskStatus.WAITING and again.usage == row.usage


def test_apply_patch_validates_values_not_of_their_field_type() -> None:
    task = Task(agent="a", status=TaskStatus.RUNNING)
    patched, _ = apply_patch(task, TaskPatch(task.id, {"iterations": "3"}), utcnow())
    assert patched.iterations == 3 and type(patched.iterations) is int
    with pytest.raises(ValueError):
        apply_patch(task, TaskPatch(task.id, {"iterations": "three"}), utcnow())
    assert task.iterations == 0  # the row it started from is unchanged


def test_apply_patch_gives_the_same_row_for_a_usage_and_its_dict() -> None:
    """The runner patches `usage` with a Usage, taken as it is; a dict (an older
    caller's, or a user's) is validated into one: the row is the same."""
    task = Task(agent="a", status=TaskStatus.RUNNING)
    now = utcnow()
    usage = Usage(input_tokens=3, output_tokens=4)
    taken, _ = apply_patch(task, TaskPatch(task.id, {"usage": usage}), now)
    validated, _ = apply_patch(task, TaskPatch(task.id, {"usage": usage.model_dump()}), now)
    assert type(validated.usage) is Usage and type(taken.usage) is Usage
    assert taken == validated and taken.model_dump_json() == validated.model_dump_json()
    assert task.usage == Usage()  # the row it started from is unchanged


# --- SQLite at FULL: batches on the writer thread ------------------------------------


async def test_sqlite_full_groups_concurrent_commits_into_shared_transactions(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(str(tmp_path / "s.db"), durability="full")
    await store.open()
    try:
        tasks = [await claimed(store, f"w{i}") for i in range(20)]
        before = store.batches, store.jobs_done
        await asyncio.gather(
            *(store.commit(Commit(entries=[progress(t.id, "x")], fence={t.id: 1})) for t in tasks)
        )
        batches, jobs = store.batches - before[0], store.jobs_done - before[1]
        assert jobs == 20
        assert batches < jobs  # made in one tick: they shared transactions (fsyncs)
    finally:
        await store.close()


@pytest.mark.parametrize("durability", ["normal", "full"])
async def test_sqlite_a_batch_writes_its_waiting_rows_before_a_statement_that_reads_them(
    tmp_path: Path, durability: Durability
) -> None:
    """A batch's commits write their task rows and entries together at its end;
    a job of the batch that reads or deletes rows sees what the commits before
    it in the batch did."""
    store = SQLiteStore(str(tmp_path / "s.db"), durability=durability)
    await store.open()
    try:
        doomed, kept = await claimed(store, "w1"), await claimed(store, "w2")
        before = store.batches
        # One tick: both commits and the deletion share one transaction.
        await asyncio.gather(
            store.commit(Commit(entries=[progress(doomed.id, "gone")], fence={doomed.id: 1})),
            store.commit(
                Commit(
                    entries=[progress(kept.id, "kept")],
                    patches=[TaskPatch(kept.id, {"status": "paused"})],
                    fence={kept.id: 1},
                )
            ),
            store.delete_task(doomed.id),
        )
        assert store.batches == before + 1
        with contextlib.closing(sqlite3.connect(tmp_path / "s.db")) as conn:
            orphans = conn.execute(
                "SELECT count(*) FROM entries WHERE eid >> ? NOT IN (SELECT num FROM tasks)",
                (SEQ_BITS,),
            ).fetchone()[0]
        assert orphans == 0  # the deleted task's entry was written before it was deleted
        assert (await store.get_task(kept.id)).status is TaskStatus.PAUSED
        texts = await texts_of(store, kept.id)
        assert texts == ["kept"]
    finally:
        await store.close()


@pytest.mark.parametrize("durability", ["normal", "full"])
async def test_sqlite_row_changed_by_another_connection_is_reread_not_overwritten(
    tmp_path: Path, durability: Durability
) -> None:
    """The writer takes a task row from its cache, without reading it, only while
    no other connection has committed to the file since (`PRAGMA data_version`)."""
    a = SQLiteStore(str(tmp_path / "s.db"), durability=durability)
    await a.open()
    b = SQLiteStore(str(tmp_path / "s.db"), durability=durability)  # another writer
    await b.open()
    try:
        task = await claimed(a)
        await a.commit(Commit(entries=[progress(task.id, "1")], fence={task.id: 1}))  # a's copy
        await b.commit(
            Commit(
                entries=[progress(task.id, "b")],
                patches=[TaskPatch(task.id, {"control": {"action": "pause"}})],
            )
        )
        renewed = await b.renew_lease(task.id, "w1", 1, 120)
        result = await a.commit(
            Commit(
                entries=[progress(task.id, "2")],
                patches=[TaskPatch(task.id, {"iterations": 1})],
                fence={task.id: 1},
            )
        )
        row = result.tasks[task.id]
        assert row.control == {"action": "pause"}  # b's change survived a's write
        assert row.lease.expires_at == renewed.lease.expires_at
        assert row.iterations == 1
        stored = await b.get_task(task.id)
        assert stored.control == {"action": "pause"} and stored.iterations == 1
        assert stored.last_seq == row.last_seq == 4  # the claim, "1", "b", "2": none lost
        assert await texts_of(b, task.id) == ["1", "b", "2"]
        # With nobody else writing, the next commits go on from a's own copy.
        again = await a.commit(Commit(entries=[progress(task.id, "3")], fence={task.id: 1}))
        assert again.entries[0].seq == 5
        assert await texts_of(b, task.id) == ["1", "b", "2", "3"]
    finally:
        await a.close()
        await b.close()


@pytest.mark.parametrize("durability", ["normal", "full"])
async def test_sqlite_row_cached_before_another_connections_commit_is_not_trusted_later(
    tmp_path: Path, durability: Durability
) -> None:
    """A row this process cached before another connection changed it stays
    suspect after later batches of this process, not only in the first one."""
    a = SQLiteStore(str(tmp_path / "s.db"), durability=durability)
    await a.open()
    b = SQLiteStore(str(tmp_path / "s.db"), durability=durability)  # another writer
    await b.open()
    try:
        x, y = await claimed(a), await claimed(a, "w2")
        await a.commit(Commit(entries=[progress(x.id, "x1")], fence={x.id: 1}))  # a caches x
        await b.commit(Commit(patches=[TaskPatch(x.id, {"control": {"action": "pause"}})]))
        await a.commit(Commit(entries=[progress(y.id, "y1")], fence={y.id: 1}))  # touches y only
        result = await a.commit(
            Commit(
                entries=[progress(x.id, "x2")],
                patches=[TaskPatch(x.id, {"iterations": 1})],
                fence={x.id: 1},
            )
        )
        assert result.tasks[x.id].control == {"action": "pause"}  # b's change kept
        stored = await b.get_task(x.id)
        assert stored.control == {"action": "pause"} and stored.iterations == 1
        assert await texts_of(b, x.id) == ["x1", "x2"]
    finally:
        await a.close()
        await b.close()


# --- PostgreSQL: grouped, and rows written from this process's copy --------------------


@pytest.fixture
async def pg_pair() -> AsyncIterator[tuple[PostgresStore, PostgresStore]]:
    url = require_postgres()
    schema = f"test_{uuid.uuid4().hex[:12]}"
    a = PostgresStore(url, schema=schema)
    await a.open()
    b = PostgresStore(url, schema=schema)  # another process, as far as `a` can tell
    await b.open()
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()
        drop_schema(schema)


@pytest.mark.postgres
async def test_postgres_groups_concurrent_commits_into_shared_transactions(
    pg_pair: tuple[PostgresStore, PostgresStore],
) -> None:
    store, _ = pg_pair
    tasks = [await claimed(store, f"w{i}") for i in range(20)]
    before = store.batches, store.jobs_done
    await asyncio.gather(
        *(store.commit(Commit(entries=[progress(t.id, "x")], fence={t.id: 1})) for t in tasks)
    )
    assert store.jobs_done - before[1] == 20
    assert store.batches - before[0] < 20


@pytest.mark.postgres
async def test_postgres_row_changed_elsewhere_is_reread_not_overwritten(
    pg_pair: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = pg_pair
    task = await claimed(a)
    await a.commit(Commit(entries=[progress(task.id, "1")], fence={task.id: 1}))  # a's copy
    # Another process changes the row: a control request and a renewed lease.
    await b.commit(Commit(patches=[TaskPatch(task.id, {"control": {"action": "pause"}})]))
    renewed = await b.renew_lease(task.id, "w1", 1, 120)
    result = await a.commit(
        Commit(
            entries=[progress(task.id, "2")],
            patches=[TaskPatch(task.id, {"iterations": 1})],
            fence={task.id: 1},
        )
    )
    row = result.tasks[task.id]
    assert row.control == {"action": "pause"}  # b's change survived a's write
    assert row.lease.expires_at == renewed.lease.expires_at
    assert row.iterations == 1
    stored = await b.get_task(task.id)
    assert stored.control == {"action": "pause"} and stored.iterations == 1
    assert stored.last_seq == row.last_seq == 3  # the claim, "1", "2": none lost
    texts = await texts_of(b, task.id)
    assert texts == ["1", "2"]


@pytest.mark.postgres
async def test_postgres_lease_renewals_keep_this_process_copy_of_the_rows(
    pg_pair: tuple[PostgresStore, PostgresStore],
) -> None:
    """A worker's renewals run beside the writer (renew_leases); the next commit
    of each task still writes from this process's copy, not a batch read again."""
    store, _ = pg_pair
    tasks = [await claimed(store, "w1") for _ in range(3)]
    for t in tasks:
        await store.commit(Commit(entries=[progress(t.id, "1")], fence={t.id: 1}))
    renewal = await store.renew_leases("w1", {t.id: 1 for t in tasks}, 120)
    rereads = store._writer.rereads
    for t in tasks:
        result = await store.commit(Commit(entries=[progress(t.id, "2")], fence={t.id: 1}))
        assert result.tasks[t.id].lease.expires_at == renewal.kept[t.id].lease.expires_at
    assert store._writer.rereads == rereads
    stored = await store.get_task(tasks[0].id)
    assert stored.lease.expires_at == renewal.kept[tasks[0].id].lease.expires_at
    assert stored.last_seq == 3  # the claim, "1", "2"


@pytest.mark.postgres
async def test_postgres_takeover_elsewhere_fences_this_process(
    pg_pair: tuple[PostgresStore, PostgresStore],
) -> None:
    """A stale owner writing from its copy of the row must still be refused."""
    a, b = pg_pair
    task = await claimed(a)
    await a.commit(Commit(entries=[progress(task.id, "mine")], fence={task.id: 1}))
    # The lease is taken over by another process (an expired lease, claimed again).
    await b.commit(Commit(patches=[TaskPatch(task.id, {"status": TaskStatus.PENDING})]))
    taken = await b.claim_task("w2", task_id=task.id)
    assert taken is not None and taken.lease.epoch == 2
    with pytest.raises(StaleLease):
        await a.commit(Commit(entries=[progress(task.id, "zombie")], fence={task.id: 1}))
    texts = await texts_of(b, task.id)
    assert texts == ["mine"]


@pytest.mark.postgres
async def test_postgres_checks_run_against_the_row_as_stored_not_this_process_copy(
    pg_pair: tuple[PostgresStore, PostgresStore],
) -> None:
    """A commit expecting the version another process wrote succeeds; one expecting
    this process's older copy is refused (the answer to a waiting task, say)."""
    a, b = pg_pair
    task, _ = await a.create_task(Task(agent="a"))  # a's copy: version 0
    moved = await b.commit(Commit(patches=[TaskPatch(task.id, {"iterations": 5})]))
    now = moved.tasks[task.id].version
    result = await a.commit(
        Commit(patches=[TaskPatch(task.id, {"iterations": 6}, expect_version=now)])
    )
    assert result.tasks[task.id].iterations == 6
    with pytest.raises(Conflict):
        await a.commit(Commit(patches=[TaskPatch(task.id, {"iterations": 7}, expect_version=0)]))
    assert (await b.get_task(task.id)).iterations == 6


def _prepared_runs(store: PostgresStore) -> list[tuple[str, int]]:
    """The statements prepared on the writer's connection, with how often each ran."""
    conn = store._writer._held  # kept by the writer between batches; idle now
    assert conn is not None
    rows = conn.execute(
        "SELECT statement, generic_plans + custom_plans AS runs FROM pg_prepared_statements"
    ).fetchall()
    return [(r["statement"], r["runs"]) for r in rows]


@pytest.mark.postgres
async def test_postgres_the_writer_prepares_each_statement_shape_once_per_connection(
    pg_pair: tuple[PostgresStore, PostgresStore],
) -> None:
    """A round's UPDATE and INSERT come in a few shapes: each is prepared once on
    the writer's connection and executed from then on, instead of every commit's
    text being parsed and planned again. What lands is unchanged."""
    store, other = pg_pair
    task = await claimed(store)
    for n in range(50):
        await store.commit(
            Commit(
                entries=[progress(task.id, f"{n}")],
                patches=[TaskPatch(task.id, {"iterations": n})],
                fence={task.id: 1},
            )
        )
    runs = _prepared_runs(store)
    updates = [n for text, n in runs if "UPDATE tasks SET" in text]
    inserts = [n for text, n in runs if "INSERT INTO entries" in text]
    assert len(runs) <= 4, runs  # a handful of shapes, not one per commit
    assert updates and max(updates) >= 48 and inserts and max(inserts) >= 48, runs
    row = await other.get_task(task.id)
    assert row.iterations == 49 and row.last_seq == 51  # the claim and 50 entries
    texts = await texts_of(other, task.id)
    assert texts == [f"{n}" for n in range(50)]


@pytest.mark.postgres
@pytest.mark.parametrize("on_loop", [True, False], ids=["from-loop", "from-thread"])
async def test_postgres_statements_deallocated_behind_the_writer_are_prepared_again(
    pg_pair: tuple[PostgresStore, PostgresStore], on_loop: bool
) -> None:
    """Whoever drops the writer's prepared statements (`DEALLOCATE ALL`, a
    pooler's reset) costs a commit one more try, not its failure."""
    store, other = pg_pair
    store._writer.on_loop = on_loop
    task = await claimed(store)
    await store.commit(Commit(entries=[progress(task.id, "1")], fence={task.id: 1}))
    conn = store._writer._held
    assert conn is not None and _prepared_runs(store)
    conn.execute("DEALLOCATE ALL")
    flights = store._writer.flights
    result = await store.commit(
        Commit(
            entries=[progress(task.id, "2")],
            patches=[TaskPatch(task.id, {"iterations": 2})],
            fence={task.id: 1},
        )
    )
    assert result.tasks[task.id].iterations == 2
    assert (store._writer.flights == flights + 1) is on_loop  # its first try's side
    assert _prepared_runs(store)  # prepared again
    texts = await texts_of(other, task.id)
    assert texts == ["1", "2"]
    assert (await other.get_task(task.id)).iterations == 2


@pytest.mark.postgres
async def test_postgres_a_batch_writes_a_task_row_once_and_its_entries_in_one_insert(
    pg_pair: tuple[PostgresStore, PostgresStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Commits made together on cached rows send one guarded UPDATE per task and
    one INSERT for all their entries; what lands is what each caller was told."""
    store, other = pg_pair
    tasks = [await claimed(store, f"w{i}") for i in range(3)]
    for t in tasks:  # each row now cached as this process wrote it
        await store.commit(Commit(entries=[progress(t.id, "0")], fence={t.id: 1}))
    sent: list[list[str]] = []
    real = postgres_wire.commit_message

    def recorded(conn: Any, statements: list[Any]) -> Any:
        sent.append([st.query.split(" ", 1)[0] for st in statements])
        return real(conn, statements)

    monkeypatch.setattr(
        postgres_wire, "commit_message", recorded
    )  # send_and_commit, and a batch sent from the loop
    results = await asyncio.gather(
        *(
            store.commit(
                Commit(
                    entries=[progress(t.id, f"{n}")],
                    patches=[TaskPatch(t.id, {"iterations": n})],
                    fence={t.id: 1},
                )
            )
            for n in (1, 2)
            for t in tasks
        )
    )
    assert len(sent) == 1  # one transaction, sent as one message
    assert sent[0].count("UPDATE") == 3 and sent[0].count("INSERT") == 1
    for t in tasks:
        row = await other.get_task(t.id)
        assert row.iterations == 2 and row.last_seq == 4  # the claim, "0", "1", "2"
        assert row == results[3 + tasks.index(t)].tasks[t.id]
        texts = await texts_of(other, t.id)
        assert texts == ["0", "1", "2"]


@pytest.mark.postgres
async def test_postgres_a_job_that_reads_on_the_server_sees_the_batch_before_it(
    pg_pair: tuple[PostgresStore, PostgresStore],
) -> None:
    """Writes waiting to be sent with the batch go before a job that runs on the
    connection, outside its savepoint: its refusal leaves them standing."""
    store, other = pg_pair
    task = await claimed(store)
    await store.commit(Commit(entries=[progress(task.id, "0")], fence={task.id: 1}))
    before, rereads = store.batches, store._writer.rereads
    first, refused, last = await asyncio.gather(
        store.commit(Commit(entries=[progress(task.id, "1")], fence={task.id: 1})),
        # A document read runs on the server; its expected version is wrong.
        store.commit(
            Commit(
                entries=[progress(task.id, "lost")],
                documents=[DocumentWrite("s", "k", {"v": 1}, expect_version=5)],
                fence={task.id: 1},
            )
        ),
        store.commit(Commit(entries=[progress(task.id, "2")], fence={task.id: 1})),
        return_exceptions=True,
    )
    assert store.batches == before + 1  # made in one tick: one transaction
    assert store._writer.rereads == rereads  # no row was found changed behind the batch
    assert isinstance(refused, Conflict)
    assert not isinstance(first, BaseException) and not isinstance(last, BaseException)
    texts = await texts_of(other, task.id)
    assert texts == ["0", "1", "2"]
    assert (await other.get_task(task.id)).last_seq == 4


@pytest.mark.postgres
async def test_postgres_a_batch_on_cached_rows_is_sent_and_answered_on_its_event_loop(
    pg_pair: tuple[PostgresStore, PostgresStore],
) -> None:
    """No thread between a round's commit and its answer: a batch that runs on
    this process's rows goes from the loop its commits came from. A job that
    reads on the server (a document's version) has its batch run by the writer
    thread, and the batches after it go from the loop again."""
    store, other = pg_pair
    task = await claimed(store)
    await store.commit(Commit(entries=[progress(task.id, "0")], fence={task.id: 1}))
    writer = store._writer
    flights, batches = writer.flights, writer.batches
    for i in range(1, 6):
        await store.commit(Commit(entries=[progress(task.id, f"{i}")], fence={task.id: 1}))
    assert (writer.flights - flights, writer.batches - batches) == (5, 5)
    await store.commit(
        Commit(
            entries=[progress(task.id, "6")],
            documents=[DocumentWrite("s", "k", {"v": 1})],
            fence={task.id: 1},
        )
    )
    assert (writer.flights - flights, writer.batches - batches) == (5, 6)
    await asyncio.gather(
        *(
            store.commit(Commit(entries=[progress(task.id, f"{i}")], fence={task.id: 1}))
            for i in (7, 8)
        )
    )
    assert (writer.flights - flights, writer.batches - batches) == (6, 7)
    texts = await texts_of(other, task.id)
    assert texts == [f"{i}" for i in range(9)]
    assert (await other.get_document("s", "k")) is not None


@pytest.fixture
def pg_store_of_its_own() -> Iterator[tuple[str, PostgresStore]]:
    """A PostgreSQL store (and its server's URL) for a test that runs event
    loops of its own; closed after, wherever the test stopped."""
    url = require_postgres()
    schema = f"test_{uuid.uuid4().hex[:12]}"
    store = PostgresStore(url, schema=schema)
    asyncio.run(store.open())
    try:
        yield url, store
    finally:
        asyncio.run(asyncio.wait_for(store.close(), 30))
        drop_schema(schema)


@pytest.mark.postgres
def test_postgres_commits_from_two_event_loops_at_once_all_land_in_order(
    pg_store_of_its_own: tuple[str, PostgresStore],
) -> None:
    """One store, two threads each running its own event loop and committing as
    fast as it can. A batch of one loop's commits goes from that loop, one that
    mixes both through the writer thread (which of the two happens is up to
    the threads' timing): every commit lands once, in order."""
    _, store = pg_store_of_its_own
    ids = [asyncio.run(claimed(store, f"w{i}")).id for i in range(2)]
    errors: list[BaseException] = []

    def commit_many(task_id: str) -> None:
        async def go() -> None:
            for n in range(150):
                commits = [
                    store.commit(
                        Commit(entries=[progress(task_id, f"{n}.{k}")], fence={task_id: 1})
                    )
                    for k in range(n % 3 + 1)
                ]
                await asyncio.gather(*commits)

        try:
            asyncio.run(go())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=commit_many, args=(i,), daemon=True) for i in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and not any(t.is_alive() for t in threads)
    assert store._writer.flights > 0  # some went from their loop
    for task_id in ids:
        entries = asyncio.run(store.entries(task_id, kinds=[EntryKind.PROGRESS]))
        texts = [e.payload["text"] for e in entries]
        assert texts == [f"{n}.{k}" for n in range(150) for k in range(n % 3 + 1)]


@pytest.mark.postgres
def test_postgres_a_batch_in_flight_when_its_loop_closed_lands_and_the_store_goes_on(
    pg_store_of_its_own: tuple[str, PostgresStore],
) -> None:
    """`asyncio.run` may end with a commit sent from its loop and not yet
    answered: the loop closes and never reads the answer. The writer thread
    reads it instead: that commit lands, and later commits from another loop,
    and closing the store, do not wait for ever. Held back on the server by a
    row lock, the answer cannot come before the loop has closed."""
    url, store = pg_store_of_its_own
    task = asyncio.run(claimed(store))
    asyncio.run(store.commit(Commit(entries=[progress(task.id, "0")], fence={task.id: 1})))
    with psycopg.connect(url, autocommit=True) as blocker:
        blocker.execute("BEGIN")
        blocker.execute(
            psycopg.sql.SQL("SELECT 1 FROM {}.tasks WHERE id = %s FOR UPDATE").format(
                psycopg.sql.Identifier(store.namespace)
            ),
            (task.id,),
        )

        async def send() -> None:
            flights = store._writer.flights
            store.commit_soon(Commit(entries=[progress(task.id, "1")], fence={task.id: 1}))
            while store._writer.flights == flights:  # until sent from this loop
                await asyncio.sleep(0)

        asyncio.run(send())  # its loop closed, the answer unread
        blocker.execute("ROLLBACK")

    async def after() -> list[str]:
        await asyncio.wait_for(
            store.commit(Commit(entries=[progress(task.id, "2")], fence={task.id: 1})), 30
        )
        entries = await store.entries(task.id, kinds=[EntryKind.PROGRESS])
        return [e.payload["text"] for e in entries]

    assert asyncio.run(after()) == ["0", "1", "2"]


@pytest.mark.postgres
async def test_postgres_a_batch_that_fails_to_build_on_the_loop_fails_its_callers(
    pg_pair: tuple[PostgresStore, PostgresStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug met while building a batch on the event loop reaches the batch's
    callers as their error (the writer thread runs it again and reports it);
    it does not leave them waiting. The next batch lands."""
    store, other = pg_pair
    task = await claimed(store)
    await store.commit(Commit(entries=[progress(task.id, "0")], fence={task.id: 1}))

    def broken(namespace: str, txs: list[Any]) -> list[Any]:
        raise RuntimeError("a bug")

    monkeypatch.setattr(postgres_writer, "notifications", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        await asyncio.wait_for(
            store.commit(Commit(entries=[progress(task.id, "lost")], fence={task.id: 1})), 10
        )
    monkeypatch.undo()
    await store.commit(Commit(entries=[progress(task.id, "1")], fence={task.id: 1}))
    texts = await texts_of(other, task.id)
    assert texts == ["0", "1"]


# --- an event loop that stops holding the writer's turn ------------------------


@pytest.fixture(params=["sqlite", "sqlite-full", "postgres"])
def store_of_its_own(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A group-commit store for a test that runs event loops of its own;
    closed after (within 30 s, or the test fails), wherever the test stopped."""
    schema = None
    store: Store
    if request.param == "postgres":
        url = require_postgres()
        schema = f"test_{uuid.uuid4().hex[:12]}"
        store = PostgresStore(url, schema=schema)
    else:
        durability: Durability = "full" if request.param == "sqlite-full" else "normal"
        store = SQLiteStore(str(tmp_path / "own.db"), durability=durability)
    asyncio.run(store.open())
    try:
        yield store
    finally:
        asyncio.run(asyncio.wait_for(store.close(), 30))
        if schema is not None:
            drop_schema(schema)


@pytest.mark.parametrize("then", ["closed", "kept"])
def test_a_loop_that_stops_before_the_writers_next_step_holds_up_nobody(
    store_of_its_own: Store, then: str
) -> None:
    """A loop may stop right after a commit was asked for from it, before the
    writer's next step, which that commit scheduled on it, has run. That
    loop holds the writer's turn; closed, or kept and not run again, it must
    not hold up commits from other loops, nor closing the store: the writer
    thread takes the turn, and the commit left behind lands first. A loop
    kept and run again finds its step taken and commits as before."""
    store = store_of_its_own
    task = asyncio.run(claimed(store))
    fence = {task.id: 1}
    asyncio.run(store.commit(Commit(entries=[progress(task.id, "0")], fence=fence)))
    loop = asyncio.new_event_loop()

    def ask_then_stop() -> None:
        store.commit_soon(Commit(entries=[progress(task.id, "1")], fence=fence))
        loop.stop()  # the writer's next step, scheduled just now, never runs in this run

    loop.call_soon(ask_then_stop)
    loop.run_forever()
    if then == "closed":
        loop.close()

    async def from_another_loop() -> list[str]:
        commit = Commit(entries=[progress(task.id, "2")], fence=fence)
        await asyncio.wait_for(store.commit(commit), 30)
        return await texts_of(store, task.id)

    assert asyncio.run(from_another_loop()) == ["0", "1", "2"]
    if then == "kept":
        try:
            commit = Commit(entries=[progress(task.id, "3")], fence=fence)
            loop.run_until_complete(asyncio.wait_for(store.commit(commit), 30))
        finally:
            loop.close()
        assert asyncio.run(texts_of(store, task.id)) == ["0", "1", "2", "3"]


class _HeldLoop(asyncio.SelectorEventLoop):
    """An event loop whose next `create_future`, once armed, waits for `release`.
    Both writers make a commit's future after the store's check that it is
    open and before queueing the commit: armed just before a commit, it holds
    the commit between the two."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.reached = threading.Event()
        self.release = threading.Event()

    def create_future(self) -> asyncio.Future[Any]:
        if self.armed:
            self.armed = False
            self.reached.set()
            self.release.wait(30)
        return super().create_future()


def test_a_commit_from_another_loop_that_meets_the_close_is_refused_not_lost(
    store_of_its_own: Store,
) -> None:
    """A commit asked for from another thread's loop while the store closes
    lands before the close finishes or is refused. Here it is held on its way
    to the writer's queue while `close()` starts and ends: past the store's
    check that it is open on PostgreSQL (and on SQLite before this was
    decided under the queue's lock). It must be refused with StoreError, not
    queued for a writer that is gone, which would leave it waiting for ever."""
    store = store_of_its_own
    task = asyncio.run(claimed(store))
    loop = _HeldLoop()
    outcome: list[object] = []

    def commit_from_the_loop() -> None:
        async def commit() -> None:
            loop.armed = True
            await store.commit(Commit(entries=[progress(task.id, "late")], fence={task.id: 1}))

        try:
            loop.run_until_complete(asyncio.wait_for(commit(), 30))
            outcome.append("landed")
        except BaseException as exc:
            outcome.append(exc)
        finally:
            loop.close()

    other = threading.Thread(target=commit_from_the_loop, daemon=True)
    other.start()
    assert loop.reached.wait(30), "the commit never reached the writer"
    asyncio.run(asyncio.wait_for(store.close(), 30))
    loop.release.set()
    other.join(60)
    assert len(outcome) == 1 and isinstance(outcome[0], StoreError), outcome
    assert "closed" in str(outcome[0])


@contextlib.contextmanager
def _writes_held(store: Store, task_id: str) -> Iterator[Callable[[], None]]:
    """Another connection holds what a commit of the task writes (SQLite's
    write lock, PostgreSQL's task row) until the `release` it yields is
    called, or the block ends."""
    if isinstance(store, PostgresStore):
        with psycopg.connect(require_postgres(), autocommit=True) as pg:
            _lock_row(pg, store, task_id)

            def release_row() -> None:
                pg.execute("ROLLBACK")  # a second one only warns: no transaction

            yield release_row
            release_row()
        return
    assert isinstance(store, SQLiteStore)
    with contextlib.closing(sqlite3.connect(store.path, isolation_level=None)) as db:
        db.execute("BEGIN IMMEDIATE")

        def release_lock() -> None:
            if db.in_transaction:
                db.execute("ROLLBACK")

        yield release_lock
        release_lock()


def _reopened(store: Store) -> Store:
    again: Store
    if isinstance(store, PostgresStore):
        again = PostgresStore(require_postgres(), schema=store.namespace)
    else:
        assert isinstance(store, SQLiteStore)
        again = SQLiteStore(store.path)
    asyncio.run(again.open())
    return again


def test_commits_asked_for_once_the_close_started_are_refused_and_earlier_ones_land(
    store_of_its_own: Store,
) -> None:
    """`close()` lands the commits asked for before it, and refuses those asked
    for once it started, on every store: a stream of commits cannot keep a
    store from closing. Here the earlier commit is held by another
    connection, so the close is still waiting for it when the later one
    is asked for."""
    store = store_of_its_own
    task = asyncio.run(claimed(store))
    fence = {task.id: 1}

    async def close_between(release: Callable[[], None]) -> None:
        before = store.commit_soon(Commit(entries=[progress(task.id, "before")], fence=fence))
        closing = asyncio.ensure_future(store.close())
        await asyncio.sleep(0)  # the close's first step ran: it has started
        with pytest.raises(StoreError, match="closed"):
            await store.commit(Commit(entries=[progress(task.id, "after")], fence=fence))
        assert not closing.done()  # it waits for the earlier commit
        release()
        await asyncio.wait_for(before, 30)
        await asyncio.wait_for(closing, 30)

    with _writes_held(store, task.id) as release:
        asyncio.run(close_between(release))
    again = _reopened(store)
    try:
        assert asyncio.run(texts_of(again, task.id)) == ["before"]
    finally:
        asyncio.run(again.close())


def _lock_row(blocker: psycopg.Connection[Any], store: PostgresStore, task_id: str) -> None:
    """Hold the task's row on the server until `blocker` rolls back: a commit
    that writes it is sent and not answered until then."""
    blocker.execute("BEGIN")
    blocker.execute(
        psycopg.sql.SQL("SELECT 1 FROM {}.tasks WHERE id = %s FOR UPDATE").format(
            psycopg.sql.Identifier(store.namespace)
        ),
        (task_id,),
    )


@pytest.mark.postgres
def test_postgres_a_commit_behind_the_flight_of_a_loop_that_closes_later_lands(
    pg_store_of_its_own: tuple[str, PostgresStore],
) -> None:
    """A loop stops with a batch in flight (sent from it, the answer unread)
    while another thread's loop commits: that commit waits for the flight.
    The first loop is closed only later, when nothing else happens on the
    store: the waiting commit must still notice and land (the writer thread
    reads the flight's answer), and so must the flight's own."""
    url, store = pg_store_of_its_own
    a = asyncio.run(claimed(store, "w1"))
    b = asyncio.run(claimed(store, "w2"))
    outcome: list[object] = []

    def commit_b() -> None:
        async def go() -> None:
            commit = Commit(entries=[progress(b.id, "b")], fence={b.id: 1})
            await asyncio.wait_for(store.commit(commit), 30)

        try:
            asyncio.run(go())
            outcome.append("landed")
        except BaseException as exc:
            outcome.append(exc)

    loop = asyncio.new_event_loop()
    other = threading.Thread(target=commit_b, daemon=True)
    with psycopg.connect(url, autocommit=True) as blocker:
        _lock_row(blocker, store, a.id)

        async def send() -> None:
            flights = store._writer.flights
            store.commit_soon(Commit(entries=[progress(a.id, "a")], fence={a.id: 1}))
            while store._writer.flights == flights:  # until sent from this loop
                await asyncio.sleep(0)

        loop.run_until_complete(send())  # stopped, the answer unread
        other.start()
        deadline = time.monotonic() + 30
        while not store._writer._pending and time.monotonic() < deadline:
            time.sleep(0.001)  # until b's commit waits behind the flight
        assert store._writer._pending, "the other loop's commit never queued"
        blocker.execute("ROLLBACK")
    loop.close()
    other.join(60)
    assert outcome == ["landed"]
    assert asyncio.run(texts_of(store, a.id)) == ["a"]


@pytest.mark.postgres
def test_postgres_a_read_that_reaches_the_pool_after_the_close_is_told_the_store_closed(
    pg_store_of_its_own: tuple[str, PostgresStore],
) -> None:
    """A read from another thread passed the store's check that it is open, and
    reaches the connection pool after `close()` closed it (what `_read` runs
    on a thread, called here at that moment). It is answered StoreError
    "closed", not StoreUnavailable, which says "try again later"."""
    _, store = pg_store_of_its_own
    asyncio.run(store.create_task(Task(agent="a")))
    asyncio.run(store.close())
    with pytest.raises(StoreError, match="closed") as caught:
        store._execute(lambda conn: conn.execute("SELECT 1").fetchone(), False)
    assert not isinstance(caught.value, StoreUnavailable)


@pytest.mark.postgres
def test_postgres_a_close_cancelled_while_a_commit_is_held_is_finished_by_the_next(
    pg_store_of_its_own: tuple[str, PostgresStore],
) -> None:
    """`close()` waits for the commits already asked for. Cancelled meanwhile (a
    timeout around it), it has not let go of anything yet; the next `close()`
    must finish the job, not return at once leaving the pool's connections
    and the writer's thread behind."""
    url, store = pg_store_of_its_own
    task = asyncio.run(claimed(store))

    async def go() -> None:
        flights = store._writer.flights
        pending = store.commit_soon(Commit(entries=[progress(task.id, "1")], fence={task.id: 1}))
        while store._writer.flights == flights:  # sent, and held on the server
            await asyncio.sleep(0)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(store.close(), 0.2)
        blocker.execute("ROLLBACK")
        await asyncio.wait_for(store.close(), 30)
        await pending  # it landed before the close finished

    with psycopg.connect(url, autocommit=True) as blocker:
        _lock_row(blocker, store, task.id)
        asyncio.run(go())
    assert store._pool.closed
    assert store._writer._executor._shutdown


# --- where a SQLite FULL batch runs --------------------------------------------


async def test_a_full_sqlite_batch_runs_on_the_loop_only_for_a_task_committing_alone(
    tmp_path: Path,
) -> None:
    """One task committing alone has nobody to overlap its fsync with: its batches
    run on the event loop. Once several tasks commit to the store, a batch goes to
    the writer thread (the GIL released during its fsync, so they run meanwhile),
    and stays there until the store has again had one committer for a while."""
    store = SQLiteStore(str(tmp_path / "s.db"), durability="full")
    async with store:
        a, b = await claimed(store, "w1"), await claimed(store, "w2")
        ran_on: list[str] = []
        writer = store._writer
        real = writer._run_batch

        def spy(batch: Any) -> Any:
            here = threading.current_thread() is threading.main_thread()
            ran_on.append("loop" if here else "thread")
            return real(batch)

        writer._run_batch = spy  # type: ignore[method-assign]

        async def commits(task: Task, n: int) -> None:
            for i in range(n):
                await store.commit(Commit(entries=[progress(task.id, str(i))], fence={task.id: 1}))

        await commits(a, 3)
        assert ran_on == ["loop"] * 3
        ran_on.clear()
        await asyncio.gather(commits(a, 3), commits(b, 3))
        assert "thread" in ran_on
        assert await texts_of(store, a.id) == ["0", "1", "2"] * 2
        ran_on.clear()
        await commits(a, 20)  # the two committers are still among the last batches'
        assert ran_on[0] == "thread" and ran_on[-1] == "loop"
