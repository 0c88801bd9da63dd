"""Waiting out a store that cannot be reached, instead of dying of it.

A caller waiting for a task, or a worker starting, outlives a database that
restarts or a network that drops: it tries again after a capped exponential
back-off with jitter (many clients that lost the same server do not come back
in step), and says once that it waits, not once per attempt.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from duragent.errors import StoreUnavailable

T = TypeVar("T")


class StoreOutage:
    """One stretch of a store not answering, as seen by one caller doing `what`."""

    first = 0.1  # seconds before the second attempt
    cap = 5.0  # the longest wait between attempts

    def __init__(self, what: str, log: logging.Logger) -> None:
        self.what = what
        self.log = log
        self.failures = 0  # attempts in a row that could not reach the store

    def delay(self) -> float:
        """The wait before the next attempt: doubling up to `cap`, drawn from its upper half."""
        top: float = min(self.cap, self.first * 2.0 ** min(self.failures - 1, 30))
        return top / 2 + random.uniform(0, top / 2)

    async def wait_out(self, exc: StoreUnavailable) -> None:
        """After a failed attempt: say so if it is the first, then back off."""
        self.failures += 1
        if self.failures == 1:
            self.log.warning(
                "%s: the store cannot be reached (%s); waiting for it, retrying with back-off",
                self.what,
                " ".join(str(exc).split()),  # one line: libpq's messages run over several
            )
        await asyncio.sleep(self.delay())

    def over(self) -> None:
        """After an attempt that reached the store."""
        if self.failures:
            self.log.warning(
                "%s: the store answers again (after %d failed attempts)", self.what, self.failures
            )
            self.failures = 0


async def when_reachable(call: Callable[[], Awaitable[T]], what: str, log: logging.Logger) -> T:
    """`await call()`, again after each StoreUnavailable until it gets through."""
    outage = StoreOutage(what, log)
    while True:
        try:
            result = await call()
        except StoreUnavailable as exc:
            await outage.wait_out(exc)
            continue
        outage.over()
        return result
