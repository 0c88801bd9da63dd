"""A TCP proxy in front of PostgreSQL that can lose a transaction's answer.

Bytes pass both ways unchanged until a client message ending a transaction
(`COMMIT`: at the end of the raw wire's simple query, or a statement of its
own on psycopg's) goes through while `cut` is set: the proxy forwards it, reads the
server's answer up to its ReadyForQuery (the server has committed by then),
and closes the client's side without passing the answer on. The client sees
its connection lost with the COMMIT in flight, although the commit landed.
Real sockets and a real server: a fault as a network failure makes it.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from conftest import drop_schema, require_postgres

READY_FOR_QUERY = b"Z\x00\x00\x00\x05"


class CommitAnswerLoser:
    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.cut = threading.Event()
        self.answers_lost = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._closing = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            threading.Thread(target=self._up, args=(client, server), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket) -> None:
        """Client to server; starts the server-to-client pump."""
        lose = threading.Event()
        threading.Thread(target=self._down, args=(client, server, lose), daemon=True).start()
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                if self.cut.is_set() and b"COMMIT\x00" in data:
                    self.cut.clear()
                    lose.set()
                server.sendall(data)

    def _down(self, client: socket.socket, server: socket.socket, lose: threading.Event) -> None:
        answer = b""
        with contextlib.suppress(OSError):
            while data := server.recv(65536):
                if not lose.is_set():
                    client.sendall(data)
                    continue
                answer += data
                if answer.endswith(READY_FOR_QUERY + b"I") or READY_FOR_QUERY in answer:
                    self.answers_lost += 1
                    break  # committed; the answer goes nowhere
        for s in (client, server):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        self._closing = True
        self._listener.close()


@contextlib.contextmanager
def commit_answer_loser(host: str, port: int) -> Iterator[CommitAnswerLoser]:
    proxy = CommitAnswerLoser(host, port)
    try:
        yield proxy
    finally:
        proxy.close()


class Forwarder:
    """A TCP forwarder to PostgreSQL that can be cut and restored.

    While cut, every connection through it is closed and each new one is
    accepted and closed at once (counted in `refused`): to its clients the
    server is gone, as after a restart or a dropped network. While stalled,
    nothing passes either way but nothing is closed: every peer waits, as on a
    link that went silent (a partition); new connections are accepted and hang.
    `restore` lets connections through again (what a stall held back, too).
    """

    def __init__(self, host: str, port: int, *, cut: bool = False) -> None:
        self.target = (host, port)
        self.refused = 0
        self.accepted = 0  # connections passed through
        self._cut = cut
        self._flowing = threading.Event()
        self._flowing.set()
        self._lock = threading.Lock()
        self._live: set[socket.socket] = set()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._closing = False
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, database_url: str) -> str:
        """`database_url` (the server's) with this forwarder's host and port."""
        from urllib.parse import urlsplit, urlunsplit

        parts = urlsplit(database_url)
        user = f"{parts.username}@" if parts.username else ""
        return urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{self.port}"))

    def cut(self) -> None:
        with self._lock:
            self._cut = True
            live, self._live = self._live, set()
        for s in live:
            _close(s)

    def stall(self) -> None:
        self._flowing.clear()

    def restore(self) -> None:
        with self._lock:
            self._cut = False
        self._flowing.set()

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                if self._cut:
                    self.refused += 1
                    _close(client)
                    continue
            try:
                server = socket.create_connection(self.target)
            except OSError:
                _close(client)
                continue
            with self._lock:
                self.accepted += 1
                self._live |= {client, server}
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                self._flowing.wait()
                if self._closing:
                    break
                sink.sendall(data)
        for s in (source, sink):
            _close(s)

    def close(self) -> None:
        self._closing = True
        self._flowing.set()
        self._listener.close()
        self.cut()


def _close(s: socket.socket) -> None:
    with contextlib.suppress(OSError):
        s.shutdown(socket.SHUT_RDWR)
    s.close()


@contextlib.contextmanager
def forwarder(host: str, port: int, *, cut: bool = False) -> Iterator[Forwarder]:
    proxy = Forwarder(host, port, cut=cut)
    try:
        yield proxy
    finally:
        proxy.close()


# Fixtures for the tests that put a proxy between a store and PostgreSQL (a test
# module imports them and names them in its __all__).
@pytest.fixture
def schema() -> Iterator[str]:
    """A schema of its own, dropped afterwards."""
    require_postgres()
    name = f"test_{uuid.uuid4().hex[:12]}"
    yield name
    drop_schema(name)


@pytest.fixture
def proxy() -> Iterator[Forwarder]:
    """A proxy on loopback to the test PostgreSQL server."""
    server = urlsplit(require_postgres())
    with forwarder(server.hostname or "127.0.0.1", server.port or 5432) as fwd:
        yield fwd
