"""The SQLite wake-ups between processes degrade to polling, never to a crash."""

from __future__ import annotations

from pathlib import Path

from duragent import Runtime
from duragent.store.sqlite import SQLiteStore
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
    try:
        unwatch = store.watch_controls(lambda task_id: None)
        await store.wait_for_work(0.01)
        await store.wait_for_change(0.01)
        assert not store.listening
        unwatch()
    finally:
        await store.close()
