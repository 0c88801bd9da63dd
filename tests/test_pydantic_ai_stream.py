"""Streaming through the durable wrapper (DurableAgent.run_stream): the model's text
reaches the caller as it is streamed in the worker, each response is one recorded
step, and a recorded response is replayed, not streamed again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

pytest.importorskip("pydantic_ai", reason="the pydantic-ai extra is part of the dev install")

from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel

from duragent import Runtime, TaskStatus, Timing
from duragent.pydantic_ai import DurableAgent
from duragent.types import EntryKind


@pytest.fixture(scope="module", autouse=True)
def warm_pydantic_ai() -> None:
    """Pydantic AI builds its schemas and adapters on first use: paid once, not by a test."""

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
        yield "warm"

    async def once() -> None:
        durable = DurableAgent(PydanticAgent(FunctionModel(unused, stream_function=stream)), "w")
        async with (
            Runtime("memory://", agents=[durable.agent]) as rt,
            durable.run_stream(rt, "up") as run,
        ):
            assert [t async for t in run.stream_text()] == ["warm"]

    asyncio.run(once())


def unused(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    raise AssertionError("a streamed run makes streamed requests only")


async def test_streamed_text_reaches_the_caller_while_the_model_is_still_answering() -> None:
    more = asyncio.Event()
    streamed: list[int] = []

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
        streamed.append(len(messages))
        yield "Hello "
        await more.wait()  # the model holds its answer until the caller saw the first words
        yield "world"

    durable = DurableAgent(PydanticAgent(FunctionModel(unused, stream_function=stream)), "hi")
    async with Runtime("memory://", agents=[durable.agent]) as rt:
        async with durable.run_stream(rt, "greet") as run:
            pieces = []
            async for piece in run.stream_text(delta=True):
                pieces.append(piece)
                more.set()
            assert await run.get_output() == "Hello world"
            result = await run.result()
        assert pieces == ["Hello ", "world"]
        assert await durable.steps(rt, run.task_id) == ["model:1"]
        assert result.task.status is TaskStatus.COMPLETED and streamed == [1]
        # Cumulative, as Pydantic AI's stream_text(): read again after the end.
        assert [t async for t in run.stream_text()] == ["Hello ", "Hello world"]


async def test_a_recorded_streamed_response_is_replayed_not_streamed_again() -> None:
    in_tool = asyncio.Event()
    asked: list[int] = []

    async def stream(
        messages: list[ModelMessage], info: AgentInfo
    ) -> AsyncIterator[str | DeltaToolCalls]:
        n = sum(isinstance(m, ModelResponse) for m in messages) + 1
        asked.append(n)
        if n == 1:
            yield "Let me look. "
            yield {0: DeltaToolCall("look", "{}", tool_call_id="l1")}
        else:
            yield "Found it."

    pyd = PydanticAgent(FunctionModel(unused, stream_function=stream))
    looks: list[int] = []

    @pyd.tool_plain(metadata={"replay": "safe"})
    async def look() -> str:
        looks.append(1)
        if len(looks) == 1:
            in_tool.set()
            await asyncio.Event().wait()  # until the pause cancels it
        return "here"

    durable = DurableAgent(pyd, name="looker", options={"timing": Timing(tool_grace=0.1)})
    async with Runtime("memory://", agents=[durable.agent]) as rt:
        async with durable.run_stream(rt, "find it") as run:
            await in_tool.wait()
            assert (await rt.pause(run.task_id, timeout=30)).status is TaskStatus.PAUSED
            await rt.resume(run.task_id)
            assert await run.get_output(timeout=30) == "Found it."
            text = [t async for t in run.stream_text(delta=True)]
        progress = await rt.store.entries(run.task_id, kinds=[EntryKind.PROGRESS])
    assert asked == [1, 2]  # model:1 was replayed from its record after the resume
    assert [e.payload["step"] for e in progress] == ["model:1", "model:2"]
    assert "".join(text) == "Let me look. Found it."
