"""A real HTTP receiver on 127.0.0.1 for webhook tests: records every request,
can fail the first attempts or hold the first one unanswered."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    answered: int  # the status sent back (0: never answered)

    @property
    def event(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.body)
        return data


@dataclass
class Receiver:
    fail_first: int = 0  # answer 500 to this many requests first
    hold_first: bool = False  # keep the first request unanswered until release()
    requests: list[Received] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._cond = threading.Condition()
        self._release = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver._cond:
                    n = len(receiver.requests)
                    record = Received(dict(self.headers.items()), body, 0)
                    receiver.requests.append(record)
                    receiver._cond.notify_all()
                if n == 0 and receiver.hold_first:
                    receiver._release.wait(60)
                    return  # the sender died meanwhile: never answered
                status = 500 if n < receiver.fail_first else 200
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                except OSError:
                    return
                with receiver._cond:
                    record.answered = status
                    receiver._cond.notify_all()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hooks?x=1"

    def wait_for(self, pred: Callable[[list[Received]], bool], timeout: float = 30.0) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: pred(self.requests), timeout):
                got = [(r.event.get("type"), r.answered) for r in self.requests]
                raise AssertionError(f"receiver condition not met within {timeout}s; got {got}")

    def accepted(self) -> list[Received]:
        return [r for r in self.requests if r.answered == 200]

    def close(self) -> None:
        self._release.set()
        self.server.shutdown()
        self.server.server_close()
