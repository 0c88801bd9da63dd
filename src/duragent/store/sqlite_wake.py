"""Wake-ups between the processes that share one SQLite file.

SQLite tells no one about a commit, so each process that waits binds a unix
datagram socket and registers it as a file in a directory next to the
database (`.<db name>.wake/<token>.<w|c>`); a process that commits sends one small
datagram to every registered socket. Nothing polls: a waiter sleeps in the
event loop until a datagram arrives.

- `.w` waiters (workers) hear only commits that may make work claimable and
  control requests (pause/abort) for a task; `.c` waiters hear every commit.
- A message is `w` (work) or `c` (another change), then one line per task a
  control request was set on.
- A registration whose socket is gone (its process died) is removed by the
  first sender that finds it unreachable. A full receive queue drops the
  datagram: the receiver has wake-ups pending anyway, and a dropped control
  request is still seen at the worker's next lease renewal.

On Linux the sockets live in the abstract namespace (no path length limit, no
file left behind); elsewhere the registration file is the socket itself, when
its path is short enough for a socket address.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys
import time
import uuid
from collections.abc import Callable, Iterable

_ABSTRACT = sys.platform.startswith("linux")
_MAX_PATH = 100  # sun_path holds 104-108 bytes depending on the system

# A listing of the directory is trusted while the directory's mtime is the
# same, unless the listing was taken so soon after that mtime that another
# registration in the same timestamp tick could hide behind it.
_RACY_NS = 100_000_000

# After a failed registration, waits poll; a new attempt is made this often.
_RETRY_S = 30.0

log = logging.getLogger("duragent.store")


class WakeUps:
    """One store's end of the wake-ups: a receiving socket, and sends to the others."""

    def __init__(self, db_path: str) -> None:
        # Hidden, and not named like the database: `cp agent.db*` copies files only.
        head, name = os.path.split(os.path.abspath(db_path))
        self.dir = os.path.join(head, f".{name}.wake")
        self.token = uuid.uuid4().hex
        self.kind = ""  # "", "w" or "c": what this process registered to hear
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_message: Callable[[bool, bool, list[str]], None] | None = None
        self._sender: socket.socket | None = None
        self._peers: list[str] = []
        self._listed: tuple[int, int] | None = None  # (dir mtime, when listed), ns
        self._retry_at = 0.0  # monotonic: no new registration attempt before
        self._warned = False

    @property
    def possible(self) -> bool:
        return _ABSTRACT or len(os.path.join(self.dir, self.token + ".c")) <= _MAX_PATH

    @property
    def listening(self) -> bool:
        return self._sock is not None

    # --- receiving ---

    def listen(self, on_message: Callable[[bool, bool, list[str]], None], *, changes: bool) -> bool:
        """Register to hear work and control requests, and every change if `changes`.

        `on_message(work, change, controlled_task_ids)` runs on the calling
        event loop. Returns whether this process now hears other processes.
        """
        if not self.possible:
            return False
        loop = asyncio.get_running_loop()
        if self._sock is not None and self._loop is not loop:
            self._unlisten()
        self._on_message = on_message
        want = "c" if changes or self.kind == "c" else "w"
        if self._sock is not None and want == self.kind:
            return True
        if time.monotonic() < self._retry_at:
            return False
        try:
            if self._sock is None:
                self._bind(loop)
            self._register(want)
        except OSError as exc:
            # The wake directory cannot be written (another user's 0700
            # directory, a read-only or full disk, no file descriptor left):
            # wake-ups are an optimisation, the caller polls instead.
            self._unlisten()
            self._retry_at = time.monotonic() + _RETRY_S
            if not self._warned:
                self._warned = True
                log.warning("no wake-ups through %s (%s): polling instead", self.dir, exc)
            return False
        return True

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.setblocking(False)
            address = self._address(self.token, "w")
            if not _ABSTRACT:
                # The registration file is the socket: bind it under the final
                # name only once it is registered (see _register).
                address = os.path.join(self.dir, f".{self.token}")
            sock.bind(address)
        except OSError:
            sock.close()
            raise
        self._sock, self._loop = sock, loop
        loop.add_reader(sock.fileno(), self._drain)

    def _register(self, kind: str) -> None:
        """Make the registration say `kind`, atomically (a rename)."""
        old = os.path.join(self.dir, f"{self.token}.{self.kind}") if self.kind else None
        new = os.path.join(self.dir, f"{self.token}.{kind}")
        if old is not None:
            os.replace(old, new)
        elif _ABSTRACT:
            fd = os.open(new, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.close(fd)
        else:
            os.replace(os.path.join(self.dir, f".{self.token}"), new)
        self.kind = kind

    def _drain(self) -> None:
        assert self._sock is not None
        work = change = False
        controlled: list[str] = []
        while True:
            try:
                data = self._sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                break
            head, *ids = data.decode("utf-8", "replace").split("\n")
            work = work or head == "w"
            change = True
            controlled += [i for i in ids if i]
        if change and self._on_message is not None:
            self._on_message(work, change, controlled)

    def _unlisten(self) -> None:
        sock, self._sock = self._sock, None
        if sock is None:
            return
        if self._loop is not None and not self._loop.is_closed():
            with contextlib.suppress(Exception):
                self._loop.remove_reader(sock.fileno())
        sock.close()
        if self.kind:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.dir, f"{self.token}.{self.kind}"))
        self.kind = ""

    def close(self) -> None:
        self._unlisten()
        if self._sender is not None:
            self._sender.close()
            self._sender = None

    # --- sending ---

    def announce(self, *, work: bool, controlled: Iterable[str] = ()) -> None:
        """Tell every other registered process about a commit (never blocks)."""
        peers = self._current_peers()
        if not peers:
            return
        ids = list(controlled)
        for_all = "\n".join(["w" if work else "c", *ids]).encode()
        if self._sender is None:
            self._sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sender.setblocking(False)
        for name in peers:
            token, _, kind = name.partition(".")
            if token == self.token or (kind == "w" and not work and not ids):
                continue
            try:
                self._sender.sendto(for_all, self._address(token, kind))
            except (ConnectionRefusedError, FileNotFoundError):
                # Its process is gone: forget it, for everyone.
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(self.dir, name))
            except OSError:
                pass  # its queue is full: it has wake-ups pending already

    def _current_peers(self) -> list[str]:
        try:
            mtime = os.stat(self.dir).st_mtime_ns
        except OSError:
            self._peers, self._listed = [], None
            return []
        if self._listed is None or self._listed[0] != mtime or self._listed[1] - mtime < _RACY_NS:
            try:
                names = os.listdir(self.dir)
            except OSError:
                names = []
            self._peers = [n for n in names if n.endswith((".w", ".c")) and "." in n]
            self._listed = (mtime, time.time_ns())
        return self._peers

    def _address(self, token: str, kind: str) -> str:
        if _ABSTRACT:
            return f"\0duragent-wake-{token}"
        return os.path.join(self.dir, f"{token}.{kind}")
