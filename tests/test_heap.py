"""Long histories parsed with the cyclic collector held off: what they leave
behind is still collected, and the collector is left as it was."""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator

import pytest

from duragent.heap import collector_paused
from duragent.store.base import view_data

# Messages with tool calls: containers the collector tracks, as in a real history.
HISTORY = json.dumps(
    [
        {
            "role": "assistant",
            "content": f"step {i}",
            "tool_calls": [
                {"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        }
        for i in range(4_000)
    ]
)


@pytest.fixture
def collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


@pytest.mark.usefixtures("collector_on")
def test_views_parsed_again_and_again_in_cycles_are_collected_as_they_go() -> None:
    """A worker resumes long tasks one after another; a finished runner's view
    is garbage held in reference cycles, which only the cyclic collector frees.
    However the parse handles the collector, those views must not pile up (a
    pass that moved them straight to the oldest generation once did: it reset
    the collector's counts and full collections stopped)."""
    gc.collect()
    base = len(gc.get_objects())
    per_view = 3 * 4_000  # the message, its tool_calls list and the call are tracked
    for _ in range(90):
        holder: dict[str, object] = {}
        holder["self"] = holder  # a cycle made before the parse, as a runner's
        holder["view"] = view_data(HISTORY)
        del holder
        churn = [{"k": [n]} for n in range(2_000)]  # the rest of the worker's work
        del churn
    assert len(gc.get_objects()) < base + 30 * per_view


@pytest.mark.usefixtures("collector_on")
def test_the_collector_is_on_again_after_a_parse() -> None:
    view_data(HISTORY)
    assert gc.isenabled()


def test_a_collector_the_process_turned_off_stays_off() -> None:
    was = gc.isenabled()
    gc.disable()
    try:
        view_data(HISTORY)
        assert not gc.isenabled()
    finally:
        if was:
            gc.enable()


@pytest.mark.usefixtures("collector_on")
def test_a_block_that_fails_turns_the_collector_back_on() -> None:
    with pytest.raises(ValueError), collector_paused():
        raise ValueError("broken")
    assert gc.isenabled()
