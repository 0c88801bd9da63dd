"""The SQLite wake-ups between processes degrade to polling, never to a crash."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import duragent
from duragent import Runtime, Task
from duragent.store import _sqlite_wake as sqlite_wake
from duragent.store._sqlite import SQLiteStore
from duragent.store._sqlite_wake import WakeUps
from worker_agents import AGENTS


async def test_worker_polls_when_the_wake_registration_cannot_be_made(tmp_path: Path) -> None:
    # The wake directory is one where no file can be created, not even by root
    # (tests run as root, who bypasses a 0700 directory of another user): the
    # registration fails, the worker must poll instead.
    (tmp_path / ".c.db.wake").symlink_to("/proc")
    async with Runtime(f"sqlite:///{tmp_path}/c.db", agents=AGENTS) as rt:
        done = await (await rt.submit("chat", "hello", session_id="s1", owner="u")).wait(20)
        assert done.output == "I have heard 1 messages: hello"


async def test_store_waits_poll_when_the_wake_registration_cannot_be_made(
    tmp_path: Path,
) -> None:
    (tmp_path / ".s.db.wake").symlink_to("/proc")
    store = SQLiteStore(str(tmp_path / "s.db"))
    await store.open()
    try:
        unwatch = store.watch_controls(lambda task_id: None)
        await store.wait_for_work(0.01)
        await store.wait_for_change(0.01)
        assert not store.listening
        unwatch()
    finally:
        await store.close()


async def test_a_registration_removed_from_disk_is_made_again_at_the_next_wait(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(str(tmp_path / "s.db"))
    await store.open()
    other = SQLiteStore(str(tmp_path / "s.db"))  # another process's end of the file
    await other.open()
    try:
        await store.wait_for_change(0.001)
        wake_dir = tmp_path / ".s.db.wake"
        (mine,) = list(wake_dir.iterdir())
        mine.unlink()
        await store.wait_for_change(0.001)
        assert [p.name for p in wake_dir.iterdir()] == [mine.name]
        # ...and it works: a commit by the other end wakes this one.
        waiting = asyncio.ensure_future(store.wait_for_change(60))
        await asyncio.sleep(0)
        other._wake.announce(work=False)
        await asyncio.wait_for(waiting, 30)
    finally:
        await store.close()
        await other.close()


async def test_a_closed_store_neither_sends_nor_opens_a_socket(tmp_path: Path) -> None:
    """A commit on another thread's loop may be settled after the store closed;
    its announcement must then send nothing, and a wake-up end asked to
    listen after its close must not bind: either would open a socket that
    nobody closes."""
    store = SQLiteStore(str(tmp_path / "s.db"))
    await store.open()
    other = SQLiteStore(str(tmp_path / "s.db"))  # another process's end of the file
    await other.open()
    try:
        await other.wait_for_change(0.001)
        await store.wait_for_change(0.001)
        await store.close()
        wake_dir = tmp_path / ".s.db.wake"
        others = sorted(p.name for p in wake_dir.iterdir())
        descriptors = sorted(os.listdir("/proc/self/fd"))
        store._announce(work=True, controlled=["t1"])  # what a late settlement runs
        assert not store._wake.listen(lambda work, change, ids, moved: None, changes=True)
        assert sorted(os.listdir("/proc/self/fd")) == descriptors
        assert sorted(p.name for p in wake_dir.iterdir()) == others
        assert other._wake._sock is not None
        with pytest.raises(BlockingIOError):  # a datagram is queued as it is sent
            other._wake._sock.recv(65536)
    finally:
        await store.close()
        await other.close()


# Another process floods a registration: it sends with blocking sends, so it
# waits while the receive queue is full and nothing it sends is dropped.
_FLOOD = """
import socket, sys
address, start, total = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if address.startswith("@"):
    address = "\\0" + address[1:]
with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
    for i in range(start, total):
        s.sendto(f"c\\n{i}".encode(), address)
"""


@pytest.mark.slow
async def test_a_flood_of_datagrams_does_not_starve_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The kernel caps a datagram socket's queue (net.unix.max_dgram_qlen, 10
    # on many systems), so the bound is lowered below it: a full queue then
    # always holds more than one wake-up may read.
    monkeypatch.setattr(sqlite_wake, "_DRAIN_MAX", 4)
    wake = WakeUps(str(tmp_path / "f.db"))
    drains: list[tuple[int, int]] = []  # (ticks seen, ids read) per wake-up
    ticks = 0
    total = 5_000
    seen: set[str] = set()
    all_read = asyncio.Event()

    def heard(
        work: bool, change: bool, controlled: list[str], moved: frozenset[str] | None
    ) -> None:
        drains.append((ticks, len(controlled)))
        seen.update(controlled)
        if len(seen) == total:
            all_read.set()

    assert wake.listen(heard, changes=True)
    (registration,) = os.listdir(wake.dir)
    path = Path(wake.dir) / registration
    base = registration.rpartition(".")[0].removeprefix("@")
    address = str(path) if path.is_socket() else f"\0duragent-wake-{base}"

    # Fill the queue before the loop turns: the first wake-up finds more
    # datagrams than it may read.
    queued = 0
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            while queued < total:
                s.sendto(f"c\n{queued}".encode(), address)
                queued += 1
    assert queued > sqlite_wake._DRAIN_MAX

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    ticking = asyncio.ensure_future(ticker())
    sender = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _FLOOD,
        "@" + address[1:] if address.startswith("\0") else address,
        str(queued),
        str(total),
    )
    try:
        # The sender blocks while the queue is full, so every datagram
        # arrives, however slow the machine; a sender that fails says so at
        # once. The timeouts only guard against a hang.
        assert await asyncio.wait_for(sender.wait(), 600) == 0
        await asyncio.wait_for(all_read.wait(), 600)
    finally:
        ticking.cancel()
        if sender.returncode is None:
            sender.kill()
            await sender.wait()
        wake.close()
    assert seen == {str(i) for i in range(total)}  # nothing lost
    assert drains[0][1] == sqlite_wake._DRAIN_MAX  # the bound stopped the first read
    assert max(n for _, n in drains) <= sqlite_wake._DRAIN_MAX
    # The loop ran other coroutines between any two drains.
    assert all(a[0] < b[0] for a, b in itertools.pairwise(drains))


async def test_the_socket_is_a_file_only_the_owner_can_reach(tmp_path: Path) -> None:
    store = SQLiteStore(str(tmp_path / "s.db"))
    await store.open()
    try:
        await store.wait_for_work(0.001)
        wake_dir = tmp_path / ".s.db.wake"
        assert wake_dir.stat().st_mode & 0o777 == 0o700
        (mine,) = list(wake_dir.iterdir())
        assert mine.is_socket()  # not the abstract namespace, open to every local user
    finally:
        await store.close()


async def test_a_refusing_peer_is_forgotten_only_once_its_process_is_gone(
    tmp_path: Path,
) -> None:
    exited = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
    await exited.wait()
    wake = WakeUps(str(tmp_path / "p.db"))
    os.makedirs(wake.dir, mode=0o700)
    # Registrations nobody listens to: as a live process in another network
    # namespace looks from here (its abstract socket is invisible), and as a
    # process that exited.
    alive = Path(wake.dir) / f"@{'a' * 32}-{os.getpid()}.w"
    dead = Path(wake.dir) / f"@{'b' * 32}-{exited.pid}.w"
    alive.touch()
    dead.touch()
    try:
        wake.announce(work=True)
    finally:
        wake.close()
    assert alive.exists()
    assert not dead.exists()


@pytest.mark.parametrize("path", [":memory:", "file:shared?mode=memory&cache=shared"])
async def test_no_wake_folder_for_a_database_that_is_no_plain_file(
    path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    store = SQLiteStore(path)
    await store.open()
    try:
        await store.wait_for_change(0.001)
        store._announce(work=True, controlled=[])
        hears_others = store.notifies_across_processes
    finally:
        await store.close()
    assert list(tmp_path.iterdir()) == []
    assert not hears_others


@pytest.mark.slow
def test_the_demo_removes_its_wake_folder_with_its_store(tmp_path: Path) -> None:
    # The duragent under test, wherever it is imported from (a checkout or a worktree).
    src = str(Path(duragent.__file__).resolve().parents[1])
    env = {"COLUMNS": "200", "PATH": "/usr/bin:/bin", "PYTHONPATH": src}
    done = subprocess.run(
        [sys.executable, "-m", "duragent", "demo", "--no-crash"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Store removed" in done.stdout
    assert [p.name for p in tmp_path.iterdir()] == []


async def test_the_tasks_a_commit_moved_reach_the_other_process_and_a_gap_means_all(
    tmp_path: Path,
) -> None:
    sender, receiver = WakeUps(str(tmp_path / "m.db")), WakeUps(str(tmp_path / "m.db"))
    heard: list[frozenset[str] | None] = []
    got = asyncio.Event()

    def noted(work: bool, change: bool, ids: list[str], moved: frozenset[str] | None) -> None:
        heard.append(moved)
        got.set()

    async def next_heard() -> frozenset[str] | None:
        async with asyncio.timeout(10):
            while not heard:
                got.clear()
                await got.wait()
        return heard.pop(0)

    try:
        assert receiver.listen(noted, changes=True)
        sender.announce(work=False, tasks=["t1", "t2"])
        assert await next_heard() == frozenset({"t1", "t2"})
        sender._sent += 1  # a message the receiver never got (its queue was full)
        sender.announce(work=False, tasks=["t3"])
        assert await next_heard() is None, "a missed message: every task may have moved"
        sender.announce(work=False, tasks=["t4"])
        assert await next_heard() == frozenset({"t4"})
        sender.announce(work=False, tasks=[f"task-{i:05d}" for i in range(5000)])
        assert await next_heard() is None, "too many to list"
    finally:
        sender.close()
        receiver.close()


async def test_a_last_message_a_full_queue_refused_still_reaches_the_other_process(
    tmp_path: Path,
) -> None:
    # A receiver's queue holds a bounded number of datagrams: a sender that
    # commits faster than it reads finds it full and its message is lost. A
    # later message shows the gap; with none (the task's last commit), the
    # receiver must still learn that something moved.
    sender, receiver = WakeUps(str(tmp_path / "m.db")), WakeUps(str(tmp_path / "m.db"))
    heard: list[frozenset[str] | None] = []
    got = asyncio.Event()

    def noted(work: bool, change: bool, ids: list[str], moved: frozenset[str] | None) -> None:
        heard.append(moved)
        got.set()

    try:
        assert receiver.listen(noted, changes=True)
        n = 5000  # far more than a queue holds; the receiver reads none meanwhile
        for i in range(n):
            sender.announce(work=False, tasks=[f"t{i}"])
        async with asyncio.timeout(10):
            while not any(h is None or f"t{n - 1}" in h for h in heard):
                got.clear()
                await got.wait()
    finally:
        sender.close()
        receiver.close()


async def test_a_first_message_a_full_queue_refused_is_not_hidden_by_the_next(
    tmp_path: Path,
) -> None:
    # Another process filled the receiver's queue; this sender's first message
    # is refused, its second taken: the receiver, having heard nothing from it
    # before, sees no gap in its numbers, so it must be told '*' all the same.
    path = str(tmp_path / "m.db")
    flood, sender, receiver = WakeUps(path), WakeUps(path), WakeUps(path)
    heard: list[frozenset[str] | None] = []
    got = asyncio.Event()

    def noted(work: bool, change: bool, ids: list[str], moved: frozenset[str] | None) -> None:
        heard.append(moved)
        got.set()

    async def until(done: Callable[[], bool]) -> None:
        async with asyncio.timeout(10):
            while not done():
                got.clear()
                await got.wait()

    try:
        assert receiver.listen(noted, changes=True)
        for i in range(5000):
            flood.announce(work=False, tasks=[f"f{i}"])
        sender.announce(work=False, tasks=["lost"])

        def queued() -> bool:
            assert receiver._sock is not None
            try:
                return bool(receiver._sock.recv(1, socket.MSG_PEEK) or True)
            except BlockingIOError:
                return False

        while queued():  # the receiver drains its queue on this loop
            await asyncio.sleep(0)
        sender.announce(work=False, tasks=["next"])
        await until(lambda: any(h is None or "lost" in h for h in heard))
    finally:
        for w in (flood, sender, receiver):
            w.close()


async def test_a_watcher_whose_registration_was_removed_is_told_to_re_read_all(
    tmp_path: Path,
) -> None:
    # While its registration is gone, other processes' commits do not reach it:
    # once it registers again, its watchers must re-read what they watch.
    store = SQLiteStore(str(tmp_path / "s.db"), poll_interval=0.05)
    await store.open()
    other = SQLiteStore(str(tmp_path / "s.db"))  # another process's end of the file
    await other.open()
    heard: list[frozenset[str] | None] = []
    got = asyncio.Event()

    def noted(ids: frozenset[str] | None) -> None:
        heard.append(ids)
        got.set()

    stop = store.watch_tasks(noted)
    try:
        wake_dir = tmp_path / ".s.db.wake"
        (mine,) = list(wake_dir.iterdir())
        mine.unlink()
        task, _ = await other.create_task(Task(agent="a"))  # heard by nobody
        async with asyncio.timeout(10):
            while not any(h is None or task.id in h for h in heard):
                got.clear()
                await got.wait()
        assert [p.name for p in wake_dir.iterdir()] == [mine.name]
    finally:
        stop()
        await store.close()
        await other.close()
