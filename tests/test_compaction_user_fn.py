"""A user's compact function: what it returns is checked before anything is committed."""

from __future__ import annotations

from typing import Any

import pytest

from duragent import Runtime, ScriptedModel, Store, TaskStatus
from duragent.types import EntryKind
from support.long_task import WindowedModel, agent_with, long_task_script


def raises(old: list[dict[str, Any]]) -> str:
    raise ValueError("my summariser is broken")


def returns_none(old: list[dict[str, Any]]) -> Any:
    return None


async def malformed(old: list[dict[str, Any]]) -> Any:
    return [{"role": "wizard", "content": "hi"}]


def not_a_list_of_dicts(old: list[dict[str, Any]]) -> Any:
    return ["just text"]


@pytest.mark.parametrize(
    ("compact", "said"),
    [
        (raises, "ContextPolicy(compact=raises) raised ValueError: my summariser is broken"),
        (returns_none, "ContextPolicy(compact=returns_none) returned NoneType: it must return"),
        (malformed, "ContextPolicy(compact=malformed) returned a list that is not API messages"),
        (not_a_list_of_dicts, "returned a list that is not API messages (at 0"),
    ],
)
async def test_a_failing_or_malformed_compact_function_fails_the_task_storing_nothing(
    store: Store, compact: Any, said: str
) -> None:
    model = WindowedModel(ScriptedModel(long_task_script(30)), window=6_000)
    agent = agent_with(model, window=6_000, elide_over=100_000, compact=compact)
    async with Runtime(store, agents=[agent]) as rt:
        task = await (await rt.submit("long", "Fetch every page.")).wait(timeout=120)
    assert task.status is TaskStatus.FAILED
    assert task.error is not None and said in task.error and "\n" not in task.error
    assert await store.entries(task.id, kinds=[EntryKind.COMPACTION]) == []
    assert "compacted" not in task.config


async def test_messages_a_compact_function_returns_are_stored_in_wire_form(store: Store) -> None:
    def compact(old: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"role": "user", "content": "Fetched pages; last step 99."}]

    model = WindowedModel(ScriptedModel(long_task_script(30)), window=6_000)
    agent = agent_with(model, window=6_000, elide_over=100_000, compact=compact)
    async with Runtime(store, agents=[agent]) as rt:
        task = await (await rt.submit("long", "Fetch every page.")).wait(timeout=120)
    assert task.status is TaskStatus.COMPLETED, task.error
    heads = [e.payload["head"] for e in await store.entries(task.id, kinds=[EntryKind.COMPACTION])]
    assert heads and all(h[-1]["content"] == "Fetched pages; last step 99." for h in heads)
