"""Stream tokens: a browser's way to open one task's event stream.

`EventSource` cannot send an Authorization header, and a bearer token in a URL
lands in histories and logs for good. A stream token is worth less: it opens
only `/v1/tasks/<its task>/events`, only for its owner, only for a short time.
It is `<payload>.<mac>`, the payload naming the task, the user and the expiry,
the MAC an HMAC-SHA256 under the server's secret: DURAGENT_STREAM_SECRET when
set (every server process behind one address needs the same), else random per
process. Nothing is stored; the secret is never logged, nor is a token: the
access log shows `stream_token=…`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import time
from dataclasses import dataclass

from duragent.errors import UsageError

SECRET_VAR = "DURAGENT_STREAM_SECRET"
TTL = 60.0  # seconds a token may open a stream; the stream itself goes on
MIN_SECRET_LENGTH = 32
MAX_TOKEN_LENGTH = 1000


@dataclass(frozen=True)
class StreamGrant:
    task_id: str
    user: str
    expires_at: float


class InvalidStreamToken(Exception):
    """Not a token this server made, or an expired one."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class StreamTokens:
    def __init__(self, secret: str | bytes | None = None, ttl: float = TTL) -> None:
        if secret is None:
            secret = os.environ.get(SECRET_VAR) or secrets.token_bytes(32)
        key = secret.encode("utf-8") if isinstance(secret, str) else secret
        if len(key) < MIN_SECRET_LENGTH:
            # The length only: this message reaches the terminal.
            raise UsageError(
                f"{SECRET_VAR} has {len(key)} bytes; it needs at least {MIN_SECRET_LENGTH} "
                "(make one with: python -c 'import secrets; print(secrets.token_urlsafe(32))')"
            )
        self._key = key
        self.ttl = ttl

    def _mac(self, payload: str) -> str:
        return _b64(hmac.new(self._key, payload.encode("ascii"), hashlib.sha256).digest())

    def mint(self, task_id: str, user: str, now: float | None = None) -> StreamGrant:
        expires = int((time.time() if now is None else now) + self.ttl)
        return StreamGrant(task_id, user, float(expires))

    def token(self, grant: StreamGrant) -> str:
        body = {"t": grant.task_id, "u": grant.user, "e": int(grant.expires_at)}
        payload = _b64(json.dumps(body, separators=(",", ":")).encode("utf-8"))
        return f"{payload}.{self._mac(payload)}"

    def check(self, token: str, now: float | None = None) -> StreamGrant:
        """The grant a token carries, or InvalidStreamToken (forged, garbled, expired)."""
        payload, sep, mac = token.partition(".")
        if not sep or len(token) > MAX_TOKEN_LENGTH:
            raise InvalidStreamToken("the stream token is not valid")
        try:
            known = self._mac(payload)
        except UnicodeEncodeError:
            raise InvalidStreamToken("the stream token is not valid") from None
        # Bytes, not str: compare_digest refuses a str with non-ASCII characters
        # (a client can send them percent-encoded) with a TypeError, a 500.
        if not hmac.compare_digest(known.encode(), mac.encode("utf-8", "surrogatepass")):
            raise InvalidStreamToken("the stream token is not valid")
        body = json.loads(_unb64(payload))  # signed by us: well-formed
        if (time.time() if now is None else now) >= body["e"]:
            raise InvalidStreamToken(
                "the stream token has expired; ask POST /v1/tasks/{task_id}/stream-token "
                "for a new one"
            )
        return StreamGrant(body["t"], body["u"], float(body["e"]))


_IN_QUERY = re.compile(r"(stream_token=)[^&\s]*")


class HideStreamTokens(logging.Filter):
    """Drops the token from the access log's request lines (uvicorn.access)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(
                _IN_QUERY.sub(r"\1…", a) if isinstance(a, str) else a for a in record.args
            )
        elif isinstance(record.msg, str):
            record.msg = _IN_QUERY.sub(r"\1…", record.msg)
        return True


def hide_tokens_in_access_log() -> None:
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, HideStreamTokens) for f in access.filters):
        access.addFilter(HideStreamTokens())
