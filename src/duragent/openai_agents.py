"""OpenAI Agents SDK agents as durable duragent tasks (extra `openai-agents`).

`DurableAgent(sdk_agent, name=...)` wraps any `agents.Agent`. Its `.agent` is
a duragent `Agent` for a Runtime or a `duragent worker`; running it (`await
durable.run(rt, input)`, or `durable.run_sync(rt, input)`) submits a task whose
one tool call, `openai_agents_run` (`replay="resume"`), runs the SDK's own
`Runner.run` loop, as DBOS's and Temporal's integrations do, through the SDK's
public `Model`, `ModelProvider` and `FunctionTool` interfaces:

- each model call is a durable step (`ctx.step`) named by its order in the run
  (`model:1`, `model:2`, ...), whichever agent of a handoff chain makes it: the
  run's `RunConfig(model_provider=...)` and every agent's own `Model` are
  wrapped, and the `ModelResponse` is stored as JSON. A call cut off by a crash
  is asked again (a model call has no effect outside the run); one that fails
  is no step: the SDK's retry (`ModelSettings(retry=)`) sees the provider's own
  error and asks again under the same name;
- each function tool call is a durable step named by the model call it answers
  and its call id (`tool:N:<call id>`). A tool is never run again after a crash
  unless it is marked safe (`safe_tools=`): an interrupted unsafe call returns
  duragent's "interrupted" text to the model instead, and the run goes on. A
  run nested in a tool (`Agent.as_tool()`) is part of that tool's step.

After a crash the worker runs the tool call again: the SDK's loop starts over,
every recorded step returns its stored result without running, and the loop
continues live from the first step not recorded. Handoffs and guardrails are
the SDK's own: the agents a run hands off to are wrapped the same way, and each
input or output guardrail's verdict is a step (`guardrail:input:<name>`), as is
a function tool's own guardrails' (`guardrail:tool_input:<name>:<N>:<call id>`),
so a guardrail that asks a model of its own is not asked again on a replay.
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
import dataclasses
import json
from collections.abc import AsyncIterator, Awaitable, Collection, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any, TypeVar

from duragent._wrapped_run import carry_over_steps, driver, envelope, recorded_steps
from duragent.errors import InvalidOption, MissingExtra
from duragent.llm._scripted import ScriptedModel
from duragent.runtime._agent import Agent
from duragent.runtime._context import FailTask, ToolContext
from duragent.runtime._fingerprint import wrapped_version
from duragent.runtime._runtime import Runtime
from duragent.runtime._steps import StepInterrupted
from duragent.runtime._tools import Tool, tool
from duragent.types import Task

try:
    import agents
    import pydantic
    from agents import (
        CodeInterpreterTool,
        FileSearchTool,
        FunctionTool,
        GuardrailFunctionOutput,
        Handoff,
        HostedMCPTool,
        ImageGenerationTool,
        InputGuardrail,
        Model,
        ModelProvider,
        ModelResponse,
        ModelTracing,
        OutputGuardrail,
        RunConfig,
        Runner,
        ToolGuardrailFunctionOutput,
        ToolInputGuardrail,
        ToolOutputGuardrail,
        WebSearchTool,
    )
    from agents.tool_context import ToolContext as SdkToolContext
    from pydantic_core import PydanticSerializationError, to_jsonable_python
except ImportError as exc:  # pragma: no cover - depends on the install
    raise MissingExtra("OpenAI Agents SDK agents", "openai-agents") from exc

__all__ = ["RUN_TOOL", "DurableAgent", "DurableRunResult"]

RUN_TOOL = "openai_agents_run"
_CONTEXT_KEY = "openai_agents"
_RESPONSE: pydantic.TypeAdapter[ModelResponse] = pydantic.TypeAdapter(ModelResponse)
# Tools the model provider runs on its side: their work is in the recorded response.
_HOSTED = (CodeInterpreterTool, FileSearchTool, HostedMCPTool, ImageGenerationTool, WebSearchTool)


# Set while a function tool's step runs: a run nested in it (`Agent.as_tool()` runs
# one with the parent's run config, so with the durable model) is part of that
# step, replayed with it; its model calls and guardrails are no steps of their own.
_IN_TOOL_STEP: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "duragent_openai_agents_in_tool_step", default=False
)

_Guardrail = TypeVar("_Guardrail", InputGuardrail[Any], OutputGuardrail[Any])
_ToolGuardrail = TypeVar("_ToolGuardrail", ToolInputGuardrail[Any], ToolOutputGuardrail[Any])


@dataclass
class _Run:
    """One run of the SDK's loop inside one run of the tool call."""

    ctx: ToolContext
    safe_tools: frozenset[str]
    requests: int = 0  # model calls made (or replayed) so far in this run
    guardrails: dict[str, int] = field(default_factory=dict)  # step name -> times asked
    agents: dict[int, agents.Agent[Any]] = field(default_factory=dict)  # id(original) -> durable


class _Unrecorded(BaseException):
    """A model call that failed: carried past its step (a BaseException, so the
    step records nothing) and raised again as the provider's own error."""

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error


class DuragentModel(Model):
    """A model whose every call is a durable step of the task."""

    def __init__(self, wrapped: Model, run: _Run) -> None:
        self.wrapped = wrapped
        self._run = run

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[Any],
        model_settings: Any,
        tools: list[Any],
        output_schema: Any,
        handoffs: list[Any],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> ModelResponse:
        def call() -> Awaitable[ModelResponse]:
            return self.wrapped.get_response(
                system_instructions,
                input,
                model_settings,
                tools,
                output_schema,
                handoffs,
                tracing,
                previous_response_id=previous_response_id,
                conversation_id=conversation_id,
                prompt=prompt,
            )

        if _IN_TOOL_STEP.get():  # a nested run's call: inside its tool's step
            return await call()
        # Numbered by the turns that got an answer: an attempt that failed (and the
        # SDK's runner may retry) is no step, so a replay numbers the turns alike.
        n = self._run.requests + 1

        async def ask() -> Any:
            try:
                response = await call()
            except Exception as exc:
                raise _Unrecorded(exc) from None
            return _RESPONSE.dump_python(response, mode="json", by_alias=True)

        step = f"model:{n}"
        try:
            stored = await self._run.ctx.step(step, ask, safe=True)
        except BaseException as stop:  # failed, or cut off (the SDK's timeout): not recorded
            with suppress(ValueError):
                self._run.ctx._steps.names.remove(step)  # so its retry may take the name
            if isinstance(stop, _Unrecorded):  # the provider's own error, for the retry policy
                raise stop.error from None
            raise
        self._run.requests = n
        return _RESPONSE.validate_python(stored)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        # The durable run calls Runner.run, which never streams; this is someone else's call.
        raise InvalidOption(
            "a durable OpenAI Agents run is not streamed: run it with DurableAgent.run"
        )

    def get_retry_advice(self, request: Any) -> Any:
        return self.wrapped.get_retry_advice(request)

    async def _cleanup_on_run_end(self, owner: object) -> None:
        await self.wrapped._cleanup_on_run_end(owner)

    async def close(self) -> None:
        await self.wrapped.close()


class DuragentModelProvider(ModelProvider):
    """The run's model provider, each model it gives wrapped in a `DuragentModel`."""

    def __init__(self, wrapped: ModelProvider, run: _Run) -> None:
        self.wrapped = wrapped
        self._run = run

    def get_model(self, model_name: str | None) -> Model:
        return DuragentModel(self.wrapped.get_model(model_name), self._run)


def _durable_tool(original: FunctionTool, run: _Run) -> FunctionTool:
    """A copy of a function tool whose every call is a durable step of the task."""
    invoke = original.on_invoke_tool
    safe = original.name in run.safe_tools

    async def on_invoke_tool(context: SdkToolContext[Any], arguments: str) -> Any:
        if _IN_TOOL_STEP.get():  # a tool of a run nested in a tool's step
            return await invoke(context, arguments)

        async def call() -> Any:
            token = _IN_TOOL_STEP.set(True)
            try:
                return {"value": to_jsonable_python(await invoke(context, arguments))}
            finally:
                _IN_TOOL_STEP.reset(token)

        step = f"tool:{run.requests}:{context.tool_call_id or original.name}"
        try:
            stored = await run.ctx.step(step, call, safe=safe)
        except StepInterrupted as stop:
            return stop.message()
        # Live or replayed, the SDK gets the stored value, so both runs see the same.
        return stored["value"]

    durable = copy.copy(original)
    durable.on_invoke_tool = on_invoke_tool
    if original.tool_input_guardrails:
        durable.tool_input_guardrails = [
            _durable_tool_guardrail(g, "tool_input", run) for g in original.tool_input_guardrails
        ]
    if original.tool_output_guardrails:
        durable.tool_output_guardrails = [
            _durable_tool_guardrail(g, "tool_output", run) for g in original.tool_output_guardrails
        ]
    return durable


def _durable_tool_guardrail(guardrail: _ToolGuardrail, kind: str, run: _Run) -> _ToolGuardrail:
    """A copy of a function tool's input or output guardrail whose verdict is a durable
    step of the task (`guardrail:tool_input:<name>:<N>:<call id>`)."""
    check: Any = guardrail.guardrail_function
    name = guardrail.get_name()

    async def guardrail_function(data: Any) -> ToolGuardrailFunctionOutput:
        async def call() -> Any:
            verdict = check(data)
            if not isinstance(verdict, ToolGuardrailFunctionOutput):
                verdict = await verdict
            info = to_jsonable_python(verdict.output_info, fallback=repr)
            return {"info": info, "behavior": dict(verdict.behavior)}

        if _IN_TOOL_STEP.get():  # a run nested in a tool's step
            stored = await call()
        else:
            step = f"guardrail:{kind}:{name}:{run.requests}:{data.context.tool_call_id}"
            stored = await run.ctx.step(step, call, safe=True)
        return ToolGuardrailFunctionOutput(output_info=stored["info"], behavior=stored["behavior"])

    return dataclasses.replace(guardrail, guardrail_function=guardrail_function, name=name)


def _durable_guardrail(guardrail: _Guardrail, kind: str, run: _Run) -> _Guardrail:
    """A copy of an input or output guardrail whose verdict is a durable step of the task.

    A guardrail may run an agent of its own (a model call): recorded, its
    verdict comes back on a replay without asking again; `output_info` then
    comes back as its JSON."""
    check = guardrail.guardrail_function

    async def guardrail_function(context: Any, agent: Any, given: Any) -> GuardrailFunctionOutput:
        if _IN_TOOL_STEP.get():  # a guardrail of a run nested in a tool's step
            verdict = check(context, agent, given)
            return verdict if isinstance(verdict, GuardrailFunctionOutput) else await verdict
        step = f"guardrail:{kind}:{guardrail.get_name()}"
        run.guardrails[step] = asked = run.guardrails.get(step, 0) + 1
        step = step if asked == 1 else f"{step}:{asked}"

        async def call() -> Any:
            verdict = check(context, agent, given)
            if not isinstance(verdict, GuardrailFunctionOutput):
                verdict = await verdict
            info = to_jsonable_python(verdict.output_info, fallback=repr)
            return {"tripwire": verdict.tripwire_triggered, "info": info}

        stored = await run.ctx.step(step, call, safe=True)
        return GuardrailFunctionOutput(stored["info"], stored["tripwire"])

    return dataclasses.replace(guardrail, guardrail_function=guardrail_function)


def _check(agent: agents.Agent[Any]) -> None:
    """Refuse, in one line, what a durable run cannot record."""
    if agent.mcp_servers:
        raise InvalidOption(
            f"agent {agent.name!r} has mcp_servers, whose calls a durable run cannot record "
            "yet: use a HostedMCPTool, or function tools that call the server"
        )
    for each in agent.tools:
        if isinstance(each, FunctionTool):
            if each.needs_approval is not False:
                raise InvalidOption(
                    f"tool {each.name!r} of agent {agent.name!r} has needs_approval, which a "
                    "durable run cannot wait for: give the duragent Agent approvals instead"
                )
        elif not isinstance(each, _HOSTED):
            raise InvalidOption(
                f"tool {getattr(each, 'name', each)!r} ({type(each).__name__}) of agent "
                f"{agent.name!r} runs locally outside a durable step: wrap it in a function_tool"
            )


def _durable_agent(agent: agents.Agent[Any], run: _Run) -> agents.Agent[Any]:
    """The agent (and every agent it hands off to) with its model and tools wrapped."""
    if id(agent) in run.agents:
        return run.agents[id(agent)]
    _check(agent)
    model = DuragentModel(agent.model, run) if isinstance(agent.model, Model) else agent.model
    tools = [_durable_tool(t, run) if isinstance(t, FunctionTool) else t for t in agent.tools]
    durable = agent.clone(
        model=model,
        tools=tools,
        handoffs=[],
        input_guardrails=[_durable_guardrail(g, "input", run) for g in agent.input_guardrails],
        output_guardrails=[_durable_guardrail(g, "output", run) for g in agent.output_guardrails],
    )
    run.agents[id(agent)] = durable  # before the handoffs: they may lead back here
    durable.handoffs = [_durable_handoff(h, run) for h in agent.handoffs]
    return durable


def _durable_handoff(
    handoff: agents.Agent[Any] | Handoff[Any, Any], run: _Run
) -> agents.Agent[Any] | Handoff[Any, Any]:
    if isinstance(handoff, agents.Agent):
        return _durable_agent(handoff, run)
    invoke = handoff.on_invoke_handoff

    async def on_invoke_handoff(context: Any, arguments: str) -> Any:
        return _durable_agent(await invoke(context, arguments), run)

    return dataclasses.replace(handoff, on_invoke_handoff=on_invoke_handoff)


def _model_name(model: Any) -> Any:
    """A model as a version counts it: its name, or its class and the name it holds."""
    if model is None or isinstance(model, str):
        return model
    return [type(model).__qualname__, str(getattr(model, "model", ""))]


def _graph(agent: agents.Agent[Any]) -> dict[str, agents.Agent[Any]]:
    """The agents a run can reach through handoffs, by name, as far as they are known.

    A `handoff(agent)` object keeps (weakly) the agent it was made for; one
    built by hand may not, and its agent is met only when it is taken."""
    found: dict[str, agents.Agent[Any]] = {}
    todo = [agent]
    while todo:
        each = todo.pop()
        if each.name in found:
            continue
        found[each.name] = each
        for h in each.handoffs:
            ref = getattr(h, "_agent_ref", None) if isinstance(h, Handoff) else None
            target = h if isinstance(h, agents.Agent) else ref() if callable(ref) else None
            if isinstance(target, agents.Agent):
                todo.append(target)
    return found


@dataclass
class DurableRunResult:
    """What a durable run gave back: its final output (typed), its items and its task."""

    final_output: Any
    last_agent: str  # the name of the agent that answered
    input_list: list[Any]  # `RunResult.to_input_list()`: the next run's input
    task: Task


@dataclass
class DurableAgent:
    """An OpenAI Agents SDK agent that runs as a duragent task (see the module's docstring)."""

    wrapped: agents.Agent[Any]
    name: str
    safe_tools: Collection[str] = ()
    # The SDK's run options: its RunConfig (model_provider: whose models are
    # wrapped), max_turns, and the type the run's context is rebuilt as.
    run_config: RunConfig | None = None
    max_turns: int | None = None
    context_type: Any = None
    # Further options of the duragent Agent (limits, timing, webhook, deadline, ...).
    options: dict[str, Any] = field(default_factory=dict)
    agent: Agent = field(init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.wrapped, agents.Agent):
            raise InvalidOption(
                f"DurableAgent wraps an agents.Agent, not {type(self.wrapped).__name__}"
            )
        for each in _graph(self.wrapped).values():
            _check(each)
        config = self.run_config or RunConfig()
        if config.session_settings is not None or config.session_input_callback is not None:
            raise InvalidOption("a durable run keeps its own history: drop the session options")
        if config.sandbox is not None:
            raise InvalidOption("a sandbox runs outside durable steps: drop RunConfig(sandbox=)")
        self.agent = Agent(
            name=self.name,
            model=ScriptedModel(
                driver(RUN_TOOL, "OpenAI Agents"), name=f"openai-agents:{self.name}"
            ),
            tools=[self._run_tool()],
            **{"version": wrapped_version(self._describe()), **self.options},
        )

    def _describe(self) -> list[Any]:
        """What decides how the SDK agent answers, for its version when none is
        declared (runtime/_fingerprint.py `wrapped_version`): for each agent its
        handoffs reach, its instructions (a function by its name), its tools'
        schemas, its handoffs, output type and model; and the run's model."""
        config = self.run_config or RunConfig()
        return [
            [
                a.name,
                a.instructions,
                a.handoff_description,
                sorted(
                    [t.name, getattr(t, "description", ""), getattr(t, "params_json_schema", None)]
                    for t in a.tools
                ),
                sorted(getattr(h, "agent_name", getattr(h, "name", "")) for h in a.handoffs),
                a.output_type,
                _model_name(a.model),
            ]
            for a in sorted(_graph(self.wrapped).values(), key=lambda a: a.name)
        ] + [_model_name(config.model)]

    def _run_tool(self) -> Tool:
        outer = self

        @tool(name=RUN_TOOL, replay="resume")
        async def openai_agents_run(prompt: str, ctx: ToolContext) -> str:
            """Run the OpenAI Agents SDK agent, each model call and tool call a durable step."""
            return await outer._play(prompt, ctx)

        return openai_agents_run

    async def _play(self, prompt: str, ctx: ToolContext) -> str:
        given = ctx.context.get(_CONTEXT_KEY) or {}
        await carry_over_steps(ctx)
        run = _Run(ctx, frozenset(self.safe_tools))
        config = self.run_config or RunConfig()
        model = config.model
        config = dataclasses.replace(
            config,
            model=DuragentModel(model, run) if isinstance(model, Model) else model,
            model_provider=DuragentModelProvider(config.model_provider, run),
            input_guardrails=[
                _durable_guardrail(g, "input", run) for g in config.input_guardrails or ()
            ],
            output_guardrails=[
                _durable_guardrail(g, "output", run) for g in config.output_guardrails or ()
            ],
        )
        context = given.get("context")
        if context is not None and self.context_type is not None:
            context = pydantic.TypeAdapter(self.context_type).validate_python(context)
        kwargs: dict[str, Any] = {"context": context, "run_config": config}
        if self.max_turns is not None:
            kwargs["max_turns"] = self.max_turns
        try:
            entry = _durable_agent(self.wrapped, run)
            result = await Runner.run(entry, given.get("input", prompt), **kwargs)
        except Exception as exc:
            # The run's own failure fails the task, as it would end run(), with this
            # call unanswered: a retry runs it again from the last recorded step.
            raise FailTask(f"the OpenAI Agents run failed: {type(exc).__name__}: {exc}") from exc
        body = {
            "output": to_jsonable_python(result.final_output),
            "last_agent": result.last_agent.name,
            "input_list": to_jsonable_python(result.to_input_list()),
        }
        return json.dumps(body, ensure_ascii=False)

    def context_for(
        self, context: Any = None, input: str | Sequence[Any] | None = None
    ) -> dict[str, Any]:
        """The task context that carries a run's context object and input items, as JSON."""
        given: dict[str, Any] = {}
        if context is not None and self.context_type is None and not _plain(context):
            # Rebuilt from JSON as is, it would reach the tools as a dict.
            raise InvalidOption(
                f"the context of a durable run is stored as JSON and rebuilt as its "
                f"context_type: give DurableAgent(context_type={type(context).__name__})"
            )
        if context is not None:
            try:
                given["context"] = pydantic.TypeAdapter(self.context_type or Any).dump_python(
                    context, mode="json"
                )
            except PydanticSerializationError as exc:
                raise InvalidOption(
                    f"the context of a durable run is stored as JSON: {exc}; pass data "
                    "(a dataclass or pydantic model of plain fields) and build clients in the tools"
                ) from exc
        if input is not None and not isinstance(input, str):
            given["input"] = to_jsonable_python(list(input))
        return {_CONTEXT_KEY: given} if given else {}

    async def run(
        self,
        rt: Runtime,
        input: str | Sequence[Any],
        *,
        context: Any = None,
        timeout: float | None = None,
        **submit: Any,
    ) -> DurableRunResult:
        """Submit a task that runs the agent (as `Runner.run`), wait for it, give its result.

        `input` is a prompt, or input items (a former result's `input_list` plus
        a new user message); `context` is the SDK run's context (stored as JSON)."""
        prompt = input if isinstance(input, str) else _last_user_text(input)
        task_context = self.context_for(context, input)
        sub = await rt.submit(self.name, prompt, context=task_context, **submit)
        task = await sub.wait(timeout=timeout)
        return await self.result(rt, task)

    def run_sync(self, rt: Runtime, input: str | Sequence[Any], **kw: Any) -> DurableRunResult:
        """`run` for scripts without an event loop (as `Runner.run_sync`): opens `rt` for it."""

        async def go() -> DurableRunResult:
            async with rt:
                return await self.run(rt, input, **kw)

        return asyncio.run(go())

    async def steps(self, rt: Runtime, task_id: str) -> list[str]:
        """The steps a task of this agent recorded, in order (`model:1`, `tool:1:<id>`, ...)."""
        return await recorded_steps(rt, task_id)

    async def result(self, rt: Runtime, task: Task) -> DurableRunResult:
        """The typed result of a finished task of this agent (raises TaskFailed if it failed)."""
        given = await envelope(rt, task, "OpenAI Agents")
        output, last = given["output"], given["last_agent"]
        answered = _graph(self.wrapped).get(last)
        output_type = answered.output_type if answered is not None else None
        if isinstance(output_type, type) and output_type is not str:
            # An output type pydantic cannot rebuild comes back as JSON.
            with suppress(pydantic.ValidationError, pydantic.PydanticSchemaGenerationError):
                output = pydantic.TypeAdapter(output_type).validate_python(output)
        return DurableRunResult(output, last, given["input_list"], task)


def _plain(value: Any) -> bool:
    """JSON data as such (what a context rebuilt without a context_type is)."""
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    return value is None or isinstance(value, str | int | float | bool)


def _last_user_text(items: Sequence[Any]) -> str:
    for item in reversed(items):
        if isinstance(item, dict) and item.get("role") == "user":
            content = item.get("content")
            return content if isinstance(content, str) else json.dumps(content)
    return ""
