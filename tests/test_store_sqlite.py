"""What only the SQLite file store does: schema versions, bad files, durability settings."""

from __future__ import annotations

import asyncio
import json
import random
import sqlite3
import subprocess
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

from duragent.errors import StoreCorrupt, StoreError, StoreVersionError
from duragent.store import Commit, Store, TaskPatch, TaskQuery, open_store
from duragent.store._commits import CopyEntries
from duragent.store._sqlite import SQLiteStore
from duragent.store._sqlite_schema import MIGRATIONS, SCHEMA_VERSION, WAL_READY_FRAMES
from duragent.store._sqlite_tx import TaskNumbers
from duragent.types import EntryKind, NewEntry, Task, TaskStatus


async def test_newer_schema_version_is_refused_naming_both_versions(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = open_store(f"sqlite:///{path}")
    await store.open()
    await store.close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    conn.commit()
    conn.close()
    with pytest.raises(StoreVersionError) as info:
        await open_store(f"sqlite:///{path}").open()
    assert "99" in str(info.value) and str(SCHEMA_VERSION) in str(info.value)
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT value FROM meta").fetchone()[0] == "99"  # untouched


async def test_older_store_is_migrated_on_open(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    sqlite3.connect(path).close()  # version 0: an empty file
    store = open_store(f"sqlite:///{path}")
    await store.open()
    assert isinstance(store, SQLiteStore) and store.migrated_from == 0
    await store.create_task(Task(agent="a"))
    await store.close()
    again = open_store(f"sqlite:///{path}")
    await again.open()
    assert isinstance(again, SQLiteStore) and again.migrated_from == SCHEMA_VERSION
    await again.close()


def test_a_file_that_is_not_a_database_gives_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreCorrupt, match="not a readable duragent SQLite store"):
        asyncio.run(open_store(f"sqlite:///{path}").open())
    assert path.read_bytes() == b"this is not sqlite" * 100


@pytest.mark.parametrize(("url_suffix", "expected"), [("", 1), ("?durability=full", 2)])
async def test_durability_sets_synchronous(tmp_path: Path, url_suffix: str, expected: int) -> None:
    store = open_store(f"sqlite:///{tmp_path}/d.db{url_suffix}")
    await store.open()
    assert isinstance(store, SQLiteStore)
    assert store._writer_conn.execute("PRAGMA synchronous").fetchone()[0] == expected
    assert store._writer_conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    await store.close()


async def test_a_full_store_writes_over_its_wal_instead_of_growing_it(tmp_path: Path) -> None:
    """At FULL every commit syncs the WAL, and while the WAL grows each sync
    also journals the file's new size. The first write transaction gives the
    WAL its whole length at once (WAL_READY_FRAMES), and, checkpointed every
    FULL_WAL_PAGES pages, the WAL restarts from its start: hundreds of commits
    of two or three pages each, more than the WAL holds, leave its size as the
    first commit made it."""
    path = tmp_path / "f.db"
    store = open_store(f"sqlite:///{path}?durability=full")
    await store.open()
    assert isinstance(store, SQLiteStore)
    task = Task(agent="a")
    await store.create_task(task)
    wal = Path(f"{path}-wal")
    page = store._writer_conn.execute("PRAGMA page_size").fetchone()[0]
    ready = 32 + WAL_READY_FRAMES * (page + 24)
    assert wal.stat().st_size == ready
    sizes = set()
    for _ in range(600):
        payload = {"n": random.randbytes(2500).hex()}  # more than a page: no compressing it
        entry = NewEntry(task_id=task.id, kind=EntryKind.CHECKPOINT, payload=payload)
        await store.commit(Commit(entries=[entry]))
        sizes.add(wal.stat().st_size)
    pages = store._writer_conn.execute("PRAGMA page_count").fetchone()[0]
    await store.close()
    assert pages > 2 * WAL_READY_FRAMES  # the commits wrote more than the WAL holds
    assert sizes == {ready}


async def test_a_wal_holding_a_killed_process_commits_is_readied_without_losing_them(
    tmp_path: Path,
) -> None:
    """A process at NORMAL dies with its commits in the WAL, not yet copied
    into the database. A store opened at FULL extends that WAL with its first
    commit: past the killed process's commits, which are all still there after
    the store closes (checkpointing them) and opens again."""
    path = tmp_path / "k.db"
    child = subprocess.Popen(
        [sys.executable, "-c", _COMMIT_THEN_WAIT, f"sqlite:///{path}", "20"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        task_id = child.stdout.readline().strip()  # after its 20 commits
        assert task_id, "the child printed no task id"
    finally:
        child.kill()  # SIGKILL: no checkpoint, the WAL stays
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
    wal = Path(f"{path}-wal")
    holds = wal.stat().st_size
    assert holds > 32  # the killed process's commits are in the WAL only

    store = open_store(f"sqlite:///{path}?durability=full")
    await store.open()
    assert isinstance(store, SQLiteStore)
    entry = NewEntry(task_id=task_id, kind=EntryKind.CHECKPOINT, payload={"n": "after"})
    await store.commit(Commit(entries=[entry]))
    page = store._writer_conn.execute("PRAGMA page_size").fetchone()[0]
    assert wal.stat().st_size == 32 + WAL_READY_FRAMES * (page + 24) > holds  # readied
    assert len(await store.entries(task_id)) == 21
    await store.close()

    again = open_store(f"sqlite:///{path}")
    await again.open()
    payloads = [e.payload["n"] for e in await again.entries(task_id)]
    await again.close()
    assert payloads == [*range(20), "after"]


async def test_the_wal_readied_is_the_stores_own_after_the_process_changes_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store opened by a relative path, in a process that then changes
    directory: its first commit readies its own WAL, never a file of the same
    name in the new directory (another database's log, which the store's
    write lock does not guard)."""
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir()
    elsewhere.mkdir()
    bystander = elsewhere / "s.db-wal"
    bystander.write_bytes(b"another database's log")
    monkeypatch.chdir(home)
    store = open_store("sqlite:///s.db?durability=full")
    await store.open()
    assert isinstance(store, SQLiteStore)
    monkeypatch.chdir(elsewhere)
    await store.create_task(Task(agent="a"))
    page = store._writer_conn.execute("PRAGMA page_size").fetchone()[0]
    readied = (home / "s.db-wal").stat().st_size
    await store.close()
    assert bystander.read_bytes() == b"another database's log"
    assert readied == 32 + WAL_READY_FRAMES * (page + 24)


# Commits argv[2] entries to a new task of the store at argv[1], prints the
# task's id, then waits to be killed.
_COMMIT_THEN_WAIT = """
import asyncio, sys
from duragent.store import Commit, open_store
from duragent.types import EntryKind, NewEntry, Task

async def main():
    store = open_store(sys.argv[1])
    await store.open()
    task, _ = await store.create_task(Task(agent="a"))
    for n in range(int(sys.argv[2])):
        entry = NewEntry(task_id=task.id, kind=EntryKind.CHECKPOINT, payload={"n": n})
        await store.commit(Commit(entries=[entry]))
    print(task.id, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def test_unknown_durability_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="durability"):
        open_store(f"sqlite:///{tmp_path}/d.db?durability=sometimes")


def test_unknown_scheme_names_the_choices() -> None:
    with pytest.raises(ValueError, match="sqlite:///"):
        open_store("mongodb://x")


async def test_a_version_1_store_with_data_is_migrated_losing_nothing(tmp_path: Path) -> None:
    """Build a real version-1 file (its DDL, its text kinds), fill it, open it with this code."""
    path = tmp_path / "v1.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    for ddl in MIGRATIONS[1]:
        assert isinstance(ddl, str)
        conn.execute(ddl)
    conn.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    conn.commit()
    conn.close()
    # Fill it through SQL the version-1 schema accepts (text task ids and kinds).
    tasks = [Task(agent="a", owner="o", request_id=f"r{i}", input=f"in {i}") for i in range(3)]
    conn = sqlite3.connect(path)
    for i, t in enumerate(tasks):
        conn.execute(
            "INSERT INTO tasks (id, owner, request_id, agent, status, created_at, updated_at,"
            " last_seq, data, input) VALUES (?, ?, ?, ?, 'pending', ?, ?, 2, ?, ?)",
            (
                t.id,
                t.owner,
                t.request_id,
                t.agent,
                1000.0 + i,
                1000.0 + i,
                t.model_copy(update={"last_seq": 2}).model_dump_json(exclude={"input"}),
                f'"in {i}"',
            ),
        )
        conn.execute(
            "INSERT INTO entries VALUES (?, 1, 'api_message', 1, ?, 1000.0)",
            (t.id, json.dumps({"role": "user", "content": f"hello {i}"})),
        )
        conn.execute(
            "INSERT INTO entries VALUES (?, 2, 'ui_message', 1, ?, 1000.5)",
            (t.id, json.dumps({"type": "notice", "message": f"n{i}"})),
        )
    conn.commit()
    conn.close()

    store = open_store(f"sqlite:///{path}")
    await store.open()
    assert isinstance(store, SQLiteStore) and store.migrated_from == 1
    for i, t in enumerate(tasks):
        loaded = await store.get_task(t.id)
        assert loaded.input == f"in {i}" and loaded.last_seq == 2
        entries = await store.entries(t.id)
        assert [(e.seq, e.kind.value) for e in entries] == [(1, "api_message"), (2, "ui_message")]
        assert [m.content for m in await store.model_view(t.id)] == [f"hello {i}"]
    again, created = await store.create_task(Task(agent="a", owner="o", request_id="r1"))
    assert not created and again.id == tasks[1].id  # the request-id index survived
    fresh, _ = await store.create_task(Task(agent="a"))
    await store.commit(
        Commit(
            entries=[
                NewEntry(
                    task_id=fresh.id,
                    kind=EntryKind.UI_MESSAGE,
                    payload={"type": "notice", "message": "x"},
                )
            ]
        )
    )
    assert len(await store.entries(fresh.id)) == 1
    await store.close()


async def _claim_steps(store: SQLiteStore) -> tuple[int, int]:
    """SQLite VM steps (in thousands) of one claim and of one next_wake_at."""
    steps = [0]

    def count() -> int:
        steps[0] += 1
        return 0

    for conn in (store._writer_conn, store._reader_conn):
        conn.set_progress_handler(count, 1000)
    try:
        assert await store.claim_task("w", ttl=3600) is not None
        claim, steps[0] = steps[0], 0
        assert await store.next_wake_at() is not None
        return claim, steps[0]
    finally:
        for conn in (store._writer_conn, store._reader_conn):
            conn.set_progress_handler(None, 0)


@pytest.mark.parametrize("running", [20, pytest.param(2000, marks=pytest.mark.slow)])
async def test_claims_and_wake_ups_do_not_read_every_running_task(
    tmp_path: Path, running: int
) -> None:
    """The expired-lease part of a claim and of next_wake_at reads the lease index:
    with 2,000 tasks running, as few SQLite steps as with 20 (counted, not timed)."""
    store = open_store(f"sqlite:///{tmp_path}/c.db")
    await store.open()
    assert isinstance(store, SQLiteStore)
    await store.commit(Commit(new_tasks=[Task(agent="a") for _ in range(running + 50)]))
    for _ in range(running):
        assert await store.claim_task("w", ttl=3600) is not None
    claim, wake = await _claim_steps(store)
    await store.close()
    # A read of every running row costs about 10 steps of 1,000 per 1,000 rows: 20+ here.
    assert claim <= 3 and wake <= 3, (running, claim, wake)


def _wal_frames(conn: sqlite3.Connection, wal: Path, since: int) -> list[str]:
    """The b-tree of each page the WAL holds after byte `since` (past its 32-byte
    header; frames: a 24-byte header, first field the page number, then the page)."""
    page = conn.execute("PRAGMA page_size").fetchone()[0]
    owners = dict(conn.execute("SELECT pageno, name FROM dbstat").fetchall())
    data = wal.read_bytes()[max(since, 32) :]
    return [
        owners.get(int.from_bytes(data[at : at + 4], "big"), "header or free-list")
        for at in range(0, len(data) - 24, 24 + page)
    ]


def _pages_written(conn: sqlite3.Connection, wal: Path, since: int) -> set[str]:
    """The b-trees whose pages the WAL holds after byte `since`."""
    return set(_wal_frames(conn, wal, since))


async def test_a_commit_that_keeps_a_tasks_status_and_lease_writes_no_index_page(
    tmp_path: Path,
) -> None:
    """SQLite rewrites an index entry whenever its column is SET, even to the value
    it had: a round's commit (same status, same lease) must leave the status,
    queue and lease indexes alone; one that changes the status must update them."""
    path = tmp_path / "i.db"
    store = open_store(f"sqlite:///{path}")
    await store.open()
    assert isinstance(store, SQLiteStore)
    await store.create_task(Task(agent="a"))
    task = await store.claim_task("w", ttl=3600)
    assert task is not None
    conn = store._writer_conn
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    wal = Path(f"{path}-wal")
    indexes = {"tasks_runnable", "tasks_queue", "tasks_leases", "tasks_due", "tasks_ready"}

    entry = NewEntry(task_id=task.id, kind=EntryKind.CHECKPOINT, payload={"round": 1})
    patch = TaskPatch(task.id, {"iterations": 1})
    fence = {task.id: task.lease.epoch}
    await store.commit(Commit(entries=[entry], patches=[patch], fence=fence))
    written = _pages_written(conn, wal, 32)
    assert "tasks" in written and "entries" in written
    assert not written & indexes, written

    since = wal.stat().st_size
    done = TaskPatch(task.id, {"status": TaskStatus.COMPLETED})
    await store.commit(Commit(patches=[done], fence=fence))
    assert {"tasks_runnable", "tasks_queue", "tasks_leases"} <= _pages_written(conn, wal, since)
    # The index and the row agree: a query served by the status index finds it.
    page = await store.list_tasks(TaskQuery(status=TaskStatus.COMPLETED))
    assert [t.id for t in page.tasks] == [task.id]
    assert not (await store.list_tasks(TaskQuery(status=TaskStatus.RUNNING))).tasks
    await store.close()


async def test_opening_an_up_to_date_store_never_waits_for_another_writer(
    tmp_path: Path,
) -> None:
    """Opening reads the schema version and takes no write lock: a store opens at
    once while another process is in the middle of a write transaction."""
    path = tmp_path / "o.db"
    async with SQLiteStore(str(path)):
        pass  # made, migrated and closed
    holder = sqlite3.connect(path, isolation_level=None)
    opened: list[SQLiteStore] = []
    try:
        holder.execute("BEGIN IMMEDIATE")
        holder.execute("INSERT INTO meta(key, value) VALUES ('held', 'by another process')")

        # Waiting for the lock would take the busy timeout (30 s): a thread, so
        # the test can tell and release it.
        def opener_runs() -> None:
            store = SQLiteStore(str(path))
            asyncio.run(store.open())
            opened.append(store)

        opener = threading.Thread(target=opener_runs)
        opener.start()
        opener.join(10)
        assert opened, "opening waited for another connection's write transaction"
        assert opened[0].migrated_from == SCHEMA_VERSION
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    for store in opened:
        await store.close()


async def test_a_new_store_file_gives_freed_pages_back_incrementally(tmp_path: Path) -> None:
    path = tmp_path / "n.db"
    async with SQLiteStore(str(path)):
        pass  # made, migrated and closed
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # INCREMENTAL
    conn.close()


async def test_a_new_store_files_meta_table_has_no_index_of_its_own(tmp_path: Path) -> None:
    path = tmp_path / "n.db"
    async with SQLiteStore(str(path)):
        pass  # made, migrated and closed
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT name FROM sqlite_master WHERE tbl_name='meta'").fetchall() == [
        ("meta",)
    ]
    conn.close()


def _downgrade_to_version_9(path: Path) -> None:
    """Take a store back to version 9: label rows without their task's time."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    for ddl in [
        """CREATE TABLE task_labels_v9 (
            key TEXT NOT NULL, value TEXT NOT NULL, task_num INTEGER NOT NULL,
            PRIMARY KEY (key, value, task_num)
        ) WITHOUT ROWID""",
        "INSERT INTO task_labels_v9 SELECT key, value, task_num FROM task_labels",
        "DROP TABLE task_labels",
        "ALTER TABLE task_labels_v9 RENAME TO task_labels",
        "CREATE INDEX task_labels_task ON task_labels(task_num)",
        "UPDATE meta SET value='9' WHERE key='schema_version'",
    ]:
        conn.execute(ddl)
    conn.execute("COMMIT")
    conn.close()


def _downgrade_to_version_8(path: Path) -> None:
    """Take a store back to version 8: no kept counts, no listing indexes."""
    _downgrade_to_version_9(path)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    for ddl in [
        *[f"DROP TRIGGER tasks_counted_{t}" for t in ("in", "out", "moves")],
        "DROP TABLE task_counts",
        *[f"DROP INDEX tasks_{i}" for i in ("created", "agent", "owner_status", "queue")],
        "CREATE INDEX tasks_queue ON tasks(queue, status)",
        "UPDATE meta SET value='8' WHERE key='schema_version'",
    ]:
        conn.execute(ddl)
    conn.execute("COMMIT")
    conn.close()


def _downgrade_to_version_7(path: Path) -> None:
    """Make a store as version 7 kept it: tasks with no agent version column (and
    none of version 9's counts and indexes)."""
    _downgrade_to_version_8(path)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("ALTER TABLE tasks DROP COLUMN agent_version")
    conn.execute("UPDATE meta SET value='7' WHERE key='schema_version'")
    conn.close()


async def test_a_version_7_store_migrates_its_tasks_to_any_agent_version(tmp_path: Path) -> None:
    """Version 8 adds the tasks' agent version: an old task has none, so a worker
    of any version of its agent claims it; a new one is pinned to its version."""
    path = tmp_path / "v7.db"
    store = open_store(f"sqlite:///{path}")
    await store.open()
    old, _ = await store.create_task(Task(agent="a"))
    await store.close()
    _downgrade_to_version_7(path)
    again = open_store(f"sqlite:///{path}")
    await again.open()
    try:
        assert again.migrated_from == 7 and again.schema_version == SCHEMA_VERSION
        new, _ = await again.create_task(Task(agent="a", agent_version="v2"))
        assert await again.claim_task("w", agents=["a"], versions={"a": "v3"}) is not None
        assert await again.claim_task("w", agents=["a"], versions={"a": "v3"}) is None
        claimed = await again.claim_task("w", agents=["a"], versions={"a": "v2"})
        assert claimed is not None and claimed.id == new.id
        assert (await again.get_task(old.id)).agent_version is None
    finally:
        await again.close()


def _downgrade_entries_to_version_6(path: Path) -> None:
    """Rewrite a store's entries table as version 6 kept it: times a REAL of seconds."""
    _downgrade_to_version_7(path)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    for ddl in [
        "DROP VIEW entry_rows",
        "DROP INDEX entries_src",
        "ALTER TABLE entries RENAME TO entries_v7",
        *[s for s in MIGRATIONS[6] if isinstance(s, str) and s.startswith("CREATE TABLE")],
        "INSERT INTO entries_v6 SELECT eid, kind, round, payload, created_ms / 1000.0, src"
        " FROM entries_v7",
        "DROP TABLE entries_v7",
        "ALTER TABLE entries_v6 RENAME TO entries",
        *[
            s
            for s in MIGRATIONS[6]
            if isinstance(s, str) and s.startswith("CREATE ") and "_v6" not in s
        ],
        "UPDATE meta SET value='6' WHERE key='schema_version'",
    ]:
        conn.execute(ddl)
    conn.execute("COMMIT")
    conn.close()


def _downgrade_entries_to_version_5(path: Path) -> None:
    """Rewrite a store's entries table as version 5 kept it: keyed by (task_num,
    seq) WITHOUT ROWID, a fork's reference in two columns."""
    _downgrade_entries_to_version_6(path)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    for ddl in [
        "DROP VIEW entry_rows",
        "DROP INDEX entries_src",
        """CREATE TABLE entries_v5 (
            task_num INTEGER NOT NULL, seq INTEGER NOT NULL, kind INTEGER NOT NULL,
            round INTEGER NOT NULL, payload TEXT NOT NULL, created_at REAL NOT NULL,
            src_num INTEGER, src_seq INTEGER, PRIMARY KEY (task_num, seq)
        ) WITHOUT ROWID""",
        "INSERT INTO entries_v5 SELECT eid >> 32, eid & 4294967295, kind, round, payload,"
        " created_at, src >> 32, src & 4294967295 FROM entries",
        "DROP TABLE entries",
        "ALTER TABLE entries_v5 RENAME TO entries",
        *[s for s in MIGRATIONS[5] if isinstance(s, str) and s.startswith("CREATE")],
        "UPDATE meta SET value='5' WHERE key='schema_version'",
    ]:
        conn.execute(ddl)
    conn.execute("COMMIT")
    conn.close()


async def test_a_version_5_store_keeps_every_entry_and_fork_reference_through_version_6(
    tmp_path: Path,
) -> None:
    """Version 6 keys entries by one integer: the migration keeps every entry of
    every task in order, a fork's entries still read their source's payloads
    (and get them back when the source is purged), and new entries follow."""
    path = tmp_path / "v5.db"
    store = open_store(f"sqlite:///{path}")
    await store.open()
    assert isinstance(store, SQLiteStore)
    tasks = [Task(agent="a") for _ in range(3)]
    for n, task in enumerate(tasks):
        entries = [
            NewEntry(task_id=task.id, kind=EntryKind.API_MESSAGE, round=r, payload=payload)
            for r, payload in enumerate(
                [{"role": "user", "content": f"q{n}"}, {"role": "assistant", "content": f"a{n}"}],
                start=1,
            )
        ]
        await store.create_task(task, entries)
    fork = Task(agent="a")
    copy = CopyEntries(tasks[1].id, 1, 2, (EntryKind.API_MESSAGE,), max_round=9, count=2)
    await store.create_fork(fork, [copy])
    before = {t.id: await store.entries(t.id) for t in [*tasks, fork]}
    views = {t.id: await store.model_view_data(t.id) for t in [*tasks, fork]}
    await store.close()

    _downgrade_entries_to_version_5(path)
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT count(*) FROM entries WHERE src_num IS NOT NULL").fetchone()[0] == 2
    conn.close()

    again = open_store(f"sqlite:///{path}")
    await again.open()
    assert isinstance(again, SQLiteStore) and again.migrated_from == 5
    assert {t: await again.entries(t) for t in before} == before
    assert {t: await again.model_view_data(t) for t in views} == views
    assert views[fork.id] == views[tasks[1].id]
    # The next entry of a task follows its last, and reads back in order.
    more = NewEntry(task_id=tasks[0].id, kind=EntryKind.CHECKPOINT, payload={"type": "more"})
    await again.commit(Commit(entries=[more]))
    assert [e.seq for e in await again.entries(tasks[0].id)] == [1, 2, 3]
    assert [e.seq for e in await again.entries(tasks[0].id, after_seq=2)] == [3]
    # Purging the source gives the fork its payloads back.
    await again.delete_task(tasks[1].id)
    assert await again.model_view_data(fork.id) == views[fork.id]
    await again.close()


async def test_a_version_6_store_keeps_every_entry_through_version_7_to_the_millisecond(
    tmp_path: Path,
) -> None:
    """Version 7 keeps an entry's time in whole milliseconds: the migration keeps
    every entry and fork reference, and rounds a version-6 time (a REAL of
    seconds) down to its millisecond, as a new entry's is."""
    path = tmp_path / "v6.db"
    store = open_store(f"sqlite:///{path}")
    await store.open()
    assert isinstance(store, SQLiteStore)
    task, fork = Task(agent="a"), Task(agent="a")
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    await store.create_task(
        task,
        [NewEntry(task_id=task.id, kind=EntryKind.API_MESSAGE, payload=m) for m in messages],
    )
    copy = CopyEntries(task.id, 1, 2, (EntryKind.API_MESSAGE,), max_round=9, count=2)
    await store.create_fork(fork, [copy])
    before = {t.id: await store.entries(t.id) for t in (task, fork)}
    await store.close()

    _downgrade_entries_to_version_6(path)
    on_a_ms = datetime(2026, 12, 3, 8, 15, 4, 157000, tzinfo=UTC)
    between = datetime(2026, 12, 3, 8, 15, 4, 123999, tzinfo=UTC)
    conn = sqlite3.connect(path)
    assert {r[0] for r in conn.execute("SELECT typeof(created_at) FROM entries")} == {"real"}
    eid = conn.execute("SELECT min(eid) FROM entries").fetchone()[0]
    for n, at in enumerate((on_a_ms, between)):
        conn.execute("UPDATE entries SET created_at=? WHERE eid=?", (at.timestamp(), eid + n))
    conn.commit()
    conn.close()

    again = open_store(f"sqlite:///{path}")
    await again.open()
    assert isinstance(again, SQLiteStore) and again.migrated_from == 6
    after = {t: await again.entries(t) for t in before}
    assert [e.created_at for e in after[task.id]] == [on_a_ms, between.replace(microsecond=123000)]
    assert after[fork.id] == before[fork.id]
    assert [e.model_dump(exclude={"created_at"}) for e in after[task.id]] == [
        e.model_dump(exclude={"created_at"}) for e in before[task.id]
    ]
    conn = sqlite3.connect(path)
    assert {r[0] for r in conn.execute("SELECT typeof(created_ms) FROM entries")} == {"integer"}
    # A process of version 6 still running is refused on its next write (the
    # column it writes seconds to is gone) and writes nothing.
    rows = conn.execute("SELECT count(*) FROM entries").fetchone()
    with pytest.raises(sqlite3.OperationalError, match="no column named created_at"):
        conn.execute(
            "INSERT INTO entries (eid, kind, round, payload, created_at) VALUES (?, ?, ?, ?, ?)",
            (eid + 100, 8, 0, "{}", on_a_ms.timestamp()),
        )
    assert conn.execute("SELECT count(*) FROM entries").fetchone() == rows
    conn.close()
    # A new entry's time is kept to its millisecond: the commit gives it so, and
    # it reads back equal.
    res = await again.commit(
        Commit(entries=[NewEntry(task_id=task.id, kind=EntryKind.CHECKPOINT, payload={})])
    )
    (new,) = await again.entries(task.id, after_seq=2)
    assert new.created_at == res.entries[0].created_at
    assert new.created_at.microsecond % 1000 == 0
    await again.close()


@pytest.mark.slow
async def test_a_long_tasks_entries_are_appended_to_full_pages(tmp_path: Path) -> None:
    """A task's entries go to the end of the entries table: a commit of one
    entry writes one page of it (two when the last is full), and the pages
    that fill stay full. Keyed WITHOUT ROWID, a full last page was rebalanced
    with its two left siblings: four pages written every few commits, and
    pages left a quarter empty."""
    path = tmp_path / "a.db"
    store = open_store(f"sqlite:///{path}")
    await store.open()
    assert isinstance(store, SQLiteStore)
    other = Task(agent="a")  # the task before it in the table
    await store.create_task(
        other, [NewEntry(task_id=other.id, kind=EntryKind.CHECKPOINT, payload={})]
    )
    task = Task(agent="a")
    await store.create_task(task)
    conn = store._writer_conn
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    wal = Path(f"{path}-wal")
    written = 0
    commits = 600
    for n in range(commits):
        since = wal.stat().st_size if wal.exists() else 0
        entry = NewEntry(task_id=task.id, kind=EntryKind.CHECKPOINT, payload={"n": f"{n:090}"})
        await store.commit(Commit(entries=[entry]))
        written += _wal_frames(conn, wal, since).count("entries")
    # Leaves in key order (dbstat's path); the last is still filling.
    unused = [
        r[0]
        for r in conn.execute(
            "SELECT unused FROM dbstat WHERE name='entries' AND pagetype='leaf' ORDER BY path"
        )
    ]
    await store.close()
    assert written <= commits * 1.2, written / commits
    assert len(unused) > 10 and max(unused[:-1]) < 150, unused  # less than one more entry


def test_a_read_from_another_thread_that_meets_the_close_is_told_the_store_closed(
    tmp_path: Path,
) -> None:
    """A read on another thread's event loop passed the store's check that it
    is open, then the store closed its files under it. It is answered
    StoreError "closed", not StoreCorrupt, which would say the file is damaged."""
    store = SQLiteStore(str(tmp_path / "r.db"))
    asyncio.run(store.open())
    asyncio.run(store.create_task(Task(agent="a")))
    inside, closed = threading.Event(), threading.Event()
    outcome: list[object] = []

    def count(conn: sqlite3.Connection) -> int:
        inside.set()
        closed.wait(30)
        return int(conn.execute("SELECT count(*) FROM tasks").fetchone()[0])

    def read_from_another_loop() -> None:
        try:
            outcome.append(asyncio.run(store._read(count)))
        except BaseException as exc:
            outcome.append(exc)

    reader = threading.Thread(target=read_from_another_loop, daemon=True)
    reader.start()
    assert inside.wait(30), "the read never started"
    asyncio.run(store.close())
    closed.set()
    reader.join(30)
    assert len(outcome) == 1 and type(outcome[0]) is StoreError, outcome
    assert "closed" in str(outcome[0])


async def test_a_view_payload_that_is_no_text_is_reported_as_corrupt(tmp_path: Path) -> None:
    """A payload of the model's view changed by hand into a BLOB: the view is
    refused with StoreCorrupt, with or without a rollback marker in the log
    (two ways of reading it), and the entries still read."""
    path = tmp_path / "b.db"
    store = SQLiteStore(str(path))
    await store.open()
    try:
        task, _ = await store.create_task(Task(agent="a"))
        user = {"role": "user", "content": "hi"}
        entry = NewEntry(task_id=task.id, kind=EntryKind.API_MESSAGE, payload=user)
        await store.commit(Commit(entries=[entry, entry]))
        assert await store.model_view_data(task.id) == [user, user]
        with sqlite3.connect(path) as db:
            db.execute(
                "UPDATE entries SET payload = CAST(payload AS BLOB) WHERE eid & 0xffffffff = 2"
            )
        with pytest.raises(StoreCorrupt, match="no text"):
            await store.model_view_data(task.id)
        marker = {"scope": "api", "from_seq": 1, "to_seq": 1, "reason": "test"}
        rollback = NewEntry(task_id=task.id, kind=EntryKind.ROLLBACK, payload=marker)
        await store.commit(Commit(entries=[rollback]))
        with pytest.raises(StoreCorrupt, match="no text"):
            await store.model_view_data(task.id)
        assert len(await store.entries(task.id)) == 3
    finally:
        await store.close()


def progress(task_id: str, text: str) -> NewEntry:
    return NewEntry(task_id=task_id, kind=EntryKind.PROGRESS, payload={"text": text})


async def test_the_map_of_task_numbers_stays_bounded_and_commits_land_on_their_tasks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long-lived worker meets every task it ever ran: the ids it keeps the
    numbers of are bounded, and a task forgotten has its number read again."""
    monkeypatch.setattr(TaskNumbers, "limit", 4)
    store = open_store(f"sqlite:///{tmp_path}/s.db")
    await store.open()
    assert isinstance(store, SQLiteStore)
    try:
        tasks = []
        for _ in range(10):
            await store.create_task(Task(agent="a"))
            claimed = await store.claim_task("w1")
            assert claimed is not None
            tasks.append(claimed)
            assert len(store._nums) <= 4
        for n in range(3):
            for task in tasks:  # one at a time: every task forgotten and met again
                commit = Commit(entries=[progress(task.id, f"{task.id} {n}")], fence={task.id: 1})
                await store.commit(commit)
                assert len(store._nums) <= 4
        await asyncio.gather(  # and in batches
            *(
                store.commit(Commit(entries=[progress(t.id, f"{t.id} 3")], fence={t.id: 1}))
                for t in tasks
            )
        )
        assert len(store._nums) <= 4
        for task in tasks:
            entries = await store.entries(task.id, kinds=[EntryKind.PROGRESS])
            assert [e.payload["text"] for e in entries] == [f"{task.id} {n}" for n in range(4)]
            assert [e.seq for e in entries] == [2, 3, 4, 5]  # after the claim's status entry
    finally:
        await store.close()


async def test_a_search_by_id_prefix_reads_the_id_index_not_every_task(tmp_path: Path) -> None:
    """GET /v1/tasks?id_prefix= on a user with 5,000 tasks: the prefix is a range
    of the id index, as few SQLite steps as a list of one (counted, not timed)."""
    store = open_store(f"sqlite:///{tmp_path}/p.db")
    await store.open()
    assert isinstance(store, SQLiteStore)
    made = [Task(agent="a", owner="alice") for _ in range(5000)]
    await store.commit(Commit(new_tasks=made))
    steps = [0]

    def count() -> int:
        steps[0] += 1
        return 0

    store._reader_conn.set_progress_handler(count, 1000)
    try:
        for prefix, found in ((made[1234].id, [made[1234].id]), (made[0].id + "x", [])):
            steps[0] = 0
            page = await store.list_tasks(TaskQuery(owner="alice", id_prefix=prefix))
            assert [t.id for t in page.tasks] == found
            # Every task of alice read and compared: about 30 steps of 1,000 here.
            assert steps[0] <= 2, (prefix, steps[0])
    finally:
        store._reader_conn.set_progress_handler(None, 0)
        await store.close()


async def _some_tasks(store: Store) -> None:
    """Tasks of several owners, agents, queues and statuses (no owner and the
    empty owner among them)."""
    for n, owner in enumerate([None, "", "alice", "alice", "bob"]):
        task, _ = await store.create_task(
            Task(agent="ab"[n % 2], owner=owner, queue=None if n % 2 else "q")
        )
        if n % 3 == 0:
            await store.commit(Commit(patches=[TaskPatch(task.id, {"status": TaskStatus.PAUSED})]))


async def test_a_version_8_store_with_tasks_gets_its_counts_built_by_version_9(
    tmp_path: Path,
) -> None:
    """Version 9 keeps counts per owner, agent, queue and status: the migration
    counts the tasks already there, and writes after it keep them."""
    path = tmp_path / "v8.db"
    store = open_store(f"sqlite:///{path}")
    await store.open()
    await _some_tasks(store)
    queries = [TaskQuery(), TaskQuery(owner=""), TaskQuery(no_owner=True), TaskQuery(agent="b")]
    want = [await store.count_tasks(q) for q in queries]
    await store.close()
    _downgrade_to_version_8(path)

    again = open_store(f"sqlite:///{path}")
    await again.open()
    assert isinstance(again, SQLiteStore) and again.migrated_from == 8
    assert [await again.count_tasks(q) for q in queries] == want
    conn = sqlite3.connect(path)
    kept = conn.execute("SELECT okey, agent, queue, status, n FROM task_counts").fetchall()
    recount = conn.execute(
        "SELECT CASE WHEN owner IS NULL THEN '' ELSE '.' || owner END, agent, queue, status,"
        " count(*) FROM tasks GROUP BY 1, 2, 3, 4"
    ).fetchall()
    conn.close()
    assert sorted(kept) == sorted(recount) and len(kept) >= 5
    pending = await again.list_tasks(TaskQuery(status=TaskStatus.PENDING, owner="alice"))
    await again.delete_task(pending.tasks[0].id)
    assert await again.count_tasks(TaskQuery(owner="alice")) == {("b", "paused"): 1}
    await again.close()


async def test_a_version_9_store_pages_its_labelled_tasks_in_list_order_after_version_10(
    tmp_path: Path,
) -> None:
    """Version 10 gives each label row its task's time: the migration fills it for
    the tasks already there, and a page filtered by metadata is read from the
    label's key newest first, cursor by cursor, as before the migration."""
    path = tmp_path / "v9.db"
    store = open_store(f"sqlite:///{path}")
    await store.open()
    made = []
    for n in range(7):
        task, _ = await store.create_task(
            Task(agent="a", metadata={"batch": "b1" if n % 2 else "b2", "n": str(n)})
        )
        made.append(task)
    await store.close()
    _downgrade_to_version_9(path)
    conn = sqlite3.connect(path)
    assert "task_created" not in str(conn.execute("PRAGMA table_info(task_labels)").fetchall())
    conn.close()

    again = open_store(f"sqlite:///{path}")
    await again.open()
    try:
        assert isinstance(again, SQLiteStore) and again.migrated_from == 9
        later, _ = await again.create_task(Task(agent="a", metadata={"batch": "b1"}))
        b1 = [t for t in [*made, later] if t.metadata["batch"] == "b1"]
        want = [t.id for t in sorted(b1, key=lambda t: (t.created_at, t.id), reverse=True)]
        got, cursor = [], None
        while True:
            page = await again.list_tasks(
                TaskQuery(metadata={"batch": "b1"}, limit=2, cursor=cursor)
            )
            got += [t.id for t in page.tasks]
            if not (cursor := page.next_cursor):
                break
        assert got == want
        both = await again.list_tasks(TaskQuery(metadata={"batch": "b2", "n": "4"}))
        assert [t.id for t in both.tasks] == [made[4].id]
    finally:
        await again.close()
    conn = sqlite3.connect(path)
    stale = conn.execute(
        "SELECT count(*) FROM task_labels l JOIN tasks t ON t.num = l.task_num"
        " WHERE l.task_created IS NOT t.created_at"
    ).fetchone()[0]
    rows = conn.execute("SELECT count(*) FROM task_labels").fetchone()[0]
    conn.close()
    assert stale == 0 and rows == 7 * 2 + 1
