"""A tiny local HTTP(S) server for tests of the network tools."""

from __future__ import annotations

import ssl
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Handler = Callable[[BaseHTTPRequestHandler], None]


@contextmanager
def serving(
    handle: Handler,
    host: str = "127.0.0.1",
    port: int = 0,
    tls: ssl.SSLContext | None = None,
    keep_alive: bool = False,
) -> Iterator[str]:
    """An HTTP(S) server on `host` answering every GET with `handle`; yields its base URL."""

    class _Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1" if keep_alive else "HTTP/1.0"

        def do_GET(self) -> None:
            handle(self)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((host, port), _Handler)
    server.daemon_threads = True
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"{'https' if tls else 'http'}://{host}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def answer(text: str, status: int = 200, **headers: str) -> Handler:
    def handle(req: BaseHTTPRequestHandler) -> None:
        body = text.encode()
        req.send_response(status)
        for name, value in {"Content-Type": "text/plain", **headers}.items():
            req.send_header(name, value)
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        req.wfile.write(body)

    return handle
