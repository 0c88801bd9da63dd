"""What tools keep open between their calls (an MCP session), by key: opened on
first use, reused, closed together when their holder (a task's run, a worker) ends."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import Protocol, TypeVar

log = logging.getLogger("duragent.held")


class Closeable(Protocol):
    async def aclose(self) -> None: ...


R = TypeVar("R", bound=Closeable)


class Held:
    """Open things by key. `get` opens one at most once at a time per key (calls
    running together wait for the same opening) and opens it again when the held
    one is no longer `usable`; `aclose` closes them all, and after it nothing is held."""

    def __init__(self) -> None:
        self._items: dict[Hashable, Closeable] = {}
        self._locks: dict[Hashable, asyncio.Lock] = {}
        self.closed = False

    def __len__(self) -> int:
        return len(self._items)

    async def get(
        self,
        key: Hashable,
        open: Callable[[], Awaitable[R]],
        usable: Callable[[R], bool],
    ) -> R:
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            if self.closed:
                raise RuntimeError("nothing is held once its holder has closed")
            item = self._items.get(key)
            if item is not None:
                if usable(item):  # type: ignore[arg-type]
                    return item  # type: ignore[return-value]
                await self.drop(key, item)
            opened = await open()
            if self.closed:  # closed while it opened: not ours to keep
                await opened.aclose()
                raise RuntimeError("nothing is held once its holder has closed")
            self._items[key] = opened
            return opened

    def peek(self, key: Hashable) -> Closeable | None:
        """What is held under `key`, if anything (not opened if not)."""
        return self._items.get(key)

    async def drop(self, key: Hashable, item: Closeable) -> None:
        """Close `item` and forget it, if it is still the one held under `key`."""
        if self._items.get(key) is item:
            del self._items[key]
        await _close(item)

    async def aclose(self) -> None:
        self.closed = True
        items, self._items = list(self._items.values()), {}
        for item in items:
            await _close(item)


async def _close(item: Closeable) -> None:
    try:
        await item.aclose()
    except Exception:  # one that fails to close does not keep the others open
        log.warning("closing %r failed", item, exc_info=True)


__all__ = ["Held"]
