"""Round trips to PostgreSQL per round and per claim, counted at a proxy.

    python -m bench.pg_roundtrips                   # 1 worker, 64 tasks x 5 rounds
    python -m bench.pg_roundtrips --workers 2 --tasks 200

A proxy in this process passes the workers' connections through unchanged and
reads the client side's messages. A round trip is a turn of the conversation:
the client sends after the server last answered (or first), and waits. Each
turn is named by the statements it carries (a simple query's text, or the
text a `Bind` refers to through its `Parse`): what kind of call made it.

The workload is bench/pg_workers.py's, with no delay; the figures are turns
per round (the task's `iterations`), over the whole run and by kind, and turns
per claim call (turns that carry the claim query, and those of the same
transaction, counted from the claim's BEGIN to its COMMIT on that connection).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

_SPECIAL = (80877103, 80877104)  # SSLRequest, GSSENCRequest: a startup packet follows


def kind_of(sql: str) -> str:
    """What a statement belongs to, by its text."""
    s = sql.lower()
    for needle, name in (
        ("listen ", "listen"),
        ("skip locked", "claim: candidates"),
        ("server_now, q.*", "claim: queues + now()"),
        ("lease_expires = now()", "renewal"),
        ("renew", "renewal"),
        ("min(wake_at)", "next_wake_at"),
        ("presence", "presence"),
        ("webhook", "webhooks"),
        ("schedules", "housekeeping"),
        ("insert into entries", "commit"),
        ("update tasks", "commit"),
        ("commit", "commit"),
        ("set ", "session setup"),
    ):
        if needle in s:
            return name
    return s[:40]


@dataclass
class Conn:
    """One client connection's messages, as read so far."""

    started: bool = False
    buf: bytes = b""
    names: dict[bytes, str] = field(default_factory=dict)  # statement name -> text
    turn: list[str] = field(default_factory=list)  # the current turn's statements
    answered: bool = True  # the server spoke since the client last did


class Counter:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.turns: collections.Counter[str] = collections.Counter()
        self.total = 0

    def feed(self, conn: Conn, data: bytes) -> None:
        """Client bytes: a new turn if the server answered since the last ones."""
        if conn.answered:
            self._close_turn(conn)
            conn.answered = False
            with self.lock:
                self.total += 1
        conn.buf += data
        while True:
            if not conn.started:
                if len(conn.buf) < 8:
                    return
                n, code = struct.unpack("!ii", conn.buf[:8])
                if len(conn.buf) < n:
                    return
                conn.buf = conn.buf[n:]
                conn.started = code not in _SPECIAL
                conn.turn.append("startup")
                continue
            if len(conn.buf) < 5:
                return
            typ = conn.buf[:1]
            (n,) = struct.unpack("!i", conn.buf[1:5])
            if len(conn.buf) < 1 + n:
                return
            body, conn.buf = conn.buf[5 : 1 + n], conn.buf[1 + n :]
            if typ == b"Q":
                conn.turn.append(body.split(b"\0", 1)[0].decode(errors="replace"))
            elif typ == b"P":
                name, rest = body.split(b"\0", 1)
                text = rest.split(b"\0", 1)[0].decode(errors="replace")
                conn.names[name] = text
                conn.turn.append(text)
            elif typ == b"B":
                _portal, rest = body.split(b"\0", 1)
                name = rest.split(b"\0", 1)[0]
                if name:  # an unnamed statement's Parse is in this turn already
                    conn.turn.append(conn.names.get(name, "?"))
            elif typ == b"p":
                conn.turn.append("auth")

    def answer(self, conn: Conn) -> None:
        conn.answered = True

    def _close_turn(self, conn: Conn) -> None:
        if not conn.turn:
            return
        kinds = [kind_of(s) for s in conn.turn]
        # A turn is named by its most telling statement.
        order = [
            "claim: candidates",
            "claim: queues + now()",
            "renewal",
            "listen",
            "next_wake_at",
            "presence",
            "webhooks",
            "housekeeping",
            "commit",
            "session setup",
        ]
        name = next((k for k in order if k in kinds), kinds[0])
        with self.lock:
            self.turns[name] += 1
        conn.turn = []

    def flush(self, conns: list[Conn]) -> None:
        for c in conns:
            self._close_turn(c)


async def _pump(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    on_data: Callable[[bytes], None],
) -> None:
    try:
        while data := await reader.read(1 << 16):
            on_data(data)
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


class CountingProxy:
    """A proxy on 127.0.0.1 in a thread of this process, counting turns."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.counter = Counter()
        self.conns: list[Conn] = []
        self.port = 0
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        threading.Thread(target=self._run, daemon=True).start()
        self._ready.wait()

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()

        async def handle(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
            sr, sw = await asyncio.open_connection(*self.target)
            conn = Conn()
            self.conns.append(conn)
            await asyncio.gather(
                _pump(cr, sw, lambda d: self.counter.feed(conn, d)),
                _pump(sr, cw, lambda d: self.counter.answer(conn)),
            )

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        await server.serve_forever()

    def snapshot(self) -> tuple[int, dict[str, int]]:
        self.counter.flush(self.conns)
        with self.counter.lock:
            return self.counter.total, dict(self.counter.turns)


def main(argv: list[str] | None = None) -> None:
    from bench import latency_net
    from bench.pg_workers import PG_URL

    parser = argparse.ArgumentParser(prog="python -m bench.pg_roundtrips", description=__doc__)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=None)
    parser.add_argument(
        "--rtt", type=float, default=0.0, help="ms, through bench.latency_net's delay"
    )
    parser.add_argument("--timeout", type=float, default=120)
    args = parser.parse_args(argv)
    args.lease_ttl = None
    target = urlsplit(PG_URL)
    where = (target.hostname or "127.0.0.1", target.port or 5432)
    delay = latency_net.Link(where, args.rtt) if args.rtt else None
    if delay is not None:
        where = ("127.0.0.1", delay.port)
    proxy = CountingProxy(where)
    before: list[Any] = []

    def started() -> None:  # the workers listen: what they do from here is counted
        before.append(proxy.snapshot())

    try:
        run = latency_net.run_once(f"{args.rtt:g}", args, proxy.port, on_started=started)
    finally:
        if delay is not None:
            delay.close()
    total, kinds = proxy.snapshot()
    total0, kinds0 = before[0]
    rounds = run.rounds
    print(
        f"# {args.workers} worker(s), {run.tasks} tasks x {args.rounds} rounds "
        f"({rounds} rounds counted, {run.done} tasks done in {run.seconds:.1f}s), "
        f"round trip {args.rtt:g} ms"
    )
    print(f"round trips per round, all kinds: {(total - total0) / rounds:.2f}")
    print("| kind | round trips | per round |")
    print("| --- | ---: | ---: |")
    for name, n in sorted(kinds.items(), key=lambda kv: -kv[1]):
        n -= kinds0.get(name, 0)
        if n:
            print(f"| {name} | {n} | {n / rounds:.3f} |")


if __name__ == "__main__":
    main()
