"""The counts a store keeps per (owner, agent, queue, status) equal a full recount
after any sequence of writes, on every store; an older store's counts are built
when it is migrated."""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import subprocess
import sys
import tempfile
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import PG_URL, drop_schema, require_postgres
from duragent.errors import DuragentError
from duragent.store import Commit, Store, TaskPatch, TaskQuery, open_store
from duragent.store._postgres import PostgresStore
from duragent.types import Task, TaskStatus

OWNERS = [None, "", "alice", "bob"]
AGENTS = ["a", "b"]
QUEUES = [None, "q"]
MOVES = [TaskStatus.PAUSED, TaskStatus.PENDING, TaskStatus.ABORTED, TaskStatus.FAILED]
STATUSES = [s.value for s in TaskStatus]

pick = st.integers(0, 40)  # an index into the tasks made so far, modulo their number
op = st.one_of(
    st.tuples(st.just("new"), st.sampled_from(range(4)), st.sampled_from(range(2)), st.booleans()),
    st.tuples(st.just("claim")),
    st.tuples(st.just("finish"), pick),
    st.tuples(st.just("move"), pick, st.sampled_from(MOVES)),
    st.tuples(st.just("failed_commit"), pick, st.booleans()),
    st.tuples(st.just("delete"), pick),
    st.tuples(st.just("purge"), st.sampled_from(AGENTS)),
    st.tuples(st.just("fork"), pick),
)


def task(owner: int, agent: int, queue: bool) -> Task:
    return Task(agent=AGENTS[agent], owner=OWNERS[owner], queue=QUEUES[queue])


async def apply(store: Store, ids: list[str], o: tuple[Any, ...]) -> None:
    """One operation; a refused one (a transition the task's status forbids, a
    task already gone) must change no count."""
    kind = o[0]
    tid = ids[o[1] % len(ids)] if len(o) > 1 and isinstance(o[1], int) and ids else None
    try:
        if kind == "new":
            ids.append((await store.create_task(task(*o[1:])))[0].id)
        elif kind == "claim":
            await store.claim_task("w", ttl=3600)
        elif kind == "finish" and tid:
            done = {"status": TaskStatus.COMPLETED}
            await store.commit(Commit(patches=[TaskPatch(tid, done)]))
        elif kind == "move" and tid:
            await store.commit(Commit(patches=[TaskPatch(tid, {"status": o[2]})]))
        elif kind == "failed_commit" and tid:
            await _failed_commit(store, ids, tid, missing=o[2])
        elif kind == "delete" and tid:
            await store.delete_task(tid)
        elif kind == "purge":
            await store.purge_tasks(TaskQuery(agent=o[1], status=[TaskStatus.COMPLETED]))
        elif kind == "fork" and tid:
            source = await store.get_task(tid)
            fork = Task(agent=source.agent, owner=source.owner, queue=source.queue)
            ids.append((await store.create_fork(fork, []))[0].id)
    except DuragentError:
        pass


async def _failed_commit(store: Store, ids: list[str], tid: str, *, missing: bool) -> None:
    """A commit that creates a task and moves another, then fails on its last
    patch (a task that does not exist, or a transition no status allows): it
    must leave everything, the counts too, as it was."""
    before = await recount(store)
    new = Task(agent="a", owner="alice")
    last = (
        TaskPatch(f"t_{uuid.uuid4().hex}", {"status": TaskStatus.PAUSED})
        if missing
        else TaskPatch(tid, {"status": TaskStatus.WAITING})  # no reason: refused
    )
    commit = Commit(new_tasks=[new], patches=[TaskPatch(tid, {"status": TaskStatus.ABORTED}), last])
    with pytest.raises(DuragentError):
        await store.commit(commit)
    assert await recount(store) == before
    assert await store.count_tasks() == before


async def recount(store: Store) -> dict[tuple[str, str], int]:
    """Every task counted by reading every page of the list: no kept count used."""
    seen: Counter[tuple[str, str]] = Counter()
    cursor = None
    while True:
        page = await store.list_tasks(TaskQuery(limit=200, cursor=cursor))
        seen.update((t.queue or t.agent, t.status.value) for t in page.tasks)
        if page.next_cursor is None:
            return dict(seen)
        cursor = page.next_cursor


QUERIES = [
    TaskQuery(),
    TaskQuery(no_owner=True),
    *[TaskQuery(owner=o) for o in OWNERS if o is not None],
    *[TaskQuery(agent=a) for a in AGENTS],
    TaskQuery(queue="q"),
    TaskQuery(owner="alice", agent="b", status=[TaskStatus.PENDING, TaskStatus.COMPLETED]),
    TaskQuery(status=TaskStatus.ABORTED),
]


async def check_counts(store: Store) -> None:
    tasks = []
    cursor = None
    while True:
        page = await store.list_tasks(TaskQuery(limit=200, cursor=cursor))
        tasks += page.tasks
        if (cursor := page.next_cursor) is None:
            break
    for q in QUERIES:
        want = Counter((t.queue or t.agent, t.status.value) for t in tasks if q.matches(t))
        assert await store.count_tasks(q) == dict(want), q


async def run(target: str | Store, ops: list[tuple[Any, ...]]) -> None:
    store = open_store(target) if isinstance(target, str) else target
    await store.open()
    try:
        ids: list[str] = []
        for o in ops:
            await apply(store, ids, o)
        await check_counts(store)
    finally:
        await store.close()


COUNT_SETTINGS = settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["memory", "sqlite", "sqlite-full", "jsonl"])
@COUNT_SETTINGS
@given(ops=st.lists(op, max_size=30))
def test_kept_counts_equal_a_recount_after_any_writes(kind: str, ops: list[Any]) -> None:
    with tempfile.TemporaryDirectory() as d:
        url = {
            "memory": "memory://",
            "sqlite": f"sqlite:///{d}/c.db",
            "sqlite-full": f"sqlite:///{d}/c.db?durability=full",
            "jsonl": f"jsonl:///{d}/c",
        }[kind]
        asyncio.run(run(url, ops))


@pytest.fixture
def pg_schema() -> Iterator[str]:
    """A schema of its own for a test, dropped afterwards."""
    require_postgres()
    schema = f"counts_{uuid.uuid4().hex[:10]}"
    yield schema
    drop_schema(schema)


def pg_store(schema: str) -> PostgresStore:
    return PostgresStore(PG_URL, schema=schema, max_size=4)


@pytest.mark.slow
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=st.lists(op, max_size=30))
def test_postgres_kept_counts_equal_a_recount_after_any_writes(
    pg_schema: str, ops: list[Any]
) -> None:
    """One schema for every example: the counts must equal a recount of whatever
    the store holds, whatever came before."""
    asyncio.run(run(pg_store(pg_schema), ops))


# Creates, moves and deletes tasks without end, printing a line every few
# writes; its parent kills it mid-write.
WRITER = r"""
import asyncio, sys
from duragent.store import Commit, TaskPatch, open_store
from duragent.store._postgres import PostgresStore
from duragent.types import Task, TaskStatus

async def main(target):
    store = open_store(target) if "://" in target else PostgresStore(sys.argv[2], schema=target)
    await store.open()
    n = 0
    while True:
        t, _ = await store.create_task(Task(agent="ab"[n % 2], owner=["x", None][n % 3 == 0]))
        await store.claim_task("w", ttl=3600)
        status = [TaskStatus.PAUSED, TaskStatus.ABORTED][n % 2]
        await store.commit(Commit(patches=[TaskPatch(t.id, {"status": status})]))
        if n % 4 == 0:
            await store.delete_task(t.id)
        n += 1
        print(n, flush=True)

asyncio.run(main(sys.argv[1]))
"""


def kill_mid_writes(args: list[str]) -> None:
    """Start the writer, let it make 150 rounds of writes, SIGKILL it."""
    with subprocess.Popen(
        [sys.executable, "-c", WRITER, *args], stdout=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if int(line) >= 150:
                break
        proc.send_signal(signal.SIGKILL)
        proc.wait()


@pytest.mark.slow
@pytest.mark.parametrize("durability", ["normal", "full"])
async def test_a_writer_killed_mid_commit_leaves_sqlite_counts_equal_a_recount(
    tmp_path: Path, durability: str
) -> None:
    url = f"sqlite:///{tmp_path}/k.db?durability={durability}"
    kill_mid_writes([url])
    store = open_store(url)
    await store.open()
    try:
        assert sum((await store.count_tasks()).values()) > 100
        await check_counts(store)
    finally:
        await store.close()


@pytest.mark.slow
async def test_a_writer_killed_mid_commit_leaves_postgres_counts_equal_a_recount(
    pg_schema: str,
) -> None:
    kill_mid_writes([pg_schema, PG_URL])
    store = pg_store(pg_schema)
    await store.open()
    try:
        assert sum((await store.count_tasks()).values()) > 100
        await check_counts(store)
    finally:
        await store.close()


def test_a_count_filtered_by_anything_but_the_kept_keys_reads_the_tasks() -> None:
    # The counts are kept per (owner, agent, queue, status): any other filter,
    # including one added to TaskQuery later (a version, a label...), must send
    # the count to the tasks themselves, never be dropped silently.
    keys = {"owner", "no_owner", "status", "agent", "queue", "limit", "cursor"}
    assert TaskQuery(owner="o", agent="a", queue="q", status=TaskStatus.PENDING).counted()
    for f in dataclasses.fields(TaskQuery):
        if f.name not in keys:
            set_one: dict[str, Any] = {f.name: "x"}
            assert not TaskQuery(**set_one).counted(), f.name
