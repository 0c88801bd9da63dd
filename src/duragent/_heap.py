"""Building thousands of objects that are not garbage: a long task's messages.

A resumed history is parsed into thousands of dicts, lists and models at once,
all of them kept for the runner's life. The cyclic collector would run over
them again and again while they are made (up to tens of milliseconds on
resume), so it is held off meanwhile (`collector_paused`), and only then.

The collector is the process's, so holding it off is too: the pause is as
short as the parse, and is counted, so that a parse in another thread (or one
inside another) never turns the collector back on while a parse still runs,
nor on at all if the process had turned it off. (Moving the parsed objects to
the oldest generation instead, `gc.freeze`, was tried: it reset the
collector's counts, full collections stopped and finished runners' views
piled up; tests/test_heap.py.)
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class _Pauses:
    """The parses holding the collector off now, and whether it was on before the first."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.depth = 0
        self.was_enabled = False


# One per process, like the collector it guards.
_PAUSES = _Pauses()


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic collector held off while the block runs, then as it was."""
    pauses = _PAUSES
    with pauses.lock:
        if pauses.depth == 0:
            pauses.was_enabled = gc.isenabled()
            gc.disable()
        pauses.depth += 1
    try:
        yield
    finally:
        with pauses.lock:
            pauses.depth -= 1
            if pauses.depth == 0 and pauses.was_enabled:
                gc.enable()
