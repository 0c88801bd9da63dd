"""A message's answer read on the event loop, as its connection's socket gets ready.

The PostgreSQL writer (postgres_writer.py) sends a batch that runs on its
cached rows, `BEGIN` to `COMMIT`, from the loop its commits came from, and
reads the answer there: the same libpq calls its thread makes (psycopg's
`execute` generator), driven by the loop's reader callbacks instead of a
blocking wait. That spares each round two hand-offs between threads, the
thread's wake-up and the loop's, about a tenth of a round on the test machine.

A flight is callbacks, not a coroutine: no task's cancellation can stop it
between sending and reading, so the connection never keeps half an answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.generators import execute
from psycopg.waiting import READY_R, READY_W, WAIT_R, WAIT_W, Ready

Answer = Callable[[list[Any] | None, Exception | None], None]  # (results, or the error)


class Flight:
    """The answer to what was just queued on `pgconn` (`send_query`), read on `loop`."""

    __slots__ = ("_answer", "_fileno", "_gen", "_loop", "_waiting")

    def __init__(self, loop: asyncio.AbstractEventLoop, pgconn: Any, answer: Answer) -> None:
        self._loop = loop
        self._fileno: int = pgconn.socket
        self._gen = execute(pgconn)
        self._answer = answer
        self._waiting = 0

    def start(self) -> None:
        """Write the message out and wait for its answer; `answer` is called with it."""
        self._step(None)

    def _ready(self, ready: Ready) -> None:
        if self._waiting & WAIT_R:
            self._loop.remove_reader(self._fileno)
        if self._waiting & WAIT_W:
            self._loop.remove_writer(self._fileno)
        self._waiting = 0
        self._step(ready)

    def _step(self, ready: Ready | None) -> None:
        try:
            state = next(self._gen) if ready is None else self._gen.send(ready)
        except StopIteration as stop:
            self._answer(stop.value, None)
            return
        except OSError as exc:  # as psycopg's own waits report it
            lost = psycopg.OperationalError("connection socket closed")
            lost.__cause__ = exc
            self._answer(None, lost)
            return
        except Exception as exc:
            self._answer(None, exc)
            return
        if state & WAIT_R:
            self._loop.add_reader(self._fileno, self._ready, READY_R)
        if state & WAIT_W:
            self._loop.add_writer(self._fileno, self._ready, READY_W)
        self._waiting = state
