"""OpenAI Agents SDK agents as duragent tasks (duragent.openai_agents), in one process.

The SDK's own `OpenAIChatCompletionsModel` talks to a local OpenAI-compatible
server (support.llm_servers), over real sockets; the SDK's tracing is off."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import pytest

pytest.importorskip("agents", reason="the openai-agents extra is part of the dev install")

import httpx2
from agents import (
    Agent as SdkAgent,
    GuardrailFunctionOutput,
    LocalShellTool,
    ModelRetryBackoffSettings,
    ModelRetrySettings,
    ModelSettings,
    OpenAIChatCompletionsModel,
    RunConfig,
    RunContextWrapper,
    RunHooks,
    ToolGuardrailFunctionOutput,
    ToolInputGuardrailData,
    ToolOutputGuardrailData,
    function_tool,
    handoff,
    input_guardrail,
    output_guardrail,
    retry_policies,
    set_tracing_disabled,
    tool_input_guardrail,
    tool_output_guardrail,
)
from agents.mcp import MCPServerStdio
from openai import AsyncOpenAI, DefaultAsyncHttpxClient
from pydantic import BaseModel

from duragent import InvalidOption, Runtime, TaskFailed, TaskStatus, Timing
from duragent.openai_agents import RUN_TOOL, DurableAgent
from duragent.types import EntryKind
from support.llm_servers import Script, ScriptedOpenAIServer, ToolCall

set_tracing_disabled(True)
Serve = Callable[[Script], ScriptedOpenAIServer]


@pytest.fixture
def serve() -> Iterator[Serve]:
    """Start a local OpenAI-compatible server answering a script (closed after the test)."""
    with ExitStack() as servers:

        def start(turns: Script) -> ScriptedOpenAIServer:
            server = ScriptedOpenAIServer(turns, answer_by="history")
            servers.enter_context(server)
            return server

        yield start


def model(server: ScriptedOpenAIServer) -> OpenAIChatCompletionsModel:
    # No kept-alive connections: none is left open when a test's loop ends.
    http = DefaultAsyncHttpxClient(limits=httpx2.Limits(max_keepalive_connections=0))
    client = AsyncOpenAI(base_url=server.base_url, api_key="k", http_client=http)
    return OpenAIChatCompletionsModel("gpt-test", client)


@dataclass
class Shop:
    city: str


class Forecast(BaseModel):
    city: str
    sky: str


async def test_model_calls_and_tool_calls_are_steps_and_the_output_is_typed(serve: Serve) -> None:
    server = serve([[ToolCall("sky", {"city": "Paris"})], '{"city":"Paris","sky":"sunny"}'])
    seen: list[str] = []

    @function_tool
    def sky(wrapper: RunContextWrapper[Shop], city: str) -> str:
        """The sky over a city."""
        seen.append(wrapper.context.city)
        return f"sunny over {city}"

    sdk = SdkAgent(name="weather", model=model(server), tools=[sky], output_type=Forecast)
    durable = DurableAgent(sdk, name="weather", context_type=Shop)
    async with Runtime("memory://", agents=[durable.agent]) as rt:
        result = await durable.run(rt, "weather?", context=Shop("Paris"), timeout=30)
        assert result.final_output == Forecast(city="Paris", sky="sunny")
        assert result.last_agent == "weather" and seen == ["Paris"]
        task = await rt.get(result.task.id)
        assert task.status is TaskStatus.COMPLETED and task.agent == "weather"
        assert await durable.steps(rt, task.id) == ["model:1", "tool:1:call_0_0", "model:2"]
        intents = await rt.store.entries(task.id, kinds=[EntryKind.TOOL_INTENT])
        assert [(e.payload["name"], e.payload["replay"]) for e in intents] == [(RUN_TOOL, "resume")]
    # The tool's result reached the model as the SDK sends it.
    told = server.requests[1].json["messages"][-1]
    assert told == {"role": "tool", "tool_call_id": "call_0_0", "content": "sunny over Paris"}
    assert [i.get("type", "message") for i in result.input_list] == [
        "message",
        "function_call",
        "function_call_output",
        "message",
    ]


def test_run_sync_runs_it_like_runner_run_sync(serve: Serve) -> None:
    server = serve(["hello there"])
    durable = DurableAgent(SdkAgent(name="chat", model=model(server)), name="chat")
    result = durable.run_sync(Runtime("memory://", agents=[durable.agent]), "hi", timeout=30)
    assert result.final_output == "hello there" and result.task.status is TaskStatus.COMPLETED


async def test_an_input_list_carries_a_conversation_into_the_next_task(serve: Serve) -> None:
    server = serve(["first answer", "second answer"])
    durable = DurableAgent(SdkAgent(name="chat", model=model(server)), name="chat")
    async with Runtime("memory://", agents=[durable.agent]) as rt:
        first = await durable.run(rt, "hello", timeout=30)
        again = [*first.input_list, {"role": "user", "content": "again"}]
        second = await durable.run(rt, again, timeout=30)
        assert second.task.input == "again"
    assert (first.final_output, second.final_output) == ("first answer", "second answer")
    sent = [(m["role"], m["content"]) for m in server.requests[1].json["messages"]]
    assert sent == [("user", "hello"), ("assistant", "first answer"), ("user", "again")]


async def test_a_handoff_moves_the_run_to_the_other_agent_and_its_calls_are_steps(
    serve: Serve,
) -> None:
    server = serve(
        [
            [ToolCall("transfer_to_billing", {})],
            [ToolCall("refund", {"amount": 5})],
            "refunded 5",
        ]
    )
    handed: list[str] = []

    @function_tool
    def refund(amount: int) -> str:
        """Refund an amount."""
        return f"refund of {amount} done"

    billing = SdkAgent(
        name="billing", instructions="You do refunds.", model=model(server), tools=[refund]
    )
    triage = SdkAgent(
        name="triage",
        instructions="Route the customer.",
        model=model(server),
        handoffs=[handoff(billing, on_handoff=lambda ctx: handed.append("billing"))],
    )
    billing.handoffs = [triage]  # a cycle: converted once
    durable = DurableAgent(triage, name="support")
    async with Runtime("memory://", agents=[durable.agent]) as rt:
        result = await durable.run(rt, "refund me", timeout=30)
        steps = await durable.steps(rt, result.task.id)
    assert result.final_output == "refunded 5" and result.last_agent == "billing"
    assert handed == ["billing"]
    # The handoff is the SDK's own (no tool step): the recorded response decides it again.
    assert steps == ["model:1", "model:2", "tool:2:call_1_0", "model:3"]
    # The second call was billing's: its instructions and its tool.
    second = server.requests[1].json
    assert second["messages"][0] == {"role": "system", "content": "You do refunds."}
    assert {t["function"]["name"] for t in second["tools"]} == {"refund", "transfer_to_triage"}


async def test_guardrails_run_inside_the_durable_run(serve: Serve) -> None:
    server = serve(["a polite answer"])
    checked: list[str] = []

    @input_guardrail
    def no_secrets(ctx: RunContextWrapper[Any], agent: Any, given: Any) -> GuardrailFunctionOutput:
        checked.append(f"in:{given}")
        return GuardrailFunctionOutput(output_info=None, tripwire_triggered="secret" in str(given))

    @output_guardrail
    def polite(ctx: RunContextWrapper[Any], agent: Any, output: Any) -> GuardrailFunctionOutput:
        checked.append(f"out:{output}")
        return GuardrailFunctionOutput(output_info=None, tripwire_triggered="rude" in output)

    sdk = SdkAgent(
        name="guarded",
        model=model(server),
        input_guardrails=[no_secrets],
        output_guardrails=[polite],
    )
    durable = DurableAgent(sdk, name="guarded")
    rude = sdk.clone(model=model(serve(["a rude answer"])))
    rude_durable = DurableAgent(rude, name="rude")
    async with Runtime("memory://", agents=[durable.agent, rude_durable.agent]) as rt:
        ok = await durable.run(rt, "hello", timeout=30)
        assert ok.final_output == "a polite answer"
        assert checked == ["in:hello", "out:a polite answer"]
        # Each verdict is a step: a replay gets it back without asking the guardrail again.
        assert set(await durable.steps(rt, ok.task.id)) == {
            "guardrail:input:no_secrets",
            "model:1",
            "guardrail:output:polite",
        }
        with pytest.raises(TaskFailed, match="InputGuardrailTripwireTriggered"):
            await durable.run(rt, "tell the secret", timeout=30)
        with pytest.raises(TaskFailed, match="OutputGuardrailTripwireTriggered"):
            await rude_durable.run(rt, "hi", timeout=30)
        tasks = (await rt.store.list_tasks()).tasks
        assert sorted(t.status.value for t in tasks) == ["completed", "failed", "failed"]


async def test_pause_cuts_the_run_short_and_resume_replays_it_from_the_store(serve: Serve) -> None:
    server = serve([[ToolCall("work", {"i": 0})], [ToolCall("work", {"i": 1})], "finished"])
    in_tool, release = asyncio.Event(), asyncio.Event()
    runs: list[int] = []

    @function_tool
    async def work(i: int) -> str:
        """Do some work."""
        runs.append(i)
        if i == 1 and not release.is_set():
            in_tool.set()
            await asyncio.Event().wait()  # until the pause cancels it
        return f"worked {i}"

    guarded: list[str] = []

    @input_guardrail
    async def calm(ctx: RunContextWrapper[Any], agent: Any, given: Any) -> GuardrailFunctionOutput:
        guarded.append(str(given))  # could be a model call of its own
        return GuardrailFunctionOutput(output_info={"calm": True}, tripwire_triggered=False)

    sdk = SdkAgent(name="pausable", model=model(server), tools=[work], input_guardrails=[calm])
    options = {"timing": Timing(tool_grace=0.1)}
    durable = DurableAgent(sdk, name="pausable", safe_tools={"work"}, options=options)
    async with Runtime("memory://", agents=[durable.agent]) as rt:
        sub = await rt.submit("pausable", "go")
        await in_tool.wait()
        paused = await rt.pause(sub.task_id, timeout=30)
        assert paused.status is TaskStatus.PAUSED
        release.set()
        await rt.resume(sub.task_id)
        result = await durable.result(rt, await sub.wait(timeout=30))
    assert result.final_output == "finished"
    assert len(server.requests) == 3  # the two recorded model calls were not asked again
    assert runs == [0, 1, 1]  # the cut-off safe call ran again, the recorded one did not
    assert guarded == ["go"]  # its recorded verdict came back on the replay


async def test_abort_ends_the_run_and_its_task(serve: Serve) -> None:
    server = serve([[ToolCall("wait", {})]])
    in_tool, cancelled = asyncio.Event(), asyncio.Event()

    @function_tool
    async def wait() -> str:
        """Wait forever."""
        in_tool.set()
        try:
            await asyncio.Event().wait()  # until the abort cancels it
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    sdk = SdkAgent(name="abortable", model=model(server), tools=[wait])
    durable = DurableAgent(sdk, name="abortable", options={"timing": Timing(tool_grace=0.1)})
    async with Runtime("memory://", agents=[durable.agent]) as rt:
        sub = await rt.submit("abortable", "go")
        await in_tool.wait()
        task = await rt.abort(sub.task_id)
        assert task.status is TaskStatus.ABORTED and cancelled.is_set()
        with pytest.raises(TaskFailed, match="aborted"):
            await durable.result(rt, task)


def test_what_a_durable_run_cannot_record_is_a_clear_one_line_error() -> None:
    with pytest.raises(InvalidOption, match=r"wraps an agents\.Agent") as err:
        DurableAgent(object(), name="x")  # type: ignore[arg-type]
    mcp = MCPServerStdio(params={"command": "true"})
    with pytest.raises(InvalidOption, match="mcp_servers") as err:
        DurableAgent(SdkAgent(name="m", mcp_servers=[mcp]), name="m")
    assert "\n" not in str(err.value)

    @function_tool(needs_approval=True)
    def pay() -> str:
        """Pay."""
        return "paid"

    helper = SdkAgent(name="payer", tools=[pay])
    with pytest.raises(InvalidOption, match="needs_approval"):  # found through a handoff too
        DurableAgent(SdkAgent(name="front", handoffs=[helper]), name="front")
    with pytest.raises(InvalidOption, match="needs_approval"):  # and a handoff() object
        DurableAgent(SdkAgent(name="front", handoffs=[handoff(helper)]), name="front")
    shell = LocalShellTool(executor=lambda request: "ok")
    with pytest.raises(InvalidOption, match=r"LocalShellTool.*wrap it in a function_tool"):
        DurableAgent(SdkAgent(name="sh", tools=[shell]), name="sh")
    durable = DurableAgent(SdkAgent(name="c"), name="c")
    with pytest.raises(InvalidOption, match="stored as JSON"):
        durable.context_for(context=RunHooks())


async def test_a_run_that_fails_fails_its_task_with_the_reason(serve: Serve) -> None:
    server = serve([])
    server.fail_next(status=400, message="the model does not exist")
    durable = DurableAgent(SdkAgent(name="broken", model=model(server)), name="broken")
    async with Runtime("memory://", agents=[durable.agent]) as rt:
        with pytest.raises(TaskFailed, match="the model does not exist"):
            await durable.run(rt, "hi", timeout=30)


async def test_a_failed_run_is_retried_from_its_last_recorded_step(serve: Serve) -> None:
    """A run that failed fails its task with the run's call unanswered, so
    `Runtime.retry` runs it again: the recorded steps replay (the tool does not run
    again) and the model call that failed is asked again."""
    server = serve([[ToolCall("charge", {"amount": 12})], "charged 12"])
    charges: list[int] = []

    @function_tool
    def charge(amount: int) -> str:
        charges.append(amount)
        # The next model call fails for good (a 400 is not retried).
        server.fail_next(status=400, message="the model is gone for now")
        return f"charged {amount}"

    sdk = SdkAgent(
        name="shop", model=model(server), tools=[charge], tool_use_behavior="run_llm_again"
    )
    durable = DurableAgent(sdk, name="shop")
    async with Runtime("memory://", agents=[durable.agent]) as rt:
        sub = await rt.submit("shop", "buy it")
        failed = await rt.wait(sub.task_id, timeout=30, until=lambda t: t.status.terminal)
        assert failed.status is TaskStatus.FAILED
        assert "the model is gone for now" in (failed.error or "")
        await rt.retry(sub.task_id)
        task = await rt.wait(sub.task_id, timeout=30)
        result = await durable.result(rt, task)
    assert result.final_output == "charged 12"
    assert charges == [12]  # replayed from its step, not run again


async def test_the_sdks_model_retry_still_retries_and_a_failed_attempt_is_no_step(
    serve: Serve,
) -> None:
    """A model call the SDK's runner retries (ModelSettings(retry=)) fails with the
    provider's own error, so the retry policy sees it; the failed attempt is no step,
    so a replay asks for `model:1` what the run that went on recorded."""
    server = serve([[ToolCall("sky", {"city": "Rome"})], "sunny in Rome"])
    server.fail_next(status=503)

    @function_tool
    def sky(city: str) -> str:
        return f"sunny over {city}"

    http = DefaultAsyncHttpxClient(limits=httpx2.Limits(max_keepalive_connections=0))
    client = AsyncOpenAI(base_url=server.base_url, api_key="k", http_client=http, max_retries=0)
    retry = ModelRetrySettings(
        max_retries=2,
        backoff=ModelRetryBackoffSettings(initial_delay=0, max_delay=0, jitter=False),
        policy=retry_policies.http_status([503]),
    )
    sdk = SdkAgent(
        name="weather",
        model=OpenAIChatCompletionsModel("gpt-test", client),
        model_settings=ModelSettings(retry=retry),
        tools=[sky],
        tool_use_behavior="run_llm_again",
    )
    durable = DurableAgent(sdk, name="weather", safe_tools=["sky"])
    async with Runtime("memory://", agents=[durable.agent]) as rt:
        result = await durable.run(rt, "weather in Rome?", timeout=30)
        steps = await durable.steps(rt, result.task.id)
        errors = [
            e.payload["step"]
            for e in await rt.store.entries(result.task.id, kinds=[EntryKind.CHECKPOINT])
            if e.payload.get("type") == "step" and "error" in e.payload
        ]
    assert result.final_output == "sunny in Rome"
    assert len(server.requests) == 3  # the failed attempt, then the two turns
    assert [s.split(":")[0] + ":" + s.split(":")[1] for s in steps] == [
        "model:1",
        "tool:1",
        "model:2",
    ]
    assert errors == []


def test_a_typed_context_without_context_type_is_refused_not_turned_into_a_dict() -> None:
    """The context comes back from JSON: without `context_type`, a dataclass would
    reach the tools as a dict (`wrapper.context.city` failing inside the run), so it
    is refused in one line; plain data still passes."""
    durable = DurableAgent(SdkAgent(name="c"), name="c")
    with pytest.raises(InvalidOption, match=r"context_type=Shop") as err:
        durable.context_for(context=Shop("Paris"))
    assert "\n" not in str(err.value)
    assert durable.context_for(context={"city": "Paris"}) == {
        "openai_agents": {"context": {"city": "Paris"}}
    }
    typed = DurableAgent(SdkAgent(name="c"), name="c", context_type=Shop)
    assert typed.context_for(context=Shop("Rome")) == {
        "openai_agents": {"context": {"city": "Rome"}}
    }


async def test_an_agent_run_as_a_tool_is_inside_its_tool_step_and_replays_alike() -> None:
    """`Agent.as_tool()` runs a nested Runner.run with the parent's run config, so
    its model calls reach the durable model: they are part of the tool's step, not
    steps of their own, so a replay (the tool's step recorded, the nested run not
    made again) gives each later turn of the parent its own recorded answer."""

    def answer(request: Any) -> Any:
        messages = request.json["messages"]
        if messages[0].get("content") == "Translate.":
            return "bonjour"  # the nested agent's one turn
        done = sum(1 for m in messages if m.get("role") == "tool")
        return [[ToolCall("translator", {"input": "hello"})], [ToolCall("work", {})], "finished"][
            done
        ]

    in_tool, release = asyncio.Event(), asyncio.Event()

    @function_tool
    async def work() -> str:
        """Do some work."""
        if not release.is_set():
            in_tool.set()
            await asyncio.Event().wait()  # until the pause cancels it
        return "worked"

    server = ScriptedOpenAIServer(answer)
    with server:
        helper = SdkAgent(name="helper", instructions="Translate.")
        translator = helper.as_tool(tool_name="translator", tool_description="Translate.")
        sdk = SdkAgent(name="front", instructions="Help.", tools=[translator, work])
        config = RunConfig(model=model(server))
        options = {"timing": Timing(tool_grace=0.1)}
        durable = DurableAgent(
            sdk, name="front", run_config=config, safe_tools={"work"}, options=options
        )
        async with Runtime("memory://", agents=[durable.agent]) as rt:
            sub = await rt.submit("front", "go")
            await in_tool.wait()
            assert (await rt.pause(sub.task_id, timeout=30)).status is TaskStatus.PAUSED
            release.set()
            await rt.resume(sub.task_id)
            result = await durable.result(rt, await sub.wait(timeout=30))
            steps = await durable.steps(rt, sub.task_id)
    assert result.final_output == "finished"
    assert [s.rsplit(":", 1)[0] if s.startswith("tool") else s for s in steps] == [
        "model:1",
        "tool:1",
        "model:2",
        "tool:2",
        "model:3",
    ]


async def test_a_model_call_the_sdk_timed_out_is_retried_under_its_name(serve: Serve) -> None:
    """`ModelSettings(timeout=)` cancels a slow attempt and the SDK's retry asks
    again: the cut-off attempt recorded nothing, so the retry is the same step."""
    server = serve(["on time"])
    server.stall_next(after=0)
    retry = ModelRetrySettings(
        max_retries=1,
        backoff=ModelRetryBackoffSettings(initial_delay=0, max_delay=0, jitter=False),
        policy=retry_policies.network_error(),
    )
    settings = ModelSettings(timeout=0.5, retry=retry)
    sdk = SdkAgent(name="slow", model=model(server), model_settings=settings)
    durable = DurableAgent(sdk, name="slow")
    async with Runtime("memory://", agents=[durable.agent]) as rt:
        result = await durable.run(rt, "hi", timeout=30)
        assert await durable.steps(rt, result.task.id) == ["model:1"]
    assert result.final_output == "on time"


async def test_a_tool_guardrails_verdict_is_recorded_and_not_asked_again(serve: Serve) -> None:
    """A function tool's own input and output guardrails (which may ask a model)
    give their verdict once: after a pause the replay gets the recorded one."""
    server = serve([[ToolCall("price", {"item": "book"})], [ToolCall("work", {})], "finished"])
    asked: list[str] = []
    in_tool, release = asyncio.Event(), asyncio.Event()

    @tool_input_guardrail
    def sane(data: ToolInputGuardrailData) -> ToolGuardrailFunctionOutput:
        asked.append("input")
        return ToolGuardrailFunctionOutput.allow(output_info={"ok": True})

    @tool_output_guardrail
    def cheap(data: ToolOutputGuardrailData) -> ToolGuardrailFunctionOutput:
        asked.append(f"output {data.output}")
        return ToolGuardrailFunctionOutput.allow()

    @function_tool(tool_input_guardrails=[sane], tool_output_guardrails=[cheap])
    def price(item: str) -> str:
        """Price an item."""
        return f"{item}: 12"

    @function_tool
    async def work() -> str:
        """Do some work."""
        if not release.is_set():
            in_tool.set()
            await asyncio.Event().wait()  # until the pause cancels it
        return "worked"

    sdk = SdkAgent(name="shop", model=model(server), tools=[price, work])
    options = {"timing": Timing(tool_grace=0.1)}
    durable = DurableAgent(sdk, name="shop", safe_tools={"work"}, options=options)
    async with Runtime("memory://", agents=[durable.agent]) as rt:
        sub = await rt.submit("shop", "go")
        await in_tool.wait()
        assert (await rt.pause(sub.task_id, timeout=30)).status is TaskStatus.PAUSED
        release.set()
        await rt.resume(sub.task_id)
        result = await durable.result(rt, await sub.wait(timeout=30))
    assert result.final_output == "finished"
    assert asked == ["input", "output book: 12"]
