"""What every worker does besides running tasks: fire due schedule ticks, apply queue TTLs."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping

from duragent.errors import StoreError
from duragent.runtime.agent import Agent
from duragent.runtime.schedules import fire_due
from duragent.store.base import Store
from duragent.store.purge import expire_by_ttl
from duragent.types import utcnow

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
                if time.monotonic() - self._last_ttl >= self.ttl_interval:
                    self._last_ttl = time.monotonic()
                    deleted = await expire_by_ttl(self.store)
                    if deleted:
                        log.info("purged %d tasks past their queue's ttl", deleted)
            except StoreError as exc:
                log.warning("housekeeping failed: %s", exc)
            await asyncio.sleep(delay)


async def stop(job: asyncio.Future[None] | None) -> None:
    if job is not None:
        job.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await job
