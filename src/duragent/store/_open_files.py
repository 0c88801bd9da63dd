"""The files of every store this process has open, so that no tool of ours touches them.

A file tool's root may hold a store (`duragent run --workdir .` beside a
`./duragent.db`, or an agent built with `toolset(root=...)` on a data
directory): one `write_file(path="duragent.db")` would turn every task in it
into "file is not a database". So the file stores (SQLite, JSONL) hold their
files here while they are open, and the tools ask `is_store_path` (and
`is_store_inode` on what they opened) before they read, write or list.

What a store holds is a set of paths, each a file or a directory whose whole
content is the store's (the JSONL directory, SQLite's wake-up directory); a
path at or under one of them is refused however it is spelt:

- by path, both as written and with links resolved, compared case-folded:
  on a case-insensitive filesystem `DURAGENT.DB` is the store, and refusing
  it on a case-sensitive one too costs nothing;
- by (st_dev, st_ino), so a hard link (or a bind mount) is the same file.

The paths are checked at each call, not when the store opened: SQLite makes
its `-wal` and `-shm` files later, and a file may be replaced meanwhile.

This is the one piece of process-wide state: the tools and the stores are
built apart (a toolset never sees the Runtime), and which files are a store's
is a fact about the process, not about one runtime.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

_lock = threading.Lock()
_held: dict[int, tuple[str, ...]] = {}  # Held's id -> the absolute paths it holds


@dataclass(eq=False)
class Held:
    """The paths one open store holds; `release()` when the store closes."""

    paths: tuple[str, ...]

    def release(self) -> None:
        with _lock:
            _held.pop(id(self), None)


def hold(paths: Iterable[str]) -> Held:
    """Keep the tools off `paths` (files, or directories with all they contain)."""
    held = Held(tuple(os.path.abspath(p) for p in paths))
    with _lock:
        _held[id(held)] = held.paths
    return held


def sqlite_paths(db_path: str) -> list[str]:
    """A SQLite store's files: the database, its journals, its wake-up directory."""
    from duragent.store._sqlite_wake import wake_dir

    if db_path == ":memory:" or db_path.startswith("file:"):
        return []
    out = []
    for base in dict.fromkeys((os.path.abspath(db_path), os.path.realpath(db_path))):
        out += [base, f"{base}-wal", f"{base}-shm", f"{base}-journal", wake_dir(base)]
    return out


def _key(path: str) -> str:
    return os.path.normcase(path).casefold()


def _inode(path: str, follow: bool = True) -> tuple[int, int] | None:
    try:
        st = os.stat(path, follow_symlinks=follow)
    except (OSError, ValueError):
        return None
    return (st.st_dev, st.st_ino)


@dataclass(frozen=True)
class StoreFiles:
    """What the open stores hold, looked at once (a listing asks for each entry)."""

    keys: frozenset[str]  # every held path, as held and resolved, case-folded
    inodes: frozenset[tuple[int, int]]  # those that exist

    def cover(self, path: str | os.PathLike[str]) -> bool:
        """Whether `path` is, or is inside, one of them, however it is spelt."""
        if not self.keys:
            return False
        given = os.path.abspath(path)
        for spelling in dict.fromkeys((given, os.path.realpath(given))):
            for p in _self_and_parents(spelling):
                if _key(p) in self.keys:
                    return True
                # lstat for the path as given: a link *to* the store is caught by
                # its resolved spelling; here only a hard link (the same inode) counts.
                ino = _inode(p, follow=p != given)
                if ino is not None and ino in self.inodes:
                    return True
        return False


def store_files() -> StoreFiles:
    """The files of every store this process has open, now."""
    with _lock:
        paths = [p for held in _held.values() for p in held]
    keys: set[str] = set()
    inodes: set[tuple[int, int]] = set()
    for p in paths:
        keys.add(_key(p))
        keys.add(_key(os.path.realpath(p)))
        if (ino := _inode(p)) is not None:
            inodes.add(ino)
    return StoreFiles(frozenset(keys), frozenset(inodes))


def _self_and_parents(path: str) -> Iterator[str]:
    while True:
        yield path
        parent = os.path.dirname(path)
        if parent == path:
            return
        path = parent


def is_store_path(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is, or is inside, a file or directory of a store this process has open."""
    return store_files().cover(path)


def is_store_inode(fd: int) -> bool:
    """Whether the open file `fd` is one of a store's (checked after opening: a
    link swapped in between the path's check and the open is caught here)."""
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino) in store_files().inodes
