"""Whose turn it is to run a group-commit writer's next batch.

The SQLite and PostgreSQL writers run a batch on the event loop its commits
came from when they can (inline on SQLite, a flight on PostgreSQL), and on
their writer thread otherwise; one batch at a time. Between two batches the
turn may wait in a loop's ready queue (a `call_soon` of the writer's next
step). A loop that stops before running it, and is closed or simply never run
again, would hold every later commit of every loop, and the store's `close()`,
for ever. So the writer notes which loop holds the turn (`Turn`), its next
step runs only while that loop still holds it, and anyone may hand a turn
held by a loop that is not running over to the writer thread (`rescue` in
each writer): a commit, `close()`, and a commit's watch (`watch`) while
another loop holds the turn, as that loop may stop only later.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

# How often a commit queued behind another loop's turn looks whether that loop
# stopped with it: only then is anything armed, so it costs nothing otherwise.
WATCH_SECONDS = 0.1


class Turn:
    """The event loop that has the writer's next step scheduled, or None while
    the writer thread has it or nothing waits; used under the writer's lock.
    Each hand-out is numbered and a step runs only with the latest number, so
    a step left behind in a loop whose turn was taken never runs a batch."""

    __slots__ = ("_number", "loop")

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self._number = 0

    def give(self, loop: asyncio.AbstractEventLoop) -> int:
        """Hand the turn to `loop`: the number its scheduled step must show."""
        self.loop = loop
        self._number += 1
        return self._number

    def take(self) -> None:
        """The writer thread takes the turn (or nobody needs it)."""
        self.loop = None
        self._number += 1

    def holds(self, number: int) -> bool:
        """The step given `number` still has the turn."""
        return self.loop is not None and number == self._number

    def stranded(self) -> bool:
        """The loop holding the turn runs none of its callbacks now: stopped (it
        may run again; its step then finds the turn gone) or closed."""
        loop = self.loop
        return loop is not None and not loop.is_running()


def watch(
    loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], rescue: Callable[[], None]
) -> None:
    """Call `rescue` now, then from `loop` every WATCH_SECONDS until `future` is
    done: for a commit queued while another loop holds the turn. (A turn held
    by the committing loop, running, or by the writer thread needs none.)"""

    def check() -> None:
        if not future.done():
            rescue()
            loop.call_later(WATCH_SECONDS, check)

    check()
