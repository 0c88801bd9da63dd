"""The HTTP service (needs the `server` extra: pip install 'duragent[server]')."""

from __future__ import annotations

from duragent.errors import MissingExtra

try:
    import fastapi  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised without the extra installed
    raise MissingExtra("the HTTP service", "server") from exc

from duragent.server.app import create_app
from duragent.server.auth import TokenStore
from duragent.server.limits import ServerLimits
from duragent.server.token_file import WatchedTokenFile

__all__ = ["ServerLimits", "TokenStore", "WatchedTokenFile", "create_app"]
