"""What only the SQLite file store does: schema versions, bad files, durability settings."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from duragent.errors import StoreCorrupt, StoreVersionError
from duragent.store import SCHEMA_VERSION, open_store
from duragent.store.sqlite import SQLiteStore
from duragent.types import Task


async def test_newer_schema_version_is_refused_naming_both_versions(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = open_store(f"sqlite:///{path}")
    await store.close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    conn.commit()
    conn.close()
    with pytest.raises(StoreVersionError) as info:
        open_store(f"sqlite:///{path}")
    assert "99" in str(info.value) and str(SCHEMA_VERSION) in str(info.value)
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT value FROM meta").fetchone()[0] == "99"  # untouched


async def test_older_store_is_migrated_on_open(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    sqlite3.connect(path).close()  # version 0: an empty file
    store = open_store(f"sqlite:///{path}")
    assert isinstance(store, SQLiteStore) and store.migrated_from == 0
    await store.create_task(Task(agent="a"))
    await store.close()
    again = open_store(f"sqlite:///{path}")
    assert isinstance(again, SQLiteStore) and again.migrated_from == SCHEMA_VERSION
    await again.close()


def test_a_file_that_is_not_a_database_gives_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreCorrupt, match="not a readable duragent SQLite store"):
        open_store(f"sqlite:///{path}")
    assert path.read_bytes() == b"this is not sqlite" * 100


@pytest.mark.parametrize(("url_suffix", "expected"), [("", 1), ("?durability=full", 2)])
async def test_durability_sets_synchronous(tmp_path: Path, url_suffix: str, expected: int) -> None:
    store = open_store(f"sqlite:///{tmp_path}/d.db{url_suffix}")
    assert isinstance(store, SQLiteStore)
    assert store._writer_conn.execute("PRAGMA synchronous").fetchone()[0] == expected
    assert store._writer_conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    await store.close()


def test_unknown_durability_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="durability"):
        open_store(f"sqlite:///{tmp_path}/d.db?durability=sometimes")


def test_unknown_scheme_names_the_choices() -> None:
    with pytest.raises(ValueError, match="sqlite:///"):
        open_store("mongodb://x")
