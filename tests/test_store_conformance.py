"""One suite, every backend: what a Store must do."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from pydantic import BaseModel

from conftest import STORE_FACTORIES, WIRE_FACTORIES, opened_store, require_postgres
from duragent.errors import Conflict, InvalidTransition, StaleLease, StoreError, TaskNotFound
from duragent.store import Commit, DocumentWrite, Store, TaskPatch, TaskQuery, iter_entries
from duragent.store._codec import MAX_SEQ
from duragent.store._postgres import PostgresStore
from duragent.store._sqlite import SQLiteStore
from duragent.types import (
    AssistantMessage,
    EntryKind,
    FunctionCall,
    NewEntry,
    Task,
    TaskStatus,
    ToolCallData,
    ToolMessage,
    UIText,
    UserMessage,
    dump_message,
    task_scope,
)


@pytest.fixture(params=sorted({**STORE_FACTORIES, **WIRE_FACTORIES}))
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """Every backend, the PostgreSQL store on both its wires (_postgres_message.py)."""
    async with opened_store(request.param, tmp_path) as s:
        yield s


def api(task_id: str, message: BaseModel, rnd: int = 0) -> NewEntry:
    return NewEntry(
        task_id=task_id, kind=EntryKind.API_MESSAGE, round=rnd, payload=dump_message(message)
    )


def ui(task_id: str, text: str) -> NewEntry:
    return NewEntry(
        task_id=task_id, kind=EntryKind.UI_MESSAGE, payload=dump_message(UIText(text=text))
    )


async def make(store: Store, **kw: object) -> Task:
    task, created = await store.create_task(Task(agent=str(kw.pop("agent", "a")), **kw))  # type: ignore[arg-type]
    assert created
    return task


async def test_task_round_trips_with_exact_types(store: Store) -> None:
    wake = datetime(2030, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
    original = Task(
        agent="writer",
        owner="alice",
        session_id="s1",
        input={"text": "hi", "n": [1, 2.5, None, True]},
        context={"nested": {"deep": {"x": [1, {"y": "z"}]}}, "when": "2030-01-01"},
        config={"temperature": 0.1},
        wake_at=wake,
    )
    created, _ = await store.create_task(original)
    loaded = await store.get_task(original.id)
    # The row the store hands back is the row it reads back, down to the fields given.
    assert created == loaded
    assert created.model_fields_set == loaded.model_fields_set == set(Task.model_fields)
    assert loaded.status is TaskStatus.PENDING
    assert loaded.input == original.input
    assert loaded.context == original.context
    assert loaded.config == original.config
    assert loaded.wake_at == wake and loaded.wake_at.tzinfo is not None
    assert isinstance(loaded.created_at, datetime)
    assert loaded.root_id == original.id
    assert Task.model_validate_json(loaded.model_dump_json()) == loaded


async def test_missing_task_raises_task_not_found(store: Store) -> None:
    with pytest.raises(TaskNotFound, match="nope"):
        await store.get_task("nope")


async def test_request_id_deduplicates_per_owner(store: Store) -> None:
    first, created = await store.create_task(Task(agent="a", owner="alice", request_id="r1"))
    assert created
    again, created_again = await store.create_task(Task(agent="a", owner="alice", request_id="r1"))
    assert not created_again and again.id == first.id
    other, created_other = await store.create_task(Task(agent="a", owner="bob", request_id="r1"))
    assert created_other and other.id != first.id
    anon, created_anon = await store.create_task(Task(agent="a", request_id="r1"))
    assert created_anon and anon.id not in (first.id, other.id)
    # No owner and the empty owner are one owner, in every store.
    same, created_same = await store.create_task(Task(agent="a", owner="", request_id="r1"))
    assert not created_same and same.id == anon.id
    page = await store.list_tasks(TaskQuery(owner="alice"))
    assert [t.id for t in page.tasks] == [first.id]


async def test_concurrent_duplicate_requests_create_one_task(store: Store) -> None:
    results = await asyncio.gather(
        *(store.create_task(Task(agent="a", owner="o", request_id="same")) for _ in range(10))
    )
    assert len({t.id for t, _ in results}) == 1
    assert sum(created for _, created in results) == 1


async def test_create_with_entries_is_atomic_and_numbered(store: Store) -> None:
    task = Task(agent="a")
    await store.create_task(task, [api(task.id, UserMessage(content="hello"))])
    entries = await store.entries(task.id)
    assert [(e.seq, e.kind) for e in entries] == [(1, EntryKind.API_MESSAGE)]
    assert (await store.get_task(task.id)).last_seq == 1


async def test_commit_seqs_are_gap_free_across_tasks(store: Store) -> None:
    a, b = await make(store), await make(store)
    r1 = await store.commit(Commit(entries=[ui(a.id, "1"), ui(b.id, "x"), ui(a.id, "2")]))
    assert [(e.task_id, e.seq) for e in r1.entries] == [(a.id, 1), (b.id, 1), (a.id, 2)]
    await store.commit(Commit(entries=[ui(a.id, "3")]))
    assert [e.seq for e in await store.entries(a.id)] == [1, 2, 3]
    assert [e.payload["text"] for e in await store.entries(a.id)] == ["1", "2", "3"]
    assert r1.tasks[a.id].last_seq == 2


async def test_commit_is_all_or_nothing(store: Store) -> None:
    a = await make(store)
    child = Task(agent="a", parent_id=a.id)
    bad = Commit(
        entries=[ui(a.id, "should vanish")],
        documents=[DocumentWrite(task_scope(a.id), "plan", {"x": 1})],
        new_tasks=[child],
        patches=[
            TaskPatch(a.id, {"status": TaskStatus.COMPLETED})
        ],  # pending -> completed: illegal
    )
    with pytest.raises(InvalidTransition):
        await store.commit(bad)
    assert await store.entries(a.id) == []
    assert await store.get_document(task_scope(a.id), "plan") is None
    with pytest.raises(TaskNotFound):
        await store.get_task(child.id)
    assert (await store.get_task(a.id)).version == a.version


async def test_stale_epoch_commit_is_rejected_and_leaves_no_trace(store: Store) -> None:
    task = await make(store)
    first = await store.claim_task("w1", ttl=0.0)
    assert first is not None and first.lease.epoch == 1
    second = await store.claim_task("w2", ttl=30)  # w1's lease expired: w2 takes over
    assert second is not None and second.lease.epoch == 2
    before = await store.get_task(task.id)
    with pytest.raises(StaleLease) as info:
        await store.commit(
            Commit(
                fence={task.id: 1},
                entries=[ui(task.id, "zombie write")],
                patches=[TaskPatch(task.id, {"context": {"zombie": True}})],
                documents=[DocumentWrite(task_scope(task.id), "k", 1)],
            )
        )
    assert info.value.epoch == 1 and info.value.current == 2
    after = await store.get_task(task.id)
    assert after == before
    assert all(e.kind is EntryKind.STATUS for e in await store.entries(task.id))
    assert await store.get_document(task_scope(task.id), "k") is None
    ok = await store.commit(Commit(fence={task.id: 2}, entries=[ui(task.id, "owner")]))
    assert ok.entries[0].seq == after.last_seq + 1


async def test_status_change_is_validated_and_logged(store: Store) -> None:
    task = await make(store)
    with pytest.raises(InvalidTransition, match="'pending' to 'completed'"):
        await store.commit(Commit(patches=[TaskPatch(task.id, {"status": "completed"})]))
    claimed = await store.claim_task("w")
    assert claimed is not None
    res = await store.commit(
        Commit(
            fence={task.id: claimed.lease.epoch},
            patches=[TaskPatch(task.id, {"status": TaskStatus.COMPLETED, "output": "done"})],
        )
    )
    done = res.tasks[task.id]
    assert done.status is TaskStatus.COMPLETED and done.completed_at is not None
    statuses = await store.entries(task.id, kinds=[EntryKind.STATUS])
    assert [(e.payload["from"], e.payload["to"]) for e in statuses] == [
        ("pending", "running"),
        ("running", "completed"),
    ]
    with pytest.raises(InvalidTransition, match="'completed' to 'pending'"):
        await store.commit(Commit(patches=[TaskPatch(task.id, {"status": "pending"})]))


async def test_waiting_needs_a_reason(store: Store) -> None:
    task = await make(store)
    claimed = await store.claim_task("w")
    assert claimed
    with pytest.raises(InvalidTransition, match="needs a reason"):
        await store.commit(Commit(patches=[TaskPatch(task.id, {"status": "waiting"})]))
    res = await store.commit(
        Commit(patches=[TaskPatch(task.id, {"status": "waiting", "status_reason": "input"})])
    )
    assert res.tasks[task.id].status_reason == "input"


async def test_expect_status_guards_a_patch(store: Store) -> None:
    task = await make(store)
    with pytest.raises(Conflict):
        await store.commit(
            Commit(
                patches=[
                    TaskPatch(task.id, {"status": "aborted"}, expect_status=[TaskStatus.PAUSED])
                ]
            )
        )
    assert (await store.get_task(task.id)).status is TaskStatus.PENDING


async def test_list_tasks_filters_newest_first_with_cursor(store: Store) -> None:
    made = []
    for i in range(7):
        made.append(
            await make(store, owner="alice" if i % 2 == 0 else "bob", session_id=f"s{i % 3}")
        )
    child = await make(store, owner="alice", parent_id=made[0].id, agent="sub")
    page = await store.list_tasks(TaskQuery(owner="alice", limit=2))
    seen = [t.id for t in page.tasks]
    while page.next_cursor:
        page = await store.list_tasks(TaskQuery(owner="alice", limit=2, cursor=page.next_cursor))
        seen += [t.id for t in page.tasks]
    alice = [t.id for t in [*made, child] if t.owner == "alice"]
    assert seen == list(reversed(alice))
    assert [t.id for t in (await store.list_tasks(TaskQuery(parent_id=made[0].id))).tasks] == [
        child.id
    ]
    assert [t.id for t in (await store.list_tasks(TaskQuery(agent="sub"))).tasks] == [child.id]
    s1 = (await store.list_tasks(TaskQuery(session_id="s1"))).tasks
    assert {t.id for t in s1} == {made[1].id, made[4].id}
    assert len((await store.list_tasks(TaskQuery(status=TaskStatus.PENDING, limit=100))).tasks) == 8
    assert (await store.list_tasks(TaskQuery(status=[TaskStatus.COMPLETED]))).tasks == []


async def test_list_tasks_by_id_prefix_compares_text_exactly(store: Store) -> None:
    ids = ["t_ab1", "t_ab2", "t_ac", "t_a%b", "t_a_b", "t_é1", "T_AB3"]
    for tid in ids:
        await make(store, id=tid, owner="alice")
    await make(store, id="t_ab9", owner="bob")

    async def found(prefix: str, owner: str | None = "alice") -> set[str]:
        page = await store.list_tasks(TaskQuery(owner=owner, id_prefix=prefix, limit=100))
        return {t.id for t in page.tasks}

    assert await found("t_ab") == {"t_ab1", "t_ab2"}  # bob's is not alice's; case counts
    assert await found("t_ab", owner=None) == {"t_ab1", "t_ab2", "t_ab9"}
    assert await found("t_a%") == {"t_a%b"}  # % and _ are characters, not patterns
    assert await found("t_a_") == {"t_a_b"}
    assert await found("t_é") == {"t_é1"}
    assert await found("t_ab1") == {"t_ab1"}
    assert await found("t_ab1x") == set()
    assert await found("x' OR '1'='1") == set()
    # The range a SQL store reads for a prefix ends past every id starting with it:
    # after the last code point, and across the surrogates (never in text).
    for tid in ["t_\U0010ffff", "t_\U0010ffffz", "t_\ud7ff", "t_\ud7ffz", "t_\ue000"]:
        await make(store, id=tid, owner="carol")
    assert await found("t_\U0010ffff", "carol") == {"t_\U0010ffff", "t_\U0010ffffz"}
    assert await found("t_\ud7ff", "carol") == {"t_\ud7ff", "t_\ud7ffz"}
    assert await found("t_", "carol") == {
        "t_\U0010ffff",
        "t_\U0010ffffz",
        "t_\ud7ff",
        "t_\ud7ffz",
        "t_\ue000",
    }


async def test_list_and_count_tasks_by_agent_version(store: Store) -> None:
    v3 = [await make(store, agent="a", agent_version="v3", owner="al") for _ in range(2)]
    await make(store, agent="a", agent_version="v4", owner="al")
    await make(store, agent="b", agent_version="v3", owner="al")
    await make(store, agent="a", owner="al")  # from before versions: on none
    await make(store, agent="a", agent_version="v3", owner="bo")
    mine = TaskQuery(owner="al", agent="a", agent_version="v3")
    assert {t.id for t in (await store.list_tasks(mine)).tasks} == {t.id for t in v3}
    assert sum((await store.count_tasks(mine)).values()) == 2
    assert len((await store.list_tasks(TaskQuery(agent_version="v3"))).tasks) == 4
    odd = TaskQuery(agent_version="v3' OR '1'='1")  # a parameter, never SQL text
    assert (await store.list_tasks(odd)).tasks == []
    # A migration moves a task between the filter's answers.
    moved = v3[0]
    await store.commit(Commit(patches=[TaskPatch(moved.id, {"agent_version": "v4"})]))
    assert [t.id for t in (await store.list_tasks(mine)).tasks] == [v3[1].id]
    v4 = (await store.list_tasks(TaskQuery(agent_version="v4", owner="al"))).tasks
    assert moved.id in {t.id for t in v4} and len(v4) == 2


async def test_entries_after_seq_by_kind_with_limit_and_streamed(store: Store) -> None:
    task = await make(store)
    await store.commit(
        Commit(
            entries=[
                ui(task.id, str(i)) if i % 2 else api(task.id, UserMessage(content=str(i)))
                for i in range(10)
            ]
        )
    )
    assert [e.seq for e in await store.entries(task.id, after_seq=7)] == [8, 9, 10]
    uis = await store.entries(task.id, kinds=[EntryKind.UI_MESSAGE], limit=3)
    assert [e.seq for e in uis] == [2, 4, 6]
    streamed = [e.seq async for e in iter_entries(store, task.id, after_seq=2, page=3)]
    assert streamed == list(range(3, 11))


async def test_model_view_skips_rolled_back_rounds_but_ui_stays(store: Store) -> None:
    task = await make(store)
    call = ToolCallData(id="c1", function=FunctionCall(name="f", arguments='{"a": 1}'))
    await store.commit(
        Commit(entries=[api(task.id, UserMessage(content="q")), ui(task.id, "you: q")])
    )
    r = await store.commit(
        Commit(
            entries=[
                api(task.id, AssistantMessage(content="thinking", tool_calls=[call]), 1),
                ui(task.id, "assistant is calling f"),
                NewEntry(
                    task_id=task.id,
                    kind=EntryKind.TOOL_RESULT,
                    round=1,
                    payload={
                        **dump_message(ToolMessage(tool_call_id="c1", content="r")),
                        "outcome": "ok",
                    },
                ),
            ]
        )
    )
    first, last = r.entries[0].seq, r.entries[-1].seq
    await store.commit(
        Commit(
            entries=[
                NewEntry(
                    task_id=task.id,
                    kind=EntryKind.ROLLBACK,
                    payload={"from_seq": first, "to_seq": last},
                )
            ]
        )
    )
    await store.commit(Commit(entries=[api(task.id, AssistantMessage(content="final"), 1)]))
    view = await store.model_view(task.id)
    assert [type(m).__name__ for m in view] == ["UserMessage", "AssistantMessage"]
    assert view[1].content == "final"
    assert await store.model_view_data(task.id) == [dump_message(m) for m in view]
    # A runner's start reads both at once (the rollback makes PostgreSQL read
    # the view's rows again, after its pipeline).
    entries, data = await store.start_reads(task.id, first)
    assert data == [dump_message(m) for m in view]
    assert entries == await store.entries(task.id, after_seq=first)
    assert [getattr(m, "text", None) for m in await store.ui_messages(task.id)] == [
        "you: q",
        "assistant is calling f",
    ]


async def test_model_view_keeps_tool_messages(store: Store) -> None:
    task = await make(store)
    call = ToolCallData(id="c1", function=FunctionCall(name="f", arguments="{}"))
    await store.commit(
        Commit(
            entries=[
                api(task.id, AssistantMessage(tool_calls=[call])),
                NewEntry(
                    task_id=task.id,
                    kind=EntryKind.TOOL_RESULT,
                    payload={
                        "role": "tool",
                        "tool_call_id": "c1",
                        "content": "42",
                        "outcome": "ok",
                    },
                ),
            ]
        )
    )
    view = await store.model_view(task.id)
    assert isinstance(view[1], ToolMessage) and view[1].content == "42"
    calls = view[0].tool_calls if isinstance(view[0], AssistantMessage) else None
    assert calls is not None and calls[0].function.name == "f"
    # The plain view is the wire form: the result's `outcome` is the log's, not the model's.
    data = await store.model_view_data(task.id)
    assert data == [dump_message(m) for m in view]
    assert data[1] == {"role": "tool", "tool_call_id": "c1", "content": "42"}


async def test_documents_upsert_with_versions(store: Store) -> None:
    scope = "session:s1"
    r = await store.commit(
        Commit(documents=[DocumentWrite(scope, "plan", {"steps": ["a"]}, expect_version=0)])
    )
    assert r.documents[0].version == 1
    await store.commit(Commit(documents=[DocumentWrite(scope, "plan", {"steps": ["a", "b"]})]))
    doc = await store.get_document(scope, "plan")
    assert doc is not None and doc.version == 2 and doc.value == {"steps": ["a", "b"]}
    with pytest.raises(Conflict):
        await store.commit(Commit(documents=[DocumentWrite(scope, "plan", {}, expect_version=1)]))
    await store.commit(Commit(documents=[DocumentWrite(scope, "other", 7)]))
    assert [d.key for d in await store.list_documents(scope)] == ["other", "plan"]
    await store.commit(Commit(documents=[DocumentWrite(scope, "other", delete=True)]))
    assert await store.get_document(scope, "other") is None


@pytest.mark.slow
async def test_every_session_scope_is_per_owner(store: Store) -> None:
    """Bob (and an ownerless caller) naming Alice's session id see nothing of hers
    and change nothing of hers: not her session documents, not her history, not
    her request ids."""
    from duragent import Runtime
    from server_agents import notebook

    async def run(owner: str | None, text: str, **kw: Any) -> tuple[Task, list[Any]]:
        sub = await rt.submit("notebook", text, owner=owner, session_id="s1", **kw)
        done = await sub.wait(timeout=60)
        assert done.status is TaskStatus.COMPLETED, done.error
        return done, await rt.model_view(done.id)

    async with Runtime(store, [notebook()], poll_interval=0.05) as rt:
        first, _ = await run("alice", "alice's secret")
        assert first.output == "notes before: []"
        bob, bob_view = await run("bob", "bob was here", continue_session=True)
        assert bob.output == "notes before: []"
        assert not any("alice" in str(m.content) for m in bob_view)
        nobody, nobody_view = await run(None, "anonymous", continue_session=True)
        assert nobody.output == "notes before: []"
        assert not any("alice" in str(m.content) for m in nobody_view)
        again, alice_view = await run("alice", "alice again", continue_session=True)
        assert again.output == """notes before: ["alice's secret"]"""
        assert "alice's secret" in [m.content for m in alice_view]
        assert not any("bob" in str(m.content) or "anonymous" in str(m.content) for m in alice_view)
        bob2, _ = await run("bob", "bob again")
        assert bob2.output == 'notes before: ["bob was here"]'

        mine = await rt.submit("notebook", "x", owner="alice", session_id="s1", request_id="r1")
        theirs = await rt.submit("notebook", "y", owner="bob", session_id="s1", request_id="r1")
        anon = await rt.submit("notebook", "z", session_id="s1", request_id="r1")
        assert mine.created and theirs.created and anon.created
        assert len({mine.task_id, theirs.task_id, anon.task_id}) == 3
        for sub in (mine, theirs, anon):
            await sub.wait(timeout=60)


async def test_claim_bumps_epoch_and_hands_out_a_task_once(store: Store) -> None:
    task = await make(store, agent="known")
    await make(store, agent="unknown")
    assert await store.claim_task("w0", agents=["nobody"]) is None
    claimed = await store.claim_task("w1", agents=["known"], ttl=30)
    assert claimed is not None and claimed.id == task.id
    assert claimed.status is TaskStatus.RUNNING
    assert claimed.lease.owner == "w1" and claimed.lease.epoch == 1
    assert await store.claim_task("w2", agents=["known"]) is None
    assert claimed.restarts == 0


async def test_a_task_pinned_to_an_agent_version_is_claimed_only_by_a_worker_serving_it(
    store: Store,
) -> None:
    v1 = await make(store, agent="a", agent_version="v1")
    v2 = await make(store, agent="a", agent_version="v2")
    old = await make(store, agent="a")  # from before versions: any version runs it
    other = await make(store, agent="b", agent_version="v1")
    assert (await store.get_task(v2.id)).agent_version == "v2"
    serving_v3 = await store.claim_tasks("w3", 10, agents=["a", "b"], versions={"a": "v3"})
    assert [t.id for t in serving_v3] == [old.id]
    assert await store.claim_task("w3", agents=["a"], versions={"a": "v3"}) is None
    assert await store.claim_task("w3", task_id=v1.id, versions={"a": "v3"}) is None
    got = await store.claim_tasks("w2", 10, agents=["a", "b"], versions={"a": "v2", "b": "v1"})
    assert sorted(t.id for t in got) == sorted([v2.id, other.id])
    # A migration moves the pin (a patch of the row): the version it names runs it next.
    await store.commit(Commit(patches=[TaskPatch(v1.id, {"agent_version": "v2"})]))
    moved = await store.claim_task("w2", agents=["a"], versions={"a": "v2"})
    assert moved is not None and moved.id == v1.id and moved.agent_version == "v2"


async def test_expired_lease_is_taken_over_and_counts_a_restart(store: Store) -> None:
    task = await make(store)
    await store.claim_task("w1", ttl=0.0)
    taken = await store.claim_task("w2", ttl=30)
    assert taken is not None and taken.id == task.id
    assert taken.restarts == 1 and taken.lease.epoch == 2 and taken.lease.owner == "w2"
    claims = await store.entries(task.id, kinds=[EntryKind.STATUS])
    assert [e.payload.get("takeover") for e in claims] == [False, True]


async def test_due_timer_is_claimable_future_one_is_not(store: Store) -> None:
    due, later = await make(store), await make(store)
    for t, wake in ((due, -1), (later, 3600)):
        c = await store.claim_task("w", task_id=t.id)
        assert c is not None
        await store.commit(
            Commit(
                fence={t.id: c.lease.epoch},
                patches=[
                    TaskPatch(
                        t.id,
                        {
                            "status": "waiting",
                            "status_reason": "timer",
                            "wake_at": datetime.now(UTC) + timedelta(seconds=wake),
                        },
                    )
                ],
            )
        )
        await store.release_lease(t.id, c.lease.epoch)
    woke = await store.claim_task("w2")
    assert woke is not None and woke.id == due.id and woke.wake_at is None
    assert await store.claim_task("w2") is None
    await store.commit(
        Commit(
            fence={due.id: woke.lease.epoch}, patches=[TaskPatch(due.id, {"status": "completed"})]
        )
    )
    nxt = await store.next_wake_at()
    assert nxt is not None and nxt > datetime.now(UTC) + timedelta(seconds=3000)


async def test_a_waiting_task_is_claimable_on_its_due_wake_at_whatever_it_waits_for(
    store: Store,
) -> None:
    """An approval's time limit (waiting for input, with a wake_at) is a durable timer too."""
    due, later, open_ended = await make(store), await make(store), await make(store)
    for t, wake in ((due, -1), (later, 3600), (open_ended, None)):
        c = await store.claim_task("w", task_id=t.id)
        assert c is not None
        when = None if wake is None else datetime.now(UTC) + timedelta(seconds=wake)
        patch = {"status": "waiting", "status_reason": "input", "wake_at": when}
        await store.commit(Commit(fence={t.id: c.lease.epoch}, patches=[TaskPatch(t.id, patch)]))
        await store.release_lease(t.id, c.lease.epoch)
    nxt = await store.next_wake_at()
    assert nxt is not None and nxt < datetime.now(UTC)
    assert await store.claim_task("w2", task_id=later.id) is None
    assert await store.claim_task("w2", task_id=open_ended.id) is None
    woke = await store.claim_task("w2", task_id=due.id)
    assert woke is not None and woke.id == due.id and woke.status is TaskStatus.RUNNING
    assert await store.claim_task("w2") is None  # neither the later nor the open-ended one
    done = TaskPatch(due.id, {"status": "completed"})
    await store.commit(Commit(fence={due.id: woke.lease.epoch}, patches=[done]))
    nxt = await store.next_wake_at()
    assert nxt is not None and nxt > datetime.now(UTC) + timedelta(seconds=3000)


async def test_renew_and_release(store: Store) -> None:
    task = await make(store)
    c = await store.claim_task("w1", ttl=1)
    assert c is not None
    r = await store.renew_lease(task.id, "w1", c.lease.epoch, ttl=60)
    assert r.lease.expires_at is not None and r.lease.expires_at > datetime.now(UTC) + timedelta(
        seconds=50
    )
    with pytest.raises(StaleLease):
        await store.renew_lease(task.id, "w1", c.lease.epoch - 1, ttl=60)
    await store.release_lease(task.id, c.lease.epoch)
    released = await store.get_task(task.id)
    assert released.status is TaskStatus.PENDING and released.lease.owner is None
    again = await store.claim_task("w2")
    assert again is not None and again.lease.epoch == c.lease.epoch + 1 and again.restarts == 0


async def test_delete_removes_task_descendants_entries_and_documents(store: Store) -> None:
    root = await make(store, owner="o", request_id="r")
    child = await make(store, parent_id=root.id)
    grandchild = await make(store, parent_id=child.id)
    other = await make(store)
    await store.commit(
        Commit(
            entries=[ui(root.id, "x"), ui(grandchild.id, "y"), ui(other.id, "z")],
            documents=[
                DocumentWrite(task_scope(child.id), "k", 1),
                DocumentWrite(task_scope(other.id), "k", 2),
            ],
        )
    )
    await store.delete_task(root.id)
    for t in (root, child, grandchild):
        with pytest.raises(TaskNotFound):
            await store.get_task(t.id)
        assert await store.entries(t.id) == []
    assert await store.get_document(task_scope(child.id), "k") is None
    assert (await store.get_document(task_scope(other.id), "k")) is not None
    assert len(await store.entries(other.id)) == 1
    again, created = await store.create_task(Task(agent="a", owner="o", request_id="r"))
    assert created and again.id != root.id


async def test_new_child_and_parent_wait_commit_together(store: Store) -> None:
    parent = await make(store)
    c = await store.claim_task("w", task_id=parent.id)
    assert c
    child = Task(agent="a", parent_id=parent.id, root_id=parent.root_id, input="sub")
    res = await store.commit(
        Commit(
            fence={parent.id: c.lease.epoch},
            new_tasks=[child],
            patches=[TaskPatch(parent.id, {"status": "waiting", "status_reason": "subtask"})],
        )
    )
    assert res.tasks[child.id].status is TaskStatus.PENDING
    assert res.tasks[parent.id].status is TaskStatus.WAITING
    loaded = await store.get_task(child.id)
    assert loaded.root_id == parent.id and loaded.input == "sub"


async def until_listening(store: Store) -> None:
    """Stores that hear other processes start listening at their first wait, and
    may return early while they start (callers re-read after any return)."""
    for _ in range(100):
        if getattr(store, "listening", True):
            return
        await store.wait_for_change(0.2)
    raise AssertionError("the store never started listening")


@pytest.mark.slow
async def test_wait_for_change_waits_for_a_commit_then_wakes(store: Store) -> None:
    task = await make(store)
    await until_listening(store)
    waiter = asyncio.create_task(store.wait_for_change(60))
    # Nothing is committed: the wait must still be running after the loop has
    # had plenty of chances to finish it (a store that polls returns here).
    done, _ = await asyncio.wait({waiter}, timeout=1.0)
    assert not done, "wait_for_change returned though nothing was committed"
    await store.commit(Commit(entries=[ui(task.id, "x")]))
    await asyncio.wait_for(waiter, 30)


async def test_renew_leases_renews_all_in_one_call_and_reports_the_lost(store: Store) -> None:
    mine = [await make(store) for _ in range(3)]
    gone = await make(store)
    claimed = {}
    for t in [*mine, gone]:
        c = await store.claim_task("w1", task_id=t.id, ttl=5)
        assert c is not None
        claimed[t.id] = c
    # `gone` is taken over by w2 after its lease is released: w1's epoch is stale.
    await store.release_lease(gone.id, claimed[gone.id].lease.epoch)
    assert await store.claim_task("w2", task_id=gone.id, ttl=60) is not None
    held = {tid: c.lease.epoch for tid, c in claimed.items()}
    held["no-such-task"] = 1
    before = {t.id: claimed[t.id].lease.expires_at for t in mine}
    renewal = await store.renew_leases("w1", held, ttl=600)
    assert set(renewal.kept) == {t.id for t in mine}
    assert renewal.lost == {gone.id, "no-such-task"}
    for t in mine:
        row = await store.get_task(t.id)
        assert row.lease.owner == "w1" and row.lease.epoch == held[t.id]
        was = before[t.id]
        assert was is not None and row.lease.expires_at is not None and row.lease.expires_at > was
        assert row.lease.expires_at == renewal.kept[t.id].lease.expires_at
    assert (await store.get_task(gone.id)).lease.owner == "w2"
    # A renewal by a worker that does not own the task loses it, and changes nothing.
    other = await store.renew_leases("w2", {mine[0].id: held[mine[0].id]}, ttl=600)
    assert other.lost == {mine[0].id} and not other.kept
    assert (await store.renew_leases("w1", {}, ttl=5)).kept == {}


async def test_renew_leases_returns_the_control_request_on_the_row(store: Store) -> None:
    task = await make(store)
    c = await store.claim_task("w1", task_id=task.id, ttl=60)
    assert c is not None
    control = {"action": "pause", "rollback": False, "reason": None}
    await store.commit(Commit(patches=[TaskPatch(task.id, {"control": control})]))
    renewal = await store.renew_leases("w1", {task.id: c.lease.epoch}, ttl=60)
    assert renewal.kept[task.id].control == control


async def test_watch_controls_is_told_the_task_a_control_request_was_set_on(
    store: Store,
) -> None:
    task, other = await make(store), await make(store)
    told: list[str] = []
    arrived = asyncio.Event()

    listening = asyncio.Event()

    def noted(task_id: str | None) -> None:
        if task_id is None:  # listening (re)started: anything before may be unheard
            listening.set()
            return
        told.append(task_id)
        arrived.set()

    stop = store.watch_controls(noted)
    try:
        if getattr(store, "listening", None) is False and store.url.startswith("postgres"):
            # Its notices come through LISTEN even from this process: wait until
            # the listener is in place, as the worker's heartbeat covers the gap.
            await asyncio.wait_for(listening.wait(), 30)
        c = await store.claim_task("w1", task_id=task.id, ttl=60)
        assert c is not None
        await store.commit(Commit(entries=[ui(other.id, "not a control request")]))
        assert told == []
        control = {"action": "abort", "rollback": False, "reason": "enough"}
        await store.commit(Commit(patches=[TaskPatch(task.id, {"control": control})]))
        await asyncio.wait_for(arrived.wait(), 30)
        assert told == [task.id]
        # The owner's own commits keep the request on the row: no second notice
        # (notices arrive in commit order, so the next one proves none came).
        arrived.clear()
        await store.commit(Commit(fence={task.id: c.lease.epoch}, entries=[ui(task.id, "x")]))
        await store.commit(Commit(patches=[TaskPatch(other.id, {"control": control})]))
        await asyncio.wait_for(arrived.wait(), 30)
        assert told == [task.id, other.id]
    finally:
        stop()


@pytest.mark.slow
async def test_model_view_keeps_commit_order_across_many_interleaved_commits(store: Store) -> None:
    a, b = await make(store), await make(store)
    expected = []
    for i in range(120):
        msg = UserMessage(content=f"a{i}") if i % 2 else AssistantMessage(content=f"a{i}")
        expected.append(f"a{i}")
        await store.commit(
            Commit(
                entries=[api(b.id, UserMessage(content=f"b{i}")), ui(a.id, "noise"), api(a.id, msg)]
            )
        )
    view = await store.model_view(a.id)
    assert [m.content for m in view] == expected
    assert [m.content for m in await store.model_view(b.id)] == [f"b{i}" for i in range(120)]
    assert await store.model_view((await make(store)).id) == []
    assert [m["content"] for m in await store.model_view_data(a.id)] == expected
    assert await store.model_view_data((await make(store)).id) == []


async def test_among_many_running_tasks_the_expired_lease_is_found_and_the_earliest_end_woken_for(
    store: Store,
) -> None:
    """A claim takes the one lapsed lease among many running tasks, and next_wake_at is
    the earliest lease end (both now read the lease index; test_store_sqlite counts it)."""
    tasks = [await make(store) for _ in range(30)]
    for t in tasks[:-2]:
        assert await store.claim_task("w", task_id=t.id, ttl=3600) is not None
    soon, expired = tasks[-2], tasks[-1]
    assert await store.claim_task("w", task_id=soon.id, ttl=60) is not None
    lapsed = await store.claim_task("w", task_id=expired.id, ttl=-1)  # its lease already over
    assert lapsed is not None
    nxt = await store.next_wake_at()
    assert nxt is not None and nxt <= datetime.now(UTC)  # the lapsed lease: now
    taken = await store.claim_task("w2", ttl=3600)
    assert taken is not None and taken.id == expired.id
    assert taken.lease.epoch == lapsed.lease.epoch + 1 and taken.lease.owner == "w2"
    assert await store.claim_task("w2") is None  # every other lease still runs
    nxt = await store.next_wake_at()
    assert nxt is not None
    assert timedelta(seconds=50) < nxt - datetime.now(UTC) < timedelta(seconds=61)


def _behind_the_store(store: Store, sqlite_sql: str, pg_sql: str, *params: Any) -> list[Any]:
    """Run one statement on the store's file or schema behind its back (PostgreSQL's
    names its schema `{0}`); its rows."""
    if isinstance(store, SQLiteStore):
        with closing(sqlite3.connect(store.path)) as db, db:
            return db.execute(sqlite_sql, params).fetchall()
    assert isinstance(store, PostgresStore) and store.schema is not None
    with psycopg.connect(require_postgres(), autocommit=True) as pg:
        cur = pg.execute(sql.SQL(pg_sql).format(sql.Identifier(store.schema)), params)
        return cur.fetchall() if cur.description else []


def _set_last_seq(store: Store, task_id: str, seq: int) -> None:
    """Set a task's last seq behind the store's back, in its column and its data."""
    _behind_the_store(
        store,
        "UPDATE tasks SET last_seq=?, data=json_set(data, '$.last_seq', ?) WHERE id=?",
        "UPDATE {0}.tasks SET last_seq = %s,"
        " data = jsonb_set(data::jsonb, '{{last_seq}}', to_jsonb(%s::bigint))::text"
        " WHERE id = %s",
        seq,
        seq,
        task_id,
    )


@pytest.mark.parametrize("kind", ["sqlite", "sqlite-full", "postgres", "postgres-psycopg"])
async def test_a_task_past_the_last_seq_an_entry_key_holds_is_refused_and_nothing_written(
    kind: str, tmp_path: Path
) -> None:
    """The SQL stores keep a task's seqs in the low 32 bits of its entries' keys:
    the entry with seq MAX_SEQ is stored, the one after it is refused with a
    clear error and writes nothing (no key of the next task's is taken)."""
    async with opened_store(kind, tmp_path) as store:
        task, _ = await store.create_task(Task(agent="a"))
        _set_last_seq(store, task.id, MAX_SEQ - 1)
        last = NewEntry(task_id=task.id, kind=EntryKind.CHECKPOINT, payload={"n": "last"})
        await store.commit(Commit(entries=[last]))
        assert [e.seq for e in await store.entries(task.id)] == [MAX_SEQ]
        beyond = NewEntry(task_id=task.id, kind=EntryKind.CHECKPOINT, payload={"n": "beyond"})
        with pytest.raises(StoreError, match="at most 4,294,967,295 entries"):
            await store.commit(Commit(entries=[beyond]))
        assert [e.payload for e in await store.entries(task.id)] == [{"n": "last"}]
        assert (await store.get_task(task.id)).last_seq == MAX_SEQ


def _stored_payloads(store: Store, task_id: str) -> list[dict[str, Any]]:
    """A task's payloads as the file or the server holds them, in seq order."""
    rows = _behind_the_store(
        store,
        "SELECT e.payload FROM entry_rows e JOIN tasks t ON t.num = e.task_num"
        " WHERE t.id = ? ORDER BY e.seq",
        "SELECT e.payload FROM {0}.entries e JOIN {0}.tasks t ON e.eid >> 32 = t.num"
        " WHERE t.id = %s ORDER BY e.eid",
        task_id,
    )
    return [json.loads(r[0]) for r in rows]


def _restore_payloads(store: Store, task_id: str, texts: list[str]) -> None:
    """Write payload texts over a task's first entries behind the store's back."""
    for seq, text in enumerate(texts, 1):
        _behind_the_store(
            store,
            "UPDATE entries SET payload = ?"
            " WHERE eid = ((SELECT num FROM tasks WHERE id = ?) << 32) + ?",
            "UPDATE {0}.entries SET payload = %s"
            " WHERE eid = ((SELECT num FROM {0}.tasks WHERE id = %s) << 32) + %s",
            text,
            task_id,
            seq,
        )


@pytest.mark.parametrize("kind", ["sqlite", "sqlite-full", "postgres", "postgres-psycopg"])
async def test_a_payload_reads_back_as_written_though_its_defaults_are_not_stored(
    kind: str, tmp_path: Path
) -> None:
    """The SQL stores leave an intent's replay "never" and a result's outcome "ok"
    out of the stored payload (two of a round's three rows) and give them back on
    reading; any other value is stored, and a row that has the field reads the same."""
    written = [
        (EntryKind.TOOL_INTENT, {"call_id": "c1", "name": "send", "replay": "never"}),
        (EntryKind.TOOL_INTENT, {"call_id": "c2", "name": "look", "replay": "safe"}),
        (EntryKind.TOOL_RESULT, {"role": "tool", "tool_call_id": "c1", "content": "sent"}),
        (EntryKind.TOOL_RESULT, {"role": "tool", "tool_call_id": "c2", "content": "x"}),
        (EntryKind.CHECKPOINT, {"type": "started", "call_id": "c1", "replay": "never"}),
    ]
    written[2][1]["outcome"] = "ok"
    written[3][1]["outcome"] = "error"
    async with opened_store(kind, tmp_path) as store:
        task, _ = await store.create_task(Task(agent="a"))
        res = await store.commit(
            Commit(entries=[NewEntry(task_id=task.id, kind=k, payload=p) for k, p in written])
        )
        assert [e.payload for e in res.entries] == [p for _, p in written]
        read = await store.entries(task.id)
        assert [(e.kind, e.payload) for e in read] == written
        assert read == res.entries  # times too: kept as the store keeps them
        assert _stored_payloads(store, task.id) == [
            {"call_id": "c1", "name": "send"},
            written[1][1],
            {"role": "tool", "tool_call_id": "c1", "content": "sent"},
            written[3][1],
            written[4][1],  # another kind keeps every field
        ]
        # Rows written in full, as before this encoding, read the same.
        _restore_payloads(store, task.id, [json.dumps(p) for _, p in written])
        assert _stored_payloads(store, task.id) == [p for _, p in written]
        assert [(e.kind, e.payload) for e in await store.entries(task.id)] == written


async def test_a_handoff_entry_round_trips_and_stays_out_of_the_model_view(store: Store) -> None:
    task = Task(agent="triage")
    await store.create_task(task, [api(task.id, UserMessage(content="hello"), 1)])
    handoff = {"call_id": "c1", "from": "triage", "to": "billing"}
    await store.commit(
        Commit(
            entries=[
                ui(task.id, "before"),
                NewEntry(task_id=task.id, kind=EntryKind.HANDOFF, round=1, payload=handoff),
            ]
        )
    )
    (got,) = await store.entries(task.id, kinds=[EntryKind.HANDOFF])
    assert (got.seq, got.kind, got.round, got.payload) == (3, EntryKind.HANDOFF, 1, handoff)
    (head,) = await store.entry_heads(task.id, kinds=[EntryKind.HANDOFF])
    assert (head.seq, head.kind, head.round, head.role) == (3, EntryKind.HANDOFF, 1, None)
    assert await store.model_view(task.id) == [UserMessage(content="hello")]
    assert [e.kind for e in await store.entries(task.id)][-1] is EntryKind.HANDOFF
