"""Replacing a compacted task's messages voids its compactions too (the rollback rule)."""

from __future__ import annotations

import json

from duragent import Runtime, ScriptedModel, Store, TaskStatus
from duragent.store._seed import SeedPersistence
from duragent.store._views import build_model_view
from duragent.types import EntryKind, UserMessage
from support.long_task import WindowedModel, agent_with, long_task_script


async def test_replacing_a_compacted_tasks_messages_leaves_only_the_new_ones(store: Store) -> None:
    model = WindowedModel(ScriptedModel(long_task_script(20)), window=6_000)
    async with Runtime(store, agents=[agent_with(model, window=6_000)]) as rt:
        task = await (await rt.submit("long", "Fetch every page.")).wait(timeout=120)
    assert task.status is TaskStatus.COMPLETED, task.error
    assert await store.entries(task.id, kinds=[EntryKind.COMPACTION])
    seed = SeedPersistence(store)
    await seed.save_api_messages(task.id, [UserMessage(content="only me")])
    assert [m.content for m in await seed.load_api_messages(task.id)] == ["only me"]
    assert [m["content"] for m in await store.model_view_data(task.id)] == ["only me"]
    assert "compacted" not in (await store.get_task(task.id)).config
    await seed.append_api_message(task.id, UserMessage(content="and me"))
    assert [m.content for m in await seed.load_api_messages(task.id)] == ["only me", "and me"]


def row(seq: int, kind: EntryKind, payload: dict[str, object]) -> tuple[int, str, str]:
    return seq, kind.value, json.dumps(payload)


def user(seq: int, text: str) -> tuple[int, str, str]:
    return row(seq, EntryKind.API_MESSAGE, {"role": "user", "content": text})


def test_a_rollback_into_a_compactions_range_voids_it_and_the_earlier_one_stands() -> None:
    head = [{"role": "user", "content": "summary A"}]
    later = [{"role": "user", "content": "summary B"}]
    rows = [
        *(user(s, f"m{s}") for s in (1, 2, 3, 4)),
        row(5, EntryKind.COMPACTION, {"upto": 3, "head": head}),
        *(user(s, f"m{s}") for s in (6, 7, 8)),
        row(9, EntryKind.COMPACTION, {"upto": 8, "head": later}),
        user(10, "m10"),
        # An open round's rollback (after B's range) leaves B standing.
        row(11, EntryKind.ROLLBACK, {"from_seq": 10, "to_seq": 10, "reason": "retry"}),
    ]
    assert [m.content for m in build_model_view(rows)] == ["summary B"]
    # One reaching into B's range voids B: A stands, with what follows it unvoided.
    rows.append(row(12, EntryKind.ROLLBACK, {"from_seq": 7, "to_seq": 11, "reason": "x"}))
    rows.append(user(13, "m13"))
    assert [m.content for m in build_model_view(rows)] == ["summary A", "m4", "m6", "m13"]
