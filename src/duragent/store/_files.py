"""What the file stores (SQLite, JSONL) share about their files on disk.

- Paths in URLs follow one rule, SQLAlchemy's: `sqlite:///rel.db` and
  `jsonl:///rel/dir` are relative to the working directory, `sqlite:////abs.db`
  and `jsonl:////abs/dir` absolute.
- duragent creates a store (its file or its directory), never the parents:
  a missing parent is a mistyped path more often than a wish.
- Files are created 0600 and directories 0700: a store holds conversations.
- A write refused for lack of room is `StoreFull` (the files are intact),
  never `StoreCorrupt`.
"""

from __future__ import annotations

import errno
import os
import warnings

from duragent.errors import InvalidStoreURL, StoreFull, StoreNotFound

# The JSONL store's log file in its directory (store/_jsonl.py).
LOG_NAME = "log.jsonl"

FILE_MODE = 0o600
DIR_MODE = 0o700

# Out of room: the disk, the user's quota, or the process's file-size limit.
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def url_path(url: str) -> str:
    """The path part of `scheme:///path?query`, by the SQLAlchemy rule (see above)."""
    rest = url.split("://", 1)[1].split("?", 1)[0]
    return os.path.expanduser(rest[1:] if rest.startswith("/") else rest)


def jsonl_directory(url: str) -> str:
    """The absolute directory a `jsonl://` URL names.

    Before this rule, `jsonl:///abs/dir` meant `/abs/dir`. Where the relative
    reading cannot be meant (its parent does not exist) but the absolute one
    can, the old meaning is kept with a warning, so old URLs go on working.
    """
    path = url_path(url)
    if not path:
        raise InvalidStoreURL(f"no directory in store URL {url!r}; use jsonl:///path/to/dir")
    relative = os.path.abspath(path)
    if os.path.isabs(path) or os.path.isdir(os.path.dirname(relative)):
        return relative
    legacy = "/" + path
    if os.path.isdir(os.path.dirname(os.path.abspath(legacy))):
        warnings.warn(
            f"{url!r}: jsonl:/// is followed by a relative path now (as for sqlite:///); "
            f"{legacy} is used because {os.path.dirname(relative)} does not exist. "
            f"Write jsonl:///{legacy} for an absolute path",
            FutureWarning,
            stacklevel=3,
        )
        return os.path.abspath(legacy)
    return relative


def require_parent(path: str, url_hint: str = "") -> None:
    """`StoreNotFound` unless the directory that holds `path` exists."""
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise StoreNotFound(parent, url_hint)


def absolute_hint(scheme: str, path: str) -> str:
    """What to write if a relative path was meant to be absolute."""
    if os.path.isabs(path):
        return "create it first (duragent creates the store, not its parent directories)"
    return (
        f"{scheme}:///{path} is relative to {os.getcwd()}; for an absolute path write "
        f"{scheme}:////{path}"
    )


def free_bytes(path: str) -> int | None:
    """Free space for this user on the filesystem holding `path` (None if unknown)."""
    probe = os.path.abspath(path)
    while probe and not os.path.exists(probe):
        probe = os.path.dirname(probe)
    try:
        st = os.statvfs(probe or "/")
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def is_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in FULL_ERRNOS


def full_error(path: str, exc: BaseException | None = None) -> StoreFull:
    detail = ""
    if isinstance(exc, OSError) and exc.errno is not None:
        detail = os.strerror(exc.errno)
    elif exc is not None:
        detail = str(exc)
    return StoreFull(path, free_bytes(path), detail)


def create_private_file(path: str) -> bool:
    """Create `path` empty with mode 0600 unless it exists; True if it was created.

    SQLite gives its -wal and -shm files the database file's mode, so a
    database created here keeps all three private.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def missing_store(url: str) -> str | None:
    """Where the file store `url` names was looked for, if it is not there; None if
    it is, or if the URL names no file (memory://, postgresql://: a server's
    database is there or the connection says so)."""
    scheme = url.partition("://")[0].lower()
    if scheme == "sqlite":
        path = url_path(url)
        if not path or path == ":memory:" or path.startswith("file:"):
            return None
        return None if os.path.isfile(path) else os.path.abspath(path)
    if scheme == "jsonl":
        directory = jsonl_directory(url)
        return None if os.path.isfile(os.path.join(directory, LOG_NAME)) else directory
    return None
