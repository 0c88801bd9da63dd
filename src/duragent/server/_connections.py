"""Connections of `duragent serve`: how many, how slow, and what a flood leaves in the log.

- `HeaderTimeoutProtocol`: uvicorn's h11 protocol, but a connection that has not
  sent a whole request head within `header_timeout` seconds is closed (a
  slowloris client sending a byte of headers at a time holds nothing for long).
  uvicorn's own `timeout_keep_alive` only covers the idle time between requests.
- `AddressCounts`: open connections per client address; past
  `--max-connections-per-address` a new one is answered 429 and closed at once,
  so one address cannot hold every slot (addresses of trusted proxies,
  `--forwarded-allow-ips`, are exempt: the proxy must limit per client).
- `raise_fd_limit`: the soft limit of open files up to the hard one, so the
  connection limit, not the default 1024 descriptors, decides when to refuse.
- `quiet_accept_errors`: asyncio logs a traceback for every failed `accept()`
  once descriptors run out; this logs one line per interval, with a count.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import resource
import time
from collections.abc import Callable
from typing import Any

import h11
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from duragent.errors import InvalidOption
from duragent.server._problem_types import type_uri

log = logging.getLogger("duragent.server")

RESERVED_FDS = 64  # kept for the store, log files and the listening socket


TOO_MANY_FROM_HERE = (
    b"HTTP/1.1 429 Too Many Requests\r\n"
    b"content-type: application/problem+json\r\n"
    b"retry-after: 1\r\n"
    b"connection: close\r\n"
    b"content-length: %d\r\n\r\n%s"
)


def _too_many_body(limit: int) -> bytes:
    detail = (
        f"more than {limit} open connections from this address "
        "(serve --max-connections-per-address)"
    )
    body = json.dumps(
        {
            "type": type_uri("too-many-requests"),
            "title": "Too many requests",
            "status": 429,
            "detail": detail,
        }
    ).encode()
    return TOO_MANY_FROM_HERE % (len(body), body)


class Proxies:
    """The addresses `--forwarded-allow-ips` trusts (IPs or networks, `*` for all):
    their X-Forwarded-For is read, and their connections are not held to the
    per-address limit (behind a proxy every client shares its address, so the
    proxy limits connections per client)."""

    def __init__(self, spec: str | None) -> None:
        items = [i.strip() for i in (spec or "").split(",") if i.strip()]
        self.spec = ",".join(items)
        self.everyone = "*" in items
        self.networks = []
        for item in items:
            if item == "*":
                continue
            try:
                self.networks.append(ipaddress.ip_network(item, strict=False))
            except ValueError as exc:
                raise InvalidOption(
                    f"--forwarded-allow-ips: {item!r} is not an IP address or network"
                ) from exc

    def __bool__(self) -> bool:
        return self.everyone or bool(self.networks)

    def trusts(self, host: str) -> bool:
        if self.everyone:
            return True
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(address in net for net in self.networks)


class AddressCounts:
    """Open connections per peer address, shared by every connection of one server."""

    def __init__(self, per_address: int, proxies: Proxies | None = None) -> None:
        self.per_address = per_address
        self.proxies = proxies or Proxies(None)
        self.open: dict[str, int] = {}

    def admit(self, host: str) -> bool:
        """Count one more connection from `host`, or False (not counted) past the limit."""
        n = self.open.get(host, 0)
        if n >= self.per_address and not self.proxies.trusts(host):
            return False
        self.open[host] = n + 1
        return True

    def closed(self, host: str) -> None:
        n = self.open.get(host, 0) - 1
        if n > 0:
            self.open[host] = n
        else:
            self.open.pop(host, None)


def protocol_with_header_timeout(
    header_timeout: float, counts: AddressCounts | None = None
) -> type[H11Protocol]:
    """uvicorn takes a protocol class (`Config(http=...)`); this one carries the timeout
    and, with `counts`, the per-address connection limit: one address (one client
    opening a thousand half-sent connections) cannot take every slot of
    `--max-connections` and leave everyone else with 503."""

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
            self._counted: str | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if counts is not None:
                peer = transport.get_extra_info("peername")
                host = str(peer[0]) if isinstance(peer, tuple) and peer else "unknown"
                if not counts.admit(host):
                    # Answered and closed before it is read: it holds no slot.
                    transport.write(_too_many_body(counts.per_address))
                    transport.close()
                    return
                self._counted = host
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
            if counts is not None and self._counted is not None:
                counts.closed(self._counted)
                self._counted = None
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
