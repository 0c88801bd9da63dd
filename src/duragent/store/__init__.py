"""Stores: where duragent keeps tasks, entries and documents. `open_store(url)` picks one."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl

from duragent.store.base import (
    SCHEMA_VERSION,
    Commit,
    CommitResult,
    DocumentWrite,
    Store,
    TaskPage,
    TaskPatch,
    TaskQuery,
    iter_entries,
)

DEFAULT_URL = "sqlite:///duragent.db"

__all__ = [
    "DEFAULT_URL",
    "SCHEMA_VERSION",
    "Commit",
    "CommitResult",
    "DocumentWrite",
    "Store",
    "TaskPage",
    "TaskPatch",
    "TaskQuery",
    "iter_entries",
    "open_store",
]


def open_store(url: str | None = None, **options: Any) -> Store:
    """Open the store a URL names.

    - ``memory://``
    - ``sqlite:///relative.db``, ``sqlite:////absolute.db`` (``?durability=full``)
    - ``jsonl:///dir`` (``?durability=full``)
    - ``postgresql://user@host/db``

    Query parameters and keyword options are passed to the backend.
    """
    url = url or DEFAULT_URL
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError(
            f"store URL {url!r} has no scheme; use memory://, sqlite:///file.db, "
            "jsonl:///dir or postgresql://..."
        )
    query = dict(parse_qsl(rest.partition("?")[2]))
    opts: dict[str, Any] = {**query, **options}
    scheme = scheme.lower()
    if scheme == "memory":
        from duragent.store.memory import MemoryStore

        return MemoryStore(url)
    if scheme == "sqlite":
        from duragent.store.sqlite import SQLiteStore, sqlite_path_from_url

        if "poll_interval" in opts:
            opts["poll_interval"] = float(opts["poll_interval"])
        return SQLiteStore(sqlite_path_from_url(url), **opts)
    if scheme == "jsonl":
        try:
            from duragent.store.jsonl import JSONLStore  # type: ignore[import-not-found]
        except ImportError as exc:  # pragma: no cover - arrives with the JSONL issue
            raise ValueError("the jsonl:// store is not available in this build") from exc
        return JSONLStore.from_url(url, **options)  # type: ignore[no-any-return]
    if scheme in ("postgres", "postgresql"):
        from duragent.store.postgres import PostgresStore  # type: ignore[import-not-found]

        return PostgresStore(url, **options)  # type: ignore[no-any-return]
    raise ValueError(
        f"unknown store scheme {scheme!r} in {url!r}; use memory://, sqlite:///file.db, "
        "jsonl:///dir or postgresql://..."
    )
