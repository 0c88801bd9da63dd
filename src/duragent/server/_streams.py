"""How many event streams each user holds open; one past the limit is answered 429.

A stream holds a connection (a file descriptor) for as long as the task runs,
so without a limit one user's open streams could use up the server's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.types import Receive, Scope, Send

from duragent.server._problems import problem

RETRY_AFTER = 5  # seconds a client is asked to wait before opening another stream


class TooManyStreams(Exception):
    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(
            f"you have {limit} event streams open, the most one user may hold "
            "(serve --streams-per-user); close one and try again"
        )


class StreamSlots:
    def __init__(self, per_user: int) -> None:
        self.per_user = per_user
        self._open: dict[str, int] = {}

    def acquire(self, user: str) -> Callable[[], None]:
        """Take a slot, or raise TooManyStreams; returns the function that gives it back."""
        held = self._open.get(user, 0)
        if held >= self.per_user:
            raise TooManyStreams(self.per_user)
        self._open[user] = held + 1
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            left = self._open.get(user, 1) - 1
            if left > 0:
                self._open[user] = left
            else:
                self._open.pop(user, None)

        return release

    def held(self, user: str) -> int:
        return self._open.get(user, 0)


class SlotStreamingResponse(StreamingResponse):
    """A streaming response that gives its slot back when the stream ends or the
    client goes away."""

    def __init__(self, content: Any, release: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


def too_many_streams(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, TooManyStreams)
    return problem(429, "Too many requests", str(exc), headers={"Retry-After": str(RETRY_AFTER)})
