"""Building thousands of objects that are not garbage: a long task's messages.

A resumed history is parsed into thousands of dicts, lists and models at once,
all of them kept for the runner's life. The cyclic collector would run over
them again and again while they are made (up to tens of milliseconds on
resume), so it is held off meanwhile (`collector_paused`).

Once made, they would still be traversed twice more: by the first young
collection after the pause (every one of them is young then; 2.5-4 ms for a
10,000-entry history on a 2-core host) and by the middle generation's. Being
long-lived, they go to the oldest generation at once instead, which only the
rare full collections traverse (`gc.freeze()` then `gc.unfreeze()`: two list
splices, whatever the number of objects). Whatever else was young at that
moment goes along: any garbage among it is freed by the next full collection
instead of a young one. Not done when the process has frozen objects of its
own (`gc.freeze()` before forking workers; unfreezing would undo that) nor on
a free-threaded build, where freezing walks the whole heap.

Only a block that built more objects than the young generations hold between
two collections of the middle one (700 x 10 by default) does this: a model
call builds its round's few messages every time, and sweeping the young
generations that often would leave cyclic garbage to the rare full
collections.
"""

from __future__ import annotations

import gc
import sysconfig
from collections.abc import Iterator
from contextlib import contextmanager

_FREE_THREADED = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic collector held off while the block runs, then as it was; what
    a block that built many objects built, when it ends without an error, in
    the oldest generation."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
        young, middle, _ = gc.get_threshold()
        if enabled and gc.get_count()[0] >= young * middle:
            to_oldest_generation()
    finally:
        if enabled:
            gc.enable()


def to_oldest_generation() -> None:
    """Every object the collector tracks, moved to its oldest generation without
    traversing any (see the module's docstring for when it is not done)."""
    if _FREE_THREADED or gc.get_freeze_count():
        return
    gc.freeze()
    gc.unfreeze()
