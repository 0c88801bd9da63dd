"""ContextPolicy's options checked when it is made, each refusal one line naming the option."""

from __future__ import annotations

import math
from typing import Any

import pytest

from duragent import ContextPolicy, InvalidOption, Runtime, ScriptedModel, Store, TaskStatus
from support.long_task import WindowedModel, agent_with, long_task_script


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ({"chars_per_token": math.inf}, "chars_per_token is a number from 0.5 to 100"),
        ({"chars_per_token": math.nan}, "chars_per_token is a number from 0.5 to 100"),
        ({"chars_per_token": 0}, "chars_per_token is a number from 0.5 to 100"),
        ({"chars_per_token": "4"}, "chars_per_token is a number from 0.5 to 100"),
        ({"windows": {"m": 0}}, "windows['m'] is a whole number of tokens >= 256"),
        ({"windows": {"m": -5}}, "windows['m'] is a whole number of tokens >= 256"),
        ({"windows": {"m": math.nan}}, "windows['m'] is a whole number of tokens >= 256"),
        ({"windows": {"m": True}}, "windows['m'] is a whole number of tokens >= 256"),
        ({"windows": {"": 8_000}}, "windows: a key is a model name"),
        ({"summary_chars": 10**9}, "summary_chars is at most 200000"),
        ({"target": math.nan}, "0 < target < threshold <= 1"),
    ],
)
def test_a_bad_option_is_refused_in_one_line(bad: dict[str, Any], says: str) -> None:
    with pytest.raises(InvalidOption, match="ContextPolicy") as refused:
        ContextPolicy(**bad)
    assert says in str(refused.value) and "\n" not in str(refused.value)


async def test_a_summary_longer_than_the_window_allows_is_named_as_the_cause(store: Store) -> None:
    # The window comes from the table (not checked when the policy is made).
    model = WindowedModel(ScriptedModel(long_task_script(30)), window=6_000)
    agent = agent_with(
        model, windows={"small-model": 6_000}, summary_chars=40_000, elide_over=100_000
    )
    async with Runtime(store, agents=[agent]) as rt:
        task = await (await rt.submit("long", "Fetch every page.")).wait(timeout=120)
    assert task.status is TaskStatus.FAILED
    assert "lower ContextPolicy.summary_chars: 40000 characters" in (task.error or "")
