"""Building thousands of objects that are not garbage: a long task's messages.

A resumed history is parsed into thousands of dicts, lists and models at once,
all of them kept for the runner's life. The cyclic collector would run over
them again and again while they are made (up to tens of milliseconds on
resume), so it is held off meanwhile (`collector_paused`).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic collector held off while the block runs, then as it was."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
