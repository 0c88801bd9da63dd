"""A compaction's commit and what else changes the task's row meanwhile."""

from __future__ import annotations

from typing import Any

from duragent import Runtime, ScriptedModel, Store, TaskStatus
from duragent.types import EntryKind
from support.long_task import WindowedModel, agent_with, long_task_script


async def test_a_message_sent_while_the_summariser_runs_reaches_the_model(store: Store) -> None:
    box: dict[str, Any] = {}

    async def compact(old: list[dict[str, Any]]) -> str:
        if "sent" not in box:  # the row changes between the decision and the commit
            box["sent"] = await box["rt"].send(box["id"], "ALSO SAY BANANA")
        return "summary of the old rounds"

    model = WindowedModel(ScriptedModel(long_task_script(30)), window=6_000)
    agent = agent_with(model, window=6_000, elide_over=100_000, compact=compact)
    async with Runtime(store, agents=[agent]) as rt:
        box["rt"] = rt
        sub = await rt.submit("long", "Fetch every page, one by one.")
        box["id"] = sub.task_id
        task = await sub.wait(timeout=120)
    assert task.status is TaskStatus.COMPLETED, task.error
    assert "sent" in box and await store.entries(task.id, kinds=[EntryKind.COMPACTION])
    delivered = [
        e
        for e in await store.entries(task.id, kinds=[EntryKind.API_MESSAGE])
        if e.payload.get("role") == "user" and e.payload.get("content") == "ALSO SAY BANANA"
    ]
    assert len(delivered) == 1
    assert not task.config.get("inbox")
