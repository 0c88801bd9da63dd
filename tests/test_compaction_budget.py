"""The budget a compaction decides by: the whole request (the output schema too)
against the window less the room the answer needs."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from duragent import (
    Agent,
    ContextOverflow,
    ContextPolicy,
    Runtime,
    ScriptedModel,
    Store,
    TaskStatus,
)
from duragent.llm._base import ModelRequest, StreamEvent
from duragent.llm._windows import overflow_numbers
from duragent.runtime._commits import Commits
from duragent.runtime._compaction import ANSWER_SHARE, Compactor
from duragent.runtime._control import Controls
from duragent.runtime._submit import new_task
from duragent.store import open_store
from duragent.types import EntryKind
from support.long_task import WindowedModel, agent_with, long_task_script

BIG = {
    "type": "object",
    "properties": {"done": {"type": "string", "description": "d" * 8_000}},
    "required": ["done"],
}


async def compactor_of(agent: Agent) -> Compactor:
    store = open_store("memory://")
    await store.open()
    task, first = new_task(agent, "go")
    stored, _ = await store.create_task(task, [first])
    commits = Commits(store, stored, Controls(), state_debounce=1.0, state_max_wait=1.0)

    async def trace(*_a: Any, **_k: Any) -> None:
        return None

    return Compactor(agent, commits, Controls(), trace)


async def test_the_output_schema_counts_in_every_request() -> None:
    plain = Agent(name="a", model=ScriptedModel(["x"]))
    shaped = Agent(name="a", model=ScriptedModel(["x"]), output_type=BIG)
    grown = (await compactor_of(shaped)).budget.fixed - (await compactor_of(plain)).budget.fixed
    assert grown >= 8_000


@pytest.mark.parametrize(
    ("settings", "reserve"),
    [
        ({"max_tokens": 1_500}, 1_500),
        ({"max_completion_tokens": 900}, 900),
        ({"max_tokens": 90_000}, 3_000),  # never more than half the window
        ({}, int(6_000 * ANSWER_SHARE)),
    ],
)
async def test_the_answers_room_is_kept_out_of_the_window(
    settings: dict[str, Any], reserve: int
) -> None:
    agent = Agent(
        name="a",
        model=ScriptedModel(["x"]),
        model_settings=settings,
        context=ContextPolicy(window=6_000),
    )
    assert (await compactor_of(agent))._reserve(6_000) == reserve


def test_an_overflow_message_gives_the_prompts_part_of_the_tokens_requested() -> None:
    said = (
        "This model's maximum context length is 16385 tokens. However, you requested "
        "17000 tokens (16000 in the messages, 1000 in the completion). Please reduce "
        "the length of the messages or completion."
    )
    assert overflow_numbers(said) == (16_000, 16_385)
    newer = (
        "This model's maximum context length is 128000 tokens. However, your messages "
        "resulted in 130511 tokens. Please reduce the length of the messages."
    )
    assert overflow_numbers(newer) == (130_511, 128_000)


class AnswerRoomModel(WindowedModel):
    """A provider that counts the answer's max tokens into the window, as OpenAI does."""

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        room = int(request.settings.get("max_tokens", 0))
        chars = sum(len(json.dumps(m.model_dump())) for m in request.messages)
        if chars // 4 + room > self.window:
            self.refused += 1
            raise ContextOverflow(
                f"maximum context length is {self.window} tokens. However, you requested "
                f"{chars // 4 + room} tokens ({chars // 4} in the messages, {room} in the "
                "completion)",
                tokens=chars // 4,
                limit=self.window,
            )
        return super().stream(request)


async def test_a_long_task_leaves_its_answer_room_and_is_never_refused(store: Store) -> None:
    model = AnswerRoomModel(ScriptedModel(long_task_script(30)), window=6_000)
    agent = agent_with(model, window=6_000)
    agent = Agent(
        name=agent.name,
        model=model,
        tools=list(agent.tools),
        limits=agent.limits,
        context=agent.context,
        model_settings={"max_tokens": 2_000},
    )
    async with Runtime(store, agents=[agent]) as rt:
        task = await (await rt.submit("long", "Fetch every page.")).wait(timeout=120)
    assert task.status is TaskStatus.COMPLETED, task.error
    assert await store.entries(task.id, kinds=[EntryKind.COMPACTION])
    assert model.refused == 0
