"""Wake-ups between the processes that share one SQLite file.

SQLite tells no one about a commit, so each process that waits binds a unix
datagram socket and registers it as a file in a directory next to the
database (`.<db name>.wake/<token>.<w|c>`); a process that commits sends one small
datagram to every registered socket. Nothing polls: a waiter sleeps in the
event loop until a datagram arrives.

- `.w` waiters (workers) hear only commits that may make work claimable and
  control requests (pause/abort) for a task; `.c` waiters hear every commit.
- A message is `w` (work) or `c` (another change), then one line per task a
  control request was set on, then `=<sender token> <n>` (the sender's n-th
  message) and `+<id>` per task the commit wrote or deleted (`*` when too many
  to list). A receiver that finds a sender's n skip a number, or a message
  without `=` (from an older version), tells `watch_tasks` None: re-read all.
  A `.c` peer whose full queue refused a message is sent `*` once it takes
  one: a later message may never come, and one that does shows no gap to a
  receiver that had heard nothing from the sender before.
- A registration whose socket refuses datagrams is removed by the first
  sender that finds its process gone (the token ends with the pid); a
  refusal alone may mean a peer in another network namespace. A process also
  re-creates its own registration, should it have been removed, at each wait.
  A full receive queue drops the datagram: the receiver has wake-ups pending
  anyway, and a dropped control request is still seen at the worker's next
  lease renewal.
- A receiver reads at most `_DRAIN_MAX` datagrams per wake-up, so a flood
  cannot starve the event loop (and the heartbeat that keeps its leases).

The registration file is the socket itself, inside the 0700 directory, when
its path is short enough for a socket address: only the directory's owner
can send. Otherwise, on Linux only, the socket lives in the abstract namespace
(no access control) and its registration is a plain file named `@<token>.<w|c>`.
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
# sun_path holds 104-108 bytes depending on the system, with its final NUL.
_MAX_PATH = 107 if _ABSTRACT else 100

# A listing of the directory is trusted while the directory's mtime is the
# same, unless the listing was taken so soon after that mtime that another
# registration in the same timestamp tick could hide behind it.
_RACY_NS = 100_000_000

# Datagrams read per wake-up; the rest wait for the loop's next turn.
_DRAIN_MAX = 256

# Task ids listed in one message at most (in bytes); past it, `*`: re-read all.
_IDS_MAX = 32_000

# (work, change, controlled task ids, moved task ids or None: unknown)
OnMessage = Callable[[bool, bool, list[str], "frozenset[str] | None"], None]

# After a failed registration, waits poll; a new attempt is made this often.
_RETRY_S = 30.0

# A peer whose full queue refused a message is sent `*` this long after, and
# again as long as its queue is full.
_OWED_S = 0.05

log = logging.getLogger("duragent.store")


def wake_dir(db_path: str) -> str:
    """The directory of the wake-ups between the processes that share `db_path`."""
    # Hidden, and not named like the database: `cp agent.db*` copies files only.
    head, name = os.path.split(os.path.abspath(db_path))
    return os.path.join(head, f".{name}.wake")


class WakeUps:
    """One store's end of the wake-ups: a receiving socket, and sends to the others."""

    def __init__(self, db_path: str) -> None:
        # An in-memory database or a URI names no file to put a folder next to.
        self._plain_file = db_path != ":memory:" and not db_path.startswith("file:")
        self.dir = wake_dir(db_path)
        # The pid tells a sender whether a refusing peer is gone (see announce).
        self.token = f"{uuid.uuid4().hex[:16]}-{os.getpid()}"  # short: see _MAX_PATH
        self._prefix = ""  # "@" when the socket is in the abstract namespace
        self.kind = ""  # "", "w" or "c": what this process registered to hear
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_message: OnMessage | None = None
        self._sent = 0  # messages sent (each carries its number: receivers see gaps)
        self._heard_from: dict[str, int] = {}  # sender token -> its last message's number
        self._sender: socket.socket | None = None
        self._owed: set[str] = set()  # `.c` peers whose full queue refused a message
        self._paying: asyncio.TimerHandle | None = None
        # Registrations made (a removed one made anew counts): what went to the
        # process between two of them went unheard.
        self.registrations = 0
        self._paying_on: asyncio.AbstractEventLoop | None = None  # the loop it runs on
        self._peers: list[str] = []
        self._listed: tuple[int, int] | None = None  # (dir mtime, when listed), ns
        self._retry_at = 0.0  # monotonic: no new registration attempt before
        self._warned = False
        self._closed = False  # for good: nothing binds or sends after close()

    @property
    def possible(self) -> bool:
        return self._plain_file and (_ABSTRACT or self._fits)

    @property
    def _fits(self) -> bool:
        return len(os.fsencode(os.path.join(self.dir, self.token + ".c"))) <= _MAX_PATH

    def _registration(self, kind: str) -> str:
        return os.path.join(self.dir, f"{self._prefix}{self.token}.{kind}")

    @property
    def listening(self) -> bool:
        return self._sock is not None

    # --- receiving ---

    def listen(self, on_message: OnMessage, *, changes: bool) -> bool:
        """Register to hear work and control requests, and every change if `changes`.

        `on_message(work, change, controlled_task_ids, moved_task_ids)` runs on the calling
        event loop. Returns whether this process now hears other processes.
        """
        if not self.possible or self._closed:
            return False
        loop = asyncio.get_running_loop()
        if self._sock is not None and self._loop is not loop:
            self._unlisten()
        self._on_message = on_message
        want = "c" if changes or self.kind == "c" else "w"
        if self._sock is not None and want == self.kind:
            if os.path.lexists(self._registration(want)):
                return True
            self._unlisten()  # someone removed it: register anew
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
            if self._fits:
                # The registration file is the socket: bind it under the final
                # name only once it is registered (see _register).
                self._prefix = ""
                sock.bind(os.path.join(self.dir, f".{self.token}"))
            else:
                self._prefix = "@"
                sock.bind(f"\0duragent-wake-{self.token}")
        except OSError:
            sock.close()
            raise
        self._sock, self._loop = sock, loop
        loop.add_reader(sock.fileno(), self._drain)

    def _register(self, kind: str) -> None:
        """Make the registration say `kind`, atomically (a rename)."""
        old = self._registration(self.kind) if self.kind else None
        new = self._registration(kind)
        if old is not None:
            os.replace(old, new)
        elif self._prefix:
            fd = os.open(new, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.close(fd)
        else:
            os.replace(os.path.join(self.dir, f".{self.token}"), new)
        self.kind = kind
        self.registrations += 1

    def _drain(self) -> None:
        assert self._sock is not None
        work = change = False
        controlled: list[str] = []
        moved: set[str] | None = set()
        for _ in range(_DRAIN_MAX):
            try:
                data = self._sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                break
            head, *lines = data.decode("utf-8", "replace").split("\n")
            work = work or head == "w"
            change = True
            ids = self._moved(lines)
            moved = None if ids is None or moved is None else moved | ids
            controlled += [i for i in lines if i and i[0] not in "=+*"]
        if change and self._on_message is not None:
            self._on_message(work, change, controlled, None if moved is None else frozenset(moved))

    def _moved(self, lines: list[str]) -> set[str] | None:
        """The tasks a message says moved; None when it cannot say, or when a
        message from its sender went missing (a full queue drops datagrams)."""
        mark = next((line for line in lines if line.startswith("=")), None)
        if mark is None or "*" in lines:
            return None
        token, _, n = mark[1:].partition(" ")
        if not n.isdigit():
            return None
        last = self._heard_from.get(token)
        self._heard_from[token] = int(n)
        if last is not None and int(n) != last + 1:
            return None
        return {line[1:] for line in lines if line.startswith("+")}

    def _unlisten(self) -> None:
        sock, self._sock = self._sock, None
        if sock is None:
            return
        if self._loop is not None and not self._loop.is_closed():
            with contextlib.suppress(Exception):
                self._loop.remove_reader(sock.fileno())
        sock.close()
        if self.kind or not self._prefix:
            with contextlib.suppress(OSError):
                os.unlink(self._registration(self.kind) if self.kind else self._unregistered)
        self.kind = ""

    @property
    def _unregistered(self) -> str:
        return os.path.join(self.dir, f".{self.token}")

    def close(self) -> None:
        """Stop hearing and sending, for good: a commit settled after this on
        another thread's loop must not open a socket nobody closes."""
        self._closed = True
        self._unlisten()
        if self._paying is not None:
            self._paying.cancel()
            self._paying = None
        if self._sender is not None:
            self._sender.close()
            self._sender = None

    # --- sending ---

    def announce(
        self, *, work: bool, controlled: Iterable[str] = (), tasks: Iterable[str] | None = None
    ) -> None:
        """Tell every other registered process about a commit (never blocks):
        whether it made work, the tasks it set a control request on, the tasks
        it wrote or deleted (None: not known)."""
        if not self._plain_file or self._closed:
            return
        peers = self._current_peers()
        if not peers:
            return
        ids = list(controlled)
        self._sent += 1
        moved = [f"+{i}" for i in tasks] if tasks is not None else ["*"]
        if sum(len(m) + 1 for m in moved) > _IDS_MAX:
            moved = ["*"]
        mark = f"={self.token} {self._sent}"
        for_all = "\n".join(["w" if work else "c", *ids, mark, *moved]).encode()
        if self._sender is None:
            self._sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sender.setblocking(False)
        for name in peers:
            base, _, kind = name.rpartition(".")
            token = base.removeprefix("@")
            if token == self.token or (kind == "w" and not work and not ids):
                continue
            try:
                self._sender.sendto(for_all, self._address(name))
            except BlockingIOError:
                if kind == "c":  # a task it watches may have moved: see _pay
                    self._owe(name)
            except ConnectionRefusedError:
                # Nothing listens there, from here. Its process may live in
                # another network namespace: forget it, for everyone, only
                # once its process is gone.
                if _gone(token):
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(self.dir, name))
            except OSError:
                pass  # removed already, or its queue is full: it has wake-ups pending

    def _owe(self, name: str) -> None:
        """`name` missed a message (its queue was full): it is sent `*` (re-read
        all) once it takes one. The lost message may be a task's last commit,
        and our next one shows no gap to a peer that had not heard us before."""
        self._owed.add(name)
        if self._paying is None or self._paying_on is None or self._paying_on.is_closed():
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # no loop to come back on: the peer waits for our next message
            self._paying, self._paying_on = loop.call_later(_OWED_S, self._pay), loop

    def _pay(self) -> None:
        self._paying = None
        if self._closed or self._sender is None:
            return
        data = f"c\n={self.token} {self._sent}\n*".encode()
        for name in list(self._owed):
            try:
                self._sender.sendto(data, self._address(name))
            except BlockingIOError:
                continue  # still full
            except OSError:
                pass  # gone
            self._owed.discard(name)
        if self._owed:
            self._paying = asyncio.get_running_loop().call_later(_OWED_S, self._pay)

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

    def _address(self, name: str) -> str:
        base = name.rpartition(".")[0]
        if base.startswith("@") or (_ABSTRACT and "-" not in base):
            # In the abstract namespace (a token without a pid: an older version's).
            return f"\0duragent-wake-{base.removeprefix('@')}"
        return os.path.join(self.dir, name)


def _gone(token: str) -> bool:
    """Whether the process that registered `token` has exited."""
    pid = token.rpartition("-")[2]
    if not pid.isdigit():
        return True  # an older version's registration: refusal meant gone
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # alive, another user's
    return False
