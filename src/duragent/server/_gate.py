"""The ASGI gate in front of the app: what is decided from the request head alone.

Before the app reads a byte of the body, the gate
- answers a request on a protected path without a valid bearer token with 401
  (so a wrong token costs the server nothing, however large the body);
- answers a wrong token from a client address that sent too many wrong tokens
  in the last minute with 429 and `Retry-After` (a valid token is still admitted);
- answers a body larger than the limit with 413: at once when `Content-Length`
  says so, or as soon as a chunked body passes the limit while it streams;
- refuses a URL holding a NUL character (no store can look it up);
and it adds the security headers to every response. Early answers close the
connection, so the unread rest of the body is never received.
"""

from __future__ import annotations

import math
import re
import time
from collections import OrderedDict, deque
from http import HTTPStatus
from typing import Protocol
from urllib.parse import parse_qs, unquote_to_bytes

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from duragent.errors import TaskNotFound
from duragent.server._limits import ServerLimits, human_bytes
from duragent.server._problems import problem
from duragent.server._stream_tokens import InvalidStreamToken, StreamTokens

# Paths served without a token; everything else needs one. A token sent to
# /openapi.json is checked (and counted when wrong): with it, the schema names the agents.
PUBLIC_PATHS = frozenset({"/", "/v1/health", "/favicon.ico", "/favicon.svg"})
PUBLIC_PREFIXES = ("/static/",)
TOKEN_OPTIONAL = frozenset({"/openapi.json"})
# The one route a stream token opens (server/_stream_tokens.py): a task's events.
EVENTS_PATH = re.compile(r"/v1/tasks/([^/]+)/events")

# The page loads only its own files: no inline script, no other origin, no framing.
SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        b"connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'self'; "
        b"frame-ancestors 'none'",
    ),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
]

TOO_LARGE = HTTPStatus(413).phrase
CLOSE = {"Connection": "close"}  # an early answer leaves the body unread
UNAUTHORIZED = {**CLOSE, "WWW-Authenticate": 'Bearer realm="duragent"'}
FAILURE_WINDOW = 60.0  # seconds over which wrong tokens are counted
MAX_TRACKED_CLIENTS = 10_000  # addresses remembered; the oldest are forgotten first


class TokenLookup(Protocol):
    def user_for(self, token: str) -> str | None: ...


class BodyTooLarge(HTTPException):
    """A body that passed the limit while it streamed (FastAPI lets HTTPExceptions through
    its body parsing, so this reaches the app's problem handler as a 413)."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            413,
            f"the request body is larger than {human_bytes(limit)} (serve --max-body)",
            headers={"Connection": "close"},
        )


class WrongTokenThrottle:
    """Wrong tokens per client address in a sliding minute."""

    def __init__(self, per_minute: int, window: float = FAILURE_WINDOW) -> None:
        self.per_minute = per_minute
        self.window = window
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def _recent(self, client: str, now: float) -> deque[float] | None:
        times = self._failures.get(client)
        if times is None:
            return None
        while times and times[0] <= now - self.window:
            times.popleft()
        if not times:
            del self._failures[client]
            return None
        return times

    def retry_after(self, client: str, now: float | None = None) -> int | None:
        """Seconds until `client` may try again, or None if it is not throttled."""
        now = time.monotonic() if now is None else now
        times = self._recent(client, now)
        if times is None or len(times) < self.per_minute:
            return None
        return max(1, math.ceil(times[0] + self.window - now))

    def failed(self, client: str, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        times = self._recent(client, now)
        if times is None:
            times = self._failures[client] = deque(maxlen=self.per_minute)
            while len(self._failures) > MAX_TRACKED_CLIENTS:
                self._failures.popitem(last=False)
        times.append(now)


def needs_token(path: str) -> bool:
    return path not in PUBLIC_PATHS and not path.startswith(PUBLIC_PREFIXES)


def bearer_token(headers: Headers) -> str | None:
    scheme, _, token = headers.get("authorization", "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


class Gate:
    """ASGI middleware; see the module docstring."""

    def __init__(
        self,
        app: ASGIApp,
        tokens: TokenLookup,
        limits: ServerLimits,
        stream_tokens: StreamTokens | None = None,
    ) -> None:
        self.app = app
        self.tokens = tokens
        self.limits = limits
        self.stream_tokens = stream_tokens
        self.throttle = WrongTokenThrottle(limits.auth_failures_per_minute)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_with_headers(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                present = {name.lower() for name, _ in message.get("headers", [])}
                extra = [(n, v) for n, v in SECURITY_HEADERS if n not in present]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        early = self._answer_from_head(scope)
        if early is not None:
            await early(scope, receive, send_with_headers)
            return
        received = 0
        limit = self.limits.max_body

        async def receive_limited() -> Message:
            # Counts body bytes: past the limit the request is refused (before the
            # response started) or treated as a disconnect (after); never buffered.
            nonlocal received
            if received > limit:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    if started:
                        return {"type": "http.disconnect"}
                    raise BodyTooLarge(limit)
            return message

        await self.app(scope, receive_limited, send_with_headers)

    def _answer_from_head(self, scope: Scope) -> JSONResponse | None:
        """A response decided by the request line and headers, or None to go on.
        The token comes first: a client without one learns nothing else."""
        headers = Headers(scope=scope)
        if needs_token(scope["path"]):
            refused = self._authenticate(scope, headers)
            if refused is not None:
                return refused
        if "\x00" in scope["path"] or b"\x00" in unquote_to_bytes(scope.get("query_string", b"")):
            return problem(422, "Validation error", "the URL contains a NUL character")
        length = headers.get("content-length")
        if length is not None and not length.isdigit():
            detail = "the Content-Length header is not a number"
            return problem(400, "Bad request", detail, headers=CLOSE)
        if length is not None and int(length) > self.limits.max_body:
            detail = (
                f"the request body is larger than {human_bytes(self.limits.max_body)} "
                "(serve --max-body)"
            )
            return problem(413, TOO_LARGE, detail, headers=CLOSE)
        return None

    def _authenticate(self, scope: Scope, headers: Headers) -> JSONResponse | None:
        """None when the request may go on (the user noted in the scope), else the refusal.

        A valid token is always checked and admitted, throttled address or not:
        refusing it would let anyone sharing an address (a NAT, a proxy) lock
        its users out by sending wrong tokens. Only wrong tokens are refused
        (429) once an address sent too many in the last minute. The address is
        the TCP peer, or the forwarded one only from `--forwarded-allow-ips`."""
        token = bearer_token(headers)
        if token is None and scope["path"] in TOKEN_OPTIONAL:
            return None
        if token is None and self.stream_tokens is not None:
            stream = _stream_token(scope)
            if stream is not None:
                return self._admit_stream(scope, stream)
        user = None if token is None else self.tokens.user_for(token)
        if user is not None:
            scope.setdefault("state", {})["user"] = user
            return None
        if token is None:
            # Not a guess: a missing token is not counted (a page before sign-in).
            detail = "this endpoint needs an 'Authorization: Bearer <token>' header"
            return problem(401, "Unauthorized", detail, headers=UNAUTHORIZED)
        return self._wrong_token(scope, "the bearer token is not valid")

    def _wrong_token(self, scope: Scope, detail: str) -> JSONResponse:
        """401 for a wrong token, counted; 429 once its address sent too many."""
        client = (scope.get("client") or ("unknown", 0))[0]
        wait = self.throttle.retry_after(client)
        if wait is not None:
            return problem(
                429,
                "Too many requests",
                "too many wrong tokens from this address; try again later",
                headers={**CLOSE, "Retry-After": str(wait)},
            )
        self.throttle.failed(client)
        return problem(401, "Unauthorized", detail, headers=UNAUTHORIZED)

    def _admit_stream(self, scope: Scope, token: str) -> JSONResponse | None:
        """A stream token opens its own task's events, as its owner; a valid token
        for another task answers 404, as that task's events would to its owner."""
        assert self.stream_tokens is not None
        try:
            grant = self.stream_tokens.check(token)
        except InvalidStreamToken as exc:
            return self._wrong_token(scope, str(exc))
        match = EVENTS_PATH.fullmatch(scope["path"])
        asked = match.group(1) if match else ""
        if asked != grant.task_id:
            return problem(404, "Task not found", str(TaskNotFound(asked)), kind="task-not-found")
        scope.setdefault("state", {})["user"] = grant.user
        return None


def _stream_token(scope: Scope) -> str | None:
    """The ?stream_token= of a request for a task's events (elsewhere it opens nothing)."""
    if EVENTS_PATH.fullmatch(scope["path"]) is None:
        return None
    query = scope.get("query_string", b"").decode("latin-1")
    values = parse_qs(query, keep_blank_values=True).get("stream_token")
    return values[0] if values else None
