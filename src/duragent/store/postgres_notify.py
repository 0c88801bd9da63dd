"""Change notification for the PostgreSQL store: LISTEN/NOTIFY, and the local signals.

A commit notifies one channel with its store's namespace (schema) as payload,
delivered by the server only if and when the transaction commits. Each store
keeps one listening connection per event loop; waiters wait on a local
signal that both the listener and the store's own commits fire.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import psycopg
from psycopg import sql

from duragent.store.base import ChangeSignal

# A commit notifies one channel with the store's namespace as payload: WORK_CHANNEL
# when it may have made a task claimable (see PgTx.work), CHANNEL otherwise.
CHANNEL = "duragent_changes"
WORK_CHANNEL = "duragent_work"


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

    It listens to WORK_CHANNEL, and to CHANNEL only if `changes`: a process
    that only waits for work (a worker) is not sent the notification of every
    commit in the cluster.
    """

    def __init__(
        self, conninfo: str, namespace: str, signals: Callable[[], Signals], *, changes: bool
    ) -> None:
        self.conninfo = conninfo
        self.namespace = namespace
        self.signals = signals
        self.changes = changes
        self.loop = asyncio.get_running_loop()
        self.ready = asyncio.Event()
        self.task = self.loop.create_task(self._run())

    async def _run(self) -> None:
        channels = [WORK_CHANNEL, CHANNEL] if self.changes else [WORK_CHANNEL]
        listen = sql.SQL("; ").join(
            sql.SQL("LISTEN {}").format(sql.Identifier(c)) for c in channels
        )
        delay = 0.1
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True)
                async with conn:
                    await conn.execute(listen)
                    self.ready.set()
                    delay = 0.1
                    async for note in conn.notifies():
                        if note.payload == self.namespace:
                            self.signals().fire(work=note.channel == WORK_CHANNEL)
            except psycopg.Error:
                pass
            # Not listening: whatever changed meanwhile was unheard, so wake everyone.
            self.ready.clear()
            self.signals().fire(work=True)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    async def stop(self) -> None:
        if self.loop is not asyncio.get_running_loop():
            if not self.loop.is_closed():
                self.loop.call_soon_threadsafe(self.task.cancel)
            return
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
