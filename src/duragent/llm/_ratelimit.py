"""A provider's rate limits (requests and tokens per minute) respected by the whole fleet.

`RateLimited(model, store, requests_per_minute=..., tokens_per_minute=...)` is a
ChatModel: before each call it takes one request from a bucket kept in the
store (a document in scope `duragent:rate-limits`, updated with a version
check, so every worker on every machine draws from the same bucket), and after
the call it debits the tokens the call really used. Tokens are known only
afterwards, so the token bucket may go below zero; the next call then waits
until it has refilled. A call waits (asyncio.sleep, never a busy loop) rather
than fails.

The bucket refills continuously (a minute's budget over a minute) and holds at
most `burst_seconds` of the budget: by default 60, so after a quiet minute a
whole minute's budget may go at once (as a provider's own per-minute limit
lets it); `burst_seconds=1` spreads the calls evenly (500 requests a minute:
one every 0.12 s, at most ~8 at once).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from duragent.errors import Conflict, InvalidOption
from duragent.llm._base import ChatModel, ModelRequest, StreamEvent, UsageDelta
from duragent.store._commits import Commit, DocumentWrite
from duragent.store._protocol import Store

RATE_SCOPE = "duragent:rate-limits"


class RateLimited:
    """Wrap a ChatModel so all of its callers, in every process, share one budget."""

    def __init__(
        self,
        model: ChatModel | str,
        store: Store,
        *,
        key: str | None = None,
        requests_per_minute: float | None = None,
        tokens_per_minute: float | None = None,
        burst_seconds: float = 60.0,
        **model_options: Any,
    ) -> None:
        if requests_per_minute is None and tokens_per_minute is None:
            raise InvalidOption("give requests_per_minute, tokens_per_minute or both")
        for value in (requests_per_minute, tokens_per_minute):
            if value is not None and value <= 0:
                raise InvalidOption("rate limits must be positive")
        if not 0 < burst_seconds <= 60:
            raise InvalidOption(
                f"burst_seconds must be more than 0 and at most 60, not {burst_seconds!r}"
            )
        if isinstance(model, str):
            from duragent.llm import resolve_model

            model = resolve_model(model, **model_options)
        self.inner = model
        self.name = model.name
        self.store = store
        self.key = key or model.name  # one bucket per provider account, typically
        self.rpm = requests_per_minute
        self.tpm = tokens_per_minute
        # What the bucket holds at most: `burst_seconds` of the budget (one request
        # at least, or none could ever be taken).
        share = burst_seconds / 60
        self.max_requests = max(1.0, (requests_per_minute or 0.0) * share)
        self.max_tokens = (tokens_per_minute or 0.0) * share
        self.waited = 0.0  # seconds this process spent waiting for the budget

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        await self.acquire()
        used = 0
        try:
            async for event in self.inner.stream(request):
                if isinstance(event, UsageDelta):
                    used += event.input_tokens + event.output_tokens
                yield event
        finally:
            if used and self.tpm is not None:
                await self._update(lambda b: {**b, "tokens": b["tokens"] - used})

    async def aclose(self) -> None:
        aclose = getattr(self.inner, "aclose", None)
        if aclose is not None:
            await aclose()

    # --- the shared bucket ---

    def _refilled(self, value: dict[str, Any] | None, now: float) -> dict[str, Any]:
        rpm, tpm = self.rpm or 0.0, self.tpm or 0.0
        top_r, top_t = self.max_requests, self.max_tokens
        if value is None:
            return {"requests": top_r, "tokens": top_t, "at": now}
        elapsed = max(0.0, now - float(value["at"]))
        return {
            "requests": min(top_r, float(value["requests"]) + elapsed * rpm / 60),
            "tokens": min(top_t, float(value["tokens"]) + elapsed * tpm / 60),
            "at": now,
        }

    async def acquire(self) -> None:
        """Take one request from the bucket, waiting until it has one (and tokens left)."""
        while True:
            doc = await self.store.get_document(RATE_SCOPE, self.key)
            bucket = self._refilled(None if doc is None else doc.value, time.time())
            short = []
            if self.rpm is not None and bucket["requests"] < 1:
                short.append((1 - bucket["requests"]) * 60 / self.rpm)
            if self.tpm is not None and bucket["tokens"] <= 0:
                short.append((1 - bucket["tokens"]) * 60 / self.tpm)
            if short:
                delay = min(max(short), 5.0)  # look again at least every few seconds
                self.waited += delay
                await asyncio.sleep(delay)
                continue
            if self.rpm is not None:
                bucket["requests"] -= 1
            try:
                await self._write(bucket, 0 if doc is None else doc.version)
            except Conflict:
                continue  # another caller took from the bucket meanwhile: look again
            return

    async def _update(self, change: Any) -> None:
        for _ in range(20):
            doc = await self.store.get_document(RATE_SCOPE, self.key)
            bucket = change(self._refilled(None if doc is None else doc.value, time.time()))
            try:
                await self._write(bucket, 0 if doc is None else doc.version)
            except Conflict:
                continue
            return

    async def _write(self, bucket: dict[str, Any], version: int) -> None:
        write = DocumentWrite(RATE_SCOPE, self.key, bucket, expect_version=version)
        await self.store.commit(Commit(documents=[write]))
