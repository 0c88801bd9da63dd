"""Queues on every store: claim order, claiming N at once, delayed starts, and
limits (concurrency, per worker, per owner, rate) enforced inside the claim."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from conftest import drop_schema, require_postgres
from duragent.errors import QueueNotFound
from duragent.store import Commit, Store, TaskPatch, TaskQuery, open_store
from duragent.store._queues import Queue, define_queue, delete_queue, list_queues
from duragent.types import Task


async def make(store: Store, **kw: object) -> Task:
    task, created = await store.create_task(Task(agent=str(kw.pop("agent", "a")), **kw))  # type: ignore[arg-type]
    assert created
    return task


async def finish(store: Store, task: Task) -> None:
    await store.commit(
        Commit(
            fence={task.id: task.lease.epoch},
            patches=[TaskPatch(task.id, {"status": "completed"})],
        )
    )


async def test_claim_tasks_takes_n_by_priority_then_age(store: Store) -> None:
    low = [await make(store) for _ in range(3)]
    high = await make(store, priority=5)
    other = await make(store, agent="b")
    got = await store.claim_tasks("w", 3, agents=["a"], ttl=60)
    assert [t.id for t in got] == [high.id, low[0].id, low[1].id]
    assert all(t.status.value == "running" and t.lease.owner == "w" for t in got)
    assert all(t.lease.epoch == 1 for t in got)
    rest = await store.claim_tasks("w", 10, ttl=60)
    assert {t.id for t in rest} == {low[2].id, other.id}
    assert await store.claim_tasks("w", 10) == []
    assert await store.claim_tasks("w", 0) == []


async def test_a_task_goes_to_its_agents_queue_unless_given_one(store: Store) -> None:
    plain = await make(store, agent="writer")
    queued = await make(store, agent="writer", queue="bulk", metadata={"k": "v"})
    assert plain.queue == "writer"
    stored = await store.get_task(queued.id)
    assert stored.queue == "bulk" and stored.metadata == {"k": "v"}


async def test_delayed_start_is_claimed_only_when_due(store: Store) -> None:
    later = datetime.now(UTC) + timedelta(hours=1)
    delayed = await make(store, wake_at=later)
    due = await make(store, wake_at=datetime.now(UTC) - timedelta(seconds=1))
    got = await store.claim_tasks("w", 10)
    assert [t.id for t in got] == [due.id]
    await finish(store, got[0])
    nxt = await store.next_wake_at()
    assert nxt is not None and abs((nxt - later).total_seconds()) < 1
    assert (await store.get_task(delayed.id)).status.value == "pending"


async def test_concurrency_limit_holds_across_claims(store: Store) -> None:
    await define_queue(store, Queue("q", concurrency=2))
    tasks = [await make(store, queue="q") for _ in range(5)]
    free = await make(store, queue="other")
    got = await store.claim_tasks("w1", 10, ttl=60)
    in_q = [t for t in got if t.queue == "q"]
    assert len(in_q) == 2 and free.id in {t.id for t in got}
    assert await store.claim_tasks("w2", 10, ttl=60) == []
    await finish(store, in_q[0])
    again = await store.claim_tasks("w2", 10, ttl=60)
    assert len(again) == 1 and again[0].id == tasks[2].id


async def test_per_worker_limit(store: Store) -> None:
    await define_queue(store, Queue("q", per_worker=1))
    for _ in range(4):
        await make(store, queue="q")
    assert len(await store.claim_tasks("w1", 10, ttl=60)) == 1
    assert len(await store.claim_tasks("w1", 10, ttl=60)) == 0
    assert len(await store.claim_tasks("w2", 10, ttl=60)) == 1


async def test_per_owner_limit_lets_other_owners_through(store: Store) -> None:
    await define_queue(store, Queue("q", per_owner=1, concurrency=10))
    a1 = await make(store, queue="q", owner="alice")
    await make(store, queue="q", owner="alice")
    b1 = await make(store, queue="q", owner="bob")
    got = await store.claim_tasks("w", 10, ttl=60)
    assert {t.id for t in got} == {a1.id, b1.id}


async def test_rate_limit_counts_starts_in_the_store(store: Store) -> None:
    await define_queue(store, Queue("q", rate=(2, 3600)))
    for _ in range(4):
        await make(store, queue="q")
    first = await store.claim_tasks("w1", 10, ttl=60)
    assert len(first) == 2
    for t in first:
        await finish(store, t)
    assert await store.claim_tasks("w2", 10, ttl=60) == []  # finished: still no tokens
    (q,) = [q for q in await list_queues(store) if q.name == "q"]
    assert q.tokens is not None and q.tokens < 1


async def test_takeover_is_not_blocked_by_a_full_queue(store: Store) -> None:
    await define_queue(store, Queue("q", concurrency=1))
    task = await make(store, queue="q")
    await make(store, queue="q")
    (held,) = await store.claim_tasks("w1", 5, ttl=0.0)  # its lease expires at once
    (taken,) = await store.claim_tasks("w2", 5, ttl=60)
    assert taken.id == task.id == held.id and taken.restarts == 1


async def test_concurrent_claims_never_exceed_the_limit(store: Store) -> None:
    await define_queue(store, Queue("q", concurrency=3))
    for _ in range(20):
        await make(store, queue="q")
    batches = await asyncio.gather(*(store.claim_tasks(f"w{i}", 2, ttl=60) for i in range(6)))
    assert sum(len(b) for b in batches) == 3


async def test_list_and_count_filter_by_queue_metadata_and_time(store: Store) -> None:
    t0 = datetime.now(UTC)
    a = await make(store, queue="q1", metadata={"customer": "acme", "tier": 2})
    b = await make(store, queue="q1", metadata={"customer": "globex"})
    c = await make(store, agent="b", metadata={"customer": "acme"})
    await asyncio.sleep(0.01)  # distinct creation times for the range filter
    t1 = datetime.now(UTC)
    d = await make(store, queue="q1")
    (running,) = await store.claim_tasks("w", 1, agents=["b"], ttl=60)

    async def ids(**kw: object) -> set[str]:
        page = await store.list_tasks(TaskQuery(**kw))  # type: ignore[arg-type]
        return {t.id for t in page.tasks}

    assert await ids(queue="q1") == {a.id, b.id, d.id}
    assert await ids(metadata={"customer": "acme"}) == {a.id, c.id}
    assert await ids(metadata={"customer": "acme", "tier": 2}) == {a.id}
    assert await ids(metadata={"customer": "acme", "tier": 3}) == set()
    assert await ids(created_after=t1) == {d.id}
    assert await ids(created_before=t1, queue="q1") == {a.id, b.id}
    assert await ids(updated_after=t0, status="running") == {running.id}
    counts = await store.count_tasks()
    assert counts == {("q1", "pending"): 3, ("b", "running"): 1}
    assert await store.count_tasks(TaskQuery(metadata={"customer": "acme"})) == {
        ("q1", "pending"): 1,
        ("b", "running"): 1,
    }


async def test_removing_limits_a_queue_never_had_is_not_found(store: Store) -> None:
    await define_queue(store, Queue("q", concurrency=1))
    with pytest.raises(QueueNotFound, match="'nope'"):
        await delete_queue(store, "nope")
    await delete_queue(store, "q")
    assert await list_queues(store) == []


async def test_a_claim_may_be_kept_to_named_queues(store: Store) -> None:
    past = datetime.now(UTC) - timedelta(seconds=1)
    a_ready = await make(store, queue="a")
    a_due = await make(store, queue="a", wake_at=past)
    b_ready = await make(store, queue="b", priority=9)
    b_due = await make(store, queue="b", wake_at=past)
    c_ready = await make(store, agent="c")  # its agent's queue, "c"
    (b_held,) = await store.claim_tasks("gone", 1, queues=["b"], ttl=0.0)  # expires at once
    assert b_held.id == b_ready.id
    assert await store.claim_tasks("w", 10, queues=[]) == []
    got = await store.claim_tasks("w", 10, queues=["a", "c", "a"], ttl=60)
    assert {t.id for t in got} == {a_ready.id, a_due.id, c_ready.id}
    assert await store.claim_tasks("w", 10, queues=["a"]) == []
    assert await store.claim_task("w", queues=["nothing-here"]) is None
    rest = await store.claim_tasks("w", 10, queues=["b"], ttl=60)
    assert {t.id for t in rest} == {b_due.id, b_ready.id}  # the expired lease taken over


async def test_next_wake_at_of_named_queues_ignores_the_others(store: Store) -> None:
    soon = datetime.now(UTC) + timedelta(minutes=5)
    later = datetime.now(UTC) + timedelta(hours=2)
    await make(store, queue="b", wake_at=soon)
    await make(store, queue="a", wake_at=later)
    for queues, want in ((["a"], later), (["b", "a"], soon), (None, soon)):
        got = await store.next_wake_at(None, queues)
        assert got is not None and abs((got - want).total_seconds()) < 1, queues
    assert await store.next_wake_at(["a"], ["a"]) is not None
    assert await store.next_wake_at(["x"], ["a"]) is None
    assert await store.next_wake_at(None, ["z"]) is None


@pytest.fixture(params=["sqlite", "jsonl", "postgres"])
def durable_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/q.db"
    elif request.param == "jsonl":
        yield f"jsonl:///{tmp_path}/q"
    else:
        schema = f"test_{uuid.uuid4().hex[:12]}"
        yield f"{require_postgres()}?schema={schema}"
        drop_schema(schema)


async def test_queue_definitions_and_buckets_survive_a_reopen(durable_url: str) -> None:
    store = open_store(durable_url)
    await store.open()
    await define_queue(store, Queue("mail", concurrency=1, rate=(2, 3600), ttl=60))
    await define_queue(store, Queue("gone", per_owner=1))
    await delete_queue(store, "gone")
    for _ in range(3):
        await make(store, queue="mail")
    (first,) = await store.claim_tasks("w", 5, ttl=60)
    await finish(store, first)
    await store.close()

    store = open_store(durable_url)
    await store.open()
    try:
        (q,) = await list_queues(store)
        assert q.definition() == {
            "name": "mail",
            "concurrency": 1,
            "per_worker": None,
            "per_owner": None,
            "rate": [2, 3600.0],
            "ttl": 60.0,
        }
        assert q.tokens is not None and 0.9 < q.tokens < 1.1  # one of two spent
        (second,) = await store.claim_tasks("w", 5, ttl=60)
        await finish(store, second)
        assert await store.claim_tasks("w", 5, ttl=60) == []  # the bucket is empty
    finally:
        await store.close()


async def test_a_metadata_filter_pages_newest_first_through_the_cursor(store: Store) -> None:
    """Every labelled task once, newest first, over pages smaller than the match,
    with unlabelled tasks between them; the same through a status filter."""
    base = datetime(2026, 3, 1, tzinfo=UTC)
    labelled = []
    for n in range(9):
        t = Task(agent="a", metadata={"campaign": "x"} if n % 3 else {})
        t.created_at = t.updated_at = base + timedelta(seconds=n)
        await store.create_task(t)
        if n % 3:
            labelled.append(t.id)
    seen, cursor = [], None
    while True:
        page = await store.list_tasks(TaskQuery(metadata={"campaign": "x"}, limit=2, cursor=cursor))
        seen += [t.id for t in page.tasks]
        if (cursor := page.next_cursor) is None:
            break
    assert seen == labelled[::-1]
    q = TaskQuery(metadata={"campaign": "x"}, status="pending", limit=4)  # type: ignore[arg-type]
    first = await store.list_tasks(q)
    q.cursor = first.next_cursor
    assert [t.id for t in first.tasks + (await store.list_tasks(q)).tasks] == labelled[::-1]


async def test_a_metadata_filter_pages_tasks_of_one_time_by_id_through_the_cursor(
    store: Store,
) -> None:
    """Labelled tasks made in one commit share their time: they come id descending,
    each once, one per page, after a later one; the cursor's tie on time is
    decided by the id under a label too."""
    tied = [Task(agent="a", metadata={"campaign": "y"} if n != 2 else {}) for n in range(5)]
    await store.commit(Commit(new_tasks=tied))
    later, _ = await store.create_task(Task(agent="a", metadata={"campaign": "y"}))
    want = [later.id, *sorted((t.id for t in tied if t.metadata), reverse=True)]
    seen, cursor = [], None
    while True:
        page = await store.list_tasks(TaskQuery(metadata={"campaign": "y"}, limit=1, cursor=cursor))
        seen += [t.id for t in page.tasks]
        if (cursor := page.next_cursor) is None:
            break
    assert seen == want
