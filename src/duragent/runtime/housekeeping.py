"""What every worker does besides running tasks: fire due schedule ticks, apply queue TTLs."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta

from duragent.errors import StoreError
from duragent.runtime.agent import Agent
from duragent.runtime.schedules import fire_due
from duragent.store.base import Store
from duragent.store.purge import expire_by_ttl, ttl_expiries
from duragent.store.queues import list_queues
from duragent.types import Task, utcnow

log = logging.getLogger("duragent.worker")


class Housekeeper:
    """Runs beside a worker's claim loop. Each schedule tick is fired by one worker
    only (schedules.py says how), so any number of workers may run this."""

    def __init__(
        self,
        store: Store,
        agents: Mapping[str, Agent],
        *,
        interval: float = 1.0,
        ttl_interval: float = 60.0,
        on_fired: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.on_fired = on_fired
        self.agents = agents
        self.interval = interval
        self.ttl_interval = ttl_interval
        self.fired = 0
        self._last_ttl = 0.0
        # Queue TTLs are applied every `ttl_interval`, and also as soon as a
        # finished task comes due (`_ttl_due`): the first expiry the last look
        # found, or a task this worker finished since (`finished`).
        self._ttl_due: datetime | None = None
        self._ttls: dict[str, float] = {}  # queue -> ttl, as of the last look

    async def run(self) -> None:
        while True:
            delay = self.interval
            try:
                ids, soonest = await fire_due(self.store, self.agents)
                self.fired += len(ids)
                if ids and self.on_fired is not None:
                    self.on_fired()  # claim the new tasks now, not at the next poll
                if soonest is not None:
                    delay = min(delay, max(0.0, (soonest - utcnow()).total_seconds()))
                due = self._ttl_due is not None and self._ttl_due <= utcnow()
                if due or time.monotonic() - self._last_ttl >= self.ttl_interval:
                    await self._apply_ttls()
                if self._ttl_due is not None:
                    delay = min(delay, max(0.0, (self._ttl_due - utcnow()).total_seconds()))
            except StoreError as exc:
                log.warning("housekeeping failed: %s", exc)
            await asyncio.sleep(delay)

    async def _apply_ttls(self) -> None:
        self._last_ttl = time.monotonic()
        self._ttl_due = None
        now = utcnow()
        deleted = await expire_by_ttl(self.store, now)
        if deleted:
            log.info("purged %d tasks past their queue's ttl", deleted)
        self._ttls = {q.name: q.ttl for q in await list_queues(self.store) if q.ttl is not None}
        if self._ttls:
            self._note_due(await ttl_expiries(self.store, now, self.ttl_interval))

    def finished(self, task: Task) -> None:
        """A task this worker ran finished: purge it when its queue's ttl says, if any."""
        ttl = self._ttls.get(task.queue or "")
        if ttl is not None:
            self._note_due(task.updated_at + timedelta(seconds=ttl))

    def _note_due(self, at: datetime | None) -> None:
        if at is not None and (self._ttl_due is None or at < self._ttl_due):
            self._ttl_due = at


async def stop(job: asyncio.Future[None] | None) -> None:
    if job is not None:
        job.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await job
