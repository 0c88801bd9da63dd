"""A message's answer read on the event loop, as its connection's socket gets ready.

The PostgreSQL writer (_postgres_writer.py) sends a batch that runs on its
cached rows, `BEGIN` to `COMMIT`, from the loop its commits came from, and
reads the answer there: the same libpq calls its thread makes (psycopg's
`execute` generator), driven by the loop's reader callbacks instead of a
blocking wait. That spares each round two hand-offs between threads, the
thread's wake-up and the loop's, about a tenth of a round on the test machine.

A flight is callbacks, not a coroutine: no task's cancellation can stop it
between sending and reading, so the connection never keeps half an answer.
Should its loop close with the answer unread (its callbacks will never run),
`finish` reads the rest on the calling thread instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator
from typing import Any

import psycopg
from psycopg.abc import PQGen
from psycopg.generators import execute
from psycopg.waiting import READY_R, READY_W, WAIT_R, WAIT_W, Ready, Wait, wait

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

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def start(self) -> None:
        """Write the message out and wait for its answer; `answer` is called with it."""
        self._step(None)

    def finish(self) -> None:
        """Read the rest of the answer on this thread, blocking, then call `answer`:
        for a flight whose loop closed before reading it (the loop, closed, runs
        none of its callbacks again, and none is running)."""
        state, self._waiting = self._waiting, 0

        def rest() -> int:
            raise StopIteration(wait(_resumed(self._gen, Wait(state)), self._fileno))

        self._run(rest)

    def _ready(self, ready: Ready) -> None:
        if self._waiting & WAIT_R:
            self._loop.remove_reader(self._fileno)
        if self._waiting & WAIT_W:
            self._loop.remove_writer(self._fileno)
        self._waiting = 0
        self._step(ready)

    def _step(self, ready: Ready | None) -> None:
        state = self._run(lambda: next(self._gen) if ready is None else self._gen.send(ready))
        if state is None:
            return
        if state & WAIT_R:
            self._loop.add_reader(self._fileno, self._ready, READY_R)
        if state & WAIT_W:
            self._loop.add_writer(self._fileno, self._ready, READY_W)
        self._waiting = state

    def _run(self, advance: Callable[[], Any]) -> int | None:
        """The generator advanced: the state it waits for, or None once `answer`
        was called (with the results, or the error)."""
        try:
            state: int = advance()
        except StopIteration as stop:
            self._answer(stop.value, None)
            return None
        except OSError as exc:  # as psycopg's own waits report it
            lost = psycopg.OperationalError("connection socket closed")
            lost.__cause__ = exc
            self._answer(None, lost)
            return None
        except Exception as exc:
            self._answer(None, exc)
            return None
        return state


def _resumed(gen: Generator[Any, Any, Any], state: Wait) -> PQGen[Any]:
    """`gen`, which last asked to wait for `state`, as a generator psycopg's `wait`
    can drive from the start."""
    while True:
        ready = yield state
        try:
            state = gen.send(ready)
        except StopIteration as stop:
            return stop.value
