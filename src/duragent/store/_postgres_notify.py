"""Change notification for the PostgreSQL store: LISTEN/NOTIFY, and the local signals.

A commit notifies TASKS_CHANNEL with its store's namespace (schema) and the
ids of the tasks it wrote or deleted, and WORK_CHANNEL with the namespace
when it may have made a task claimable, delivered by the server only if and
when the transaction commits: a process that watches tasks (`watch_tasks`:
the server's event streams) re-reads only the tasks that moved, a worker hears
only of work. Older versions notified CHANNEL instead of TASKS_CHANNEL: a
listener still hears CHANNEL and takes such a note for "anything may have
moved" (a mixed-version deploy costs reads, not missed events; their own
listeners of CHANNEL fall back to their waits' timeouts). Each store
keeps one listening connection per event loop; waiters wait on a local
signal that both the listener and the store's own commits fire. A commit that
sets a control request (pause/abort) on a task also notifies CONTROL_CHANNEL
with the task's id, so its worker, wherever it runs, stops at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable

import psycopg
from psycopg import sql

from duragent.store._postgres_bounds import WaitBounds, session_setup
from duragent.store._postgres_wire import Statement
from duragent.store._signals import ChangeSignal, ControlCallback, TasksCallback

# CHANNEL: what older versions notified for a commit that made no work.
CHANNEL = "duragent_changes"
WORK_CHANNEL = "duragent_work"
CONTROL_CHANNEL = "duragent_control"
TASKS_CHANNEL = "duragent_tasks"

# A NOTIFY payload must be shorter than 8000 bytes: a commit's ids are listed
# in payloads of at most _TASKS_MAX bytes, at most _TASKS_NOTIFIES of them (a
# group commit of a few hundred tasks); past that they are left out (null):
# every watcher re-reads what it watches.
_TASKS_MAX = 7000
_TASKS_NOTIFIES = 8


def control_payload(namespace: str, task_id: str) -> str:
    return json.dumps([namespace, task_id])


def change_notifies(
    namespace: str, work: bool, task_ids: set[str] | frozenset[str]
) -> list[Statement]:
    """What a commit that changed something notifies: WORK_CHANNEL if it may have
    made work, and TASKS_CHANNEL with `[namespace, ids]` (null ids: too many to list)."""
    out = []
    if work:
        out.append(Statement("SELECT pg_notify(%s, %s)", (WORK_CHANNEL, namespace), False))
    for payload in _tasks_payloads(namespace, sorted(task_ids)):
        out.append(Statement("SELECT pg_notify(%s, %s)", (TASKS_CHANNEL, payload), False))
    return out


def _tasks_payloads(namespace: str, ids: list[str]) -> list[str]:
    """`[namespace, ids]` payloads listing `ids` (one, with [], for none), each
    under _TASKS_MAX bytes; `[namespace, null]` alone when they take too many."""
    empty = len(json.dumps([namespace, []]).encode())
    chunks: list[list[str]] = [[]]
    size = empty
    for task_id in ids:
        more = len(json.dumps(task_id).encode()) + 2  # with its ", "
        if size + more > _TASKS_MAX:
            if empty + more > _TASKS_MAX or len(chunks) == _TASKS_NOTIFIES:
                return [json.dumps([namespace, None])]
            chunks.append([])
            size = empty
        chunks[-1].append(task_id)
        size += more
    return [json.dumps([namespace, chunk]) for chunk in chunks]


class Signals:
    """The change and work signals of one event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.change = ChangeSignal()
        self.work = ChangeSignal()

    def fire(self, *, work: bool) -> None:
        self.change.notify()
        if work:
            self.work.notify()


class Listener:
    """One connection per store doing LISTEN; reconnects with backoff if it drops.

    It listens to WORK_CHANNEL and CONTROL_CHANNEL (rare: one notification per
    pause or abort of a running task), and to TASKS_CHANNEL only if `changes`:
    a process that only waits for work (a worker) is not sent the notification
    of every commit in the cluster. `on_control` is told each controlled task
    id, and `on_tasks` the tasks each commit moved; both are told None each
    time it (re)starts listening: what was committed while it was not
    listening went unheard. Its session carries the store's `bounds`
    (_postgres_bounds.py, but for statement_timeout): a listener cut off from
    the server does not leave its session behind there.
    """

    def __init__(
        self,
        conninfo: str,
        namespace: str,
        signals: Callable[[], Signals],
        *,
        changes: bool,
        on_control: ControlCallback,
        on_tasks: TasksCallback,
        bounds: WaitBounds,
    ) -> None:
        self.conninfo = conninfo
        self.bounds = bounds
        self.namespace = namespace
        self.signals = signals
        self.changes = changes
        self.on_control = on_control
        self.on_tasks = on_tasks
        self.loop = asyncio.get_running_loop()
        self.ready = asyncio.Event()
        self.task = self.loop.create_task(self._run())

    async def _run(self) -> None:
        channels = [WORK_CHANNEL, CONTROL_CHANNEL]
        if self.changes:
            channels += [TASKS_CHANNEL, CHANNEL]
        listen = sql.SQL("; ").join(
            sql.SQL("LISTEN {}").format(sql.Identifier(c)) for c in channels
        )
        delay = 0.1
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True)
                async with conn:
                    setup = session_setup(conn, self.conninfo, self.bounds, listening=True)
                    # LISTEN first: the session shows `LISTEN ...` as its query.
                    await conn.execute(sql.SQL("; ").join([listen, *setup]))
                    self.ready.set()
                    self.on_control(None)
                    if self.changes:
                        self.on_tasks(None)
                    delay = 0.1
                    async for note in conn.notifies():
                        if note.channel == CONTROL_CHANNEL:
                            self._controlled(note.payload)
                        elif note.channel == TASKS_CHANNEL:
                            self._moved(note.payload)
                        elif note.payload == self.namespace:
                            self.signals().fire(work=note.channel == WORK_CHANNEL)
                            if note.channel == CHANNEL:  # an older version's commit
                                self.on_tasks(None)
            except psycopg.Error:
                pass
            # Not listening: whatever changed meanwhile was unheard, so wake everyone.
            self.ready.clear()
            self.signals().fire(work=True)
            if self.changes:
                self.on_tasks(None)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    def _controlled(self, payload: str) -> None:
        try:
            namespace, task_id = json.loads(payload)
        except (ValueError, TypeError):
            return  # not ours: some other program on this channel
        if namespace == self.namespace and isinstance(task_id, str):
            self.on_control(task_id)

    def _moved(self, payload: str) -> None:
        try:
            namespace, task_ids = json.loads(payload)
        except (ValueError, TypeError):
            return
        if namespace != self.namespace:
            return
        self.signals().fire(work=False)
        if isinstance(task_ids, list):
            self.on_tasks(frozenset(i for i in task_ids if isinstance(i, str)))
        else:
            self.on_tasks(None)  # too many to list

    async def stop(self) -> None:
        if self.loop is not asyncio.get_running_loop():
            if not self.loop.is_closed():
                self.loop.call_soon_threadsafe(self.task.cancel)
            return
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
