from __future__ import annotations

import functools
import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from duragent.store import Store, open_store

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# A command without --store uses the user's store ($XDG_DATA_HOME/duragent): the
# tests, and every CLI process they start, get a data directory of their own.
os.environ["XDG_DATA_HOME"] = tempfile.mkdtemp(prefix="duragent-test-data-")
os.environ.pop("DURAGENT_STORE", None)

# name -> factory(tmp_path) -> an open store. Later backends add themselves here.
StoreFactory = Callable[[Path], Awaitable[Store]]


async def _memory(tmp_path: Path) -> Store:
    return open_store("memory://")


async def _sqlite(tmp_path: Path) -> Store:
    return open_store(f"sqlite:///{tmp_path}/store.db")


async def _sqlite_full(tmp_path: Path) -> Store:
    return open_store(f"sqlite:///{tmp_path}/store.db?durability=full")


async def _jsonl(tmp_path: Path) -> Store:
    return open_store(f"jsonl:///{tmp_path}/jsonl-store")


PG_URL = os.environ.get("DURAGENT_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")


@functools.cache
def postgres_unreachable() -> str | None:
    """Why the test server cannot be used, or None when it can."""
    try:
        import psycopg
    except ImportError as exc:  # pragma: no cover - the postgres extra is not installed
        return f"psycopg is not installed: {exc}"
    try:
        psycopg.connect(PG_URL, connect_timeout=3).close()
    except psycopg.Error as exc:
        return f"PostgreSQL at {PG_URL} is unreachable: {exc}"
    return None


def require_postgres() -> str:
    """The test server's URL; skip the test without one, except in CI where that fails."""
    reason = postgres_unreachable()
    if reason is not None:
        if IN_CI:
            pytest.fail(f"CI must run the PostgreSQL tests: {reason}")
        pytest.skip(reason)
    return PG_URL


def drop_schema(schema: str) -> None:
    import psycopg
    from psycopg import sql

    drop = sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
    # A server or worker may still be using the schema: PostgreSQL can then pick
    # the DROP as a deadlock's victim. That is the test's cleanup losing a race,
    # not a result: try again (a few times, then let it fail).
    for attempt in range(5):
        try:
            with psycopg.connect(PG_URL, autocommit=True) as conn:
                conn.execute(drop)
            return
        except psycopg.errors.DeadlockDetected:
            if attempt == 4:
                raise


async def _postgres(tmp_path: Path) -> Store:
    from duragent.store.postgres import PostgresStore

    class ThrowawayPostgresStore(PostgresStore):
        """A store in its own schema, dropped on close: every test starts empty."""

        async def close(self) -> None:
            try:
                await super().close()
            finally:
                assert self.schema is not None
                drop_schema(self.schema)

    url = require_postgres()
    return ThrowawayPostgresStore(url, schema=f"test_{uuid.uuid4().hex[:12]}", max_size=4)


STORE_FACTORIES: dict[str, StoreFactory] = {
    "memory": _memory,
    "sqlite": _sqlite,
    "sqlite-full": _sqlite_full,
    "jsonl": _jsonl,
    "postgres": _postgres,
}


@asynccontextmanager
async def opened_store(kind: str, tmp_path: Path) -> AsyncIterator[Store]:
    """A store of `kind` (a key of STORE_FACTORIES), opened, and closed on the way out."""
    s = await STORE_FACTORIES[kind](tmp_path)
    await s.open()
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture(params=sorted(STORE_FACTORIES))
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    async with opened_store(request.param, tmp_path) as s:
        yield s


@pytest.fixture(params=["jsonl", "sqlite", "sqlite-full"])
async def file_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """The stores kept in files, which a test can close and open again."""
    async with opened_store(request.param, tmp_path) as s:
        yield s


@pytest.fixture(params=["sqlite", "sqlite-full", "postgres"])
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """One store (a SQLite file, or a PostgreSQL schema) that several processes open."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/shared.db"
        return
    if request.param == "sqlite-full":  # batches of several commits run on the writer thread
        yield f"sqlite:///{tmp_path}/shared.db?durability=full"
        return
    schema = f"test_{uuid.uuid4().hex[:12]}"
    yield f"{require_postgres()}?schema={schema}"
    drop_schema(schema)
