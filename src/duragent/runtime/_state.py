"""Memory-first task state with debounced persistence (`ctx.state`; docs/architecture.md §3).

`update` changes memory at once; a save follows after `debounce` seconds of
quiet, or at the latest `max_wait` seconds after the first unsaved change.
Saves never overlap, a failed save is retried, and `flush` saves right away
(the engine flushes at every round commit and at pause/complete/fail/abort).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

log = logging.getLogger("duragent.state")


class Clock(Protocol):
    def now(self) -> float: ...
    async def sleep(self, seconds: float) -> None: ...


class MonotonicClock:
    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


SaveFn = Callable[[dict[str, Any]], Awaitable[None]]


class DebouncedState:
    def __init__(
        self,
        initial: dict[str, Any],
        save: SaveFn,
        *,
        debounce: float = 1.0,
        max_wait: float = 5.0,
        retry_delay: float = 0.5,
        clock: Clock | None = None,
    ) -> None:
        self.state = dict(initial)
        self._save_fn = save
        self.debounce = debounce
        self.max_wait = max_wait
        self.retry_delay = retry_delay
        self.clock = clock or MonotonicClock()
        self.dirty = False
        self._first_pending: float | None = None
        self._timer: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        # The loop that owns the timers. A sync tool runs in a thread and may
        # call update() from there: its timer is scheduled on this loop.
        self._loop: asyncio.AbstractEventLoop | None = None
        with contextlib.suppress(RuntimeError):
            self._loop = asyncio.get_running_loop()

    def update(self, **changes: Any) -> None:
        self.state.update(changes)
        self._schedule()

    def _schedule(self) -> None:
        self.dirty = True
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # a thread (a sync tool): schedule on the owning loop
            if self._loop is None:
                raise RuntimeError(
                    "task state was updated from a thread before its event loop ran"
                ) from None
            self._loop.call_soon_threadsafe(self._schedule)
            return
        self._loop = loop
        now = self.clock.now()
        if self._first_pending is None:
            self._first_pending = now
        waited = now - self._first_pending
        self._cancel_timer()
        delay = 0.0 if waited >= self.max_wait else min(self.debounce, self.max_wait - waited)
        self._timer = asyncio.ensure_future(self._save_after(delay))

    def _cancel_timer(self) -> None:
        if self._timer is not None and not self._timer.done():
            self._timer.cancel()
        self._timer = None

    async def _save_after(self, delay: float) -> None:
        if delay > 0:
            await self.clock.sleep(delay)
        await self._save()

    async def _save(self) -> None:
        async with self._lock:  # saves never overlap
            if not self.dirty:
                return
            snapshot = dict(self.state)
            self.dirty = False
            self._first_pending = None
            try:
                await self._save_fn(snapshot)
            except asyncio.CancelledError:
                self.dirty = True
                raise
            except Exception:
                log.warning("saving task state failed; retrying", exc_info=True)
                self.dirty = True
                if self._first_pending is None:
                    self._first_pending = self.clock.now()
                self._timer = asyncio.ensure_future(self._save_after(self.retry_delay))

    async def flush(self) -> None:
        """Save now if anything is unsaved (waits for a save in progress)."""
        self._cancel_timer()
        await self._save()
        if self.dirty:  # the save failed: surface it to the caller this time
            snapshot = dict(self.state)
            await self._save_fn(snapshot)
            self.dirty = False
            self._first_pending = None

    def mark_dirty(self) -> None:
        """A commit that carried the state failed: save it again later."""
        self._schedule()

    def take(self) -> dict[str, Any] | None:
        """Hand the unsaved state to a commit the caller is making anyway."""
        if not self.dirty:
            return None
        self._cancel_timer()
        self.dirty = False
        self._first_pending = None
        return dict(self.state)

    async def close(self) -> None:
        timer = self._timer
        self._cancel_timer()
        if timer is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await timer
