"""SIGKILL at each step of a compaction, with real processes: the next worker
finishes the task; no entry is lost, no never-replay call runs again, and a
compaction is committed once."""

from __future__ import annotations

from pathlib import Path

import pytest

from duragent.store import open_store
from duragent.types import Entry, EntryKind
from support.crashlib import finish, kill_at, ledger_lines, spawn

POINTS = ["start", "in_summary", "summarised", "committed"]


async def log_of(url: str) -> list[Entry]:
    store = open_store(url)
    await store.open()
    try:
        (task,) = (await store.list_tasks()).tasks
        return await store.entries(task.id)
    finally:
        await store.close()


@pytest.mark.slow
@pytest.mark.parametrize("point", POINTS)
async def test_sigkill_at_each_step_of_a_compaction_loses_nothing(
    shared_url: str, tmp_path: Path, point: str
) -> None:
    url, ledger = shared_url, tmp_path / "ledger.txt"
    kill_at(spawn("compaction_agent.py", url, str(ledger), point), f"AT {point}")
    before = await log_of(url)
    compactions = [e for e in before if e.kind is EntryKind.COMPACTION]
    # Killed at the second compaction: committed only at "committed".
    assert len(compactions) == (2 if point == "committed" else 1)

    out = finish(spawn("compaction_agent.py", url, str(ledger), "none"))
    assert "DONE completed" in out
    after = await log_of(url)
    # Nothing lost: the log before the kill is the start of the log after it.
    assert [(e.seq, e.kind, e.payload) for e in after[: len(before)]] == [
        (e.seq, e.kind, e.payload) for e in before
    ]
    # Every call ran once, none again, none declared interrupted.
    assert ledger_lines(ledger) == [f"fetch {n}" for n in range(1, 31)]
    results = [e.payload for e in after if e.kind is EntryKind.TOOL_RESULT]
    assert [r["outcome"] for r in results] == ["ok"] * 30
    # Each compaction covers more than the one before: none committed twice.
    uptos = [e.payload["upto"] for e in after if e.kind is EntryKind.COMPACTION]
    assert uptos == sorted(set(uptos)) and len(uptos) >= 3
