"""Webhooks: a URL called when a task completes, fails, is aborted, is blocked or
waits for input, delivered at least once from a durable outbox.

The outbox is a set of documents in one scope (every store has documents, and
lists a scope with one query). An event is written by the very commit that
changes the task's status, so an event is never lost and never announces a
status that was not stored. Any worker delivers it: it claims the event (a
versioned document write, so two workers cannot both hold it), POSTs it, and
deletes it once the receiver answered 2xx. A failed attempt is recorded and
retried with exponential back-off; a worker that dies mid-delivery leaves a
claim that expires, and another worker sends the event again. Receivers
de-duplicate with the event id (`Idempotency-Key` header).

Requests are signed like Stripe's: `Duragent-Signature: t=<unix>,v1=<hex>`
where v1 is HMAC-SHA256 over `"<t>.<body>"` with the secret from the
environment variable DURAGENT_WEBHOOK_SECRET (never stored). Without a secret
nothing is sent; events wait in the outbox.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import http.client
import json
import logging
import os
import random
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from duragent.errors import Conflict, InvalidOption, StoreError, UsageError, check_seconds
from duragent.store._commits import Commit, DocumentWrite
from duragent.store._protocol import Store
from duragent.types import Document, Task, TaskStatus, utcnow

log = logging.getLogger("duragent.webhooks")

OUTBOX = "outbox:webhooks"
SECRET_ENV = "DURAGENT_WEBHOOK_SECRET"
SIGNATURE_HEADER = "Duragent-Signature"

# Which status changes are announced, and as what event type.
EVENT_TYPES = {
    TaskStatus.COMPLETED: "task.completed",
    TaskStatus.FAILED: "task.failed",
    TaskStatus.ABORTED: "task.aborted",
    TaskStatus.BLOCKED: "task.blocked",
}


def check_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"a webhook must be an http:// or https:// URL, not {url!r}")
    return url


def event_type(task: Task, changes: Mapping[str, Any]) -> str | None:
    """The event a status change announces, or None."""
    if "status" not in changes:
        return None
    status = TaskStatus(changes["status"])
    reason = changes.get("status_reason")
    if status is task.status and reason == task.status_reason:
        return None  # not a change
    if status is TaskStatus.WAITING:
        return "task.waiting_for_input" if reason == "input" else None
    return EVENT_TYPES.get(status)


def outbox_events(task: Task, changes: Mapping[str, Any]) -> list[DocumentWrite]:
    """The outbox write to add to the commit that applies `changes` to `task`."""
    kind = event_type(task, changes)
    if kind is None:
        return []
    return _outbox(task, kind, {**task.model_dump(mode="json"), **_jsonable(changes)}, {})


def custom_event(task: Task, call_id: str, name: str, data: Any) -> list[DocumentWrite]:
    """The outbox write of a custom event a tool emitted (`ctx.emit`), to add to
    the commit of its progress entry: a `task.event` with `event: {name, data, call_id}`."""
    event = {"name": name, "data": data, "call_id": call_id}
    return _outbox(task, "task.event", task.model_dump(mode="json"), {"event": event})


def _outbox(
    task: Task, kind: str, after: Mapping[str, Any], extra: Mapping[str, Any]
) -> list[DocumentWrite]:
    url = task.config.get("webhook")
    if not url:
        return []
    now = utcnow()
    # Sortable by time, so the outbox is delivered roughly in order.
    event_id = f"evt_{now:%Y%m%d%H%M%S%f}_{uuid.uuid4().hex[:12]}"
    body = {
        **extra,
        "id": event_id,
        "type": kind,
        "created_at": now.isoformat(),
        "task": {
            k: after.get(k)
            for k in (
                "id",
                "agent",
                "status",
                "status_reason",
                "owner",
                "session_id",
                "parent_id",
                "root_id",
                "output",
                "error",
                "iterations",
                "usage",
            )
        },
    }
    value = {"url": url, "body": body, "attempts": 0, "next_at": None, "claimed_until": None}
    return [DocumentWrite(OUTBOX, event_id, value, expect_version=0)]


def _jsonable(changes: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in changes.items():
        if hasattr(v, "model_dump"):
            v = v.model_dump(mode="json")
        elif isinstance(v, datetime):
            v = v.isoformat()
        out[k] = v
    jsonable: dict[str, Any] = json.loads(json.dumps(out, default=str))
    return jsonable


# --- signing ---------------------------------------------------------------


def sign(secret: str, body: bytes, timestamp: int) -> str:
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def verify_signature(
    secret: str, body: bytes, header: str, *, tolerance: float = 300.0, now: float | None = None
) -> None:
    """For receivers: raise ValueError unless `header` signs `body` with `secret`
    and its timestamp is within `tolerance` seconds (replay protection)."""
    try:
        parts = dict(p.split("=", 1) for p in header.split(","))
        timestamp = int(parts["t"])
        given = parts["v1"]
    except (KeyError, ValueError) as exc:
        raise ValueError(f"malformed {SIGNATURE_HEADER} header") from exc
    expected = sign(secret, body, timestamp).split("v1=", 1)[1]
    if not hmac.compare_digest(given, expected):
        raise ValueError("webhook signature does not match")
    if abs((now if now is not None else time.time()) - timestamp) > tolerance:
        raise ValueError("webhook timestamp is outside the tolerance")


# --- delivery --------------------------------------------------------------


@dataclass
class WebhookDelivery:
    """How workers deliver webhook events."""

    secret: str | None = None  # default: the DURAGENT_WEBHOOK_SECRET environment variable
    timeout: float = 10.0  # per request
    base_delay: float = 1.0  # first retry after ~this many seconds, doubling each time
    max_delay: float = 3600.0
    max_attempts: int = 25  # then the event stays in the outbox marked dead
    poll_interval: float = 2.0  # how often to look for events other processes wrote
    concurrency: int = 8

    def __post_init__(self) -> None:
        for name in ("timeout", "base_delay", "max_delay", "poll_interval"):
            check_seconds(f"WebhookDelivery.{name}", getattr(self, name))
        for name in ("max_attempts", "concurrency"):
            if getattr(self, name) < 1:
                raise InvalidOption(f"WebhookDelivery.{name} must be at least 1")


@dataclass
class Attempt:
    ok: bool
    detail: str


class WebhookSender:
    """Delivers the outbox: run by every worker next to its tasks."""

    def __init__(
        self,
        store: Store,
        worker_id: str,
        *,
        claim_ttl: float = 30.0,
        options: WebhookDelivery | None = None,
    ) -> None:
        self.store = store
        self.worker_id = worker_id
        self.claim_ttl = claim_ttl
        self.options = options or WebhookDelivery()
        self._wake = asyncio.Event()
        self._warned = False
        self._told: set[tuple[str, int]] = set()  # bad events already logged
        self.delivered = 0  # events this sender delivered (2xx)
        self.failed_attempts = 0

    @property
    def secret(self) -> str | None:
        return self.options.secret or os.environ.get(SECRET_ENV) or None

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        while True:
            try:
                await self.deliver_due()
            except StoreError as exc:
                log.warning("webhook outbox unavailable: %s", exc)
            except Exception:  # this loop delivers every owner's events: it must go on
                log.exception("webhook delivery failed")
            woken = asyncio.ensure_future(self._wake.wait())
            try:
                await asyncio.wait([woken], timeout=self.options.poll_interval)
            finally:
                woken.cancel()
            self._wake.clear()

    async def deliver_due(self) -> int:
        """Deliver every event that is due and unclaimed; how many were delivered."""
        docs = await self.store.list_documents(OUTBOX)
        if not docs:
            return 0
        secret = self.secret
        if secret is None:
            if not self._warned:
                log.error(
                    "%d webhook event(s) wait in the outbox: set %s to deliver them",
                    len(docs),
                    SECRET_ENV,
                )
                self._warned = True
            return 0
        now = utcnow()
        due = [d for d in docs if self._readable(d) and _due(d, now)]
        gate = asyncio.Semaphore(self.options.concurrency)

        async def one(doc: Document) -> bool:
            async with gate:
                try:
                    return await self._deliver(doc, secret)
                except StoreError:
                    raise
                except Exception as exc:  # one bad event, not the others
                    self._tell(doc, exc)
                    return False

        results = await asyncio.gather(*(one(d) for d in due))
        return sum(results)

    def _readable(self, doc: Document) -> bool:
        """Whether an outbox event has the fields delivery reads (a row written
        around `outbox_events` may not); a bad one is logged once and left alone."""
        v = doc.value
        try:
            if not isinstance(v, dict) or not isinstance(v.get("body"), dict):
                raise ValueError("not an event")
            check_url(str(v["url"]))
            if "id" not in v["body"] or "type" not in v["body"]:
                raise ValueError("an event without an id or a type")
            int(v.get("attempts") or 0)
            for field in ("claimed_until", "next_at"):
                if v.get(field):
                    _aware(datetime.fromisoformat(v[field]))
        except Exception as exc:
            self._tell(doc, exc)
            return False
        return True

    def _tell(self, doc: Document, exc: Exception) -> None:
        seen = (doc.key, doc.version)
        if seen not in self._told:
            self._told.add(seen)
            log.error("webhook event %s skipped: %s", doc.key, exc)

    async def _deliver(self, doc: Document, secret: str) -> bool:
        now = utcnow()
        claim = {
            **doc.value,
            "claimed_by": self.worker_id,
            "claimed_until": (now + timedelta(seconds=self.claim_ttl)).isoformat(),
        }
        try:
            res = await self.store.commit(
                Commit(documents=[DocumentWrite(OUTBOX, doc.key, claim, doc.version)])
            )
        except Conflict:
            return False  # another worker claimed it (or delivered it) first
        version = res.documents[0].version
        attempt = await asyncio.to_thread(
            post, claim["url"], claim["body"], secret, self.options.timeout
        )
        if attempt.ok:
            write = DocumentWrite(OUTBOX, doc.key, expect_version=version, delete=True)
            self.delivered += 1
        else:
            self.failed_attempts += 1
            attempts = int(claim.get("attempts", 0)) + 1
            delay = min(self.options.max_delay, self.options.base_delay * 2 ** (attempts - 1))
            delay *= 0.5 + random.random() / 2
            log.info("webhook %s attempt %d failed: %s", doc.key, attempts, attempt.detail)
            retry = {
                **claim,
                "attempts": attempts,
                "last_error": attempt.detail,
                "next_at": (utcnow() + timedelta(seconds=delay)).isoformat(),
                "claimed_by": None,
                "claimed_until": None,
                "dead": attempts >= self.options.max_attempts,
            }
            write = DocumentWrite(OUTBOX, doc.key, retry, expect_version=version)
        try:
            await self.store.commit(Commit(documents=[write]))
        except Conflict:
            # Our claim expired and someone else holds it: they will send it again
            # (at least once), which the receiver's idempotency key absorbs.
            log.info("webhook %s: claim lost during delivery", doc.key)
        return attempt.ok


def _due(doc: Document, now: datetime) -> bool:
    v = doc.value
    if v.get("dead"):
        return False
    for field in ("claimed_until", "next_at"):
        at = v.get(field)
        if at and _aware(datetime.fromisoformat(at)) > now:
            return False
    return True


def _aware(at: datetime) -> datetime:
    if at.tzinfo is None:
        raise ValueError(f"time without a zone: {at.isoformat()}")
    return at


def post(url: str, body: Mapping[str, Any], secret: str, timeout: float) -> Attempt:
    """One signed POST (blocking: run in a thread). Redirects are not followed."""
    data = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    parts = urlsplit(url)
    conn_type = (
        http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    )
    conn = conn_type(parts.hostname or "", parts.port, timeout=timeout)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "duragent-webhooks",
        "Idempotency-Key": str(body["id"]),
        "Duragent-Event-Id": str(body["id"]),
        "Duragent-Event-Type": str(body["type"]),
        SIGNATURE_HEADER: sign(secret, data, int(time.time())),
    }
    try:
        conn.request("POST", path, body=data, headers=headers)
        response = conn.getresponse()
        response.read()
    except (OSError, http.client.HTTPException) as exc:
        return Attempt(False, f"{type(exc).__name__}: {exc}")
    finally:
        conn.close()
    if 200 <= response.status < 300:
        return Attempt(True, str(response.status))
    return Attempt(False, f"HTTP {response.status}")


__all__ = [
    "OUTBOX",
    "SECRET_ENV",
    "SIGNATURE_HEADER",
    "WebhookDelivery",
    "WebhookSender",
    "check_url",
    "outbox_events",
    "sign",
    "verify_signature",
]
