"""Connections of `duragent serve`: how many, how slow, and what a flood leaves in the log.

- `HeaderTimeoutProtocol`: uvicorn's h11 protocol, but a connection that has not
  sent a whole request head within `header_timeout` seconds is closed (a
  slowloris client sending a byte of headers at a time holds nothing for long).
  uvicorn's own `timeout_keep_alive` only covers the idle time between requests.
- `raise_fd_limit`: the soft limit of open files up to the hard one, so the
  connection limit, not the default 1024 descriptors, decides when to refuse.
- `quiet_accept_errors`: asyncio logs a traceback for every failed `accept()`
  once descriptors run out; this logs one line per interval, with a count.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections.abc import Callable
from typing import Any

import h11
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

log = logging.getLogger("duragent.server")

RESERVED_FDS = 64  # kept for the store, log files and the listening socket


def protocol_with_header_timeout(header_timeout: float) -> type[H11Protocol]:
    """uvicorn takes a protocol class (`Config(http=...)`); this one carries the timeout."""

    class HeaderTimeoutProtocol(H11Protocol):
        def __init__(
            self,
            config: Config,
            server_state: ServerState,
            app_state: dict[str, Any],
            _loop: asyncio.AbstractEventLoop | None = None,
        ) -> None:
            super().__init__(config, server_state, app_state, _loop)
            self._head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm_head_timer()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            # IDLE: the request head is not complete yet (the first one, or the next
            # one on a kept-alive connection).
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self._arm_head_timer()
            else:
                self._disarm_head_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_head_timer()
            super().connection_lost(exc)

        def _arm_head_timer(self) -> None:
            if self._head_timer is None:
                self._head_timer = self.loop.call_later(header_timeout, self._head_timed_out)

        def _disarm_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timed_out(self) -> None:
            self._head_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

    return HeaderTimeoutProtocol


def raise_fd_limit() -> int:
    """Raise the soft limit of open files to the hard limit; returns the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-files limit from %d to %d: %s", soft, hard, exc)
    return int(soft) if soft != resource.RLIM_INFINITY else 1 << 20


def connection_limit(wanted: int, fd_limit: int) -> int:
    """At most `wanted` connections, leaving descriptors for everything else."""
    room = max(fd_limit - RESERVED_FDS, 1)
    if wanted > room:
        log.warning(
            "--max-connections %d lowered to %d: the open-files limit is %d", wanted, room, fd_limit
        )
        return room
    return wanted


ACCEPT_FAILURE = "socket.accept() out of system resource"


def quiet_accept_errors(
    loop: asyncio.AbstractEventLoop, interval: float = 10.0
) -> Callable[[asyncio.AbstractEventLoop, dict[str, Any]], None]:
    """Install (and return) a loop exception handler that reports failed accepts at most
    once per `interval` seconds, without a traceback; anything else goes to the default."""
    last = -interval
    suppressed = 0

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        nonlocal last, suppressed
        if context.get("message") != ACCEPT_FAILURE:
            loop.default_exception_handler(context)
            return
        now = time.monotonic()
        if now - last < interval:
            suppressed += 1
            return
        exc = context.get("exception")
        log.error(
            "cannot accept connections: %s (%d more failed accepts since the last report; "
            "raise the open-files limit or lower --max-connections)",
            getattr(exc, "strerror", None) or exc,
            suppressed,
        )
        last, suppressed = now, 0

    loop.set_exception_handler(handler)
    return handler
