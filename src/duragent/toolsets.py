"""Small built-in toolsets, for `duragent run` and for agents that want them.

Everything that bounds these tools is fixed when the toolset is built, by
whoever runs the worker, and never read from a task's `context` (API clients
write it): the file tools' root directory, the network policy, and which tools
may run without asking the user first. Each task records them as its pin
(runtime/_pins.py); a worker whose toolset differs does not run it.

File tools only touch paths inside the root: `..` is refused, and a path is
resolved (symlinks included) before it is checked, so a link inside the root
cannot lead out of it. They never touch a store this process has open (its
database, journals, wake-up directory, JSONL log and lock, on any spelling:
see store/_open_files.py): `list_dir` leaves those out and the others refuse.
What they answer (results and errors alike, which API users read) names paths
relative to the root only: never the server's absolute paths, nor where a link
points. Reading, listing and fetching are replay-safe; writing is never re-run
after a crash. Each tool asks for approval unless its permission ("read",
"write", "http") is allowed for the run.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import os
import stat
from collections.abc import Callable, Iterable
from pathlib import Path, PurePath
from typing import TypeVar

from duragent._fetch import NetworkPolicy, fetch
from duragent.errors import UsageError
from duragent.runtime._tools import Tool, tool
from duragent.store._open_files import is_store_inode, is_store_path, store_files

T = TypeVar("T")

WORKDIR_KEY = "workdir"  # `duragent run` also names its root in the context, for people
MAX_CHARS = 20_000
MOST_CHARS = 200_000  # whatever a model asks for, a file is read (a page kept) no further
MAX_ENTRIES = 500
PERMISSIONS = ("read", "write", "http")

TOOLSETS: dict[str, tuple[str, ...]] = {
    "default": ("read_file", "list_dir", "write_file", "http_get"),
    "readonly": ("read_file", "list_dir", "http_get"),
    "none": (),
}
_PERMISSION = {"read_file": "read", "list_dir": "read", "write_file": "write", "http_get": "http"}


def check_permissions(names: Iterable[str]) -> frozenset[str]:
    """The permissions named, each one checked."""
    given = frozenset(n.strip() for n in names if n.strip())
    unknown = sorted(given - set(PERMISSIONS))
    if unknown:
        raise UsageError(
            f"unknown permission {', '.join(unknown)}; choose from: {', '.join(PERMISSIONS)}"
        )
    return given


def inside(root: Path, path: str) -> Path:
    """`path` (relative to `root`) resolved, if it stays inside `root` (already resolved)
    and is none of an open store's files."""
    if ".." in PurePath(path).parts:
        raise PermissionError(f"{path!r} is outside the working directory: '..' is not allowed")
    target = (root / path).resolve()  # resolves symlinks before the check
    if not target.is_relative_to(root):
        raise PermissionError(f"{path!r} is outside the working directory")
    if is_store_path(root / path) or is_store_path(target):
        raise _store_refusal(_shown(root, path))
    return target


def _store_refusal(path: str) -> PermissionError:
    return PermissionError(f"{path!r} is duragent's task store: no tool may read, write or list it")


def _shown(root: Path, path: str) -> str:
    """`path` as the model may see it: relative to the root."""
    if not os.path.isabs(path):
        return path
    return os.path.relpath(os.path.abspath(path), root)


def _relative(root: Path, path: str, exc: OSError) -> OSError:
    """`exc` naming `path` relative to the root: an OSError's text names the
    absolute path it was raised for, and a tool's error reaches API users."""
    if exc.errno is None:  # raised here, with its own message
        return exc
    return type(exc)(f"{_shown(root, path)!r}: {exc.strerror or os.strerror(exc.errno)}")


async def _on_file(root: Path, path: str, act: Callable[[Path], T]) -> T:
    """`act(target)` in a thread, for `path` checked by `inside`; OS errors name
    `path` relative to the root."""
    try:
        return await asyncio.to_thread(act, inside(root, path))
    except OSError as exc:
        raise _relative(root, path, exc) from None


def _clip(text: str, limit: int) -> str:
    limit = max(0, min(limit, MOST_CHARS))
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... {len(text) - limit} more characters not shown]"


def _open_regular(target: Path, flags: int, mode: int = 0o644) -> int:
    """An open descriptor on `target`, refused unless it is a regular file.

    O_NOFOLLOW: a link put in place after the check is refused, not followed.
    O_NONBLOCK: opening a FIFO (or a device) would otherwise wait, for good, for
    the other end; the check comes after the open, so the open must not block.
    """
    refused = PermissionError(f"{target.name!r} is not a regular file")
    try:
        fd = os.open(target, flags | os.O_NOFOLLOW | os.O_NONBLOCK, mode)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a FIFO nobody reads, opened for writing
            raise refused from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise refused
        if is_store_inode(fd):  # a hard link made, or a file swapped in, since the check
            raise _store_refusal(target.name)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_text(target: Path, max_chars: int) -> str:
    with os.fdopen(_open_regular(target, os.O_RDONLY), "rb") as f:
        # Enough bytes for max_chars characters and one more (never all: read(-1) is all).
        data = f.read(max(0, min(max_chars, MOST_CHARS)) * 4 + 4)
    return _clip(data.decode("utf-8", errors="replace"), max_chars)


def _write_text(target: Path, content: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    # Truncated only once it is known to be a regular file (O_TRUNC would act on open).
    fd = _open_regular(target, os.O_WRONLY | os.O_CREAT)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.truncate(0)
        f.write(content)


def _listing(target: Path) -> str:
    lines = []
    # A store's files are left out, as if they were not there.
    held = store_files()
    entries = (e for e in sorted(target.iterdir(), key=lambda p: p.name) if not held.cover(e))
    for entry in itertools.islice(entries, MAX_ENTRIES):
        # Links are shown as links, never followed, and where they lead is not
        # said: it may be outside the root.
        info = entry.lstat()
        if stat.S_ISLNK(info.st_mode):
            lines.append(f"{entry.name}  (link)")
        elif stat.S_ISDIR(info.st_mode):
            lines.append(f"{entry.name}/")
        else:
            lines.append(f"{entry.name}  ({info.st_size} bytes)")
    return "\n".join(lines) or "(empty)"


def _build(name: str, root: Path, network: NetworkPolicy, ask: bool) -> Tool:
    if name == "read_file":

        async def read_file(path: str, max_chars: int = MAX_CHARS) -> str:
            """Read a text file in the working directory.

            Args:
                path: the file, relative to the working directory
                max_chars: show at most this many characters
            """
            return await _on_file(root, path, lambda target: _read_text(target, max_chars))

        return tool(name=name, replay="safe", requires_approval=ask)(read_file)
    if name == "list_dir":

        async def list_dir(path: str = ".") -> str:
            """List a directory in the working directory: sub-directories end with '/'.

            A link shows as `name  (link)` and is not followed.

            Args:
                path: the directory, relative to the working directory
            """
            return await _on_file(root, path, _listing)

        return tool(name=name, replay="safe", requires_approval=ask)(list_dir)
    if name == "write_file":

        async def write_file(path: str, content: str) -> str:
            """Write a text file in the working directory (replacing it).

            Args:
                path: the file, relative to the working directory
                content: the whole new text of the file
            """
            await _on_file(root, path, lambda target: _write_text(target, content))
            return f"wrote {len(content)} characters to {_shown(root, path)}"

        return tool(name=name, requires_approval=ask)(write_file)

    async def http_get(url: str, max_chars: int = MAX_CHARS) -> str:
        """Fetch a web page or API response with HTTP GET.

        Args:
            url: an http:// or https:// address
            max_chars: show at most this many characters of the body
        """
        got = await fetch(url, network)
        head = f"HTTP {got.status} {got.content_type}".strip()
        text = head + "\n\n" + _clip(got.text, max_chars)
        if got.truncated:
            cap = network.max_bytes
            text += f"\n[the response is longer than {cap} bytes; the rest was not read]"
        return text

    return tool(name=name, replay="safe", timeout=network.timeout * 2, requires_approval=ask)(
        http_get
    )


def toolset(
    name: str,
    *,
    root: str | Path | None = None,
    network: NetworkPolicy | None = None,
    allow: Iterable[str] = (),
) -> list[Tool]:
    """The tools of a named toolset ("default", "readonly", "none").

    `root` is the only directory the file tools touch (default: the current
    directory, now); `network` is where `http_get` may connect (default: public
    addresses only); `allow` names the permissions ("read", "write", "http")
    whose tools run without asking the user first.
    """
    try:
        names = TOOLSETS[name]
    except KeyError:
        known = ", ".join(TOOLSETS)
        raise UsageError(f"no toolset named {name!r}; choose one of: {known}") from None
    allowed = check_permissions(allow)
    base = Path(root if root is not None else os.getcwd()).expanduser().resolve()
    if names and not base.is_dir():
        raise UsageError(f"the file tools' root {str(base)!r} is not a directory")
    policy = network or NetworkPolicy()
    # Pinned on every task of an agent with these tools (runtime/_pins.py).
    reach = {
        "workdir": str(base),
        "allow": sorted(allowed),
        "private_network": policy.allow_private,
    }
    tools = [_build(n, base, policy, _PERMISSION[n] not in allowed) for n in names]
    for t in tools:
        t.reach = reach
    return tools
