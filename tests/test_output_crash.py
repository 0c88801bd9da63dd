"""SIGKILL a real process between two structured-output attempts, and inside an
output guardrail: the restart neither asks a committed attempt again nor runs a
guardrail whose verdict is committed."""

from __future__ import annotations

from pathlib import Path

import pytest

from duragent.store import open_store
from duragent.types import EntryKind, Task, TaskStatus
from support.crashlib import finish, kill_at, ledger_lines, spawn

pytestmark = pytest.mark.slow


async def read(url: str) -> tuple[Task, list[dict[str, object]], int]:
    """The one task, its guardrail verdicts, and how many answers its log holds."""
    store = open_store(url)
    await store.open()
    try:
        (task,) = (await store.list_tasks()).tasks
        entries = await store.entries(task.id)
        verdicts = [
            e.payload
            for e in entries
            if e.kind is EntryKind.CHECKPOINT and e.payload["type"] == "guardrail"
        ]
        answers = sum(
            1
            for e in entries
            if e.kind is EntryKind.API_MESSAGE and e.payload["role"] == "assistant"
        )
        return task, verdicts, answers
    finally:
        await store.close()


async def test_a_kill_between_attempts_keeps_the_first_and_its_count(tmp_path: Path) -> None:
    url, ledger = f"sqlite:///{tmp_path}/out.db", tmp_path / "ledger.txt"
    kill_at(spawn("output_crash_agent.py", url, str(ledger), "retry"), "AT retry")
    task, _, answers = await read(url)
    # The wrong answer and the errors sent back are committed, and counted.
    assert answers == 1 and task.iterations == 1
    assert task.config["output_failures"] == 1
    assert ledger_lines(ledger) == ["screen", "vet", "answer 1"]

    out = finish(spawn("output_crash_agent.py", url, str(ledger), "none"))
    assert f"DONE completed {task.id}" in out
    task, verdicts, answers = await read(url)
    assert task.status is TaskStatus.COMPLETED
    assert task.output == {"name": "Paris", "population": 2_100_000}
    assert answers == 2
    # The first answer was not asked again; each guardrail ran once, on the valid one.
    assert ledger_lines(ledger) == [
        *("screen", "vet", "answer 1", "answer 2"),
        *("first Paris", "second Paris"),
    ]
    assert [v["name"] for v in verdicts] == ["screen", "vet", "first", "second"]


async def test_a_committed_verdict_is_not_run_again_after_a_kill(tmp_path: Path) -> None:
    url, ledger = f"sqlite:///{tmp_path}/out.db", tmp_path / "ledger.txt"
    kill_at(spawn("output_crash_agent.py", url, str(ledger), "guardrail"), "AT guardrail")
    task, verdicts, answers = await read(url)
    assert task.status is TaskStatus.RUNNING and answers == 2
    assert [(v["name"], v["tripwire"]) for v in verdicts][2:] == [("first", False)]

    out = finish(spawn("output_crash_agent.py", url, str(ledger), "none"))
    assert f"DONE completed {task.id}" in out
    task, verdicts, answers = await read(url)
    assert task.status is TaskStatus.COMPLETED
    assert task.output == {"name": "Paris", "population": 2_100_000}
    assert answers == 2  # the committed answer was checked, not asked for again
    lines = ledger_lines(ledger)
    # `first` committed its verdict before the kill: it never ran again. `second`
    # had not: it ran again, on the same committed answer.
    assert lines[2:] == ["answer 1", "answer 2", "first Paris", "second Paris", "second Paris"]
    assert [v["name"] for v in verdicts] == ["screen", "vet", "first", "second"]
    assert verdicts[2]["checked_seq"] == verdicts[3]["checked_seq"]


async def test_a_committed_input_verdict_is_not_run_again_after_a_kill(tmp_path: Path) -> None:
    url, ledger = f"sqlite:///{tmp_path}/out.db", tmp_path / "ledger.txt"
    kill_at(spawn("output_crash_agent.py", url, str(ledger), "input"), "AT input")
    task, verdicts, answers = await read(url)
    assert answers == 0  # the model is asked only once the input passed every guardrail
    assert [(v["name"], v["stage"]) for v in verdicts] == [("screen", "input")]

    out = finish(spawn("output_crash_agent.py", url, str(ledger), "none"))
    assert f"DONE completed {task.id}" in out
    task, verdicts, _ = await read(url)
    assert task.output == {"name": "Paris", "population": 2_100_000}
    # `screen` answered before the kill and is not asked again; `vet` had not.
    assert ledger_lines(ledger)[:4] == ["screen", "vet", "vet", "answer 1"]
    assert [v["name"] for v in verdicts] == ["screen", "vet", "first", "second"]
    assert verdicts[0]["checked_seq"] == verdicts[1]["checked_seq"]
