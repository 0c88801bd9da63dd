"""OpenTelemetry spans from the runtime's trace points (SDK in-memory exporter)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk", reason="opentelemetry-sdk is part of the dev install")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)

from duragent import (
    Agent,
    BuiltinTools,
    Runtime,
    ScriptedModel,
    TaskStatus,
    ToolCall,
    ToolContext,
    tool,
)
from duragent.otel import OTelTracer


def provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    p = TracerProvider()
    p.add_span_processor(SimpleSpanProcessor(exporter))
    return p, exporter


def named(spans: tuple[ReadableSpan, ...], prefix: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


@tool(replay="safe")
async def lookup(city: str, ctx: ToolContext) -> str:
    """Look a city up."""
    await ctx.step("fetch", lambda: f"{city}: sunny")
    return "sunny"


async def test_a_task_run_has_round_model_and_tool_spans(tmp_path: Path) -> None:
    tp, exporter = provider()
    model = ScriptedModel([[ToolCall("lookup", {"city": "Paris"})], "It is sunny."])
    agent = Agent(name="w", model=model, tools=[lookup], builtin_tools=BuiltinTools(plan=False))
    async with Runtime("memory://", agents=[agent], trace=OTelTracer(tp)) as rt:
        task = await (await rt.submit("w", "weather?")).wait(20)
    assert task.status is TaskStatus.COMPLETED
    spans = exporter.get_finished_spans()
    (run,) = named(spans, "duragent.task.run")
    rounds = named(spans, "duragent.round")
    chats = named(spans, "chat ")
    (call,) = named(spans, "execute_tool")
    assert len(rounds) == 2 and len(chats) == 2
    assert {s.context.trace_id for s in spans} == {run.context.trace_id}
    assert run.attributes is not None and run.attributes["duragent.task.id"] == task.id
    assert run.attributes["duragent.task.status"] == "completed"
    assert all(r.parent is not None and r.parent.span_id == run.context.span_id for r in rounds)
    first = chats[0].attributes or {}
    assert chats[0].name == f"chat {agent.model_name}"
    assert first["gen_ai.request.model"] == agent.model_name
    tokens_in, tokens_out = first["gen_ai.usage.input_tokens"], first["gen_ai.usage.output_tokens"]
    assert isinstance(tokens_in, int) and isinstance(tokens_out, int)
    assert tokens_in > 0 and tokens_out > 0
    assert first["gen_ai.response.finish_reasons"] == ("tool_calls",)
    assert (chats[1].attributes or {})["gen_ai.response.finish_reasons"] == ("stop",)
    attrs: dict[str, Any] = dict(call.attributes or {})
    assert call.name == "execute_tool lookup" and call.parent is not None
    assert call.parent.span_id == rounds[0].context.span_id
    assert attrs["gen_ai.tool.name"] == "lookup" and attrs["gen_ai.tool.call.id"] == "call_0_0"
    assert attrs["duragent.tool.replay"] == "safe" and attrs["duragent.tool.outcome"] == "ok"
    assert [e.name for e in call.events] == ["duragent.step"]


async def test_the_submitters_trace_continues_in_the_task(tmp_path: Path) -> None:
    tp, exporter = provider()
    agent = Agent(name="w", model=ScriptedModel(["Hi."]))
    async with Runtime("memory://", agents=[agent], trace=OTelTracer(tp)) as rt:
        with tp.get_tracer("app").start_as_current_span("http request") as request:
            sub = await rt.submit("w", "hi")
        await sub.wait(20)
    (run,) = named(exporter.get_finished_spans(), "duragent.task.run")
    assert run.context.trace_id == request.get_span_context().trace_id
    assert run.parent is not None and run.parent.span_id == request.get_span_context().span_id


@pytest.mark.slow
async def test_runs_of_one_task_across_a_restart_share_one_trace(tmp_path: Path) -> None:
    tp, exporter = provider()
    hang = asyncio.Event()

    @tool
    async def slow(ctx: ToolContext) -> str:
        """Hangs on the first attempt (its worker dies)."""
        if ctx.attempt == 1:
            await hang.wait()
        return "done"

    def agent() -> Agent:
        return Agent(name="w", model=ScriptedModel([[ToolCall("slow", {})], "Ok."]), tools=[slow])

    url = f"sqlite:///{tmp_path}/t.db"
    dead = OTelTracer(tp)
    first = Runtime(url, agents=[agent()], lease_ttl=1.0, poll_interval=0.1, trace=dead)
    await first.store.open()
    sub = await first.submit("w", "go")
    await first.wait(sub.task_id, timeout=20, until=lambda t: t.last_seq >= 4)
    await first.close(graceful=False)  # a dead worker: its spans never end
    (dead_run,) = dead.runs.values()
    async with Runtime(
        url, agents=[agent()], lease_ttl=1.0, poll_interval=0.1, trace=OTelTracer(tp)
    ) as second:
        task = await second.wait(sub.task_id, timeout=30)
    assert task.status is TaskStatus.COMPLETED and task.restarts == 1
    spans = exporter.get_finished_spans()
    (run,) = named(spans, "duragent.task.run")
    assert (run.attributes or {})["duragent.task.restarts"] == 1
    # Both runs, on two workers, are in one trace (derived from the task tree's root).
    assert run.context.trace_id == dead_run.span.get_span_context().trace_id
    # The interrupted call is reported from the log, not run again: a span says so.
    (call,) = named(spans, "execute_tool")
    assert (call.attributes or {})["duragent.tool.outcome"] == "interrupted"


def test_without_an_active_span_nothing_is_stored_with_the_task() -> None:
    from duragent.runtime._submit import new_task

    task, _ = new_task(Agent(name="w", model="scripted:none"), "hi")
    assert "trace" not in task.config


@pytest.mark.slow
def test_without_opentelemetry_installed_tasks_run_and_the_tracer_says_why() -> None:
    code = """
import sys
sys.modules["opentelemetry"] = None  # as if the otel extra were not installed
from duragent import Agent, Runtime, ScriptedModel
from duragent.errors import MissingExtra
from duragent.otel import OTelTracer, current_trace_context
assert current_trace_context() == {}
task = Runtime("memory://", agents=[Agent(name="a", model=ScriptedModel(["ok"]))]).run_sync(
    "a", "hi", timeout=20
)
assert task.output == "ok", task
try:
    OTelTracer()
except MissingExtra as exc:
    print("hint:", exc)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "pip install 'duragent[otel]'" in out.stdout
