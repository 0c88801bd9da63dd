"""The HTTP service (needs the `server` extra: pip install 'duragent[server]')."""

from __future__ import annotations

from duragent.errors import MissingExtra

try:
    import fastapi  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised without the extra installed
    raise MissingExtra("the HTTP service", "server") from exc

from duragent.server._app import create_app
from duragent.server._auth import TokenStore
from duragent.server._limits import ServerLimits
from duragent.server._token_file import WatchedTokenFile

__all__ = ["ServerLimits", "TokenStore", "WatchedTokenFile", "create_app"]
