"""PostgreSQL lease renewals do not queue behind task commits for a pooled connection."""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import pytest

from conftest import drop_schema, require_postgres
from duragent.errors import StoreUnavailable
from duragent.store.postgres import PostgresStore

pytestmark = pytest.mark.postgres


async def test_renewals_succeed_while_every_pooled_connection_is_busy() -> None:
    url = require_postgres()
    schema = f"test_{uuid.uuid4().hex[:12]}"
    store = PostgresStore(url, schema=schema, min_size=1, max_size=1, connect_timeout=10)
    taken, release = threading.Event(), threading.Event()

    def long_transaction() -> None:
        with store._pool.connection() as conn, conn.transaction():
            conn.execute("SELECT 1")
            taken.set()
            release.wait(60)

    holder = asyncio.ensure_future(asyncio.to_thread(long_transaction))
    try:
        assert await asyncio.to_thread(taken.wait, 30)
        for _ in range(3):  # and again, on the same dedicated connection
            try:
                renewal: Any = await store.renew_leases("w1", {"no-such-task": 1}, 30)
            except StoreUnavailable as exc:
                pytest.fail(f"a renewal waited for the shared pool: {exc}")
            assert renewal.kept == {}
    finally:
        release.set()
        await holder
        await store.close()
        drop_schema(schema)
