"""A conversation (session) as its owner sees it: its turns, its transcript, the next turn.

A session is the tasks one owner started under one `session_id` (no owner
and the empty owner are one owner, as in `session_scope`); each top-level
task is a turn, its sub-tasks are not. `continue_session` is `submit` with
`continue_session=True`: a new turn that starts from the conversation so
far, or, while a turn still runs, a message into it (runtime/_sending.py).
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from duragent.errors import SessionNotFound
from duragent.store._commits import TaskQuery
from duragent.store._views import build_model_view
from duragent.types import API_KINDS, ApiMessage, EntryKind, Task, TaskStatus

if TYPE_CHECKING:
    from duragent.store._protocol import Store

ALL = list(TaskStatus)
MAX_TURNS = 1000  # the turns one session read returns (the latest ones)


@dataclass
class SessionSummary:
    """One session in a listing: how many turns, the latest one and its status."""

    session_id: str
    owner: str | None
    turns: int
    started_at: datetime
    updated_at: datetime
    latest_task_id: str
    latest_status: TaskStatus


@dataclass
class Session:
    """A session's turns (oldest first) and its transcript: what was said in each
    turn, in order (each turn's own messages; the history a turn was started from
    is the turns before it, so it is not repeated)."""

    session_id: str
    owner: str | None
    tasks: list[Task]
    transcript: list[ApiMessage]


async def full_messages(store: Store, task_id: str) -> builtins.list[ApiMessage]:
    """A task's API messages as if it had never compacted (rollbacks still void):
    what a session's transcript shows and what its next turn starts from. The
    model's view (`model_view`) may stand a summary for the older ones."""
    kinds = [*API_KINDS, EntryKind.ROLLBACK]
    rows = [
        (e.seq, e.kind.value, json.dumps(e.payload, ensure_ascii=False))
        for e in await store.entries(task_id, kinds=kinds)
    ]
    return build_model_view(rows)


def _owners(owner: str | None) -> list[str | None]:
    return [owner] if owner else [None, ""]


class Sessions:
    """Mixed into Runtime (_runtime.py), whose store and `submit` these use."""

    store: Store

    if TYPE_CHECKING:

        async def _session_tasks(
            self, session_id: str, owner: str | None, status: Sequence[TaskStatus], limit: int
        ) -> builtins.list[Task]: ...

    async def sessions(self, *, owner: str | None = None) -> builtins.list[SessionSummary]:
        """The owner's sessions (no owner: the sessions of tasks without one), the
        most recently active first."""
        turns: dict[str, builtins.list[Task]] = {}
        for one in _owners(owner):
            cursor = None
            while True:
                page = await self.store.list_tasks(
                    TaskQuery(owner=one, no_owner=one is None, limit=500, cursor=cursor)
                )
                for t in page.tasks:
                    if t.session_id is not None and t.parent_id is None:
                        turns.setdefault(t.session_id, []).append(t)
                cursor = page.next_cursor
                if cursor is None:
                    break
        out = []
        for session_id, tasks in turns.items():
            tasks.sort(key=lambda t: t.created_at)
            latest = tasks[-1]
            out.append(
                SessionSummary(
                    session_id=session_id,
                    owner=latest.owner or None,
                    turns=len(tasks),
                    started_at=tasks[0].created_at,
                    updated_at=max(t.updated_at for t in tasks),
                    latest_task_id=latest.id,
                    latest_status=latest.status,
                )
            )
        out.sort(key=lambda s: s.updated_at, reverse=True)
        return out

    async def _turns(self, session_id: str, owner: str | None) -> builtins.list[Task]:
        found = await self._session_tasks(session_id, owner, ALL, MAX_TURNS)
        turns = sorted((t for t in found if t.parent_id is None), key=lambda t: t.created_at)
        if not turns:
            raise SessionNotFound(session_id)
        return turns

    async def session(self, session_id: str, *, owner: str | None = None) -> Session:
        """The session's turns and transcript; another owner's session is not found."""
        turns = await self._turns(session_id, owner)
        transcript: builtins.list[ApiMessage] = []
        for task in turns:
            view = await full_messages(self.store, task.id)
            copied = task.config.get("continues_session")
            own = view[copied:] if isinstance(copied, int) else view
            transcript += [m for m in own if m.role != "system"]
        return Session(session_id, turns[-1].owner or None, turns, transcript)
