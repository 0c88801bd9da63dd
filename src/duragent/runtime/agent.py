"""Agent definitions."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from duragent.errors import InvalidOption
from duragent.llm import ChatModel, resolve_model
from duragent.runtime.builtin import ask_user, update_plan
from duragent.runtime.deadlines import deadline_at
from duragent.runtime.inbox import MultitaskStrategy, check_strategy
from duragent.runtime.tools import Tool, make_tool
from duragent.webhooks import check_url


@dataclass
class Agent:
    """What a task runs: a model, instructions, tools and limits.

    `model` is a ChatModel or a string such as "openai:gpt-4o-mini".
    """

    name: str
    model: str | ChatModel
    instructions: str = ""
    tools: Sequence[Tool | Callable[..., Any] | Sequence[Tool]] = ()
    max_iterations: int = 25
    max_restarts: int = 3
    model_settings: dict[str, Any] = field(default_factory=dict)
    # Options for the client a model string builds (base_url, api_key, timeout, ...).
    # Never stored: credentials stay in the process.
    model_options: dict[str, Any] = field(default_factory=dict, repr=False)
    progress_interval: float = 0.1  # seconds between progress commits while streaming
    tool_grace: float = 10.0  # how long a pause waits for running tools
    state_debounce: float = 1.0
    state_max_wait: float = 5.0
    model_retries: int = 4
    retry_base_delay: float = 1.0
    retry_max_delay: float = 30.0
    plan_tool: bool = True  # offer the built-in update_plan tool (the task's pending steps)
    ask_user_tool: bool = False  # offer the built-in ask_user tool (waits for an answer)
    # Called on status changes of this agent's tasks (see duragent.webhooks).
    webhook: str | None = None
    # What a new message does while a turn of the session runs: enqueue, reject,
    # interrupt or rollback (runtime/inbox.py); submit(multitask_strategy=) overrides it.
    multitask_strategy: MultitaskStrategy = "enqueue"
    # Default wall-clock limit of this agent's tasks, from their submission
    # (seconds or a timedelta); submit(deadline=...) overrides it.
    deadline: float | timedelta | None = None

    def __post_init__(self) -> None:
        if self.webhook is not None:
            check_url(self.webhook)
        check_strategy(self.multitask_strategy)
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
        if self.plan_tool and not any(t.name == update_plan.name for t in tools):
            tools.append(update_plan)
        if self.ask_user_tool and not any(t.name == ask_user.name for t in tools):
            tools.append(ask_user)
        names = [t.name for t in tools]
        dupes = {n for n in names if names.count(n) > 1}
        if dupes:
            raise InvalidOption(f"agent {self.name!r} has two tools named {sorted(dupes)}")
        self.tool_map: dict[str, Tool] = {t.name: t for t in tools}
        self._model: ChatModel | None = None

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


def agents_by_name(agents: Iterable[Agent]) -> dict[str, Agent]:
    """The agents by name; two different agents under one name are refused, since a
    task names its agent and one of the two would silently never run."""
    named: dict[str, Agent] = {}
    for agent in agents:
        other = named.setdefault(agent.name, agent)
        if other is not agent:
            raise InvalidOption(
                f"two agents are named {agent.name!r}: give each agent its own name "
                "(a task names the agent that runs it)"
            )
    return named
