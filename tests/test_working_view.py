"""The engine's working view: the model's view as plain data, typed messages built when read."""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

import pytest

from duragent import Agent, BuiltinTools, Runtime, TaskStatus, ToolCall, tool
from duragent.errors import StoreCorrupt
from duragent.llm._base import ModelRequest
from duragent.llm._messages import WorkingView, wire_messages
from duragent.llm._scripted import ScriptedModel
from duragent.store import Commit, Store
from duragent.store._memory import MemoryStore
from duragent.store._sqlite import SQLiteStore
from duragent.store._views import view_data
from duragent.types import (
    AssistantMessage,
    EntryKind,
    FunctionCall,
    NewEntry,
    SystemMessage,
    Task,
    ToolCallData,
    ToolMessage,
    UserMessage,
    dump_message,
)

CALL = ToolCallData(id="c1", function=FunctionCall(name="f", arguments='{"a": 1}'))
HISTORY = [
    UserMessage(content="q"),
    AssistantMessage(content="calling f", tool_calls=[CALL]),
    ToolMessage(tool_call_id="c1", content="r"),
]


def stored(messages: list[Any]) -> list[dict[str, Any]]:
    return [dump_message(m) for m in messages]


def test_messages_are_typed_when_read_and_each_is_built_once() -> None:
    view = WorkingView(stored(HISTORY))
    system = SystemMessage(content="be brief")
    asked = view.messages([system])
    assert len(asked) == 4
    assert list(asked) == [system, *HISTORY]
    assert asked[2] is asked[2] and asked[-1] is list(asked)[-1]
    assert asked[1:3] == HISTORY[:2] and asked[::-1] == [*reversed(HISTORY), system]
    assert asked[:2] == [system, HISTORY[0]] and asked[3:1] == [] and asked[-2:] == HISTORY[1:]
    assert asked.typed_list() == [system, *HISTORY]
    with pytest.raises(IndexError):
        asked[4]
    # The next call's messages share what was built: the same objects, not copies.
    view.append(AssistantMessage(content="done"))
    later = view.messages()
    assert later[0] is asked[1] and later[3] == AssistantMessage(content="done")
    assert later.wire() == stored([*HISTORY, AssistantMessage(content="done")])


def test_a_model_call_keeps_seeing_what_it_was_asked_after_the_view_grows() -> None:
    view = WorkingView(stored(HISTORY[:1]))
    asked = view.messages()
    view.append(AssistantMessage(content="a"))
    assert list(asked) == HISTORY[:1] and len(asked) == 1
    assert asked.wire() == stored(HISTORY[:1])
    assert asked == HISTORY[:1]


def test_the_wire_form_is_what_typed_messages_dump_to_and_builds_none() -> None:
    data = stored(HISTORY)
    data.append({"role": "robot", "content": "not an API message"})
    view = WorkingView(data)
    asked = view.messages([SystemMessage(content="s")])
    # OpenAIChat sends the wire form: nothing is typed, so nothing is refused.
    assert wire_messages(asked) == [{"role": "system", "content": "s"}, *data]
    assert wire_messages([SystemMessage(content="s"), *HISTORY]) == wire_messages(asked)[:4]
    # A model that reads typed messages finds the damage, named as such.
    assert asked[3] == HISTORY[2]
    with pytest.raises(StoreCorrupt, match="not a valid API message"):
        list(asked)


async def test_the_scripted_model_reads_a_resumed_view_as_typed_messages() -> None:
    seen: list[list[Any]] = []

    def answer(messages: list[Any]) -> str:
        seen.append(messages)
        return "ok"

    request = ModelRequest(model="m", messages=WorkingView(stored(HISTORY)).messages())
    events = [e async for e in ScriptedModel(answer).stream(request)]
    assert events and seen == [HISTORY] and isinstance(seen[0], list)


def test_text_that_is_not_a_list_of_messages_is_store_corrupt() -> None:
    with pytest.raises(StoreCorrupt, match="not valid JSON"):
        view_data('[{"role": "user", "content": "q"')
    with pytest.raises(StoreCorrupt, match="not a list of message objects"):
        view_data('[{"role": "user", "content": "q"}, 7]')
    assert view_data("[]") == []


async def _damage(store: Store, task_id: str, seq: int, payload: str) -> None:
    """Overwrite one stored payload behind the store's back, as a damaged disk would."""
    if isinstance(store, SQLiteStore):
        conn = sqlite3.connect(store.path)
        with conn:
            conn.execute(
                "UPDATE entries SET payload=?"
                " WHERE eid=(SELECT num << 32 FROM tasks WHERE id=?) + ?",
                (payload, task_id, seq),
            )
        conn.close()
    elif isinstance(store, MemoryStore):  # and the JSONL store, which reads from memory
        rows = store._entries[task_id]
        rows[:] = [(s, k, r, payload if s == seq else p, c) for s, k, r, p, c in rows]
    else:
        import psycopg
        from psycopg import sql

        from conftest import PG_URL

        with psycopg.connect(PG_URL, autocommit=True) as pg:
            schema = store.schema  # type: ignore[attr-defined]
            pg.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            pg.execute(
                "UPDATE entries SET payload = %s"
                " WHERE eid = ((SELECT num FROM tasks WHERE id = %s) << 32) + %s",
                (payload, task_id, seq),
            )


async def test_a_damaged_payload_in_the_view_is_store_corrupt(store: Store) -> None:
    task, _ = await store.create_task(Task(agent="a"))
    entries = [
        NewEntry(task_id=task.id, kind=EntryKind.API_MESSAGE, payload=dump_message(m))
        for m in HISTORY[:2]
    ]
    res = await store.commit(Commit(entries=entries))
    assert await store.model_view_data(task.id) == stored(HISTORY[:2])
    await _damage(store, task.id, res.entries[1].seq, '{"role": "assistant", "cont')
    with pytest.raises(StoreCorrupt, match="not valid JSON"):
        await store.model_view_data(task.id)


def relay_agent(seen: list[list[str]]) -> Agent:
    """Three calls in one round, finishing last to first: each waits for the next."""
    done = {name: asyncio.Event() for name in ("a", "b", "c")}

    @tool
    async def step(name: str) -> str:
        """One leg of the relay."""
        after = {"a": "b", "b": "c"}.get(name)
        if after is not None:
            await done[after].wait()
        done[name].set()
        return f"leg {name}"

    def say(messages: list[Any]) -> Any:
        results = [m.content for m in messages if isinstance(m, ToolMessage)]
        if not results:
            return [ToolCall("step", {"name": n}) for n in ("a", "b", "c")]
        seen.append(results)
        return "relayed"

    return Agent(
        name="relay", model=ScriptedModel(say), tools=[step], builtin_tools=BuiltinTools(plan=False)
    )


async def test_parallel_results_reach_the_model_in_call_order(store: Store) -> None:
    seen: list[list[str]] = []
    async with Runtime(store, agents=[relay_agent(seen)]) as rt:
        sub = await rt.submit("relay", "go")
        task = await sub.wait(20)
        view = await rt.model_view(task.id)
        finished = [  # the log keeps them as they finished
            e.payload["content"]
            for e in await store.entries(task.id)
            if e.kind is EntryKind.TOOL_RESULT
        ]
        resumed = WorkingView(await store.model_view_data(task.id))  # what a takeover reads
    assert task.status is TaskStatus.COMPLETED
    assert finished == ["leg c", "leg b", "leg a"]
    in_order = ["leg a", "leg b", "leg c"]
    assert seen == [in_order]  # the model call after the round
    assert [m.content for m in view if isinstance(m, ToolMessage)] == in_order
    assert [m.content for m in resumed.messages() if isinstance(m, ToolMessage)] == in_order


def test_a_result_re_run_after_a_takeover_goes_to_its_call_s_place() -> None:
    """Calls a, b, c; a and c were answered before a crash, b is run again by the
    next owner: the model sees a, b, c (the view from the store, then b appended)."""
    calls = [
        {"id": c, "type": "function", "function": {"name": "step", "arguments": "{}"}}
        for c in "abc"
    ]
    view = WorkingView(
        [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": None, "tool_calls": calls},
            {"role": "tool", "tool_call_id": "a", "content": "leg a"},
            {"role": "tool", "tool_call_id": "c", "content": "leg c"},
        ]
    )
    view.append(ToolMessage(tool_call_id="b", content="leg b"))
    sent = view.messages()
    assert [m.tool_call_id for m in sent if isinstance(m, ToolMessage)] == ["a", "b", "c"]
    assert [m.get("tool_call_id") for m in sent.wire()][2:] == ["a", "b", "c"]
