"""The stores' files: checksums, old logs, a full disk, permissions, paths in URLs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from duragent.errors import StoreCorrupt, StoreFull, StoreNotFound, StoreVersionError
from duragent.store import Commit, DocumentWrite, open_store
from duragent.store._files import LOG_NAME
from duragent.store._jsonl import LOCK_NAME, LOG_VERSION, JSONLStore, _unseal
from duragent.types import EntryKind, NewEntry, Task, UIText, dump_message


def ui(task_id: str, text: str) -> NewEntry:
    return NewEntry(
        task_id=task_id, kind=EntryKind.UI_MESSAGE, payload=dump_message(UIText(text=text))
    )


async def small_log(directory: Path) -> tuple[str, int]:
    """A JSONL store with three commits after the task's creation; the task id and the
    size of the log before the last commit."""
    store = JSONLStore(str(directory))
    await store.open()
    task, _ = await store.create_task(Task(agent="a"))
    await store.commit(Commit(entries=[ui(task.id, "one")]))
    await store.commit(Commit(documents=[DocumentWrite("s", "k", {"v": 1})]))
    before_last = (directory / LOG_NAME).stat().st_size
    await store.commit(Commit(entries=[ui(task.id, "two"), ui(task.id, "three")]))
    await store.close()
    return task.id, before_last


async def texts(store: Any, task_id: str) -> list[str]:
    return [e.payload["text"] for e in await store.entries(task_id)]


# --- checksums ------------------------------------------------------------------------


@pytest.mark.slow
async def test_every_changed_byte_after_the_header_is_reported_not_read(tmp_path: Path) -> None:
    """A byte changed anywhere in a record or a marker, the last commit included, is
    StoreCorrupt naming file, line and byte offset; the file is left as it was."""
    src = tmp_path / "src"
    await small_log(src)
    original = (src / LOG_NAME).read_bytes()
    header_end = original.index(b"\n") + 1
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    log = damaged / LOG_NAME
    for at in range(header_end, len(original)):
        changed = bytearray(original)
        changed[at] ^= 0x01  # never a NUL nor a newline in a JSON line
        log.write_bytes(bytes(changed))
        with pytest.raises(StoreCorrupt) as info:
            await JSONLStore(str(damaged)).open()
        line = original[:at].count(b"\n") + 1
        start = original.rindex(b"\n", 0, at) + 1 if original[at : at + 1] != b"\n" else None
        message = str(info.value)
        assert f"{log}:{line}: " in message or f"{log}:{line + 1}: " in message, message
        if start is not None:
            assert f"starts at byte {start}" in message
        assert "truncate -s" in message and "backup" in message
        assert log.read_bytes() == bytes(changed)  # nothing cut off, nothing rewritten


async def test_the_advice_in_the_error_keeps_the_commits_before_the_damage(
    tmp_path: Path,
) -> None:
    task_id, before_last = await small_log(tmp_path)
    log = tmp_path / LOG_NAME
    data = bytearray(log.read_bytes())
    at = data.index(b"three")
    data[at] = ord("T")
    log.write_bytes(bytes(data))
    with pytest.raises(StoreCorrupt, match="checksum mismatch") as info:
        await JSONLStore(str(tmp_path)).open()
    command = str(info.value).split("by cutting the file there: ", 1)[1].split(" (", 1)[0]
    assert command == f"truncate -s {before_last} {log}"
    subprocess.run(shlex.split(command), check=True)
    store = JSONLStore(str(tmp_path))
    await store.open()
    assert await texts(store, task_id) == ["one"]
    assert await store.get_document("s", "k") is not None
    await store.close()


async def test_a_power_loss_hole_at_the_tail_is_still_a_torn_tail(tmp_path: Path) -> None:
    """The file grew but the last commit's bytes never reached the disk (zeros from
    some point on, newlines included): cut off, as before checksums."""
    task_id, before_last = await small_log(tmp_path)
    log = tmp_path / LOG_NAME
    data = bytearray(log.read_bytes())
    data[before_last + 40 :] = bytes(len(data) - before_last - 40)
    log.write_bytes(bytes(data))
    store = JSONLStore(str(tmp_path))
    await store.open()
    assert await texts(store, task_id) == ["one"]
    assert store.truncated_bytes == len(data) - before_last
    await store.close()


def _as_format_1(log: Path) -> bytes:
    """The log as duragent wrote it before checksums: plain JSON lines."""
    lines = log.read_bytes().split(b"\n")
    header = json.loads(lines[0])
    assert header.pop("log_version") == LOG_VERSION
    old = [json.dumps(header, separators=(",", ":")).encode()]
    for line in lines[1:-1]:
        body = _unseal(line)
        assert body is not None
        old.append(body)
    return b"\n".join(old) + b"\n"


async def test_a_format_1_log_opens_and_is_rewritten_with_checksums(tmp_path: Path) -> None:
    task_id, _ = await small_log(tmp_path)
    log = tmp_path / LOG_NAME
    v1 = _as_format_1(log)
    torn = b'{"t":"entry","task_id":"' + task_id.encode()  # a crash mid-write, years ago
    log.write_bytes(v1 + torn)
    store = JSONLStore(str(tmp_path))
    await store.open()
    assert store.log_upgraded_from == 1 and store.truncated_bytes == len(torn)
    assert await texts(store, task_id) == ["one", "two", "three"]
    await store.commit(Commit(entries=[ui(task_id, "four")]))
    await store.close()
    lines = log.read_bytes().split(b"\n")
    assert json.loads(lines[0])["log_version"] == LOG_VERSION
    assert all(_unseal(line) is not None for line in lines[1:-1])
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    again = JSONLStore(str(tmp_path))
    await again.open()
    assert again.log_upgraded_from is None
    assert await texts(again, task_id) == ["one", "two", "three", "four"]
    await again.close()
    # A format-1 log damaged before its last marker is refused, untouched.
    broken = v1.replace(b'"text":"one"', b'"text":"one', 1)
    log.write_bytes(broken)
    with pytest.raises(StoreCorrupt, match="unreadable line"):
        await JSONLStore(str(tmp_path)).open()
    assert log.read_bytes() == broken


async def test_a_newer_log_format_is_refused_naming_both_versions(tmp_path: Path) -> None:
    await small_log(tmp_path)
    log = tmp_path / LOG_NAME
    lines = log.read_bytes().split(b"\n")
    header = json.loads(lines[0])
    header["log_version"] = LOG_VERSION + 1
    changed = b"\n".join([json.dumps(header).encode(), *lines[1:]])
    log.write_bytes(changed)
    with pytest.raises(StoreVersionError) as info:
        await JSONLStore(str(tmp_path)).open()
    assert f"version {LOG_VERSION + 1}" in str(info.value)
    assert f"up to version {LOG_VERSION}" in str(info.value)
    assert log.read_bytes() == changed


# --- permissions ---------------------------------------------------------------------


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_store_files_are_private_even_with_a_permissive_umask(tmp_path: Path) -> None:
    with umask(0o022):
        sqlite = open_store(f"sqlite:///{tmp_path}/s.db")
        await sqlite.open()
        await sqlite.create_task(Task(agent="a"))
        for name in ("s.db", "s.db-wal", "s.db-shm"):
            assert mode(tmp_path / name) == 0o600, name
        await sqlite.close()

        jsonl = open_store(f"jsonl:///{tmp_path}/j")
        await jsonl.open()
        assert isinstance(jsonl, JSONLStore)
        await jsonl.create_task(Task(agent="a"))
        assert mode(tmp_path / "j") == 0o700
        assert mode(tmp_path / "j" / LOG_NAME) == 0o600
        assert mode(tmp_path / "j" / LOCK_NAME) == 0o600
        jsonl.compact()
        assert mode(tmp_path / "j" / LOG_NAME) == 0o600
        await jsonl.close()


# --- paths in URLs and missing directories ----------------------------------------


async def test_three_slashes_are_relative_four_absolute_for_both_file_stores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    for url in ("sqlite:///rel.db", "jsonl:///rel-dir", f"sqlite:///{tmp_path}/abs.db"):
        store = open_store(url)
        await store.open()
        await store.close()
    store = open_store(f"jsonl:///{tmp_path}/abs-dir")  # four slashes: absolute
    await store.open()
    await store.close()
    assert (work / "rel.db").is_file() and (work / "rel-dir" / LOG_NAME).is_file()
    assert (tmp_path / "abs.db").is_file() and (tmp_path / "abs-dir" / LOG_NAME).is_file()
    # The old meaning of jsonl:///abs/dir is kept only where the relative one cannot be
    # meant (its parent does not exist), with a warning saying what to write.
    with pytest.warns(FutureWarning, match=f"jsonl:///{tmp_path}/old for an absolute path"):
        store = open_store(f"jsonl://{tmp_path}/old")
        await store.open()
    assert isinstance(store, JSONLStore) and store.directory == str(tmp_path / "old")
    await store.close()


def test_a_missing_directory_is_named_not_called_corrupt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StoreNotFound, match=f"directory does not exist: {tmp_path}/nope") as e:
        asyncio.run(open_store("sqlite:///nope/x.db").open())
    assert "sqlite:////nope/x.db" in str(e.value)  # what to write for an absolute path
    with pytest.raises(StoreNotFound, match=f"directory does not exist: {tmp_path}/a/b"):
        asyncio.run(open_store(f"sqlite:///{tmp_path}/a/b/x.db").open())
    with pytest.raises(StoreNotFound, match=f"directory does not exist: {tmp_path}/a/b"):
        asyncio.run(open_store(f"jsonl:///{tmp_path}/a/b/store").open())
    assert os.listdir(tmp_path) == []  # nothing was created


# --- a full disk ---------------------------------------------------------------------

# Runs in a child process: opens each store URL and prints what happened, as JSON.
OPEN_ALL = """
import asyncio, json, os, resource, signal, sys
from duragent.store import open_store
from duragent.types import Task
if sys.argv[1] != "-":
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of being killed
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), resource.RLIM_INFINITY))
async def main():
    out = {}
    for url in sys.argv[2:]:
        try:
            store = open_store(url)
            await store.open()
        except Exception as exc:
            out[url] = [type(exc).__name__, str(exc)]
            continue
        tasks = (await store.list_tasks()).tasks
        await store.create_task(Task(agent="a"))
        await store.close()
        out[url] = ["opened", len(tasks)]
    print(json.dumps(out))
asyncio.run(main())
"""


def open_all(limit: int | None, *urls: str) -> dict[str, list[Any]]:
    done = subprocess.run(
        [sys.executable, "-c", OPEN_ALL, "-" if limit is None else str(limit), *urls],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, list[Any]] = json.loads(done.stdout)
    return result


async def existing_stores(directory: Path) -> tuple[str, str]:
    sqlite, jsonl = f"sqlite:///{directory}/old.db", f"jsonl:///{directory}/old-log"
    for url in (sqlite, jsonl):
        store = open_store(url)
        await store.open()
        await store.create_task(Task(agent="a"))
        await store.close()
    return sqlite, jsonl


def assert_disk_full(outcome: dict[str, list[Any]], urls: list[str]) -> None:
    for url in urls:
        kind, message = outcome[url]
        assert kind == StoreFull.__name__, (url, outcome[url])
        assert message.startswith("disk full: ") and "free space there: " in message
        assert url.split("///", 1)[1] in message  # the path


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str) -> Iterator[Path]:
    where.mkdir()
    tried = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if tried.returncode != 0:
        # Mounting needs root (CAP_SYS_ADMIN); the file-size-limit test below covers
        # the same translation without it.
        pytest.skip(f"this process cannot mount a tmpfs: {tried.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)


def fill(directory: Path) -> Path:
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"x" * 512)
    except OSError as exc:
        assert exc.errno == 28  # ENOSPC: the disk is full now
    finally:
        os.close(fd)
    return filler


@pytest.mark.slow
async def test_a_full_disk_at_open_says_disk_full_and_loses_nothing(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "disk", "1m") as disk:
        old_sqlite, old_jsonl = await existing_stores(disk)
        filler = fill(disk)
        new = [f"sqlite:///{disk}/new.db", f"jsonl:///{disk}/new-log"]
        outcome = open_all(None, old_sqlite, *new)
        assert_disk_full(outcome, [old_sqlite, *new])
        assert "free space there: 0 bytes" in outcome[old_sqlite][1]
        filler.unlink()  # space again: every store opens with what it had
        again = open_all(None, old_sqlite, old_jsonl, *new)
        assert again == {
            old_sqlite: ["opened", 1],
            old_jsonl: ["opened", 1],
            new[0]: ["opened", 0],
            new[1]: ["opened", 0],
        }


@pytest.mark.slow
async def test_a_file_size_limit_at_open_says_disk_full(tmp_path: Path) -> None:
    """The same through RLIMIT_FSIZE (EFBIG), which needs no privileges."""
    old_sqlite, old_jsonl = await existing_stores(tmp_path)
    new = [f"sqlite:///{tmp_path}/new.db", f"jsonl:///{tmp_path}/new-log"]
    outcome = open_all(0, old_sqlite, old_jsonl, *new)
    assert_disk_full(outcome, [old_sqlite, old_jsonl, *new])
    again = open_all(None, old_sqlite, old_jsonl, *new)
    assert [again[u] for u in (old_sqlite, old_jsonl)] == [["opened", 1], ["opened", 1]]
    assert [again[u] for u in new] == [["opened", 0], ["opened", 0]]


def test_the_new_store_errors_survive_pickling() -> None:
    """They cross process boundaries (a worker pool, a test harness) intact."""
    import pickle

    full = StoreFull("/data/s.db", 0, "No space left on device")
    missing = StoreNotFound("/data", "create it first")
    for error in (full, missing):
        again = pickle.loads(pickle.dumps(error))
        assert type(again) is type(error) and str(again) == str(error)
    assert pickle.loads(pickle.dumps(full)).free_bytes == 0
