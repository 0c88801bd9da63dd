"""A resumed history's objects skip the young generations of the cyclic collector."""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator

import pytest

from duragent.heap import _FREE_THREADED, collector_paused
from duragent.store.base import view_data

pytestmark = pytest.mark.skipif(_FREE_THREADED, reason="a free-threaded build has no generations")

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


def in_generation(obj: object, generation: int) -> bool:
    return any(o is obj for o in gc.get_objects(generation))


@pytest.fixture
def collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


@pytest.mark.usefixtures("collector_on")
def test_a_parsed_view_goes_to_the_oldest_generation_untraversed() -> None:
    collections: list[int] = []

    def heard(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    gc.callbacks.append(heard)
    try:
        data = view_data(HISTORY)
        young = gc.get_count()[0]  # made while thousands were young, this would collect them
    finally:
        gc.callbacks.remove(heard)
    assert collections == []
    assert young < 100
    assert in_generation(data, 2)
    assert in_generation(data[0]["tool_calls"], 2)
    assert gc.isenabled()


@pytest.mark.usefixtures("collector_on")
def test_a_short_view_is_left_to_the_young_collections() -> None:
    gc.collect()  # every generation empty: the few objects below cannot trigger one
    data = view_data(json.dumps(json.loads(HISTORY)[:20]))
    assert not in_generation(data, 2)
    assert gc.get_count()[0] > 0


@pytest.mark.usefixtures("collector_on")
def test_the_objects_a_process_froze_stay_frozen() -> None:
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        data = view_data(HISTORY)
        assert gc.get_freeze_count() == frozen
        assert not in_generation(data, 2)  # left where new objects go
    finally:
        gc.unfreeze()


def test_a_collector_the_process_turned_off_stays_off() -> None:
    was = gc.isenabled()
    gc.disable()
    try:
        data = view_data(HISTORY)
        assert not gc.isenabled()
        assert not in_generation(data, 2)
    finally:
        if was:
            gc.enable()


@pytest.mark.usefixtures("collector_on")
def test_a_block_that_fails_turns_the_collector_back_on_and_promotes_nothing() -> None:
    made: list[object] = []
    with pytest.raises(ValueError), collector_paused():
        made.append([[] for _ in range(10_000)])
        raise ValueError("broken")
    assert gc.isenabled()
    assert not in_generation(made[0], 2)
