"""Error rules the HTTP provider adapters share: how long to wait, what to call a
status, which failures a retry may cure, and keeping the API key out of all of it."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from email.utils import parsedate_to_datetime
from typing import Any, NoReturn

from duragent.errors import ContextOverflow, MissingCredential, ModelError, RetryableModelError
from duragent.llm._windows import is_overflow, overflow_numbers

# Sent when a local server or gateway (base_url given) needs no key; the SDKs insist on one.
NO_KEY = "not-needed"


def resolve_key(provider: str, env_var: str, api_key: str | None, base_url: str | None) -> str:
    """The API key from the argument or the environment; a local server (base_url) may need none."""
    key = api_key or os.environ.get(env_var)
    if key:
        return key
    if base_url is None:
        raise MissingCredential(provider, env_var)
    return NO_KEY


class SdkChat:
    """What the SDK-backed adapters share: a repr without the key, and closing the client."""

    model: str
    base_url: str | None
    _client: Any

    def __repr__(self) -> str:
        where = f", base_url={self.base_url!r}" if self.base_url else ""
        return f"{type(self).__name__}(model={self.model!r}{where})"

    async def aclose(self) -> None:
        await self._client.close()


RETRYABLE_STATUS = frozenset({408, 409, 429})


def retry_after(headers: Mapping[str, str] | None, now: float | None = None) -> float | None:
    """Seconds to wait from `retry-after-ms` or `Retry-After` (seconds or an HTTP date)."""
    if not headers:
        return None
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def scrub(text: str, secret: str) -> str:
    """`text` with the API key replaced by ***."""
    return text.replace(secret, "***") if secret and secret != NO_KEY else text


def body_message(body: object) -> str:
    """The human part of an error body (`{"error": {"message": ...}}` and kin)."""
    if isinstance(body, Mapping):
        inner = body.get("error", body)
        if isinstance(inner, Mapping) and isinstance(inner.get("message"), str):
            return str(inner["message"])
        if isinstance(inner, str):
            return inner
        return json.dumps(body)[:300]
    if isinstance(body, str) and body.strip():
        return body.strip()[:300]
    return "no details given"


def status_text(provider: str, status: int, message: str) -> str:
    if status == 401:
        what = f"{provider} rejected the API key"
    elif status == 403:
        what = f"{provider} refused access"
    elif status == 404:
        what = f"{provider} does not know this model or endpoint"
    elif status == 429:
        what = f"{provider} rate-limited the request"
    elif status == 529:
        what = f"{provider} is overloaded"
    elif status >= 500:
        what = f"{provider} had a server error"
    elif status in (408, 409):
        what = f"{provider} could not take the request now"
    else:
        what = f"{provider} rejected the request"
    return f"{what} ({status}): {message}"


def raise_status(exc: Any, secret: str, text: str, *, retryable: bool, env_var: str) -> NoReturn:
    """Raise for an SDK status error: `text` plus the request id, and for a 401 the
    variable the key comes from; the wait is what the server's headers asked for."""
    status = int(exc.status_code)
    body = getattr(exc, "body", None)
    inner = body.get("error", body) if isinstance(body, Mapping) else None
    code = inner.get("code") if isinstance(inner, Mapping) else None
    message = body_message(body)
    if is_overflow(status, code, message):
        tokens, limit = overflow_numbers(message)
        raise ContextOverflow(scrub(text, secret), tokens=tokens, limit=limit) from None
    request_id = getattr(exc, "request_id", None)
    if request_id:
        text += f" [request id {request_id}]"
    if int(exc.status_code) == 401:
        text += f"; check {env_var} or the api_key= you passed"
    raise_error(text, secret, exc, retryable=retryable, wait=retry_after(exc.response.headers))


def raise_error(
    text: str, secret: str, exc: BaseException, *, retryable: bool, wait: float | None = None
) -> NoReturn:
    error_type = RetryableModelError if retryable else ModelError
    error = error_type(scrub(text, secret), retry_after=wait)
    # Keep the SDK error as the cause for debugging, unless it would show the key.
    if secret and secret in str(exc):
        raise error from None
    raise error from exc


def connection_error(
    provider: str,
    exc: BaseException,
    *,
    started: bool,
    base_url: object,
    sdk_connection_error: type[BaseException],
    sdk_timeout: type[BaseException],
) -> RetryableModelError:
    """What to raise when the connection failed, timed out or broke mid-answer."""
    # The SDK wraps some httpx errors (the httpx one is then the cause) but not all.
    wrapped = isinstance(exc, sdk_connection_error) and exc.__cause__ is not None
    raw = exc.__cause__ if wrapped else exc
    what = type(raw).__name__
    if isinstance(exc, sdk_timeout) or isinstance(raw, httpx_errors("TimeoutException")):
        return RetryableModelError(f"{provider} did not answer in time ({what}, a timeout)")
    if started:
        return RetryableModelError(f"the connection to {provider} broke mid-answer ({what})")
    return RetryableModelError(f"could not reach {provider} at {base_url} ({what})")


def httpx_errors(name: str) -> tuple[type[BaseException], ...]:
    """The httpx error class `name`, from whichever httpx the SDK uses; a stream can
    raise these past the SDK (a connection dropped or timed out mid-body)."""
    found: list[type[BaseException]] = []
    for module in ("httpx2", "httpx"):
        try:
            found.append(getattr(__import__(module), name))
        except (ImportError, AttributeError):
            continue
    return tuple(found)
