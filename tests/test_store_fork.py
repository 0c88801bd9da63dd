"""What every store does for a fork: entry heads to plan it, and a copy made inside the store."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import BaseModel

from duragent.errors import Conflict, TaskNotFound
from duragent.store import Commit, Store, TaskPatch, TaskQuery, open_store
from duragent.store.base import CopyEntries, EntryHead
from duragent.store.jsonl import JSONLStore
from duragent.store.purge import purge
from duragent.store.sqlite import SQLiteStore
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
