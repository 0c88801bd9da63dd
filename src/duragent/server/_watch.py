"""One watcher per server process: the tasks someone waits on or streams.

The store tells the watcher which tasks each commit moved, by any process
(`Store.watch_tasks`: NOTIFY payloads on PostgreSQL, the wake-up datagrams on
SQLite). The watcher reads each moved task once (its row, and the entries new
since the last read when streams are open on it: at most two reads per task a
commit moved), wakes the task's `/wait` waiters, who test their own condition
on the row read for them, and hands the new entries to each of its event
streams. A commit to a task nobody watches costs no read. With nothing
watched, the watcher stops and stops listening.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from duragent.errors import TaskNotFound
from duragent.store._protocol import Store
from duragent.types import Entry, Task

log = logging.getLogger("duragent.server")

RECHECK = 1.0  # seconds before a read of a task that failed is tried again
PAGE = 500  # entries read at once
BACKLOG = 2000  # entries a stream may hold unsent; past it, it reads them itself


class Feed:
    """What the watcher hands one event stream: the task as last read, and the
    entries read since the stream last took them (`lost`: too many held; the
    stream reads the store itself from its own position)."""

    def __init__(self) -> None:
        self.ready = asyncio.Event()
        self.task: Task | None = None
        self.deleted = False
        self.entries: list[Entry] = []
        self.lost = False

    def put(self, task: Task | None, entries: list[Entry]) -> None:
        self.task, self.deleted = task, task is None
        if self.lost or len(self.entries) + len(entries) > BACKLOG:
            self.entries, self.lost = [], True
        else:
            self.entries += entries
        self.ready.set()

    def take(self) -> tuple[list[Entry], bool]:
        entries, lost = self.entries, self.lost
        self.entries, self.lost = [], False
        self.ready.clear()
        return entries, lost


@dataclass
class _Watched:
    task: Task | None
    seq: int  # the last entry handed to the streams
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    waiters: int = 0
    feeds: set[Feed] = field(default_factory=set)


class TaskWatch:
    """The tasks someone waits on or streams, each read once per commit that moved it."""

    def __init__(self, store: Store, recheck: float = RECHECK, page: int = PAGE) -> None:
        self.store = store
        self.recheck = recheck
        self.page = page
        self.reads = 0  # store reads made for waiters and streams, and
        self.rounds = 0  # rounds of them (one per batch of moved tasks heard): tests count both
        self._watched: dict[str, _Watched] = {}
        self._moved: set[str] | None = set()  # heard moved, not read yet (None: all)
        self._heard: asyncio.Event | None = None
        self._loop: asyncio.Task[None] | None = None
        self._unwatch: Callable[[], None] | None = None

    async def wait(
        self, task: Task, done: Callable[[Task], bool], timeout: float
    ) -> tuple[Task | None, bool]:
        """(the task, True) once `done(task)`; (the task as last read, False) when
        `timeout` seconds pass first; (None, False) if it was deleted meanwhile."""
        if done(task):
            return task, True
        w = self._slot(task)
        w.waiters += 1
        try:
            async with w.changed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        w.changed.wait_for(lambda: w.task is None or done(w.task)), timeout
                    )
                return w.task, w.task is not None and done(w.task)
        finally:
            w.waiters -= 1
            self._leave(task.id, w)

    @contextlib.asynccontextmanager
    async def feed(self, task: Task) -> AsyncIterator[Feed]:
        """A Feed of `task`'s new entries for as long as the block runs."""
        fresh = task.id not in self._watched
        w = self._slot(task)
        if not fresh:
            # Watched already: a commit the watcher read while the caller's own
            # read was on its way back is behind `w.seq`; read the row once more
            # for the new stream, which catches up from it.
            self._mark(frozenset([task.id]))
        if not w.feeds and w.task is not None:
            w.seq = max(w.seq, w.task.last_seq)  # nobody needed its entries until now
        feed = Feed()
        w.feeds.add(feed)
        try:
            yield feed
        finally:
            w.feeds.discard(feed)
            self._leave(task.id, w)

    def _slot(self, task: Task) -> _Watched:
        w = self._watched.get(task.id)
        if w is None:
            w = self._watched[task.id] = _Watched(task, task.last_seq)
            # Read once: it may have moved between the caller's read and now.
            self._mark(frozenset([task.id]))
        if self._loop is None or self._loop.done():
            self._heard = asyncio.Event()
            self._moved = set(self._watched)
            self._heard.set()
            self._unwatch = self.store.watch_tasks(self._mark)
            self._loop = asyncio.create_task(self._run(), name="duragent-task-watch")
        return w

    def _leave(self, task_id: str, w: _Watched) -> None:
        if w.waiters == 0 and not w.feeds and self._watched.get(task_id) is w:
            del self._watched[task_id]
            if not self._watched and self._heard is not None:
                self._heard.set()  # the loop ends

    def _mark(self, task_ids: frozenset[str] | None) -> None:
        """The store's callback: these tasks moved (None: any may have)."""
        if self._moved is not None:
            if task_ids is None:
                self._moved = None
            else:
                self._moved |= {t for t in task_ids if t in self._watched}
        if self._heard is not None and (self._moved is None or self._moved):
            self._heard.set()

    async def _run(self) -> None:
        assert self._heard is not None
        heard = self._heard
        try:
            while self._watched:
                await heard.wait()
                heard.clear()
                moved, self._moved = self._moved, set()
                ids = list(self._watched) if moved is None else sorted(moved)
                if ids:
                    self.rounds += 1
                for task_id in ids:
                    w = self._watched.get(task_id)
                    if w is None:
                        continue
                    try:
                        await self._read(task_id, w)
                    except Exception as exc:  # a store out of reach, a bad row: read it later
                        log.warning(
                            "watching tasks: %s; trying again",
                            str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                        )
                        # Not a sleep here: the other tasks' reads go on meanwhile.
                        asyncio.get_running_loop().call_later(
                            self.recheck, self._mark, frozenset([task_id])
                        )
        finally:
            if self._unwatch is not None:
                self._unwatch()
                self._unwatch = None

    async def _read(self, task_id: str, w: _Watched) -> None:
        try:
            task: Task | None = await self.store.get_task(task_id)
        except TaskNotFound:
            task = None
        self.reads += 1
        entries: list[Entry] = []
        if task is not None and w.feeds and task.last_seq > w.seq:
            entries = await self.store.entries(task_id, after_seq=w.seq, limit=self.page)
            self.reads += 1
            if entries:
                w.seq = entries[-1].seq
            if w.seq < task.last_seq:
                self._mark(frozenset([task_id]))  # more than a page: the rest next round
        w.task = task
        for feed in w.feeds:
            feed.put(task, entries)
        async with w.changed:
            w.changed.notify_all()
