"""A TCP proxy in front of PostgreSQL that counts round trips.

A round trip is a turn of the conversation: a client sends after the server
last answered it (or first) and then waits for the answer. Pipelined messages
sent before any answer came back are one turn; a transaction of three
statements sent one at a time is three. Real sockets, a real server: what a
slow link would charge for, counted without the link.

`hold()` keeps the server's answers at the proxy until `release()`, so what
a client sends meanwhile is in flight for as long as a test needs; `waiting`
is how many connections have a turn sent and not answered.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit


class TurnCounter:
    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.turns = 0
        self.waiting = 0  # connections whose turn is sent and not answered yet
        self._open = threading.Event()  # answers pass (see `hold`)
        self._open.set()
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, database_url: str) -> str:
        parts = urlsplit(database_url)
        user = f"{parts.username}@" if parts.username else ""
        return urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{self.port}"))

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            answered = [True]  # the server spoke since the client last did
            for pump, ends in ((self._up, (client, server)), (self._down, (server, client))):
                threading.Thread(target=pump, args=(*ends, answered), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket, answered: list[bool]) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                with self._lock:
                    if answered[0]:
                        answered[0] = False
                        self.turns += 1
                        self.waiting += 1
                server.sendall(data)
        server.close()

    def _down(self, server: socket.socket, client: socket.socket, answered: list[bool]) -> None:
        with contextlib.suppress(OSError):
            while data := server.recv(65536):
                self._open.wait()
                with self._lock:  # before the client can read it and answer
                    if not answered[0]:
                        self.waiting -= 1
                    answered[0] = True
                client.sendall(data)
        client.close()

    def hold(self) -> None:
        """Keep every answer from the server at the proxy from now on."""
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    def close(self) -> None:
        self._open.set()
        self._listener.close()


@contextlib.contextmanager
def turn_counter(host: str, port: int) -> Iterator[TurnCounter]:
    counter = TurnCounter(host, port)
    try:
        yield counter
    finally:
        counter.close()
