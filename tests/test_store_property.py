"""Random sequences of commits leave every store equal to a plain in-memory model."""

from __future__ import annotations

import asyncio
import tempfile
from typing import Any

import pytest
from hypothesis import given, strategies as st

from support.store_model import SETTINGS, _with_store, op


@pytest.mark.slow
@SETTINGS
@given(st.lists(op, max_size=25))
def test_memory_store_matches_model(ops: list[tuple[Any, ...]]) -> None:
    asyncio.run(_with_store("memory://", ops))


@pytest.mark.slow
@SETTINGS
@given(st.lists(op, max_size=25))
def test_sqlite_store_matches_model(ops: list[tuple[Any, ...]]) -> None:
    with tempfile.TemporaryDirectory() as d:
        asyncio.run(_with_store(f"sqlite:///{d}/p.db", ops))
