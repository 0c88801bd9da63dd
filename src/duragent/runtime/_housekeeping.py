"""What every worker does besides running tasks: fire due schedule ticks, apply queue TTLs."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta

from duragent.errors import InvalidOption, StoreError, check_seconds
from duragent.runtime._agent import Agent
from duragent.runtime._schedules import fire_due
from duragent.store._protocol import Store
from duragent.store._purge import expire_by_ttl, ttl_expiries, ttl_queues
from duragent.types import Document, Task, utcnow

log = logging.getLogger("duragent.worker")


class Housekeeper:
    """Runs beside a worker's claim loop. Each schedule tick is fired by one worker
    only (_schedules.py says how), so any number of workers may run this."""

    def __init__(
        self,
        store: Store,
        agents: Mapping[str, Agent],
        *,
        interval: float = 1.0,
        ttl_interval: float = 60.0,
        on_fired: Callable[[], None] | None = None,
    ) -> None:
        check_seconds("interval", interval)
        if not 0 <= ttl_interval < float("inf"):
            raise InvalidOption(f"ttl_interval must be 0 or more seconds, not {ttl_interval!r}")
        self.store = store
        self.on_fired = on_fired
        self.agents = agents
        self.interval = interval
        self.ttl_interval = ttl_interval
        self.fired = 0
        self.purged = 0
        self._last_ttl = 0.0
        # Queue TTLs are applied every `ttl_interval`, and also as soon as a
        # finished task comes due (`_ttl_due`): the first expiry the last look
        # found, or a task this worker finished since (`finished`).
        self._ttl_due: datetime | None = None
        self._ttls: dict[str, float] = {}  # queue -> ttl, as of the last look
        self._told: set[tuple[str, str, int]] = set()  # bad rows already logged

    async def run(self) -> None:
        # Schedules and TTLs are separate steps, each surviving any error: a
        # failure of one (or one bad row in it) must not stop the other, nor
        # this loop, which every owner's schedules depend on.
        while True:
            delay = await self._fire_schedules()
            due = self._ttl_due is not None and self._ttl_due <= utcnow()
            if due or time.monotonic() - self._last_ttl >= self.ttl_interval:
                await self._expire()
            if self._ttl_due is not None:
                delay = min(delay, max(0.0, (self._ttl_due - utcnow()).total_seconds()))
            await asyncio.sleep(delay)

    async def _fire_schedules(self) -> float:
        """Fire due ticks; how long to sleep before the next pass."""
        try:
            ids, soonest = await fire_due(self.store, self.agents, on_bad=self._bad_schedule)
        except StoreError as exc:
            log.warning("firing schedules failed: %s", exc)
            return self.interval
        except Exception:
            log.exception("firing schedules failed")
            return self.interval
        self.fired += len(ids)
        if ids and self.on_fired is not None:
            self.on_fired()  # claim the new tasks now, not at the next poll
        if soonest is None:
            return self.interval
        return min(self.interval, max(0.0, (soonest - utcnow()).total_seconds()))

    async def _expire(self) -> None:
        self._last_ttl = time.monotonic()
        self._ttl_due = None
        now = utcnow()
        try:
            queues = await ttl_queues(self.store, now, on_bad=self._bad_queue)
            self._ttls = {q.name: q.ttl for q, _ in queues if q.ttl is not None}
            deleted = await expire_by_ttl(self.store, queues=queues)
            self._note_due(await ttl_expiries(queues, self.store, self.ttl_interval))
        except StoreError as exc:
            log.warning("purging by queue ttl failed: %s", exc)
            return
        except Exception:
            log.exception("purging by queue ttl failed")
            return
        self.purged += deleted
        if deleted:
            log.info("purged %d tasks past their queue's ttl", deleted)

    def finished(self, task: Task) -> None:
        """A task this worker ran finished: purge it when its queue's ttl says, if any."""
        ttl = self._ttls.get(task.queue or "")
        if ttl is not None:
            self._note_due(task.updated_at + timedelta(seconds=ttl))

    def _note_due(self, at: datetime | None) -> None:
        if at is not None and (self._ttl_due is None or at < self._ttl_due):
            self._ttl_due = at

    def _bad_schedule(self, doc: Document, exc: Exception) -> None:
        self._tell("schedule", doc, exc)

    def _bad_queue(self, doc: Document, exc: Exception) -> None:
        self._tell("queue", doc, exc)

    def _tell(self, what: str, doc: Document, exc: Exception) -> None:
        """Log a bad row once per version of it, not at every pass."""
        seen = (what, doc.key, doc.version)
        if seen not in self._told:
            self._told.add(seen)
            log.error("%s %s skipped: %s", what, doc.key, exc)


async def stop(job: asyncio.Future[None] | None) -> None:
    if job is not None:
        job.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await job
