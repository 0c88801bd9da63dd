"""Typed entry payloads match what the runtime writes; one rule decides what a marker hides."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest

from duragent import Agent, Runtime, ScriptedModel, Store, TaskStatus, ToolCall, ToolContext, tool
from duragent.payloads import is_voided, rollback_marker, validate_checkpoint, voided_ranges
from duragent.types import EntryKind


def approving_shop() -> Agent:
    async def charge(amount: int) -> dict[str, Any]:
        return {"charged": amount}

    @tool(requires_approval=True, approval_timeout=600, replay="resume")
    async def order(item: str, ctx: ToolContext) -> str:
        """Order an item."""
        return f"{item}: {await ctx.step('charge', charge, 7)}"

    model = ScriptedModel([[ToolCall("order", {"item": "pen"})], "Done."])
    return Agent(name="shop", model=model, tools=[order])


async def test_every_checkpoint_a_run_writes_matches_its_typed_shape(store: Store) -> None:
    async with Runtime(store, agents=[approving_shop()]) as rt:
        sub = await rt.submit("shop", "buy")
        await rt.wait(sub.task_id, timeout=20, until=lambda t: t.status is TaskStatus.WAITING)
        await rt.respond(sub.task_id, approve=True, arguments={"item": "ink"})
        done = await rt.wait(sub.task_id, timeout=20)
    assert done.status is TaskStatus.COMPLETED
    checkpoints = await store.entries(done.id, kinds=[EntryKind.CHECKPOINT])
    typed = [validate_checkpoint(e.payload) for e in checkpoints]
    assert typed == [e.payload for e in checkpoints]  # nothing added, nothing dropped
    assert {c["type"] for c in typed} >= {"wait", "decision", "started", "step_started", "step"}


def test_a_checkpoint_missing_a_field_of_its_tag_is_refused() -> None:
    with pytest.raises(pydantic.ValidationError):
        validate_checkpoint({"type": "wait", "call_id": "c1"})  # which wait?
    with pytest.raises(pydantic.ValidationError):
        validate_checkpoint({"type": "no_such_checkpoint", "call_id": "c1"})


def test_a_marker_without_a_scope_voids_the_model_view_as_old_logs_wrote_it() -> None:
    old = {"from_seq": 3, "to_seq": 5, "reason": "rolled back"}
    assert voided_ranges([old]) == [(3, 5)]
    assert voided_ranges([old], "progress") == []


def test_each_scope_hides_only_its_own_ranges() -> None:
    markers = [
        rollback_marker("api", 2, 4, "x"),
        rollback_marker("progress", 7, 9, "interrupted stream"),
        rollback_marker("ui", 11, 11, "deleted"),
        {"role": "assistant", "content": "not a marker"},
    ]
    api, progress, ui = (voided_ranges(markers, s) for s in ("api", "progress", "ui"))
    assert (api, progress, ui) == ([(2, 4)], [(7, 9)], [(11, 11)])
    assert [s for s in range(1, 13) if is_voided(s, api)] == [2, 3, 4]
    assert not is_voided(8, api) and is_voided(8, progress)
