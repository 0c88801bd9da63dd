"""Model rate limits shared through the store: two limiters on two connections to
one SQLite file (as two workers would be) draw from one bucket."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from duragent import ScriptedModel
from duragent.llm._base import ModelRequest, UsageDelta
from duragent.llm._ratelimit import RATE_SCOPE, RateLimited
from duragent.store import open_store
from duragent.types import UserMessage


async def call(model: RateLimited) -> int:
    used = 0
    async for event in model.stream(ModelRequest(model="m", messages=[UserMessage(content="hi")])):
        if isinstance(event, UsageDelta):
            used += event.input_tokens + event.output_tokens
    return used


@pytest.mark.slow
async def test_two_workers_share_one_request_budget(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/r.db"
    one, two = open_store(url), open_store(url)
    await one.open()
    await two.open()
    try:
        # 6 a minute: the bucket holds 6, and refills one every 10 seconds.
        a = RateLimited(ScriptedModel(lambda m: "ok"), one, key="acct", requests_per_minute=6)
        b = RateLimited(ScriptedModel(lambda m: "ok"), two, key="acct", requests_per_minute=6)
        for i in range(6):
            await call(a if i % 2 else b)
        assert a.waited == 0 and b.waited == 0
        doc = await one.get_document(RATE_SCOPE, "acct")
        assert doc is not None and doc.value["requests"] < 1  # both drew from one bucket
        # The 7th call, from either worker, must wait for the refill (~10 s away).
        seventh = asyncio.ensure_future(call(a))
        done, _ = await asyncio.wait([seventh], timeout=1.0)
        assert not done and a.waited > 0
        seventh.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await seventh
    finally:
        await one.close()
        await two.close()


async def test_tokens_are_debited_after_the_call(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/r.db")
    await store.open()
    try:
        model = RateLimited(
            ScriptedModel(lambda m: "a fairly long answer " * 20), store, tokens_per_minute=60_000
        )
        used = await call(model)
        assert used > 0
        doc = await store.get_document(RATE_SCOPE, model.key)
        assert doc is not None and doc.value["tokens"] <= 60_000 - used + 1_000  # refill margin
        with pytest.raises(ValueError, match="positive"):
            RateLimited(ScriptedModel(["x"]), store, requests_per_minute=0)
        with pytest.raises(ValueError, match="requests_per_minute"):
            RateLimited(ScriptedModel(["x"]), store)
    finally:
        await store.close()


@pytest.mark.slow
async def test_burst_seconds_smooths_the_budget(tmp_path: Path) -> None:
    """120 a minute with burst_seconds=1: two at once, then one every half second,
    never a whole minute's 120 in a burst."""
    store = open_store(f"sqlite:///{tmp_path}/r.db")
    await store.open()
    try:
        model = RateLimited(
            ScriptedModel(lambda m: "ok"), store, requests_per_minute=120, burst_seconds=1
        )
        await call(model)
        await call(model)
        assert model.waited == 0
        await call(model)  # the bucket is empty: it waits for half a second's refill
        assert 0 < model.waited <= 0.5
        with pytest.raises(ValueError, match="burst_seconds"):
            RateLimited(ScriptedModel(["x"]), store, requests_per_minute=1, burst_seconds=0)
    finally:
        await store.close()
