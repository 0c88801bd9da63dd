"""What only the JSONL store does: torn tails, one owner, versions, compaction, SIGKILL."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, strategies as st

from duragent.errors import StoreCorrupt, StoreError, StoreLocked, StoreVersionError
from duragent.store import Commit, DocumentWrite, TaskPatch, open_store
from duragent.store._files import LOG_NAME
from duragent.store._jsonl import JSONLStore, compact
from duragent.store._memory import SCHEMA_VERSION
from duragent.types import (
    AssistantMessage,
    EntryKind,
    NewEntry,
    Task,
    TaskStatus,
    UIText,
    UserMessage,
    dump_message,
)
from support.store_model import SETTINGS, op, run


def ui(task_id: str, text: str) -> NewEntry:
    return NewEntry(
        task_id=task_id, kind=EntryKind.UI_MESSAGE, payload=dump_message(UIText(text=text))
    )


def texts(entries: list[Any]) -> list[str]:
    return [e.payload["text"] for e in entries if e.kind is EntryKind.UI_MESSAGE]


async def open_jsonl(directory: Path, **options: Any) -> JSONLStore:
    store = open_store(f"jsonl:///{directory}", **options)
    assert isinstance(store, JSONLStore)
    await store.open()
    return store


async def test_url_options_reach_the_store(tmp_path: Path) -> None:
    store = await open_jsonl(tmp_path, durability="full")
    assert store.durability == "full" and store.directory == str(tmp_path)
    await store.close()
    from_query = open_store(f"jsonl:///{tmp_path}?durability=full")
    await from_query.open()
    assert isinstance(from_query, JSONLStore) and from_query.durability == "full"
    await from_query.close()
    with pytest.raises(ValueError, match="durability"):
        await open_store(f"jsonl:///{tmp_path}?durability=sometimes").open()


async def test_state_survives_reopen(tmp_path: Path) -> None:
    store = await open_jsonl(tmp_path)
    task, _ = await store.create_task(Task(agent="a", owner="o", request_id="r"))
    await store.commit(
        Commit(
            entries=[ui(task.id, "one")],
            patches=[TaskPatch(task.id, {"context": {"k": [1, {"x": None}]}})],
            documents=[DocumentWrite("s", "d", {"v": 1}), DocumentWrite("s", "gone", 1)],
        )
    )
    await store.commit(Commit(documents=[DocumentWrite("s", "gone", delete=True)]))
    before = await store.get_task(task.id)
    await store.close()
    again = await open_jsonl(tmp_path)
    assert await again.get_task(task.id) == before
    assert texts(await again.entries(task.id)) == ["one"]
    assert [d.key for d in await again.list_documents("s")] == ["d"]
    same, created = await again.create_task(Task(agent="a", owner="o", request_id="r"))
    assert not created and same.id == task.id
    await again.close()


@pytest.mark.slow
async def test_every_cut_inside_the_last_commit_reopens_to_before_or_after(
    tmp_path: Path,
) -> None:
    """A crash can stop the last write at any byte: the commit is all there or not at all."""
    src = tmp_path / "src"
    store = await open_jsonl(src)
    task, _ = await store.create_task(Task(agent="a"))
    await store.commit(Commit(entries=[ui(task.id, "kept")]))
    size_before = (src / LOG_NAME).stat().st_size
    await store.commit(
        Commit(
            entries=[ui(task.id, "last-1"), ui(task.id, "last-2")],
            patches=[TaskPatch(task.id, {"context": {"last": True}})],
            documents=[DocumentWrite("s", "k", "last")],
        )
    )
    await store.close()
    full = (src / LOG_NAME).read_bytes()
    assert len(full) > size_before
    for cut in range(size_before, len(full) + 1):
        d = tmp_path / f"cut{cut}"
        d.mkdir()
        (d / LOG_NAME).write_bytes(full[:cut])
        s = await open_jsonl(d)
        got = texts(await s.entries(task.id))
        doc = await s.get_document("s", "k")
        context = (await s.get_task(task.id)).context
        if cut == len(full):
            assert got == ["kept", "last-1", "last-2"] and doc is not None
            assert context == {"last": True} and s.truncated_bytes == 0
        else:
            assert got == ["kept"] and doc is None and context == {}
            assert s.truncated_bytes == cut - size_before
            assert (d / LOG_NAME).stat().st_size == size_before  # the torn tail is gone
        # Appending after the cut must leave a log that opens cleanly.
        await s.commit(Commit(entries=[ui(task.id, "after")]))
        await s.close()
        reopened = await open_jsonl(d)
        assert texts(await reopened.entries(task.id))[-1] == "after"
        await reopened.close()


@pytest.mark.slow
async def test_second_process_gets_store_locked_naming_the_owner_pid(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import asyncio, sys\n"
            "from duragent.store._jsonl import JSONLStore\n"
            "s = JSONLStore(sys.argv[1])\n"
            "asyncio.run(s.open())\n"
            "print('ready', flush=True)\n"
            "sys.stdin.readline()\n",
            str(tmp_path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "ready"
        with pytest.raises(StoreLocked, match=f"owned by pid {holder.pid}"):
            await open_jsonl(tmp_path)
        holder.stdin.write("done\n")
        holder.stdin.close()
        assert holder.wait(30) == 0
    finally:
        holder.kill()
        holder.wait(30)
        if holder.stdout is not None:
            holder.stdout.close()
    store = await open_jsonl(tmp_path)  # the owner exited: its lock went with it
    with pytest.raises(StoreLocked, match=f"owned by pid {os.getpid()}"):
        await open_jsonl(tmp_path)  # one owner, even within a process
    await store.close()


async def test_newer_version_is_refused_naming_both_versions(tmp_path: Path) -> None:
    store = await open_jsonl(tmp_path)
    await store.create_task(Task(agent="a"))
    await store.close()
    log = tmp_path / LOG_NAME
    lines = log.read_bytes().split(b"\n")
    header = json.loads(lines[0])
    assert header["schema_version"] == SCHEMA_VERSION
    header["schema_version"] = 99
    changed = b"\n".join([json.dumps(header).encode(), *lines[1:]])
    log.write_bytes(changed)
    with pytest.raises(StoreVersionError) as info:
        await open_jsonl(tmp_path)
    assert "99" in str(info.value) and f"version {SCHEMA_VERSION}" in str(info.value)
    assert log.read_bytes() == changed  # untouched


async def test_damage_before_the_last_commit_names_file_and_line(tmp_path: Path) -> None:
    store = await open_jsonl(tmp_path)
    task, _ = await store.create_task(Task(agent="a"))
    for i in range(3):
        await store.commit(Commit(entries=[ui(task.id, str(i))]))
    await store.close()
    log = tmp_path / LOG_NAME
    lines = log.read_bytes().split(b"\n")
    lines[3] = b'{"t":"entry", garbage'
    log.write_bytes(b"\n".join(lines))
    with pytest.raises(StoreCorrupt, match=f"{LOG_NAME}:4: unreadable line"):
        await open_jsonl(tmp_path)
    log.write_bytes(b"hello, not a log\n")
    with pytest.raises(StoreCorrupt, match=f"{LOG_NAME}:1: not a duragent JSONL log"):
        await open_jsonl(tmp_path)


async def test_compact_keeps_every_fact_and_seq(tmp_path: Path) -> None:
    store = await open_jsonl(tmp_path)
    done, _ = await store.create_task(Task(agent="a", owner="o", request_id="r1"))
    live, _ = await store.create_task(Task(agent="a"))
    gone, _ = await store.create_task(Task(agent="a"))

    def progress(task_id: str, text: str) -> NewEntry:
        return NewEntry(task_id=task_id, kind=EntryKind.PROGRESS, payload={"delta": text})

    def api(task_id: str, message: Any) -> NewEntry:
        return NewEntry(task_id=task_id, kind=EntryKind.API_MESSAGE, payload=dump_message(message))

    for t in (done, live):
        await store.commit(Commit(entries=[api(t.id, UserMessage(content="q")), ui(t.id, "q")]))
        for i in range(20):
            await store.commit(Commit(entries=[progress(t.id, f"chunk{i}")]))
        r = await store.commit(Commit(entries=[api(t.id, AssistantMessage(content="draft"))]))
        seq = r.entries[0].seq
        await store.commit(
            Commit(
                entries=[
                    NewEntry(
                        task_id=t.id,
                        kind=EntryKind.ROLLBACK,
                        payload={"from_seq": seq, "to_seq": seq},
                    ),
                    api(t.id, AssistantMessage(content="final")),
                ],
                patches=[TaskPatch(t.id, {"context": {"n": i}}) for i in range(5)],
                documents=[DocumentWrite(f"task:{t.id}", "plan", [1, 2])],
            )
        )
    claimed = await store.claim_task("w", task_id=done.id)
    assert claimed is not None
    await store.commit(
        Commit(
            fence={done.id: claimed.lease.epoch},
            patches=[TaskPatch(done.id, {"status": TaskStatus.COMPLETED, "output": "ok"})],
        )
    )
    await store.delete_task(gone.id)
    for i in range(10):
        await store.commit(Commit(documents=[DocumentWrite("session:s", "counter", i)]))

    async def facts(s: JSONLStore) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for t in (done, live):
            entries = await s.entries(t.id)
            out[t.id] = {
                "task": await s.get_task(t.id),
                "entries": [
                    (e.seq, e.kind, e.payload, e.created_at)
                    for e in entries
                    if not (t is done and e.kind is EntryKind.PROGRESS)
                ],
                "model": await s.model_view(t.id),
                "ui": await s.ui_messages(t.id),
                "docs": await s.list_documents(f"task:{t.id}"),
            }
        out["session"] = await s.list_documents("session:s")
        return out

    before = await facts(store)
    await store.close()
    size_before = (tmp_path / LOG_NAME).stat().st_size
    result = compact(str(tmp_path))
    assert result.entries_dropped == 20  # the finished task's progress, nothing else
    assert result.bytes_after < size_before / 2
    assert (tmp_path / LOG_NAME).stat().st_size == result.bytes_after
    again = await open_jsonl(tmp_path)
    assert await facts(again) == before
    live_kinds = [e.kind for e in await again.entries(live.id)]
    assert live_kinds.count(EntryKind.PROGRESS) == 20  # a live task may still need them
    done_seqs = [e.seq for e in await again.entries(done.id)]
    assert done_seqs[:2] == [1, 2] and done_seqs[2] == 23  # never renumbered
    dup, created = await again.create_task(Task(agent="a", owner="o", request_id="r1"))
    assert not created and dup.id == done.id
    r = await again.commit(Commit(entries=[ui(live.id, "after compaction")]))
    assert r.entries[0].seq == before[live.id]["task"].last_seq + 1
    await again.close()
    reopened = await open_jsonl(tmp_path)
    assert texts(await reopened.entries(live.id))[-1] == "after compaction"
    await reopened.close()


async def test_compact_refuses_an_open_store(tmp_path: Path) -> None:
    store = await open_jsonl(tmp_path)
    with pytest.raises(StoreLocked):
        compact(str(tmp_path))
    await store.close()


@pytest.mark.slow
@SETTINGS
@given(st.lists(op, max_size=25))
def test_jsonl_store_matches_model_and_its_replay(ops: list[tuple[Any, ...]]) -> None:
    async def check(directory: str) -> None:
        store = JSONLStore(directory)
        await store.open()
        try:
            await run(store, ops)
            ids = [t.id for t in (await store.list_tasks()).tasks]
            live = {tid: (await store.get_task(tid), await store.entries(tid)) for tid in ids}
        finally:
            await store.close()
        replayed = JSONLStore(directory)
        await replayed.open()
        for tid, (task, entries) in live.items():
            assert await replayed.get_task(tid) == task
            assert await replayed.entries(tid) == entries
        await replayed.close()

    with tempfile.TemporaryDirectory() as d:
        asyncio.run(check(d))


# --- SIGKILL at random moments ----------------------------------------------

# Forks writers so each trial costs a fork, not a Python start-up. Each writer
# opens the store, continues the numbering from the store itself, and appends
# the number of each commit to the ack file after commit() returns. No fsync
# of the ack file: SIGKILL loses nothing the process already wrote.
ZYGOTE = r"""
import asyncio, os, sys
from duragent.store import Commit, DocumentWrite, TaskPatch
from duragent.store._jsonl import JSONLStore
from duragent.types import EntryKind, NewEntry

def ui(task_id, text):
    return NewEntry(task_id=task_id, kind=EntryKind.UI_MESSAGE,
                    payload={"type": "text", "role": "assistant", "text": text})

async def write(directory, ack_path, durability, task_id):
    store = JSONLStore(directory, durability=durability)
    await store.open()
    doc = await store.get_document("s", "last")
    n = doc.value if doc else 0
    ack = os.open(ack_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.write(1, b"ready\n")
    while True:
        n += 1
        await store.commit(Commit(
            entries=[ui(task_id, f"{n}a"), ui(task_id, f"{n}b")],
            patches=[TaskPatch(task_id, {"context": {"n": n}})],
            documents=[DocumentWrite("s", "last", n)],
        ))
        os.write(ack, f"{n}\n".encode())

while line := sys.stdin.readline():
    args = line.split()
    pid = os.fork()
    if pid == 0:
        try:
            asyncio.run(write(*args))
        finally:
            os._exit(1)
    sys.stdout.write(f"pid {pid}\n")
    sys.stdout.flush()
    os.waitpid(pid, 0)
    sys.stdout.write("reaped\n")
    sys.stdout.flush()
"""


def _markers(log: Path) -> int:
    """Commit markers in the file as the killed writer left it (a torn last line is not one)."""
    count = 0
    for line in log.read_bytes().split(b"\n")[1:-1]:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        count += isinstance(record, dict) and record.get("t") == "commit"
    return count


@pytest.mark.slow
async def test_sigkill_at_random_moments_keeps_exactly_the_marked_commits(
    tmp_path: Path,
) -> None:
    rng = random.Random(os.environ.get("DURAGENT_CRASH_SEED", "5"))
    zygote = subprocess.Popen(
        [sys.executable, "-c", ZYGOTE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert zygote.stdin is not None and zygote.stdout is not None
    trials, truncations, progressed = 200, 0, 0
    task_id, acked = "", [0]
    try:
        for trial in range(trials):
            # A fresh log every 20 trials keeps replays short; within a log,
            # each trial appends after the previous kill's (truncated) tail.
            directory = tmp_path / f"log{trial // 20}"
            durability = "full" if (trial // 20) % 3 == 2 else "normal"
            if trial % 20 == 0:
                s = JSONLStore(str(directory))
                await s.open()
                task_id = (await s.create_task(Task(agent="a")))[0].id
                await s.close()
                acked = [0]
            ack = tmp_path / f"ack{trial}"
            zygote.stdin.write(f"{directory} {ack} {durability} {task_id}\n")
            zygote.stdin.flush()
            # The writer's "ready" can come before the zygote's "pid" line when the
            # zygote is descheduled right after fork: remember it, don't skip it.
            ready = False
            line = zygote.stdout.readline().split()
            while line[0] != "pid":
                ready = ready or line == ["ready"]
                line = zygote.stdout.readline().split()
            pid = int(line[1])
            if rng.random() < 0.1:
                os.kill(pid, signal.SIGKILL)  # during start-up, replay or truncation
            else:
                while not ready:
                    said = zygote.stdout.readline().strip()
                    assert said != "reaped", f"trial {trial}: the writer died before it was ready"
                    ready = said == "ready"
                # Most kills come after a few acknowledged commits (whatever the
                # machine's load), some while the first one is being made.
                need = rng.choice((0, 1, 1, 2, 3))
                deadline = time.monotonic() + 60
                while need and (not ack.exists() or ack.read_text().count("\n") < need):
                    assert time.monotonic() < deadline, f"trial {trial}: no commit in 60 s"
                    await asyncio.sleep(0.001)
                await asyncio.sleep(rng.uniform(0, 0.012))  # the random moment of the kill
                os.kill(pid, signal.SIGKILL)
            while zygote.stdout.readline().strip() != "reaped":
                pass
            before = acked[-1]
            if ack.exists():
                acked += [int(x) for x in ack.read_text().split()]
            assert acked == sorted(set(acked)), f"trial {trial}: acks out of order"
            progressed += acked[-1] > before
            marked = _markers(directory / LOG_NAME) - 1  # minus the task's creation
            store = JSONLStore(str(directory))
            await store.open()
            try:
                truncations += store.truncated_bytes > 0
                got = texts(await store.entries(task_id))
                held = len(got) // 2
                assert got == [f"{n}{p}" for n in range(1, held + 1) for p in "ab"], (
                    f"trial {trial}: commits are torn or out of order"
                )
                assert held == marked, f"trial {trial}: {held} commits held, {marked} marked"
                assert held >= acked[-1], f"trial {trial}: acknowledged commit {acked[-1]} lost"
                doc = await store.get_document("s", "last")
                assert (doc.value if doc else 0) == held
                assert (await store.get_task(task_id)).context == ({"n": held} if held else {})
            finally:
                await store.close()
    finally:
        zygote.stdin.close()
        zygote.wait(30)
        zygote.stdout.close()
    print(f"{trials} kills, {truncations} torn tails cut off, {progressed} trials made progress")
    assert progressed > trials // 2, "the writers were mostly killed before committing"


async def test_a_jsonl_store_read_before_it_is_opened_says_so(tmp_path: Path) -> None:
    """Its log is replayed by open(): read before that, it would look empty."""
    async with JSONLStore(str(tmp_path / "s")) as store:
        task, _ = await store.create_task(Task(agent="a"))
    unopened = JSONLStore(str(tmp_path / "s"))
    with pytest.raises(StoreError, match="is not open"):
        await unopened.list_tasks()
    with pytest.raises(StoreError, match="is not open"):
        await unopened.get_task(task.id)
    async with unopened:
        assert (await unopened.get_task(task.id)).id == task.id
