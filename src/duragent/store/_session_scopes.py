"""Migration to per-owner session scopes (schema version 2), shared by every backend.

Before version 2 a session document's scope was `session:<session id>`, shared by
every owner who named that id. Each such document now goes to the one owner
whose tasks use the session. A session whose tasks belong to several owners (or
to none) cannot say whose the document is: it may hold another owner's writes,
so it is handed to nobody and kept, for an operator, under
`legacy-session:<session id>`.
"""

from __future__ import annotations

from collections.abc import Iterable

from duragent.types import session_scope

LEGACY_PREFIX = "session:"
UNCLAIMED_PREFIX = "legacy-session:"


def migrated_scope(session_id: str, owners: Iterable[str | None]) -> str:
    """Where a version-1 session document goes, given the owners of its session's tasks."""
    distinct = {owner or "" for owner in owners}
    if len(distinct) == 1:
        return session_scope(distinct.pop(), session_id)
    return UNCLAIMED_PREFIX + session_id
