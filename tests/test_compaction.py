"""Compaction: a long task's model view kept inside a small context window by
committed `compaction` entries, on every store; nothing of the log lost."""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import AsyncIterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from conftest import PG_URL, drop_schema, require_postgres
from duragent import (
    Agent,
    ContextPolicy,
    InvalidOption,
    ModelError,
    Runtime,
    ScriptedModel,
    Store,
    TaskStatus,
)
from duragent.llm._base import ModelRequest, StreamEvent
from duragent.llm._windows import context_window, is_overflow, overflow_numbers
from duragent.store import open_store
from duragent.types import EntryKind
from support.long_task import (
    SIZE,
    WindowedModel,
    agent_with,
    fetch,
    last_step_in,
    long_task_script,
)


async def run(store: Store, agent: Agent, timeout: float = 120) -> Any:
    async with Runtime(store, agents=[agent]) as rt:
        sub = await rt.submit("long", "Fetch every page, one by one.")
        task = await sub.wait(timeout=timeout)
        return task, await rt.model_view(task.id)


async def test_a_long_task_finishes_through_a_small_window(store: Store) -> None:
    model = WindowedModel(ScriptedModel(long_task_script(60)), window=8_000)
    task, view = await run(store, agent_with(model, window=8_000))
    assert task.status is TaskStatus.COMPLETED, task.error
    assert task.output == "All 60 steps done."
    assert model.refused == 0 and max(model.sizes) <= 8_000
    compactions = await store.entries(task.id, kinds=[EntryKind.COMPACTION])
    assert compactions, "a 60-round task of 3,000-character results must compact"
    # Nothing is lost: every result is stored whole, every call once.
    results = await store.entries(task.id, kinds=[EntryKind.TOOL_RESULT])
    assert [r.payload["content"].split(":")[0] for r in results] == [
        f"page {n}" for n in range(1, 61)
    ]
    assert all(len(r.payload["content"]) > SIZE for r in results)
    # The view starts with the task's words, and reads from the last compaction on.
    assert view[0].role == "user" and view[0].content == "Fetch every page, one by one."
    assert len(view) < 60
    last = compactions[-1].payload
    assert len(view) == len(last["head"]) + sum(
        1
        for e in await store.entries(task.id, after_seq=last["upto"])
        if e.kind in (EntryKind.API_MESSAGE, EntryKind.TOOL_RESULT)
    )
    # The page shows it.
    notes = [m for m in await store.ui_messages(task.id) if m.type == "notice"]
    assert any("to fit the context window" in n.message for n in notes)


async def test_elision_comes_first_and_a_summary_when_it_is_not_enough(store: Store) -> None:
    model = WindowedModel(ScriptedModel(long_task_script(40)), window=6_000)
    task, view = await run(store, agent_with(model, window=6_000, keep_rounds=2))
    assert task.status is TaskStatus.COMPLETED, task.error
    hows = [e.payload["how"] for e in await store.entries(task.id, kinds=[EntryKind.COMPACTION])]
    assert hows[0] == "elided" and "summarised" in hows
    summary = next(m for m in view if m.role == "user" and "[Summary of rounds" in m.content)
    assert "last step" in summary.content


@pytest.mark.parametrize("name", ["unknown-llm", "gpt-4o"])
async def test_an_overflow_answer_teaches_the_window(store: Store, name: str) -> None:
    # Unknown to the table, or a local server whose window is smaller than the table's.
    model = WindowedModel(ScriptedModel(long_task_script(40)), window=7_000, name=name)
    assert context_window(name) in (None, 128_000)
    task, _view = await run(store, agent_with(model))
    assert task.status is TaskStatus.COMPLETED, task.error
    assert model.refused >= 1  # it learned the window from the provider's answer
    kinds = await store.entries(task.id, kinds=[EntryKind.COMPACTION])
    assert kinds[0].payload["reason"] == "overflow"


async def test_a_view_that_cannot_fit_fails_the_task_saying_what_to_change(store: Store) -> None:
    model = WindowedModel(ScriptedModel(long_task_script(5)), window=1_000)
    agent = Agent(
        name="long",
        model=model,
        tools=[fetch],
        instructions="Be thorough. " * 400,
        context=ContextPolicy(window=1_000),
    )
    task, _view = await run(store, agent)
    assert task.status is TaskStatus.FAILED
    assert "cannot be made to fit the model's context window" in (task.error or "")
    assert "larger window" in (task.error or "")


async def test_compaction_off_leaves_an_overflow_to_fail_the_task(store: Store) -> None:
    model = WindowedModel(ScriptedModel(long_task_script(30)), window=6_000)
    task, _view = await run(store, agent_with(model, enabled=False))
    assert task.status is TaskStatus.FAILED
    assert "prompt is too long" in (task.error or "")
    assert "compaction is off" in (task.error or "")


async def test_a_window_set_too_large_is_corrected_by_the_provider(store: Store) -> None:
    # The agent says 100,000 tokens; the provider refuses past 3,000: each refusal
    # compacts as far as it takes, and the task finishes.
    model = WindowedModel(ScriptedModel(long_task_script(30)), window=3_000)
    task, _view = await run(store, agent_with(model, window=100_000))
    assert task.status is TaskStatus.COMPLETED, task.error
    assert model.refused >= 1


async def test_a_fork_before_a_compaction_sees_the_whole_view(store: Store) -> None:
    model = WindowedModel(ScriptedModel(long_task_script(40)), window=6_000)
    agent = agent_with(model, window=6_000)
    async with Runtime(store, agents=[agent]) as rt:
        sub = await rt.submit("long", "Fetch every page, one by one.")
        task = await sub.wait(timeout=120)
        assert task.status is TaskStatus.COMPLETED, task.error
        (first, *_rest) = await store.entries(task.id, kinds=[EntryKind.COMPACTION])
        before = first.round - 1  # the last round closed before the first compaction
        fork = await rt.fork(task.id, before)
        view = await rt.model_view(fork.task_id)
        forked = await store.get_task(fork.task_id)
    assert "compacted" not in forked.config
    assert not any("[Summary" in (m.content or "") or "elided" in (m.content or "") for m in view)
    assert sum(1 for m in view if m.role == "tool") == before  # every result, whole
    assert all(len(m.content) > SIZE for m in view if m.role == "tool")


def test_provider_overflow_answers_are_recognised_whatever_the_wording() -> None:
    openai = (
        "This model's maximum context length is 16385 tokens. However, your messages "
        "resulted in 17002 tokens. Please reduce the length of the messages."
    )
    assert is_overflow(400, "context_length_exceeded", "anything")
    assert is_overflow(400, None, openai)
    assert overflow_numbers(openai) == (17002, 16385)
    anthropic = "prompt is too long: 210012 tokens > 200000 maximum"
    assert is_overflow(400, None, anthropic)
    assert overflow_numbers(anthropic) == (210012, 200000)
    assert is_overflow(400, None, "Input is too long for requested model.")
    assert is_overflow(413, None, "the request exceeds the model's context window")
    assert not is_overflow(400, None, "tools[0].name is invalid")
    assert not is_overflow(429, None, "too many tokens per minute")  # a rate limit
    assert context_window("gpt-4o-mini-2024-07-18") == 128_000
    assert context_window("openai:claude-3-5-sonnet-latest") == 200_000


@pytest.mark.parametrize(
    "bad", [{"target": 0.9, "threshold": 0.8}, {"window": 10}, {"keep_rounds": -1}]
)
def test_a_bad_policy_is_refused_in_one_line(bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidOption, match="ContextPolicy"):
        ContextPolicy(**bad)


async def test_a_user_function_compacts_and_pinned_messages_stay(store: Store) -> None:
    asked: list[int] = []

    async def compact(old: list[dict[str, Any]]) -> str:
        asked.append(len(old))
        return f"My own summary: last step {last_step_in(json.dumps(old))}."

    def pinned(m: Any) -> bool:
        return m.get("role") == "tool" and str(m.get("content", "")).startswith("page 2:")

    model = WindowedModel(ScriptedModel(long_task_script(30)), window=6_000)
    agent = agent_with(model, window=6_000, compact=compact, pinned=pinned, elide_over=100_000)
    task, view = await run(store, agent)
    assert task.status is TaskStatus.COMPLETED, task.error
    assert asked and model.refused == 0
    texts = [m.content or "" for m in view]
    assert any(t.startswith("[Summary of rounds") and "My own summary" in t for t in texts)
    # Pinned: kept however old, as text (a result without its call is refused by providers).
    assert any(t.startswith("[Pinned tool result]\npage 2:") for t in texts)
    called: set[str] = set()
    for m in view:  # every result in the view answers a call the view holds
        called |= {c.id for c in getattr(m, "tool_calls", None) or ()}
        assert m.role != "tool" or m.tool_call_id in called


class FailingOnce:
    """A summariser whose first call fails (a refused request), the rest answer."""

    name = "summariser"

    def __init__(self) -> None:
        self.calls = 0

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        self.calls += 1
        if self.calls == 1:
            raise ModelError("the summariser's provider refused the request")
        text = f"Fetched pages; last step {last_step_in(request.messages[1].content)}."
        async for event in ScriptedModel([text]).stream(ModelRequest(model="s", messages=[])):
            yield event


async def test_a_failed_summary_before_any_overflow_does_not_fail_the_task(store: Store) -> None:
    summariser = FailingOnce()
    model = WindowedModel(ScriptedModel(long_task_script(30)), window=6_000)
    agent = agent_with(model, window=6_000, summarizer=summariser, elide_over=100_000)
    task, _view = await run(store, agent)
    assert task.status is TaskStatus.COMPLETED, task.error
    assert summariser.calls >= 2 and model.refused == 0
    assert await store.entries(task.id, kinds=[EntryKind.COMPACTION])


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_a_compacted_view_is_read_from_the_last_compaction_on(
    tmp_path: Path, kind: str
) -> None:
    """Resume stays flat: entries before the last compaction are never read for the view.

    Shown by making them unreadable after the task ended: rollback markers whose
    payload is not JSON, which a view built from them would have to parse."""
    schema = f"flat_{uuid.uuid4().hex[:10]}"
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path}/flat.db"
    else:
        url = f"{require_postgres()}?schema={schema}"
    store = open_store(url)
    await store.open()
    try:
        model = WindowedModel(ScriptedModel(long_task_script(40)), window=6_000)
        task, view = await run(store, agent_with(model, window=6_000))
        assert task.status is TaskStatus.COMPLETED, task.error
        upto = (await store.entries(task.id, kinds=[EntryKind.COMPACTION]))[-1].payload["upto"]
    finally:
        await store.close()
    spoil = "UPDATE entries SET kind = {k}, payload = 'not json' WHERE eid BETWEEN {a} AND {b}"
    if kind == "sqlite":
        with closing(sqlite3.connect(f"{tmp_path}/flat.db")) as db, db:
            (num,) = db.execute("SELECT num FROM tasks WHERE id = ?", (task.id,)).fetchone()
            first = num << 32  # an entry's key: its task's number, then its seq
            db.execute(spoil.format(k=6, a=first, b=first + upto))
    else:
        import psycopg

        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f"SET search_path TO {schema}")
            row = conn.execute("SELECT num FROM tasks WHERE id = %s", (task.id,)).fetchone()
            assert row is not None
            first = row[0] << 32
            conn.execute(spoil.format(k="'rollback'", a=first, b=first + upto))
    store = open_store(url)
    await store.open()
    try:
        assert await store.model_view(task.id) == view
        with pytest.raises(ValueError):  # what a read of those entries meets
            await store.entries(task.id)
    finally:
        await store.close()
        if kind == "postgres":
            drop_schema(schema)
