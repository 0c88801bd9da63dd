"""Handoffs survive a SIGKILL at every point: before the handoff's commit, right
after it, and in the target agent's first round. Real processes, every store kept
outside the process; the final answer is the uninterrupted run's and no
never-replay tool runs twice."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import drop_schema, pg_schema_url
from duragent.store import open_store
from duragent.types import EntryKind
from support.crashlib import finish, kill_at, spawn

POINTS = ["before_handoff", "after_handoff", "target_model", "target_result"]
EXPECTED = 'Billing: order 42: paid 30 EUR | {"assistant": "billing"} | refunded order 42'


@pytest.fixture(params=["sqlite", "sqlite-full", "jsonl", "postgres", "postgres-psycopg"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """One store that the killed process and the one after it open."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/handoff.db"
    elif request.param == "sqlite-full":
        yield f"sqlite:///{tmp_path}/handoff.db?durability=full"
    elif request.param == "jsonl":
        yield f"jsonl:///{tmp_path}/handoff"
    else:  # both wires of the PostgreSQL store
        schema = f"test_{uuid.uuid4().hex[:12]}"
        yield pg_schema_url(request.param, schema)
        drop_schema(schema)


async def handoffs_of(url: str) -> list[dict[str, object]]:
    store = open_store(url)
    await store.open()
    try:
        (task,) = (await store.list_tasks()).tasks
        return [e.payload for e in await store.entries(task.id, kinds=[EntryKind.HANDOFF])]
    finally:
        await store.close()


@pytest.mark.slow
@pytest.mark.parametrize("point", POINTS)
async def test_a_sigkill_around_a_handoff_changes_nothing_of_the_outcome(
    url: str, point: str, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger"
    kill_at(spawn("handoff_agent.py", url, str(ledger), point), f"AT {point}")
    out = finish(spawn("handoff_agent.py", url, str(ledger), "none"))
    assert f"DONE completed {EXPECTED}" in out
    # Each never-replay tool ran once, whatever the kill interrupted.
    assert ledger.read_text().splitlines() == ["lookup 42", "refund 42"]
    # One handoff committed: a re-decided handoff call is not a second one.
    assert await handoffs_of(url) == [{"call_id": "call_1_0", "from": "triage", "to": "billing"}]


@pytest.mark.slow
async def test_an_uninterrupted_run_gives_the_expected_answer(url: str, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    out = finish(spawn("handoff_agent.py", url, str(ledger), "none"))
    assert f"DONE completed {EXPECTED}" in out
    assert ledger.read_text().splitlines() == ["lookup 42", "refund 42"]
