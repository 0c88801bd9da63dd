"""Pydantic AI agents as durable duragent tasks (extra `pydantic-ai`).

`DurableAgent(pyd_agent, name=...)` wraps any `pydantic_ai.Agent`. Its
`.agent` is a duragent `Agent` for a Runtime or a `duragent worker`; running
it (`await durable.run(rt, prompt, deps=...)`) submits a task whose one tool
call, `pydantic_ai_run` (`replay="resume"`), runs Pydantic AI's own loop with
the agent's model and toolsets wrapped, as Pydantic AI's Temporal, DBOS and
Prefect wrappers do, through its public `WrapperModel` and `WrapperToolset`:

- each model request is a durable step (`ctx.step`) named by its order in the
  run (`model:1`, `model:2`, ...); its `ModelResponse` is stored as JSON and
  rebuilt through Pydantic AI's type adapter. A request cut off by a crash is
  asked again (a model request has no effect outside the run);
- each tool call (function tools and MCP servers alike) is a durable step named
  by the model request it answers and its call id. A tool is never run again
  after a crash unless it is marked safe (`safe_tools=`, or the Pydantic AI
  tool's `metadata={"replay": "safe"}`): an interrupted unsafe call returns
  duragent's "interrupted" text to the model instead, and the run goes on.

- a tool with `requires_approval=True` asks duragent's approval: the question
  is step `ask:N:<call id>`, the run stops and the task waits; the decision,
  once given, is step `approval:N:<call id>` and the run replays to it.

A failed run fails its task with its call unanswered, so a retry replays the
recorded steps and goes on from the one that failed; a fork at round N replays
rounds 1..N (runtime/_hosted.py). `run_stream` streams the model's text to the
caller as progress entries of the call, each response still one step.

After a crash the worker runs the tool call again: Pydantic AI's loop starts
over, every recorded step returns its stored result without running, and the
loop continues live from the first step not recorded (the replay that DBOS and
Temporal do). Deps and message history are stored in the task's context as
JSON, so deps must be serialisable by Pydantic (rebuilt from `deps_type`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Collection, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field, replace
from typing import Any

from duragent._wrapped_run import carry_over_steps, driver, envelope, recorded_steps
from duragent.errors import InvalidOption, MissingExtra, StepFailed
from duragent.llm._scripted import ScriptedModel
from duragent.runtime._agent import Agent
from duragent.runtime._context import FailTask, ToolContext, WaitForInput
from duragent.runtime._fingerprint import wrapped_version
from duragent.runtime._runtime import Runtime
from duragent.runtime._steps import StepInterrupted
from duragent.runtime._tools import Tool, tool
from duragent.types import EntryKind, NewEntry, Task

try:
    import pydantic
    import pydantic_ai
    from pydantic_ai.agent import EventStreamHandler
    from pydantic_ai.exceptions import ApprovalRequired, CallDeferred, ModelRetry
    from pydantic_ai.messages import (
        ModelMessage,
        ModelMessagesTypeAdapter,
        ModelResponse,
        PartDeltaEvent,
        PartStartEvent,
        TextPart,
        TextPartDelta,
    )
    from pydantic_ai.models import (
        CompletedStreamedResponse,
        Model,
        ModelRequestParameters,
        StreamedResponse,
    )
    from pydantic_ai.models.wrapper import WrapperModel
    from pydantic_ai.settings import ModelSettings
    from pydantic_ai.tools import RunContext
    from pydantic_ai.toolsets import AbstractToolset, ToolsetTool, WrapperToolset
    from pydantic_core import PydanticSerializationError, to_jsonable_python
except ImportError as exc:  # pragma: no cover - depends on the install
    raise MissingExtra("Pydantic AI agents", "pydantic-ai") from exc

__all__ = ["RUN_TOOL", "DurableAgent", "DurableRunResult", "DurableStream"]

RUN_TOOL = "pydantic_ai_run"
_CONTEXT_KEY = "pydantic_ai"
_RESPONSE: pydantic.TypeAdapter[ModelResponse] = pydantic.TypeAdapter(ModelResponse)


@dataclass
class _Run:
    """One run of the Pydantic AI loop inside one run of the tool call."""

    ctx: ToolContext
    safe_tools: frozenset[str]
    interval: float = 0.1  # streamed text is committed at most this often (seconds)
    requests: int = 0  # model requests made (or replayed) so far in this run
    # Approvals: the decision that answered each `ask:` step (from the log), the
    # tools that need one, and the call this run stops to ask about.
    decisions: dict[str, Any] = field(default_factory=dict)
    approval: set[str] = field(default_factory=set)
    asking: tuple[str, dict[str, Any]] | None = None


class _Park(Exception):
    """The run stops before its next model request: a tool call waits for a person."""


class _StreamedText:
    """A streamed response's text, committed as the run call's progress entries as it
    comes (at most every `interval`, the rest after it, and all of it before the
    step's record), each with its step and its offset in the step's text, so a
    reader told the text again (the step asked again after a crash) gives each
    character once (`DurableStream`)."""

    def __init__(self, run: _Run, step: str) -> None:
        self.run, self.step = run, step
        self.buffer, self.at, self.sent_at = "", 0, time.monotonic()
        self.lock = asyncio.Lock()  # one commit at a time, in order
        self.later: asyncio.Task[None] | None = None

    async def add(self, text: str) -> None:
        self.buffer += text
        wait = self.sent_at + self.run.interval - time.monotonic()
        if wait <= 0:
            async with self.lock:
                await self._send()
        elif self.later is None:  # a slow model's text is not held back: sent when due
            self.later = asyncio.ensure_future(self._send_after(wait))

    async def _send_after(self, wait: float) -> None:
        await asyncio.sleep(wait)
        async with self.lock:
            self.later = None
            await self._send()

    async def close(self) -> None:
        """Send what is left; called before the step's record is committed."""
        async with self.lock:
            if self.later is not None:  # asleep or waiting for the lock: never mid-commit
                self.later.cancel()
                self.later = None
            await self._send()

    async def _send(self) -> None:
        if not self.buffer:
            return
        ctx, kind = self.run.ctx, EntryKind.PROGRESS
        payload = {"call_id": ctx.call_id, "text": self.buffer, "step": self.step, "at": self.at}
        await ctx._host.commit(
            [NewEntry(task_id=ctx.task_id, kind=kind, round=ctx.round, payload=payload)]
        )
        self.at += len(self.buffer)
        self.buffer, self.sent_at = "", time.monotonic()


class DuragentModel(WrapperModel):
    """A model whose every request is a durable step of the task."""

    def __init__(self, wrapped: Model | str, run: _Run) -> None:
        super().__init__(wrapped)
        self._run = run

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        if self._run.asking is not None:
            raise _Park
        self._run.requests += 1

        async def ask() -> Any:
            response = await self.wrapped.request(
                messages, model_settings, model_request_parameters
            )
            return _RESPONSE.dump_python(response, mode="json")

        stored = await self._run.ctx.step(f"model:{self._run.requests}", ask, safe=True)
        return _RESPONSE.validate_python(stored)

    @asynccontextmanager
    async def request_stream(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: RunContext[Any] | None = None,
    ) -> AsyncIterator[StreamedResponse]:
        # As Pydantic AI's DBOS and Temporal models do: the step drains the real
        # stream and records its final response; the run's stream (an
        # `event_stream_handler`) gets that response's events replayed. The text
        # goes out as it comes (`DurableAgent.run_stream`); a recorded step's is
        # not streamed again.
        if self._run.asking is not None:
            raise _Park
        self._run.requests += 1
        step = f"model:{self._run.requests}"

        async def ask() -> Any:
            text = _StreamedText(self._run, step)
            try:
                async with self.wrapped.request_stream(
                    messages, model_settings, model_request_parameters, run_context
                ) as streamed:
                    async for event in streamed:
                        if isinstance(event, PartStartEvent) and isinstance(event.part, TextPart):
                            await text.add(event.part.content)
                        elif isinstance(event, PartDeltaEvent) and isinstance(
                            event.delta, TextPartDelta
                        ):
                            await text.add(event.delta.content_delta)
                await text.close()  # all of the text is out before the step is recorded
            finally:
                if text.later is not None:  # cut off: nothing is sent behind its back
                    text.later.cancel()
            return _RESPONSE.dump_python(streamed.get(), mode="json")

        stored = await self._run.ctx.step(step, ask, safe=True)
        yield CompletedStreamedResponse(
            _RESPONSE.validate_python(stored),
            model_request_parameters=model_request_parameters,
            replay_events=True,
        )


class DuragentToolset(WrapperToolset[Any]):
    """A toolset whose every tool call is a durable step of the task."""

    def __init__(self, wrapped: AbstractToolset[Any], run: _Run) -> None:
        super().__init__(wrapped)
        self._run = run

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        # A tool that needs approval (`requires_approval=True`) is called here, which
        # asks duragent's approval first, instead of being deferred by Pydantic AI.
        tools = await super().get_tools(ctx)
        for name, t in tools.items():
            if t.tool_def.kind == "unapproved":
                self._run.approval.add(name)
                tools[name] = replace(t, tool_def=replace(t.tool_def, kind="function"))
        return tools

    async def call_tool(
        self,
        name: str,
        tool_args: dict[str, Any],
        ctx: RunContext[Any],
        tool: ToolsetTool[Any],
    ) -> Any:
        run = self._run
        metadata = tool.tool_def.metadata or {}
        safe = name in run.safe_tools or metadata.get("replay") == "safe"
        key = f"{run.requests}:{ctx.tool_call_id or name}"
        step = f"tool:{key}"
        if name in run.approval:  # requires_approval=True: asked before it runs
            return await self._approved_call(key, step, name, tool_args, ctx, tool, safe)
        stored = await self._step(step, name, tool_args, ctx, tool, safe)
        if stored.get("deferred") == "approval":  # the tool raised ApprovalRequired
            step += ":approved"
            return await self._approved_call(key, step, name, tool_args, ctx, tool, safe)
        return _answer(stored)

    async def _approved_call(
        self,
        key: str,
        step: str,
        name: str,
        tool_args: dict[str, Any],
        ctx: RunContext[Any],
        tool: ToolsetTool[Any],
        safe: bool,
    ) -> Any:
        decision = await _decision(self._run, key, name, tool_args)
        if decision is None:
            return "Waiting for a person's approval."  # never seen: the run parks first
        if not decision["approved"]:
            reason = decision.get("reason")
            return "The tool call was denied." + (f" Reason: {reason}" if reason else "")
        approved = replace(ctx, tool_call_approved=True)
        return _answer(await self._step(step, name, tool_args, approved, tool, safe))

    async def _step(
        self,
        step: str,
        name: str,
        tool_args: dict[str, Any],
        ctx: RunContext[Any],
        tool: ToolsetTool[Any],
        safe: bool,
    ) -> dict[str, Any]:
        async def call() -> Any:
            try:
                value = await self.wrapped.call_tool(name, tool_args, ctx, tool)
            except ModelRetry as exc:
                # Asking the model to try again is an answer, recorded like one.
                return {"retry": exc.message}
            except ApprovalRequired:
                return {"deferred": "approval"}  # asked of a person, then run again
            except CallDeferred as exc:
                return {"deferred": "call", "metadata": to_jsonable_python(exc.metadata)}
            return {"value": to_jsonable_python(value)}

        try:
            return await self._run.ctx.step(step, call, safe=safe)  # type: ignore[no-any-return]
        except StepInterrupted as stop:
            return {"value": stop.message()}

    def visit_and_replace(
        self, visitor: Callable[[AbstractToolset[Any]], AbstractToolset[Any]]
    ) -> AbstractToolset[Any]:
        # Keep the durable wrapper around whatever the visitor makes of the inner toolset.
        return DuragentToolset(self.wrapped.visit_and_replace(visitor), self._run)


def _answer(stored: dict[str, Any]) -> Any:
    """A recorded tool step as Pydantic AI expects it back: a value, or what it raised."""
    if "retry" in stored:
        raise ModelRetry(stored["retry"])
    if stored.get("deferred") == "call":  # Pydantic AI's own deferred tools flow
        raise CallDeferred(metadata=stored.get("metadata"))
    return stored["value"]


async def _decision(
    run: _Run, key: str, name: str, arguments: dict[str, Any]
) -> dict[str, Any] | None:
    """A person's decision on tool call `key` (recorded as step `approval:<key>`), or
    None: the run then stops to ask (once: the question is step `ask:<key>`)."""
    ctx, asked, decided = run.ctx, f"ask:{key}", f"approval:{key}"

    async def answer() -> Any:
        return run.decisions[asked]

    if decided in ctx._steps.record.done or asked in run.decisions:
        return await ctx.step(decided, answer, safe=True)  # type: ignore[no-any-return]
    if run.asking is None:

        async def ask() -> Any:
            return {"tool": name, "arguments": to_jsonable_python(arguments)}

        await ctx.step(asked, ask, safe=True)  # recorded first: a crash never asks twice
        run.asking = (name, to_jsonable_python(arguments))
    return None


@dataclass
class DurableRunResult:
    """What a durable run gave back: its output (typed), its messages and its task."""

    output: Any
    messages: list[ModelMessage]
    task: Task


def _describe(pyd: pydantic_ai.Agent[Any, Any]) -> dict[str, Any]:
    """What decides how a Pydantic AI agent answers, for its version when none is
    declared (runtime/_fingerprint.py `wrapped_version`): its model, instructions
    and system prompts (a function by its name), its tools' schemas, its output
    type. Read from the agent's attributes; one a Pydantic AI release renames
    counts as absent (the version stays stable, only less fine)."""
    model = pyd.model
    instructions = [getattr(i, "instruction", i) for i in getattr(pyd, "_instructions", ())]
    prompts = [getattr(f, "function", f) for f in getattr(pyd, "_system_prompt_functions", ())]
    tools = getattr(getattr(pyd, "_function_toolset", None), "tools", {})
    return {
        "model": model
        if isinstance(model, str)
        else [getattr(model, "system", ""), getattr(model, "model_name", "")],
        "instructions": instructions,
        "system_prompts": [*getattr(pyd, "_system_prompts", ()), *prompts],
        "tools": sorted(
            [name, t.description, getattr(getattr(t, "function_schema", None), "json_schema", None)]
            for name, t in tools.items()
        ),
        "toolsets": [type(ts).__qualname__ for ts in getattr(pyd, "_user_toolsets", ())],
        "output": getattr(pyd, "output_type", None),
    }


@dataclass
class DurableAgent:
    """A Pydantic AI agent that runs as a duragent task (see the module's docstring)."""

    wrapped: pydantic_ai.Agent[Any, Any]
    name: str
    safe_tools: Collection[str] = ()
    # Streams each model response's events (and the tools') in the worker, as
    # `run(event_stream_handler=)` does; a replayed step's events come again.
    event_stream_handler: EventStreamHandler[Any] | None = None
    # Further options of the duragent Agent (limits, timing, webhook, deadline, ...).
    options: dict[str, Any] = field(default_factory=dict)
    agent: Agent = field(init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.wrapped, pydantic_ai.Agent):
            raise InvalidOption(
                f"DurableAgent wraps a pydantic_ai.Agent, not {type(self.wrapped).__name__}"
            )
        if self.wrapped.model is None:
            raise InvalidOption(
                "the Pydantic AI agent has no model: give it one (Agent(model=...)), "
                "since a durable run cannot pass one per run"
            )
        self.agent = Agent(
            name=self.name,
            model=ScriptedModel(driver(RUN_TOOL, "Pydantic AI"), name=f"pydantic-ai:{self.name}"),
            tools=[self._run_tool()],
            **{"version": wrapped_version(_describe(self.wrapped)), **self.options},
        )
        # Forks are taken at rounds of the Pydantic AI run (runtime/_hosted.py).
        self.agent.hosted_loop = RUN_TOOL

    def _run_tool(self) -> Tool:
        outer = self

        @tool(name=RUN_TOOL, replay="resume")
        async def pydantic_ai_run(prompt: str, ctx: ToolContext) -> str | WaitForInput:
            """Run the Pydantic AI agent, each model request and tool call a durable step."""
            return await outer._play(prompt, ctx)

        return pydantic_ai_run

    async def _play(self, prompt: str, ctx: ToolContext) -> str | WaitForInput:
        pyd = self.wrapped
        given = ctx.context.get(_CONTEXT_KEY) or {}
        run = _Run(ctx, frozenset(self.safe_tools), self.agent.timing.progress_interval)
        # A step that failed failed the run (and the task): a retry asks it again.
        run.decisions = await carry_over_steps(ctx, keep_failed=False)
        model = DuragentModel(pyd.model, run)  # type: ignore[arg-type]
        toolsets = [DuragentToolset(ts, run) for ts in pyd.toolsets]
        kwargs: dict[str, Any] = {}
        if "deps" in given:
            kwargs["deps"] = pydantic.TypeAdapter(pyd.deps_type).validate_python(given["deps"])
        if "history" in given:
            kwargs["message_history"] = ModelMessagesTypeAdapter.validate_python(given["history"])
        if self.event_stream_handler is not None:
            kwargs["event_stream_handler"] = self.event_stream_handler
        elif given.get("stream"):  # run_stream: requests are streamed, their text sent out
            kwargs["event_stream_handler"] = _drain
        try:
            with pyd.override(model=model, toolsets=toolsets, tools=[]):
                result = await pyd.run(prompt, **kwargs)
        except _Park:
            return _approval_wait(run)
        except Exception as exc:
            # The run's own failure fails the task, as it would end run(), with this
            # call unanswered: a retry runs it again from the last good step.
            why = exc.error if isinstance(exc, StepFailed) else f"{type(exc).__name__}: {exc}"
            raise FailTask(f"the Pydantic AI run failed: {why}") from exc
        if run.asking is not None:  # asked in the response that ended the run
            return _approval_wait(run)
        messages = ModelMessagesTypeAdapter.dump_python(result.all_messages(), mode="json")
        output = to_jsonable_python(result.output)
        return json.dumps({"output": output, "messages": messages}, ensure_ascii=False)

    def context_for(
        self,
        deps: Any = None,
        message_history: Sequence[ModelMessage] | None = None,
        *,
        stream: bool = False,
    ) -> dict[str, Any]:
        """The task context that carries a run's deps and message history (and, with
        `stream`, asks for its model requests streamed, their text sent out as it comes)."""
        given: dict[str, Any] = {"stream": True} if stream else {}
        if deps is not None:
            try:
                given["deps"] = pydantic.TypeAdapter(self.wrapped.deps_type).dump_python(
                    deps, mode="json"
                )
            except PydanticSerializationError as exc:
                raise InvalidOption(
                    f"the deps of a durable run are stored as JSON: {exc}; pass data "
                    "(a dataclass or pydantic model of plain fields) and build clients in the tools"
                ) from exc
        if message_history:
            given["history"] = ModelMessagesTypeAdapter.dump_python(
                list(message_history), mode="json"
            )
        return {_CONTEXT_KEY: given} if given else {}

    async def run(
        self,
        rt: Runtime,
        prompt: str,
        *,
        deps: Any = None,
        message_history: Sequence[ModelMessage] | None = None,
        timeout: float | None = None,
        **submit: Any,
    ) -> DurableRunResult:
        """Submit a task that runs the agent, wait for it, and give back its result."""
        context = {**submit.pop("context", {}), **self.context_for(deps, message_history)}
        sub = await rt.submit(self.name, prompt, context=context, **submit)
        task = await sub.wait(timeout=timeout)
        return await self.result(rt, task)

    @asynccontextmanager
    async def run_stream(
        self,
        rt: Runtime,
        prompt: str,
        *,
        deps: Any = None,
        message_history: Sequence[ModelMessage] | None = None,
        **submit: Any,
    ) -> AsyncIterator[DurableStream]:
        """Submit a task whose model requests are streamed; its text reaches the
        caller as the worker commits it (`DurableStream.stream_text`), its result
        once it ends (`get_output`, `result`). Each response is still one recorded
        step: after a crash a recorded one is replayed, not streamed again."""
        given = self.context_for(deps, message_history, stream=True)
        context = {**submit.pop("context", {}), **given}
        sub = await rt.submit(self.name, prompt, context=context, **submit)
        yield DurableStream(self, rt, sub.task_id)

    async def steps(self, rt: Runtime, task_id: str) -> list[str]:
        """The steps a task of this agent recorded, in order (`model:1`, `tool:1:<id>`, ...)."""
        return await recorded_steps(rt, task_id)

    async def result(self, rt: Runtime, task: Task) -> DurableRunResult:
        """The typed result of a finished task of this agent (raises TaskFailed if it failed)."""
        given = await envelope(rt, task, "Pydantic AI")
        output = given["output"]
        # An output type pydantic cannot rebuild (a function, several types) comes back as JSON.
        with suppress(pydantic.ValidationError, pydantic.PydanticSchemaGenerationError, TypeError):
            output = pydantic.TypeAdapter(self.wrapped.output_type).validate_python(output)  # type: ignore[arg-type]
        messages = ModelMessagesTypeAdapter.validate_python(given["messages"])
        return DurableRunResult(output, messages, task)


@dataclass
class DurableStream:
    """A streamed durable run, as `DurableAgent.run_stream` gives it: its task's
    streamed text, read from the store as it is committed, and its result."""

    durable: DurableAgent
    rt: Runtime
    task_id: str

    async def stream_text(self, *, delta: bool = False) -> AsyncIterator[str]:
        """The text of the run's model responses as it comes: the text so far
        (Pydantic AI's `stream_text()`), or each new piece (`delta=True`). Ends
        when the task ends. A request asked again after a crash may be told
        again: each character of a step is given once."""
        given: dict[str, int] = {}  # characters given of each step
        text = ""
        async for entry in self.rt.subscribe(self.task_id):
            payload = entry.payload
            if entry.kind is not EntryKind.PROGRESS or "step" not in payload:
                continue
            step, at, piece = payload["step"], payload.get("at", 0), payload.get("text", "")
            new = piece[max(given.get(step, 0) - at, 0) :]
            if not new:
                continue
            given[step] = at + len(piece)
            text += new
            yield new if delta else text

    async def result(self, timeout: float | None = None) -> DurableRunResult:
        """Wait for the task to end and give back its result (TaskFailed if it failed)."""
        task = await self.rt.wait(self.task_id, timeout=timeout)
        return await self.durable.result(self.rt, task)

    async def get_output(self, timeout: float | None = None) -> Any:
        """The run's output, typed (as `StreamedRunResult.get_output`)."""
        return (await self.result(timeout)).output


async def _drain(ctx: RunContext[Any], events: AsyncIterable[Any]) -> None:
    async for _ in events:
        pass


def _approval_wait(run: _Run) -> WaitForInput:
    """The task waits for a person to approve the tool call the run stopped at."""
    assert run.asking is not None
    name, arguments = run.asking
    question = f"Approve {name}({json.dumps(arguments, ensure_ascii=False)})?"
    return WaitForInput(question, "approval", tool=name, arguments=arguments, rerun=True)
