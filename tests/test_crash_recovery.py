"""SIGKILL a real process at each point of a round; restart; check nothing is lost or doubled."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from duragent.store import open_store
from duragent.types import AssistantMessage, EntryKind, TaskStatus, ToolMessage
from support.crashlib import dump, finish, kill_at, ledger_lines, spawn

POINTS = ["progress", "intents", "tool_running", "result"]


async def snapshot(url: str) -> tuple[str, dict[int, str]]:
    store = open_store(url)
    await store.open()
    try:
        page = await store.list_tasks()
        assert len(page.tasks) == 1, "exactly one task, even across restarts (request_id)"
        task = page.tasks[0]
        return task.id, {
            e.seq: dump([e.kind, e.round, e.payload]) for e in await store.entries(task.id)
        }
    finally:
        await store.close()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["unsafe", "safe"])
@pytest.mark.parametrize("point", POINTS)
async def test_sigkill_at_each_point_then_resume(tmp_path: Path, point: str, kind: str) -> None:
    url = f"sqlite:///{tmp_path}/crash.db"
    ledger = tmp_path / "ledger.txt"
    kill_at(spawn("crash_agent.py", url, str(ledger), point, kind), f"AT {point}")
    task_id, before = await snapshot(url)
    ran_before = ledger_lines(ledger)

    out = finish(spawn("crash_agent.py", url, str(ledger), "none", kind))
    assert f"DONE completed {task_id}" in out

    store = open_store(url)
    await store.open()
    try:
        task = await store.get_task(task_id)
        assert task.status is TaskStatus.COMPLETED and task.output == "All work done."
        after = {e.seq: dump([e.kind, e.round, e.payload]) for e in await store.entries(task_id)}
        # Nothing committed before the kill is missing or changed after it.
        assert {s: after.get(s) for s in before} == before

        # Every tool call in the history has exactly one result.
        view = await store.model_view(task_id)
        calls = [c.id for m in view if isinstance(m, AssistantMessage) for c in m.tool_calls or ()]
        results = Counter(m.tool_call_id for m in view if isinstance(m, ToolMessage))
        assert calls and all(results[c] == 1 for c in calls) and set(results) == set(calls)
        stored = Counter(
            e.payload["tool_call_id"]
            for e in await store.entries(task_id, kinds=[EntryKind.TOOL_RESULT])
        )
        assert all(n == 1 for n in stored.values())

        starts = Counter(
            line.split()[1] for line in ledger_lines(ledger) if line.startswith("start")
        )
        first_key = f"{task_id}:1:call_0_0"
        outcomes = {
            e.payload["tool_call_id"]: e.payload["outcome"]
            for e in await store.entries(task_id, kinds=[EntryKind.TOOL_RESULT])
        }
        if kind == "unsafe":
            assert all(n == 1 for n in starts.values()), f"an unsafe tool ran twice: {starts}"
        if point in ("intents", "tool_running"):
            # The first call was cut off: re-run only when replay-safe, else reported interrupted.
            if kind == "safe":
                assert outcomes["call_0_0"] == "ok"
                assert starts[first_key] == (2 if point == "tool_running" else 1)
            else:
                assert outcomes["call_0_0"] == "interrupted"
                assert starts[first_key] == (1 if point == "tool_running" else 0)
        else:
            assert outcomes["call_0_0"] == "ok" and starts[first_key] == 1
        if point == "progress":
            assert not ran_before  # killed while the model streamed: no tool had run
            markers = await store.entries(task_id, kinds=[EntryKind.ROLLBACK])
            assert [m.payload["scope"] for m in markers] == ["progress"]
        if point == "result":
            assert starts[first_key] == 1 and len(ran_before) == 2  # start + end, before the kill
    finally:
        await store.close()
