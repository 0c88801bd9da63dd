"""Seed 000's PersistenceManager operations, one test each, over every store."""

from __future__ import annotations

from duragent.store import Store
from duragent.store._seed import SeedPersistence
from duragent.types import AssistantMessage, Task, TaskStatus, UIError, UIText, UserMessage


async def test_save_and_load_task_state(store: Store) -> None:
    p = SeedPersistence(store)
    task = await p.save_task_state(Task(agent="a", context={"k": 1}))
    loaded = await p.load_task_state(task.id)
    assert loaded is not None and loaded.context == {"k": 1}
    task.context = {"k": 2}
    await p.save_task_state(task)
    assert (await p.load_task_state(task.id)).context == {"k": 2}  # type: ignore[union-attr]
    assert await p.load_task_state("missing") is None


async def test_update_task_state(store: Store) -> None:
    p = SeedPersistence(store)
    task = await p.save_task_state(Task(agent="a"))
    updated = await p.update_task_state(task.id, {"status": TaskStatus.PAUSED, "error": "x"})
    assert updated.status is TaskStatus.PAUSED and updated.error == "x"


async def test_delete_and_list_task_states(store: Store) -> None:
    p = SeedPersistence(store)
    a = await p.save_task_state(Task(agent="a"))
    b = await p.save_task_state(Task(agent="a"))
    assert {t.id for t in await p.list_task_states()} == {a.id, b.id}
    await p.delete_task_state(a.id)
    assert [t.id for t in await p.list_task_states()] == [b.id]


async def test_append_and_load_api_messages(store: Store) -> None:
    p = SeedPersistence(store)
    t = await p.save_task_state(Task(agent="a"))
    await p.append_api_message(t.id, UserMessage(content="q"))
    await p.append_api_message(t.id, AssistantMessage(content="a"))
    assert [m.content for m in await p.load_api_messages(t.id)] == ["q", "a"]


async def test_save_api_messages_replaces_without_deleting(store: Store) -> None:
    p = SeedPersistence(store)
    t = await p.save_task_state(Task(agent="a"))
    await p.append_api_message(t.id, UserMessage(content="old"))
    await p.save_api_messages(t.id, [UserMessage(content="new")])
    assert [m.content for m in await p.load_api_messages(t.id)] == ["new"]
    assert any(e.payload.get("content") == "old" for e in await store.entries(t.id))


async def test_delete_api_messages(store: Store) -> None:
    p = SeedPersistence(store)
    t = await p.save_task_state(Task(agent="a"))
    await p.append_api_message(t.id, UserMessage(content="q"))
    await p.delete_api_messages(t.id)
    assert await p.load_api_messages(t.id) == []


async def test_save_load_delete_user_messages(store: Store) -> None:
    p = SeedPersistence(store)
    t = await p.save_task_state(Task(agent="a"))
    await p.save_user_messages(t.id, [UIText(text="hi"), UIError(message="boom")])
    loaded = await p.load_user_messages(t.id)
    assert [type(m) for m in loaded] == [UIText, UIError]
    await p.save_user_messages(t.id, [UIText(text="only")])
    assert [m.text for m in await p.load_user_messages(t.id)] == ["only"]  # type: ignore[union-attr]
    await p.delete_user_messages(t.id)
    assert await p.load_user_messages(t.id) == []


async def test_save_load_delete_task_input(store: Store) -> None:
    p = SeedPersistence(store)
    t = await p.save_task_state(Task(agent="a", input="first"))
    assert await p.load_task_input(t.id) == "first"
    await p.save_task_input(t.id, {"text": "second", "files": ["a"]})
    assert await p.load_task_input(t.id) == {"text": "second", "files": ["a"]}
    await p.delete_task_input(t.id)
    assert await p.load_task_input(t.id) is None
