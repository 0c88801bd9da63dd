"""An agent's tuning, grouped (Limits, Timing, RetryPolicy, BuiltinTools): frozen,
with defaults, and a degenerate value refused in one line when it is built."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from duragent import (
    Agent,
    BuiltinTools,
    InvalidOption,
    Limits,
    RetryPolicy,
    ScriptedModel,
    Timing,
    WorkerOptions,
)


def test_the_defaults_are_the_documented_ones() -> None:
    agent = Agent(name="a", model=ScriptedModel(["ok"]))
    assert agent.limits == Limits(max_iterations=25, max_restarts=3)
    assert agent.timing == Timing(
        progress_interval=0.1, tool_grace=10.0, state_debounce=1.0, state_max_wait=5.0
    )
    assert agent.model_retry == RetryPolicy(max_retries=4, base_delay=1.0, max_delay=30.0)
    assert agent.builtin_tools == BuiltinTools(plan=True, ask_user=False)
    assert "update_plan" in agent.tool_map and "ask_user" not in agent.tool_map


def test_builtin_tools_choose_what_the_model_is_offered() -> None:
    agent = Agent(
        name="a", model=ScriptedModel(["ok"]), builtin_tools=BuiltinTools(plan=False, ask_user=True)
    )
    assert "update_plan" not in agent.tool_map and "ask_user" in agent.tool_map


def test_options_are_frozen_and_keyword_only() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Limits().max_iterations = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        Limits(3)  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("build", "named"),
    [
        (lambda: Limits(max_iterations=-1), "Limits.max_iterations"),
        (
            lambda: Limits(max_iterations=2.5),  # type: ignore[arg-type]
            "Limits.max_iterations",
        ),
        (lambda: Limits(max_iterations=True), "Limits.max_iterations"),
        (lambda: Limits(max_restarts=-1), "Limits.max_restarts"),
        (lambda: Timing(progress_interval=-0.1), "Timing.progress_interval"),
        (lambda: Timing(tool_grace=math.nan), "Timing.tool_grace"),
        (lambda: Timing(state_debounce=math.inf), "Timing.state_debounce"),
        (lambda: Timing(state_max_wait="5"), "Timing.state_max_wait"),  # type: ignore[arg-type]
        (lambda: RetryPolicy(max_retries=-1), "RetryPolicy.max_retries"),
        (lambda: RetryPolicy(base_delay=-1), "RetryPolicy.base_delay"),
        (lambda: RetryPolicy(max_delay=math.inf), "RetryPolicy.max_delay"),
        (lambda: BuiltinTools(plan=1), "BuiltinTools.plan"),  # type: ignore[arg-type]
    ],
)
def test_a_degenerate_value_is_refused_in_one_line_naming_it(build: Any, named: str) -> None:
    with pytest.raises(InvalidOption, match=named) as caught:
        build()
    assert "\n" not in str(caught.value)


def test_zero_means_at_once_where_waiting_is_optional() -> None:
    Timing(progress_interval=0, tool_grace=0, state_debounce=0, state_max_wait=0)
    Limits(max_restarts=0)
    RetryPolicy(max_retries=0)


def test_an_option_of_the_wrong_kind_says_which_to_build() -> None:
    with pytest.raises(InvalidOption, match=r"Agent.limits is a Limits\(...\)"):
        Agent(name="a", model="scripted:none", limits={"max_iterations": 3})  # type: ignore[arg-type]


def test_values_the_flat_knobs_took_are_still_taken() -> None:
    """Zero meant something before the grouping, and still does: no retry delay,
    a task that fails at its first round; a worker may wait for its tasks forever."""
    assert RetryPolicy(base_delay=0, max_delay=0).max_delay == 0
    assert Limits(max_iterations=0).max_iterations == 0
    assert WorkerOptions(shutdown_grace=None).shutdown_grace is None
    with pytest.raises(InvalidOption, match="concurrency is a whole number of tasks >= 1"):
        WorkerOptions(concurrency=0)
