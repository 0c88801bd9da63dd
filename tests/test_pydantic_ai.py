"""Pydantic AI agents as duragent tasks (duragent.pydantic_ai), in one process."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import AsyncIterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pydantic_ai", reason="the pydantic-ai extra is part of the dev install")

from pydantic import BaseModel
from pydantic_ai import Agent as PydanticAgent, ModelRetry, RunContext
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelResponse,
    TextPart,
    ToolCallPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

from duragent import InvalidOption, Runtime, TaskFailed, TaskStatus, Timing
from duragent.pydantic_ai import RUN_TOOL, DurableAgent
from duragent.types import EntryKind
from support.crashlib import HERE


@dataclass
class Deps:
    city: str


class Forecast(BaseModel):
    city: str
    sky: str


@pytest.fixture(scope="module", autouse=True)
def warm_pydantic_ai() -> None:
    """Pydantic AI builds its schemas and adapters on first use: paid once, not by a test."""
    result = asyncio.run(PydanticAgent(TestModel(), output_type=Forecast).run("warm up"))
    ModelMessagesTypeAdapter.validate_python(
        ModelMessagesTypeAdapter.dump_python(result.all_messages(), mode="json")
    )


async def step_names(rt: Runtime, task_id: str) -> list[str]:
    entries = await rt.store.entries(task_id, kinds=[EntryKind.CHECKPOINT])
    return [e.payload["step"] for e in entries if e.payload["type"] == "step"]


async def test_output_type_and_deps_reach_the_run_and_the_task_is_a_task() -> None:
    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart("sky", {}, tool_call_id="s1")])
        told = messages[-1].parts[0].content  # type: ignore[union-attr]
        final = info.output_tools[0].name
        return ModelResponse(parts=[ToolCallPart(final, {"city": "Paris", "sky": told})])

    pyd = PydanticAgent(FunctionModel(answer), deps_type=Deps, output_type=Forecast)

    @pyd.tool
    def sky(ctx: RunContext[Deps]) -> str:
        return f"sunny over {ctx.deps.city}"

    durable = DurableAgent(pyd, name="weather")
    async with Runtime("memory://", agents=[durable.agent]) as rt:
        result = await durable.run(rt, "weather?", deps=Deps("Paris"), timeout=30)
        assert result.output == Forecast(city="Paris", sky="sunny over Paris")
        task = await rt.get(result.task.id)
        assert task.status is TaskStatus.COMPLETED and task.agent == "weather"
        assert Forecast.model_validate_json(task.output) == result.output
        assert await step_names(rt, task.id) == ["model:1", "tool:1:s1", "model:2"]
        intents = await rt.store.entries(task.id, kinds=[EntryKind.TOOL_INTENT])
        assert [(e.payload["name"], e.payload["replay"]) for e in intents] == [(RUN_TOOL, "resume")]
        assert [type(m).__name__ for m in result.messages] == [
            "ModelRequest",
            "ModelResponse",
            "ModelRequest",
            "ModelResponse",
            "ModelRequest",
        ]


async def test_message_history_carries_a_conversation_into_the_next_task() -> None:
    seen: list[int] = []

    def count(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(len(messages))
        return ModelResponse(parts=[TextPart(f"message {len(messages)}")])

    durable = DurableAgent(PydanticAgent(FunctionModel(count)), name="chat")
    async with Runtime("memory://", agents=[durable.agent]) as rt:
        first = await durable.run(rt, "hello", timeout=30)
        second = await durable.run(rt, "again", message_history=first.messages, timeout=30)
    assert (first.output, second.output) == ("message 1", "message 3")
    assert seen == [1, 3] and len(second.messages) == 4


async def test_a_tools_model_retry_goes_back_to_the_model_as_in_pydantic_ai() -> None:
    pyd = PydanticAgent(TestModel(call_tools=["pick"]))
    tries: list[int] = []

    @pyd.tool_plain
    def pick(n: int) -> str:
        tries.append(n)
        if len(tries) == 1:
            raise ModelRetry("try again")
        return "picked"

    durable = DurableAgent(pyd, name="picker")
    async with Runtime("memory://", agents=[durable.agent]) as rt:
        result = await durable.run(rt, "pick one", timeout=30)
        names = await step_names(rt, result.task.id)
    assert len(tries) == 2 and "picked" in result.output
    assert [n.split(":")[0] for n in names] == ["model", "tool", "model", "tool", "model"]


async def test_a_run_that_fails_fails_its_task_with_the_reason() -> None:
    def broken(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        raise RuntimeError("the provider is down")

    durable = DurableAgent(PydanticAgent(FunctionModel(broken)), name="broken")
    async with Runtime("memory://", agents=[durable.agent]) as rt:
        with pytest.raises(TaskFailed, match="the provider is down"):
            await durable.run(rt, "hi", timeout=30)
        (task,) = (await rt.store.list_tasks()).tasks
        assert task.status is TaskStatus.FAILED


def test_deps_that_cannot_be_stored_are_a_clear_error() -> None:
    pyd = PydanticAgent(TestModel(), deps_type=Any)
    durable = DurableAgent(pyd, name="locked")
    with pytest.raises(InvalidOption, match="stored as JSON"):
        durable.context_for(deps=threading.Lock())


def test_an_agent_without_a_model_is_a_clear_error() -> None:
    with pytest.raises(InvalidOption, match="has no model"):
        DurableAgent(PydanticAgent(), name="nomodel")
    with pytest.raises(InvalidOption, match=r"wraps a pydantic_ai\.Agent"):
        DurableAgent(object(), name="x")  # type: ignore[arg-type]


async def test_an_event_stream_handler_sees_the_recorded_response_streamed() -> None:
    events: list[str] = []

    async def handler(ctx: RunContext[None], stream: AsyncIterable[Any]) -> None:
        async for event in stream:
            events.append(type(event).__name__)

    pyd = PydanticAgent(TestModel(custom_output_text="streamed answer"))
    durable = DurableAgent(pyd, name="streamer", event_stream_handler=handler)
    async with Runtime("memory://", agents=[durable.agent]) as rt:
        result = await durable.run(rt, "hi", timeout=30)
        assert await step_names(rt, result.task.id) == ["model:1"]
    assert result.output == "streamed answer"
    assert "PartStartEvent" in events and "FinalResultEvent" in events


async def test_pause_cuts_the_run_short_and_resume_replays_it_from_the_store() -> None:
    asked: list[int] = []
    in_tool, release = asyncio.Event(), asyncio.Event()

    def rounds(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        done = sum(isinstance(m, ModelResponse) for m in messages)
        asked.append(done + 1)
        if done < 2:
            return ModelResponse(parts=[ToolCallPart("work", {"i": done}, tool_call_id=f"w{done}")])
        return ModelResponse(parts=[TextPart("finished")])

    pyd = PydanticAgent(FunctionModel(rounds))
    runs: list[int] = []

    @pyd.tool_plain(metadata={"replay": "safe"})
    async def work(i: int) -> str:
        runs.append(i)
        if i == 1 and not release.is_set():
            in_tool.set()
            await asyncio.Event().wait()  # until the pause cancels it
        return f"worked {i}"

    durable = DurableAgent(pyd, name="pausable", options={"timing": Timing(tool_grace=0.1)})
    async with Runtime("memory://", agents=[durable.agent]) as rt:
        sub = await rt.submit("pausable", "go")
        await in_tool.wait()
        paused = await rt.pause(sub.task_id, timeout=30)
        assert paused.status is TaskStatus.PAUSED
        release.set()
        await rt.resume(sub.task_id)
        result = await durable.result(rt, await sub.wait(timeout=30))
    assert result.output == "finished"
    assert asked == [1, 2, 3]  # the two recorded requests were not asked again
    assert runs == [0, 1, 1]  # the cut-off safe call ran again, the recorded one did not


@pytest.mark.slow
async def test_an_mcp_servers_tool_call_is_a_durable_step(tmp_path: Path) -> None:
    pytest.importorskip("fastmcp", reason="pydantic-ai-slim[mcp] is part of the dev install")
    from fastmcp.client.transports import StdioTransport
    from pydantic_ai.mcp import MCPToolset

    ledger = tmp_path / "ledger.txt"
    script = [str(HERE / "mcp_server.py"), str(ledger)]
    server = StdioTransport(sys.executable, script, keep_alive=False)  # ends with the session

    def call_charge(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            args = {"amount": 5, "idempotency_key": "k1"}
            return ModelResponse(parts=[ToolCallPart("charge", args, tool_call_id="c1")])
        return ModelResponse(parts=[TextPart(f"told: {messages[-1].parts[0].content}")])  # type: ignore[union-attr]

    billing = MCPToolset(server, id="billing")
    pyd = PydanticAgent(FunctionModel(call_charge), toolsets=[billing])
    durable = DurableAgent(pyd, name="billing")
    # Held open here, the server's process ends with this block, before the test's loop.
    async with billing, Runtime("memory://", agents=[durable.agent]) as rt:
        result = await durable.run(rt, "charge 5", timeout=60)
        steps = await durable.steps(rt, result.task.id)
        entries = await rt.store.entries(result.task.id, kinds=[EntryKind.CHECKPOINT])
    assert result.output == "told: charged 5"
    assert steps == ["model:1", "tool:1:c1", "model:2"]
    # Never-replay by default: its start was committed before the server was called.
    assert [e.payload["step"] for e in entries if e.payload["type"] == "step_started"] == [
        "tool:1:c1"
    ]
    assert ledger.read_text().splitlines() == ["charge 5 k1"]


async def test_abort_ends_the_run_and_its_task() -> None:
    in_tool, cancelled = asyncio.Event(), asyncio.Event()

    pyd = PydanticAgent(TestModel(call_tools=["wait"]))

    @pyd.tool_plain
    async def wait() -> str:
        in_tool.set()
        try:
            await asyncio.Event().wait()  # until the abort cancels it
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    durable = DurableAgent(pyd, name="abortable", options={"timing": Timing(tool_grace=0.1)})
    async with Runtime("memory://", agents=[durable.agent]) as rt:
        sub = await rt.submit("abortable", "go")
        await in_tool.wait()
        task = await rt.abort(sub.task_id)
        assert task.status is TaskStatus.ABORTED
        assert cancelled.is_set()
        with pytest.raises(TaskFailed, match="aborted"):
            await durable.result(rt, task)
