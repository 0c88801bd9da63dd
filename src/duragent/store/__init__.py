"""Stores: where duragent keeps tasks, entries and documents. `open_store(url)` picks one."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

from duragent.errors import InvalidStoreURL, MissingExtra
from duragent.store._commits import (
    Commit,
    CommitResult,
    DocumentWrite,
    TaskPage,
    TaskPatch,
    TaskQuery,
)
from duragent.store._protocol import Store, iter_entries

if TYPE_CHECKING:
    from duragent.store._jsonl import JSONLStore  # noqa: F401
    from duragent.store._memory import MemoryStore  # noqa: F401
    from duragent.store._postgres import PostgresStore  # noqa: F401
    from duragent.store._sqlite import SQLiteStore  # noqa: F401

# The store classes, for type hints and direct construction (`open_store(url)` is
# the usual way). Imported on first use, so importing this package loads neither
# sqlite3's store nor psycopg; they are not in __all__ for the same reason.
_STORE_CLASSES = {
    "MemoryStore": "duragent.store._memory",
    "SQLiteStore": "duragent.store._sqlite",
    "JSONLStore": "duragent.store._jsonl",
    "PostgresStore": "duragent.store._postgres",
}


def __getattr__(name: str) -> Any:
    module = _STORE_CLASSES.get(name)
    if module is None:
        raise AttributeError(f"module 'duragent.store' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


DEFAULT_URL = "sqlite:///duragent.db"

__all__ = [
    "DEFAULT_URL",
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
    - ``jsonl:///relative/dir``, ``jsonl:////absolute/dir`` (``?durability=full``)
    - ``postgresql://user@host/db`` (needs ``pip install 'duragent[postgres]'``)

    Paths follow one rule (SQLAlchemy's): three slashes and a relative path,
    four for an absolute one. The store's parent directory must exist.
    Query parameters and keyword options are passed to the backend.
    """
    url = url or DEFAULT_URL
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise InvalidStoreURL(
            f"store URL {url!r} has no scheme; use memory://, sqlite:///file.db, "
            "jsonl:///dir or postgresql://..."
        )
    query = dict(parse_qsl(rest.partition("?")[2]))
    opts: dict[str, Any] = {**query, **options}
    scheme = scheme.lower()
    if scheme == "memory":
        from duragent.store._memory import MemoryStore

        return MemoryStore(url)
    if scheme == "sqlite":
        from duragent.store._files import url_path
        from duragent.store._sqlite import SQLiteStore

        path = url_path(url)
        if not path:
            raise InvalidStoreURL(f"no file in store URL {url!r}; use sqlite:///path/to/file.db")
        if "poll_interval" in opts:
            opts["poll_interval"] = float(opts["poll_interval"])
        return SQLiteStore(path, **opts)
    if scheme == "jsonl":
        from duragent.store._files import jsonl_directory
        from duragent.store._jsonl import JSONLStore

        return JSONLStore(jsonl_directory(url), **opts)
    if scheme in ("postgres", "postgresql"):
        try:
            from duragent.store._postgres import PostgresStore
        except ImportError as exc:
            if "psycopg" not in f"{exc.name} {exc}":
                raise
            raise MissingExtra(f"the {scheme}:// store", "postgres") from None
        return PostgresStore(url, **options)
    raise InvalidStoreURL(
        f"unknown store scheme {scheme!r} in {url!r}; use memory://, sqlite:///file.db, "
        "jsonl:///dir or postgresql://..."
    )
