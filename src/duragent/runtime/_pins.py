"""What a task is pinned to: where its data goes, what its tools may touch, and
the shape of its final answer.

A task records, when it is created, the provider URL its model requests go to
(`config["request"]["base_url"]`, next to the pinned model and settings) and
the reach of its tools (`config["tools"]`: the workdir, the permissions that run
without asking, whether `http_get` may reach private addresses; set by
duragent.toolsets) and the output schema of an agent with an `output_type`
(`config["request"]["output"]`, runtime/_output.py) and, for an agent with
handoffs, the same of every agent they reach (`config["handoffs"]`: name -> its
pins, model and settings included; runtime/_handoffs.py). Never a secret: the
API key stays in the process.

Every worker compares the pin with the agent it would run the task with, and
blocks the task (reason `pinned`) rather than send its conversation somewhere
else or let its tools touch something else; `Runtime.repin(task_id)` (and
`duragent continue --force`) pins the task to the agent as it is now. A task
created before pins were recorded has no such keys and runs as it always did.
`config` is written by the runtime only (API clients write `context`), so the
pin can be trusted.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from duragent.runtime._agent import reachable
from duragent.runtime._output import same_output

if TYPE_CHECKING:
    from duragent.runtime._agent import Agent
    from duragent.types import Task


# Where the provider SDKs send requests when no base_url is given.
_ENV_URL = {"openai": "OPENAI_BASE_URL", "anthropic": "ANTHROPIC_BASE_URL"}


def base_url_of(agent: Agent) -> str | None:
    """Where the agent's model requests go (None: the provider's public endpoint)."""
    if isinstance(agent.model, str):
        url = agent.model_options.get("base_url")
    else:
        url = getattr(agent.model, "base_url", None)
    if url is None:  # the SDK reads its variable then: the pin says where that leads
        env = _ENV_URL.get(agent.model_name.partition(":")[0])
        url = (os.environ.get(env) or None) if env else None
    return None if url is None else str(url)


def tools_reach(agent: Agent) -> list[dict[str, Any]]:
    """The distinct reaches of the agent's bounded tools (usually one toolset's)."""
    seen: dict[str, dict[str, Any]] = {}
    for t in agent.tool_map.values():
        if t.reach is not None:
            seen.setdefault(json.dumps(t.reach, sort_keys=True), t.reach)
    return [seen[k] for k in sorted(seen)]


def _reaches_a_provider(agent: Agent) -> bool:
    """Whether the agent's model sends requests over the network (a provider's
    SDK, or a model object with a `base_url`); a scripted model does not."""
    if isinstance(agent.model, str):
        return agent.model_name.partition(":")[0] in _ENV_URL
    return getattr(agent.model, "base_url", None) is not None


def with_pins(agent: Agent, config: dict[str, Any]) -> dict[str, Any]:
    """`config` with what the agent declares pinned: the base URL of a model
    that talks to a provider, the reach of bounded tools. What it does not
    declare is not pinned, so a process that only submits, naming the agent
    with a stand-in definition (`scripted:none`, no tools), leaves those to the
    workers' definition instead of blocking every task it creates.

    The agents its handoffs reach are pinned too (`config["handoffs"]`: name ->
    their own pins, model and settings included), so a resumed task hands off
    to the same agents, asking the same way."""
    out = _own_pins(agent, config)
    out.pop("handoffs", None)
    before = config.get("handoffs") or {}
    targets = {}
    for a in reachable(agent)[1:]:
        fresh = {"request": {"model": a.model_name, "settings": dict(a.model_settings)}}
        targets[a.name] = _own_pins(a, before.get(a.name) or fresh)
    if targets or "handoffs" in config:  # re-pinned to none: the log may still name one
        out["handoffs"] = targets
    return out


def request_pin(task: Task, agent: Agent) -> dict[str, Any]:
    """The pinned model request of `agent` in `task`: the task's own, or that of
    the handoff target `agent` ({} where nothing is pinned)."""
    if agent.name == task.agent:
        return task.config.get("request") or {}
    pinned = (task.config.get("handoffs") or {}).get(agent.name) or {}
    return pinned.get("request") or {}


def _own_pins(agent: Agent, config: dict[str, Any]) -> dict[str, Any]:
    out = dict(config)
    request = {k: v for k, v in (config.get("request") or {}).items() if k != "base_url"}
    if _reaches_a_provider(agent):
        request["base_url"] = base_url_of(agent)
    request.pop("output", None)
    if agent.output_pin is not None:
        request["output"] = agent.output_pin  # the shape of the final answer
    out["request"] = request
    out.pop("tools", None)  # a re-pin replaces the old reach
    if reach := tools_reach(agent):
        out["tools"] = reach
    return out


def pinned_base_url(task: Task) -> tuple[bool, str | None]:
    """(whether the task pins a base URL, the URL)."""
    return _pinned_url(task.config)


def _pinned_url(config: dict[str, Any]) -> tuple[bool, str | None]:
    request = config.get("request") or {}
    return "base_url" in request, request.get("base_url")


def pinned_reach(task: Task) -> list[dict[str, Any]] | None:
    """The task's pinned tool reach; None for a task from before pins."""
    return _pinned_reach(task.config)


def _pinned_reach(config: dict[str, Any]) -> list[dict[str, Any]] | None:
    reach = config.get("tools")
    return reach if isinstance(reach, list) else None


def _where(url: str | None) -> str:
    return url or "the provider's public endpoint"


def _reach_text(reach: list[dict[str, Any]]) -> str:
    if not reach:
        return "no file or network tools"
    parts = []
    for r in reach:
        allow = ",".join(r.get("allow") or []) or "nothing"
        net = ", private network" if r.get("private_network") else ""
        parts.append(f"workdir {r.get('workdir')} (runs without asking: {allow}{net})")
    return "; ".join(parts)


def conflict(task: Task, agent: Agent) -> str | None:
    """Why running `task` with `agent` would break its pin; None if it would not."""
    problems = _problems(task.config, agent, "this worker's agent")
    pinned = task.config.get("handoffs")
    if isinstance(pinned, dict):
        reach = {a.name: a for a in reachable(agent)[1:]}
        if set(pinned) != set(reach):
            problems.append(
                f"its handoffs are pinned to {sorted(pinned) or 'no agent'}, but this worker's "
                f"agent hands off to {sorted(reach) or 'no agent'}"
            )
        for name in sorted(set(pinned) & set(reach)):
            problems += _problems(pinned[name], reach[name], f"this worker's agent {name!r}")
    if not problems:
        return None
    return (
        "; ".join(problems) + "; run it with the pinned settings, or re-pin it "
        "(Runtime.repin(task_id), or `duragent continue ID --force`), then resume it"
    )


def _problems(config: dict[str, Any], agent: Agent, whose: str) -> list[str]:
    """How `agent` differs from the pins in `config` (a task's, or a handoff target's)."""
    problems = []
    has_url, url = _pinned_url(config)
    if has_url and url != base_url_of(agent):
        problems.append(
            f"its model requests are pinned to {_where(url)}, but {whose} "
            f"sends them to {_where(base_url_of(agent))}"
        )
    reach = _pinned_reach(config)
    if reach is not None and reach != tools_reach(agent):
        problems.append(
            f"its tools are pinned to {_reach_text(reach)}, but {whose} has "
            f"{_reach_text(tools_reach(agent))}"
        )
    pinned_output = (config.get("request") or {}).get("output")
    if pinned_output is not None and not same_output(pinned_output, agent.output_pin):
        problems.append(
            f"its final answer is pinned to the output schema {pinned_output.get('name')!r}, "
            f"but {whose} has "
            + (
                f"the schema {agent.output_pin['name']!r} (changed)"
                if agent.output_pin is not None
                else "no output_type"
            )
        )
    return problems
