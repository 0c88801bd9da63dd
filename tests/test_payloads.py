"""Typed entry payloads match what the runtime writes; one rule decides what a marker hides."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest

from duragent import (
    Agent,
    Limits,
    Runtime,
    ScriptedModel,
    Store,
    TaskStatus,
    Timing,
    ToolCall,
    ToolContext,
    tool,
)
from duragent._payloads import (
    IntentPayload,
    ProgressPayload,
    ResultPayload,
    RollbackPayload,
    StatusPayload,
    is_voided,
    rollback_marker,
    validate_checkpoint,
    voided_ranges,
)
from duragent.runtime._submit import new_task
from duragent.store._commits import Commit
from duragent.types import EntryKind, NewEntry, UIText


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


def test_a_marker_carries_its_scope_range_and_reason() -> None:
    assert rollback_marker("progress", 7, 9, "interrupted stream") == {
        "scope": "progress",
        "from_seq": 7,
        "to_seq": 9,
        "reason": "interrupted stream",
    }


SHAPES: dict[EntryKind, Any] = {
    EntryKind.TOOL_INTENT: IntentPayload,
    EntryKind.TOOL_RESULT: ResultPayload,
    EntryKind.PROGRESS: ProgressPayload,
    EntryKind.ROLLBACK: RollbackPayload,
    EntryKind.STATUS: StatusPayload,
}


async def test_every_payload_a_run_writes_has_exactly_the_keys_its_typed_shape_names(
    store: Store,
) -> None:
    """Intents, results, progress, markers and status changes as the runtime writes
    them (a claim, a wait, a takeover, a failure, a hand-back, a stream cut by a
    crash): no key the shape does not name, none it requires missing; and every
    key of a status change is seen written."""

    @tool
    async def chat(ctx: ToolContext) -> str:
        """Says something on the way."""
        await ctx.report("working")
        return "said"

    looping = Agent(
        name="loop",
        model=ScriptedModel(lambda m: [ToolCall("chat")]),
        tools=[chat],
        limits=Limits(max_iterations=1),
    )
    streaming = Agent(
        name="stream",
        model=ScriptedModel(["a streamed answer"], chunk_size=3),
        timing=Timing(progress_interval=0),
    )
    # A worker died mid-stream: the next one voids the partial answer.
    task, first = new_task(streaming, "again")
    await store.create_task(task, [first])
    dead = await store.claim_task("dead-worker", task_id=task.id, ttl=0.0)
    assert dead is not None
    cut = NewEntry(task_id=task.id, kind=EntryKind.PROGRESS, round=1, payload={"text": "a s"})
    await store.commit(Commit(entries=[cut], fence={task.id: dead.lease.epoch}))
    # A worker died between two results of a round: the next one reads the first.
    halfway, first = new_task(looping, "twice")
    await store.create_task(halfway, [first])
    dead = await store.claim_task("dead-worker", task_id=halfway.id, ttl=0.0)
    assert dead is not None
    two = [
        {"id": cid, "type": "function", "function": {"name": "chat", "arguments": "{}"}}
        for cid in ("c1", "c2")
    ]
    written: list[tuple[EntryKind, dict[str, Any]]] = [
        (EntryKind.API_MESSAGE, {"role": "assistant", "tool_calls": two}),
        (EntryKind.TOOL_INTENT, {"call_id": "c1", "name": "chat", "replay": "never"}),
        (EntryKind.TOOL_INTENT, {"call_id": "c2", "name": "chat", "replay": "never"}),
        (
            EntryKind.TOOL_RESULT,
            {"role": "tool", "tool_call_id": "c1", "content": "said", "outcome": "ok"},
        ),
    ]
    entries = [NewEntry(task_id=halfway.id, kind=k, round=1, payload=p) for k, p in written]
    await store.commit(Commit(entries=entries, fence={halfway.id: dead.lease.epoch}))
    async with Runtime(store, agents=[approving_shop(), looping, streaming]) as rt:
        shop = await rt.submit("shop", "buy")
        await rt.wait(shop.task_id, timeout=20, until=lambda t: t.status is TaskStatus.WAITING)
        await rt.respond(shop.task_id, approve=True)
        failed = await (await rt.submit("loop", "go")).wait(20)
        streamed = await (await rt.submit("stream", "go")).wait(20)
        recovered = await rt.wait(task.id, timeout=20)
        resumed = await rt.wait(halfway.id, timeout=20)
        ui = await rt.ui_messages(task.id)
        await rt.wait(shop.task_id, timeout=20)
    # A worker that hands its task back.
    handed, first = new_task(streaming, "later")
    await store.create_task(handed, [first])
    held = await store.claim_task("leaving-worker", task_id=handed.id)
    assert held is not None
    await store.release_lease(handed.id, held.lease.epoch)

    assert failed.status is TaskStatus.FAILED and recovered.status is TaskStatus.COMPLETED
    assert streamed.output == recovered.output == "a streamed answer"
    assert [m.text for m in ui if isinstance(m, UIText)] == [
        "again",
        "a streamed answer",
    ]
    payloads: dict[EntryKind, list[dict[str, Any]]] = {kind: [] for kind in SHAPES}
    outcomes = [
        (e.payload["tool_call_id"], e.payload["outcome"])
        for e in await store.entries(halfway.id, kinds=[EntryKind.TOOL_RESULT])
    ]
    assert resumed.status is TaskStatus.FAILED  # max_iterations: 1
    assert outcomes == [("c1", "ok"), ("c2", "interrupted")]  # c1 read back, not run again
    for tid in (shop.task_id, failed.id, streamed.id, task.id, handed.id, halfway.id):
        for e in await store.entries(tid):
            if e.kind in SHAPES:
                payloads[e.kind].append(e.payload)
    for kind, shape in SHAPES.items():
        assert payloads[kind], f"the run wrote no {kind.value} entry"
        for p in payloads[kind]:
            assert set(p) <= set(shape.__annotations__), (kind, p)
            assert shape.__required_keys__ <= set(p), (kind, p)
    status_keys = set().union(*payloads[EntryKind.STATUS])
    assert status_keys == set(StatusPayload.__annotations__)
    progress = payloads[EntryKind.PROGRESS]
    assert {"text": "working", "call_id": "call_0_0"} in progress and {"text": "a s"} in progress
