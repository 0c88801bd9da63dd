"""Long histories parsed with the cyclic collector held off: what they leave
behind is still collected, and the collector is left as it was. A finished
task's runner goes when its last reference does, not at a full collection."""

from __future__ import annotations

import asyncio
import gc
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from duragent import Agent, Runtime, ScriptedModel, TaskStatus, ToolCall, ToolContext, tool
from duragent._heap import collector_paused
from duragent.runtime._commits import Commits
from duragent.runtime._engine import TaskRunner
from duragent.store._views import view_data

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


@pytest.mark.slow
@pytest.mark.usefixtures("collector_on")
def test_views_parsed_again_and_again_in_cycles_are_collected_as_they_go() -> None:
    """A worker resumes long tasks one after another; a view that ends up in
    a reference cycle (anything of the user's that holds it and is held back)
    is freed only by the cyclic collector. However the parse handles the
    collector, such views must not pile up (a pass that moved them straight
    to the oldest generation once did: it reset the collector's counts and
    full collections stopped)."""
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


@pytest.fixture
def collector_off() -> Iterator[None]:
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    yield
    if was:
        gc.enable()


@pytest.mark.slow
@pytest.mark.usefixtures("collector_off")
@pytest.mark.parametrize("store", ["memory", "sqlite"])
async def test_a_finished_runner_is_freed_without_the_cyclic_collector(
    store: str, tmp_path: Path
) -> None:
    """A runner holds the task's whole view of its history. Held in a reference
    cycle (its state's saver was once its own bound method), every finished
    runner of a worker stayed in memory until a full collection; with the
    collector off here, such a runner would never go."""

    @tool(replay="safe")
    def note(text: str, ctx: ToolContext) -> str:
        """Note something in the task's state."""
        ctx.update_state(noted=text)  # the debounced state saves it
        return "noted"

    model = ScriptedModel(
        [[ToolCall("note", {"text": "a"})], [ToolCall("note", {"text": "b"})], "done"]
    )
    url = "memory://" if store == "memory" else f"sqlite:///{tmp_path}/heap.db"
    async with Runtime(url, agents=[Agent(name="a", model=model, tools=[note])]) as rt:
        task = await (await rt.submit("a", "go")).wait(30)
        assert task.status is TaskStatus.COMPLETED and task.context == {"noted": "b"}
        assert rt.worker is not None
        await asyncio.wait_for(rt.worker.wait_task(task.id), 30)
        assert rt.worker.runner(task.id) is None  # the worker let go of it
        alive = [o for o in gc.get_objects() if isinstance(o, TaskRunner | Commits)]
        assert alive == []


@pytest.mark.usefixtures("collector_on")
def test_a_pause_ending_inside_another_leaves_the_collector_off_until_the_last_ends() -> None:
    """Two parses overlapping (threads of one worker): the first to end must not
    turn the collector on under the other."""
    outer = collector_paused()
    inner = collector_paused()
    outer.__enter__()
    inner.__enter__()
    outer.__exit__(None, None, None)
    assert not gc.isenabled()
    inner.__exit__(None, None, None)
    assert gc.isenabled()
