"""Agent definitions: what a task runs, and the options that tune how it runs."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from duragent.errors import InvalidOption, check_count, check_delay
from duragent.llm import ChatModel, resolve_model
from duragent.runtime._builtin import ask_user, update_plan
from duragent.runtime._context_policy import ContextPolicy
from duragent.runtime._deadlines import deadline_at
from duragent.runtime._fingerprint import check_version, fingerprint, with_handoffs
from duragent.runtime._guardrails import Guardrail, named_guardrails
from duragent.runtime._handoffs import transfer_name
from duragent.runtime._inbox import MultitaskStrategy, check_strategy
from duragent.runtime._output import OutputType, check_output_type, output_pin
from duragent.runtime._tools import Tool, make_tool
from duragent.webhooks import check_url


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How a model call that failed with a retryable error is tried again.

    The delay before retry n is `base_delay * 2**(n-1)`, at most `max_delay`,
    with jitter (half to all of it); a provider's `retry_after` replaces it.
    Tools are never retried by this policy: a failed tool's error goes to the model.
    """

    max_retries: int = 4
    """Retries after the first attempt; then the task fails (0: never retry)."""
    base_delay: float = 1.0
    """Seconds before the first retry; each next one doubles it."""
    max_delay: float = 30.0
    """The longest wait between two attempts, in seconds."""

    def __post_init__(self) -> None:
        check_count("RetryPolicy.max_retries", self.max_retries, least=0)
        check_delay("RetryPolicy.base_delay", self.base_delay)  # 0: retry at once
        check_delay("RetryPolicy.max_delay", self.max_delay)


@dataclass(frozen=True, kw_only=True)
class Limits:
    """When a task stops trying: too many rounds, or too many takeovers."""

    max_iterations: int = 25
    """Rounds (model calls) a task may take; the next one fails it (`failed`)."""
    max_restarts: int = 3
    """Takeovers after a lost lease (a crashed worker); one more blocks the task
    (`blocked(restart_limit)`) until someone resumes it. 0: block at the first."""

    def __post_init__(self) -> None:
        check_count("Limits.max_iterations", self.max_iterations, least=0)  # 0: fails at once
        check_count("Limits.max_restarts", self.max_restarts, least=0)


@dataclass(frozen=True, kw_only=True)
class Timing:
    """How often a running task writes, and how long a stop waits for its tools.

    Every value is in seconds; zero means at once (every piece, no wait).
    """

    progress_interval: float = 0.1
    """Least time between two progress commits while the model streams (and
    while a tool reports progress); what streams meanwhile goes in the next one."""
    tool_grace: float = 10.0
    """How long a pause, interrupt or release waits for running tools to finish
    and commit their result before they are cancelled."""
    state_debounce: float = 1.0
    """Quiet time after a change to `ctx.state` before it is saved."""
    state_max_wait: float = 5.0
    """The longest a change to `ctx.state` stays unsaved while changes keep coming."""

    def __post_init__(self) -> None:
        for name in ("progress_interval", "tool_grace", "state_debounce", "state_max_wait"):
            check_delay(f"Timing.{name}", getattr(self, name))


@dataclass(frozen=True, kw_only=True)
class BuiltinTools:
    """The tools duragent offers the model besides the agent's own."""

    plan: bool = True
    """`update_plan`: the model keeps the task's pending steps (`Runtime.steps`)."""
    ask_user: bool = False
    """`ask_user`: the model asks a person and the task waits for the answer
    (`Runtime.respond(answer=...)`)."""

    def __post_init__(self) -> None:
        for name in ("plan", "ask_user"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidOption(f"BuiltinTools.{name} is True or False")


# Agent's grouped options, checked for their type (a dict passed instead says so).
_OPTIONS: dict[str, type] = {
    "limits": Limits,
    "timing": Timing,
    "model_retry": RetryPolicy,
    "builtin_tools": BuiltinTools,
    "context": ContextPolicy,
}


@dataclass
class Agent:
    """What a task runs: a model, instructions, tools, and how it runs them.

    `model` is a ChatModel or a string such as "openai:gpt-4o-mini". The tuning
    is grouped: `limits` (Limits), `timing` (Timing), `model_retry` (RetryPolicy)
    and `builtin_tools` (BuiltinTools), each with its defaults.
    """

    name: str
    model: str | ChatModel
    instructions: str = ""
    tools: Sequence[Tool | Callable[..., Any] | Sequence[Tool]] = ()
    model_settings: dict[str, Any] = field(default_factory=dict)
    # Options for the client a model string builds (base_url, api_key, timeout, ...).
    # Never stored: credentials stay in the process.
    model_options: dict[str, Any] = field(default_factory=dict, repr=False)
    limits: Limits = Limits()
    timing: Timing = Timing()
    model_retry: RetryPolicy = RetryPolicy()
    builtin_tools: BuiltinTools = BuiltinTools()
    # Called on status changes of this agent's tasks (see duragent.webhooks).
    webhook: str | None = None
    # What a new message does while a turn of the session runs: enqueue, reject,
    # interrupt or rollback (runtime/_inbox.py); submit(multitask_strategy=) overrides it.
    multitask_strategy: MultitaskStrategy = "enqueue"
    # Default wall-clock limit of this agent's tasks, from their submission
    # (seconds or a timedelta); submit(deadline=...) overrides it.
    deadline: float | timedelta | None = None
    # The shape of the final answer: a pydantic model class or a JSON schema of an
    # object (runtime/_output.py). `task.output` then holds the answer's JSON and
    # `Runtime.result` gives it back typed; an answer that does not validate goes
    # back to the model with the errors, at most `output_retries` times (and an
    # output guardrail's corrections, at most as many times: runtime/_checks.py).
    output_type: OutputType | None = None
    output_retries: int = 2
    # Checks of the task's input (before the first model call) and of the final
    # answer, each verdict committed (runtime/_guardrails.py).
    input_guardrails: Sequence[Guardrail] = ()
    output_guardrails: Sequence[Guardrail] = ()
    # How the task's view is kept inside the model's context window (compaction).
    context: ContextPolicy = field(default_factory=ContextPolicy)
    # Agents the model may hand the task to, one `transfer_to_<name>` tool each
    # (runtime/_handoffs.py); cycles are fine (assign `handoffs` after creating both).
    handoffs: Sequence[Agent] = field(default=(), repr=False, compare=False)
    # What the transfer tool to this agent tells the model about it.
    handoff_description: str = ""
    # The transfer tools: tool name -> the agent it hands to (set from `handoffs`).
    transfers: dict[str, Agent] = field(init=False, repr=False, compare=False, default_factory=dict)
    # The version its tasks are pinned to (runtime/_versions.py): declared ("v3"),
    # or, when None, a fingerprint of the instructions, tool schemas, output
    # schema and model, set here. A task runs only on a worker serving its version.
    version: str | None = None

    def __post_init__(self) -> None:
        for name, kind in _OPTIONS.items():
            if not isinstance(getattr(self, name), kind):
                raise InvalidOption(
                    f"Agent.{name} is a {kind.__name__}(...), not {getattr(self, name)!r}"
                )
        if self.webhook is not None:
            check_url(self.webhook)
        check_strategy(self.multitask_strategy)
        check_output_type(self.output_type)
        # The schema as a task pins it: built once, not on every model call.
        self.output_pin: dict[str, Any] | None = (
            None if self.output_type is None else output_pin(self.output_type)
        )
        check_count("Agent.output_retries", self.output_retries, least=0)
        self.input_checks = named_guardrails(self.input_guardrails, "input")
        self.output_checks = named_guardrails(self.output_guardrails, "output")
        if self.deadline is not None:
            if isinstance(self.deadline, bool) or not isinstance(
                self.deadline, int | float | timedelta
            ):
                raise InvalidOption("Agent.deadline is a delay: seconds or a timedelta")
            deadline_at(self.deadline)  # a delay no task could have fails here

        # An item may be a list of tools (a toolset such as mcp_tools(...)).
        flat: list[Any] = [
            x for t in self.tools for x in (t if isinstance(t, list | tuple) else [t])
        ]
        tools = [t if isinstance(t, Tool) else make_tool(t) for t in flat]
        if self.builtin_tools.plan and not any(t.name == update_plan.name for t in tools):
            tools.append(update_plan)
        if self.builtin_tools.ask_user and not any(t.name == ask_user.name for t in tools):
            tools.append(ask_user)
        names = [t.name for t in tools]
        dupes = {n for n in names if names.count(n) > 1}
        if dupes:
            raise InvalidOption(f"agent {self.name!r} has two tools named {sorted(dupes)}")
        self.tool_map: dict[str, Tool] = {t.name: t for t in tools}
        self._model: ChatModel | None = None
        # The tool a hosted loop runs in (runtime/_hosted.py): set by a framework's
        # wrapper (duragent.pydantic_ai), kept in each task's config at submit.
        self.hosted_loop: str | None = None
        self.version_declared = self.version is not None
        if self.version is None:
            self.own_print = self.version = fingerprint(
                self.instructions, self.tool_map.values(), self.output_pin, self.model_name
            )
        else:
            check_version(self.version)
        if not isinstance(self.handoff_description, str):
            raise InvalidOption("Agent.handoff_description is text")
        self.handoffs = self.handoffs  # checked, and kept as a tuple (see __setattr__)

    def __setattr__(self, name: str, value: Any) -> None:
        # `handoffs`, at Agent() or assigned later (to close a cycle), is checked at
        # once and kept as a tuple, so the transfer tools always match it.
        if name == "handoffs" and "tool_map" in self.__dict__:
            # tool name -> the agent it hands the task to
            self.__dict__["transfers"] = transfers(self.name, value, self.tool_map)
            value = tuple(value)
            super().__setattr__(name, value)
            with contextlib.suppress(InvalidOption):  # two agents with one name: said later
                self.refresh_version()
            return
        super().__setattr__(name, value)

    def refresh_version(self) -> None:
        """A fingerprint version covers the agents its handoffs reach (see
        `with_handoffs`): set again once `handoffs` change, and by `agents_by_name`
        once a cycle closed after both agents were made."""
        if self.version_declared:
            return
        graph = [
            [
                a.name,
                a.version if a.version_declared else a.own_print,
                sorted(t.name for t in a.handoffs),
                a.handoff_description,
            ]
            for a in reachable(self)
        ]
        self.version = with_handoffs(self.own_print, graph if self.handoffs else [])

    @property
    def chat_model(self) -> ChatModel:
        if self._model is None:
            self._model = resolve_model(self.model, **self.model_options)
        return self._model

    async def close_model(self) -> None:
        """Close the model this agent built from its model string (its HTTP client is
        bound to the event loop that used it); the next use builds a new one. A
        ChatModel instance passed in belongs to the caller and is left open."""
        model, self._model = self._model, None
        if model is not None and isinstance(self.model, str):
            aclose = getattr(model, "aclose", None)
            if aclose is not None:
                await aclose()

    @property
    def model_name(self) -> str:
        return self.model if isinstance(self.model, str) else self.model.name


def transfers(owner: str, handoffs: object, tools: Iterable[str]) -> dict[str, Agent]:
    """The transfer tools of agent `owner`: tool name -> target. A clear one-line
    error for a target that is not an Agent, two targets with one name, or a
    transfer tool whose name one of the agent's own tools has."""
    if not isinstance(handoffs, list | tuple):
        raise InvalidOption(f"Agent.handoffs of {owner!r} is a list of agents, not {handoffs!r}")
    out: dict[str, Agent] = {}
    own = set(tools)
    for target in handoffs:
        if not isinstance(target, Agent):
            raise InvalidOption(
                f"Agent.handoffs of {owner!r} holds agents (duragent.Agent), not {target!r}"
            )
        name = transfer_name(target.name)
        if name in out:
            raise InvalidOption(
                f"agent {owner!r} hands off twice to {name!r} (agents {out[name].name!r} "
                f"and {target.name!r}): give each target its own name"
            )
        if name in own:
            raise InvalidOption(
                f"agent {owner!r} has a tool named {name!r}, the name of its handoff to "
                f"{target.name!r}: rename the tool"
            )
        out[name] = target
    return out


def reachable(agent: Agent) -> list[Agent]:
    """`agent` and every agent its handoffs reach, once each (cycles are fine); two
    different agents under one name are refused (a log names its agents)."""
    seen: dict[str, Agent] = {}
    todo = [agent]
    while todo:
        a = todo.pop(0)
        other = seen.get(a.name)
        if other is a:
            continue
        if other is not None:
            raise InvalidOption(
                f"two agents are named {a.name!r} among the handoffs of {agent.name!r}: "
                "give each agent its own name (a task's log names the agent it hands to)"
            )
        seen[a.name] = a
        todo += a.handoffs
    return list(seen.values())


def agents_by_name(agents: Iterable[Agent]) -> dict[str, Agent]:
    """The agents by name, and those their handoffs reach; two different agents
    under one name are refused, since a task names its agent and one of the two
    would silently never run."""
    named: dict[str, Agent] = {}
    # An agent's handoff targets are served with it: a worker runs whatever it hands to.
    for agent in [r for a in agents for r in reachable(a)]:
        other = named.setdefault(agent.name, agent)
        if other is not agent:
            raise InvalidOption(
                f"two agents are named {agent.name!r}: give each agent its own name "
                "(a task names the agent that runs it)"
            )
    for agent in named.values():
        agent.refresh_version()  # the handoffs are all in place by now
    return named
