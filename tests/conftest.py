from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from duragent.store import Store, open_store

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# name -> factory(tmp_path) -> an open store. Later backends add themselves here.
StoreFactory = Callable[[Path], Awaitable[Store]]


async def _memory(tmp_path: Path) -> Store:
    return open_store("memory://")


async def _sqlite(tmp_path: Path) -> Store:
    return open_store(f"sqlite:///{tmp_path}/store.db")


async def _sqlite_full(tmp_path: Path) -> Store:
    return open_store(f"sqlite:///{tmp_path}/store.db?durability=full")


STORE_FACTORIES: dict[str, StoreFactory] = {
    "memory": _memory,
    "sqlite": _sqlite,
    "sqlite-full": _sqlite_full,
}


@pytest.fixture(params=sorted(STORE_FACTORIES))
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    s = await STORE_FACTORIES[request.param](tmp_path)
    await s.open()
    try:
        yield s
    finally:
        await s.close()
