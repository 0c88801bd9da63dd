"""One watcher per server process: a commit wakes only the streams of the task it
moved, which share one read of it; several servers on one PostgreSQL store see
each other's commits."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, cast

import httpx
import pytest

from conftest import drop_schema, require_postgres
from duragent.server._events import entry_events
from duragent.server._watch import TaskWatch
from duragent.store import Commit, Store
from duragent.store._postgres_notify import TASKS_CHANNEL, WORK_CHANNEL, change_notifies
from duragent.types import EntryKind, NewEntry, Task, UIText, dump_message
from support.server_live import LiveServer, live_server


async def events(response: httpx.Response) -> AsyncIterator[tuple[str, Any]]:
    """(event, data) of each event of a streaming response."""
    name, data = "message", None
    async for line in response.aiter_lines():
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            data = json.loads(line[6:])
        elif line == "" and data is not None:
            yield name, data
            name, data = "message", None


async def start(client: httpx.AsyncClient, server: LiveServer, agent: str) -> str:
    body = {"agent": agent, "input": "go"}
    r = await client.post(f"{server.url}/v1/tasks", json=body, headers=server.headers())
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


class Counted:
    """A store whose reads of tasks and entries are counted."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.reads = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def get_task(self, task_id: str) -> Task:
        self.reads += 1
        return await self.store.get_task(task_id)

    async def entries(self, task_id: str, **kw: Any) -> Any:
        self.reads += 1
        return await self.store.entries(task_id, **kw)


def ui(task_id: str, text: str) -> NewEntry:
    return NewEntry(
        task_id=task_id, kind=EntryKind.UI_MESSAGE, payload=dump_message(UIText(text=text))
    )


class Streams:
    """In-process event streams over one TaskWatch, each noting the seqs it got."""

    def __init__(self, watch: TaskWatch) -> None:
        self.watch = watch
        self.got: list[list[int]] = []
        self.tasks: list[asyncio.Task[None]] = []
        self._moved = asyncio.Event()

    def open(self, task_id: str) -> int:
        seqs: list[int] = []
        self.got.append(seqs)

        async def read() -> None:
            async for chunk in entry_events(self.watch, task_id, keepalive=3600):
                if chunk.startswith("id: "):
                    seqs.append(int(chunk.split("\n")[0][4:]))
                    self._moved.set()

        self.tasks.append(asyncio.create_task(read()))
        return len(self.got) - 1

    async def until(self, done: Callable[[], bool]) -> None:
        async with asyncio.timeout(30):
            while not done():
                self._moved.clear()
                await self._moved.wait()

    def close(self) -> None:
        for t in self.tasks:
            t.cancel()


async def make(store: Store) -> Task:
    task, _ = await store.create_task(Task(agent="a"))
    await store.commit(Commit(entries=[ui(task.id, "hello")]))
    return task


async def test_reads_per_commit_do_not_grow_with_the_streams(store: Store) -> None:
    counted = Counted(store)
    watch = TaskWatch(cast(Store, counted))
    hot = await make(store)
    cold = [await make(store) for _ in range(25)]
    unwatched = await make(store)
    streams = Streams(watch)
    hot_streams = [streams.open(hot.id) for _ in range(25)]
    cold_streams = [streams.open(t.id) for t in cold]
    try:
        # Every stream has the task's first entry; then a commit every stream of
        # `hot` gets settles what opening them cost (the constant).
        await streams.until(lambda: all(streams.got[i] for i in range(50)))
        await store.commit(Commit(entries=[ui(hot.id, "sync")]))
        await streams.until(lambda: all(len(streams.got[i]) == 2 for i in hot_streams))
        before = counted.reads
        n = 20
        for k in range(n):
            await store.commit(Commit(entries=[ui(hot.id, f"h{k}")]))
            await store.commit(Commit(entries=[ui(cold[0].id, f"c{k}")]))
            await store.commit(Commit(entries=[ui(unwatched.id, f"u{k}")]))
            # Each round's commits reach their streams before the next round's.

            def arrived(k: int = k) -> bool:
                hot_ok = all(len(streams.got[i]) == 3 + k for i in hot_streams)
                return hot_ok and len(streams.got[cold_streams[0]]) == 2 + k

            await streams.until(arrived)
        reads = counted.reads - before
        # 2n commits to watched tasks (50 streams), n to an unwatched one: at most
        # two reads (the row, the new entries) per commit that moved a watched
        # task, whatever the number of its streams; none for the rest.
        assert reads <= 2 * (2 * n) + 4, reads
        assert all(streams.got[i] == list(range(1, n + 3)) for i in hot_streams)
        assert all(len(streams.got[i]) == 1 for i in cold_streams[1:]), "woken for nothing"
    finally:
        streams.close()
        await asyncio.gather(*streams.tasks, return_exceptions=True)


async def test_a_stream_is_woken_only_by_its_own_task(store: Store) -> None:
    counted = Counted(store)
    watch = TaskWatch(cast(Store, counted))
    mine, other = await make(store), await make(store)
    streams = Streams(watch)
    streams.open(mine.id)
    try:
        await streams.until(lambda: streams.got[0] == [1])
        await store.commit(Commit(entries=[ui(mine.id, "sync")]))
        await streams.until(lambda: streams.got[0] == [1, 2])
        reads, rounds = counted.reads, watch.rounds
        for k in range(30):
            await store.commit(Commit(entries=[ui(other.id, f"o{k}")]))
        await store.commit(Commit(entries=[ui(mine.id, "mine")]))
        await streams.until(lambda: streams.got[0] == [1, 2, 3])
        # 31 commits; the one to `mine` woke the watcher once and cost two reads.
        assert watch.rounds - rounds == 1
        assert counted.reads - reads <= 2
    finally:
        streams.close()
        await asyncio.gather(*streams.tasks, return_exceptions=True)


async def test_watch_tasks_is_told_which_tasks_moved(store: Store) -> None:
    a, b = await make(store), await make(store)
    heard: list[frozenset[str] | None] = []
    got = asyncio.Event()

    def noted(ids: frozenset[str] | None) -> None:
        heard.append(ids)
        got.set()

    stop = store.watch_tasks(noted)
    try:
        await store.commit(Commit(entries=[ui(a.id, "x")]))
        async with asyncio.timeout(10):
            while a.id not in set().union(*(h or {a.id} for h in heard)):
                got.clear()
                await got.wait()
        # None (listening just began: re-read everything) may come first, never `b`.
        assert all(h is None or h == {a.id} for h in heard), heard
        heard.clear()
        await store.delete_task(b.id)
        async with asyncio.timeout(10):
            while not any(h is None or b.id in h for h in heard):
                got.clear()
                await got.wait()
    finally:
        stop()


def test_a_notify_lists_the_moved_tasks_or_says_it_cannot() -> None:
    work, moved = change_notifies("ns", True, {"b", "a"})
    assert work.params == (WORK_CHANNEL, "ns")
    assert moved.params[0] == TASKS_CHANNEL and json.loads(moved.params[1]) == ["ns", ["a", "b"]]
    # A payload must stay under 8000 bytes: a batch that moved more tasks than
    # one holds lists them in several; past a few, "re-read what you watch".
    (many,) = change_notifies("ns", False, {f"task-{i:040d}" for i in range(5000)})
    assert json.loads(many.params[1]) == ["ns", None]


def test_a_batch_of_many_tasks_lists_them_in_several_payloads() -> None:
    # A group commit of a few hundred tasks (a busy writer's batch) would
    # otherwise make every watcher re-read every task it watches.
    ids = {f"task-{i:040d}" for i in range(400)}
    notes = change_notifies("ns", False, ids)
    assert len(notes) > 1 and all(len(n.params[1].encode()) < 8000 for n in notes)
    listed = [json.loads(n.params[1]) for n in notes]
    assert all(ns == "ns" and moved for ns, moved in listed)
    assert set().union(*(moved for _, moved in listed)) == ids


@pytest.mark.slow
async def test_a_stream_on_one_server_sees_commits_made_through_another(
    tmp_path: Path,
) -> None:
    schema = f"test_{uuid.uuid4().hex[:12]}"
    url = f"{require_postgres()}?schema={schema}"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    try:
        # The task runs on the second server's workers; its stream is on the first,
        # which runs none; the answer goes through the second.
        with (
            live_server(tmp_path / "a", workers=0, store_url=url) as one,
            live_server(tmp_path / "b", workers=2, store_url=url) as two,
        ):
            async with httpx.AsyncClient(timeout=30) as client:
                tid = await start(client, two, "approver")
                got: list[Any] = []
                end: Any = None
                async with client.stream(
                    "GET", f"{one.url}/v1/tasks/{tid}/events", headers=one.headers()
                ) as r:
                    assert r.status_code == 200
                    async for name, data in events(r):
                        if name == "end":
                            end = data
                            break
                        got.append(data)
                        if name == "status" and data["payload"]["to"] == "waiting":
                            answer = await client.post(
                                f"{two.url}/v1/tasks/{tid}/respond",
                                json={"approve": True},
                                headers=two.headers(),
                            )
                            assert answer.status_code == 200, answer.text
        assert end["status"] == "completed"
        assert [e["seq"] for e in got] == list(range(1, len(got) + 1))
    finally:
        drop_schema(schema)


class Stale(Counted):
    """A store whose get_task, in the asyncio task `armed` names, returns the row
    it read only after `release` is set: a stream's open read made before a
    commit that lands (and reaches the watcher) while it is on its way back."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.armed: asyncio.Task[None] | None = None
        self.reading = asyncio.Event()
        self.release = asyncio.Event()

    async def get_task(self, task_id: str) -> Task:
        task = await super().get_task(task_id)
        if self.armed is not None and asyncio.current_task() is self.armed:
            self.armed = None
            self.reading.set()
            await self.release.wait()
        return task


async def test_a_stream_joining_a_watched_task_misses_no_commit(store: Store) -> None:
    stale = Stale(store)
    watch = TaskWatch(cast(Store, stale))
    task = await make(store)
    streams = Streams(watch)
    streams.open(task.id)  # the task is watched already when the second stream opens
    late: list[int] = []

    async def second() -> None:
        async for chunk in entry_events(watch, task.id, 1, keepalive=3600):
            if chunk.startswith("id: "):
                late.append(int(chunk.split("\n")[0][4:]))
                streams._moved.set()

    try:
        await streams.until(lambda: streams.got[0] == [1])
        stale.armed = asyncio.create_task(second())
        streams.tasks.append(stale.armed)
        await stale.reading.wait()  # its open read holds the row of seq 1
        await store.commit(Commit(entries=[ui(task.id, "meanwhile")]))
        await streams.until(lambda: streams.got[0] == [1, 2])  # the watcher has read it
        stale.release.set()
        await streams.until(lambda: late == [2])
    finally:
        streams.close()
        await asyncio.gather(*streams.tasks, return_exceptions=True)


class Broken(Counted):
    """A store whose reads of one task fail when the watcher makes them."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.bad = ""
        self.watcher: asyncio.Task[None] | None = None

    async def get_task(self, task_id: str) -> Task:
        if task_id == self.bad and asyncio.current_task() is self.watcher:
            raise ValueError("a row that cannot be read")
        return await super().get_task(task_id)


async def test_a_task_the_watcher_cannot_read_does_not_hold_up_the_others(store: Store) -> None:
    broken = Broken(store)
    watch = TaskWatch(cast(Store, broken), recheck=3600)  # its retry: not within the test
    bad, good = await make(store), await make(store)
    broken.bad = bad.id
    streams = Streams(watch)
    streams.open(bad.id)
    streams.open(good.id)
    try:
        await streams.until(lambda: streams.got == [[1], [1]])
        broken.watcher = watch._loop
        await store.commit(Commit(entries=[ui(bad.id, "unreadable")]))
        await store.commit(Commit(entries=[ui(good.id, "fine")]))
        await streams.until(lambda: streams.got[1] == [1, 2])
    finally:
        streams.close()
        await asyncio.gather(*streams.tasks, return_exceptions=True)
