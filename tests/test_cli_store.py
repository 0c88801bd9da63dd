"""`duragent compact` run as a real process on real JSONL stores."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from duragent.errors import TaskNotFound
from duragent.store import Commit, DocumentWrite, TaskPatch
from duragent.store._files import LOG_NAME
from duragent.store._jsonl import JSONLStore
from duragent.types import EntryKind, NewEntry, Task

PROGRESS = 4  # progress entries written to each task


def compact(url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "duragent", "compact", "--store", url],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )


def entry(task_id: str, kind: EntryKind, text: str) -> NewEntry:
    return NewEntry(task_id=task_id, kind=kind, payload={"text": text})


async def fill(directory: Path) -> dict[str, str]:
    """A store with a finished task, a live one, a deleted one and a busy document."""
    store = JSONLStore(str(directory))
    await store.open()
    try:
        ids = {}
        for name in ("finished", "live", "deleted"):
            task, _ = await store.create_task(Task(agent="a", input=name))
            ids[name] = task.id
            held = await store.claim_task("w", task_id=task.id, ttl=3600)
            assert held is not None
            for i in range(PROGRESS):
                await store.commit(
                    Commit(
                        fence={task.id: held.lease.epoch},
                        entries=[entry(task.id, EntryKind.PROGRESS, f"chunk {i}")],
                        patches=[TaskPatch(task.id, {"context": {"step": i}})],
                        documents=[DocumentWrite(f"task:{task.id}", "plan", {"v": i})],
                    )
                )
            await store.commit(
                Commit(
                    fence={task.id: held.lease.epoch},
                    entries=[entry(task.id, EntryKind.UI_MESSAGE, "done")],
                )
            )
        finished = await store.get_task(ids["finished"])
        await store.commit(
            Commit(
                fence={finished.id: finished.lease.epoch},
                patches=[TaskPatch(finished.id, {"status": "completed", "output": "ok"})],
            )
        )
        await store.delete_task(ids["deleted"])
        return ids
    finally:
        await store.close()


async def snapshot(directory: Path, ids: dict[str, str]) -> dict[str, Any]:
    store = JSONLStore(str(directory))
    await store.open()
    try:
        out: dict[str, Any] = {}
        for name in ("finished", "live"):
            task_id = ids[name]
            scope = f"task:{task_id}"
            out[name] = {
                "task": (await store.get_task(task_id)).model_dump_json(),
                "entries": [e.model_dump_json() for e in await store.entries(task_id)],
                "docs": [d.model_dump_json() for d in await store.list_documents(scope)],
            }
        with pytest.raises(TaskNotFound):
            await store.get_task(ids["deleted"])
        return out
    finally:
        await store.close()


def kinds(entries: list[str]) -> list[str]:
    return [e.split('"kind":"', 1)[1].split('"', 1)[0] for e in entries]


@pytest.mark.slow
async def test_compact_removes_what_no_reader_needs_and_keeps_the_rest(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    ids = await fill(directory)
    before = await snapshot(directory, ids)
    size_before = (directory / LOG_NAME).stat().st_size

    result = compact(f"jsonl:///{directory}")

    assert result.returncode == 0, result.stderr
    assert f"compacted {directory}" in result.stdout
    assert f"removed: {PROGRESS} progress entries of finished tasks" in result.stdout
    size_after = (directory / LOG_NAME).stat().st_size
    assert size_after < size_before
    assert f"{size_before:,} -> {size_after:,} bytes" in result.stdout
    after = await snapshot(directory, ids)
    # The live task is untouched: its progress may still be read to resume it.
    assert after["live"] == before["live"]
    # The finished task lost its progress entries only, each entry keeping its seq.
    assert after["finished"]["task"] == before["finished"]["task"]
    assert after["finished"]["docs"] == before["finished"]["docs"]
    kept = [e for e in before["finished"]["entries"] if '"kind":"progress"' not in e]
    assert after["finished"]["entries"] == kept
    assert kinds(before["finished"]["entries"]).count("progress") == PROGRESS

    # The compacted store is a working store: the next commit continues the log.
    store = JSONLStore(str(directory))
    await store.open()
    try:
        live = await store.get_task(ids["live"])
        r = await store.commit(
            Commit(
                fence={live.id: live.lease.epoch},
                entries=[entry(live.id, EntryKind.UI_MESSAGE, "later")],
            )
        )
        assert r.entries[0].seq == live.last_seq + 1
    finally:
        await store.close()

    again = compact(f"jsonl:///{directory}")  # nothing left to remove
    assert again.returncode == 0, again.stderr
    assert "removed: 0 progress entries" in again.stdout


@pytest.mark.slow
async def test_compact_refuses_a_store_another_process_has_open(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    await fill(directory)
    log = directory / LOG_NAME
    content = log.read_bytes()
    holder = JSONLStore(str(directory))  # this process owns it now
    await holder.open()
    try:
        result = compact(f"jsonl:///{directory}")
    finally:
        await holder.close()
    assert result.returncode == 1
    assert f"owned by pid {os.getpid()}" in result.stderr
    assert log.read_bytes() == content


@pytest.mark.slow
def test_compact_names_what_it_needs(tmp_path: Path) -> None:
    wrong = compact(f"sqlite:///{tmp_path}/x.db")
    assert wrong.returncode == 2 and "not a JSONL store" in wrong.stderr
    missing = tmp_path / "nothing-here"
    result = compact(f"jsonl:///{missing}")
    assert result.returncode == 1 and "no JSONL store" in result.stderr
    assert not missing.exists()  # compacting never creates a store
