"""A tokens file that is read again when it changes, so a removed token stops working
without a restart."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from duragent.errors import UsageError
from duragent.server._auth import TokenStore

log = logging.getLogger("duragent.server")

Stamp = tuple[int, int, int]


class WatchedTokenFile:
    """Who a bearer token belongs to, by the tokens file as it is now.

    Each lookup compares the file's inode, size and modification time (one
    `stat`) with those it was read at, and reads it again when they differ. A
    file that became unreadable, invalid or empty signs everyone out until it
    is fixed: a half-edited file must not keep a revoked token alive.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._tokens = TokenStore.load(self.path)  # startup: a bad file is an error
        self._stamp = self._stat()

    def _stat(self) -> Stamp | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def _refresh(self) -> None:
        stamp = self._stat()
        if stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            self._tokens = TokenStore.load(self.path)
        except UsageError as exc:
            self._tokens = TokenStore()
            log.error("%s; every token is refused until the file is fixed", exc)
            return
        log.info("tokens file re-read: %d users", len(self._tokens.users))

    def user_for(self, token: str) -> str | None:
        self._refresh()
        return self._tokens.user_for(token)

    @property
    def users(self) -> list[str]:
        self._refresh()
        return self._tokens.users

    def __len__(self) -> int:
        return len(self._tokens)
