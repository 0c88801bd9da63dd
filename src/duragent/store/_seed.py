"""Seed 000's PersistenceManager operations, each one call over a Store.

For users migrating from a save/load persistence interface: every operation
maps onto the commit log without breaking its rules. "Replacing" a message
list never deletes: it appends a rollback marker voiding the old entries,
then appends the new ones, in one commit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from duragent._payloads import VoidScope, rollback_marker
from duragent.errors import Conflict, TaskNotFound
from duragent.store._commits import Commit, TaskPatch, TaskQuery
from duragent.store._protocol import Store
from duragent.types import (
    API_MESSAGE,
    UI_MESSAGE,
    ApiMessage,
    EntryKind,
    NewEntry,
    Task,
    UIMessage,
    dump_message,
)


def _api_entry(task_id: str, message: ApiMessage) -> NewEntry:
    return NewEntry(task_id=task_id, kind=EntryKind.API_MESSAGE, payload=dump_message(message))


def _void(task_id: str, last_seq: int, scope: VoidScope) -> NewEntry:
    kind = EntryKind.ROLLBACK if scope == "api" else EntryKind.UI_MESSAGE
    payload = rollback_marker(scope, 1, last_seq, "replaced")
    return NewEntry(task_id=task_id, kind=kind, payload=payload)


class SeedPersistence:
    """save/load/update/delete/list of task state, API messages, UI messages and task input."""

    def __init__(self, store: Store) -> None:
        self.store = store

    # task state
    async def save_task_state(self, task: Task) -> Task:
        try:
            current = await self.store.get_task(task.id)
        except TaskNotFound:
            saved, _ = await self.store.create_task(task)
            return saved
        fields = {"status", "status_reason", "config", "context", "output", "error"}
        changes = {k: getattr(task, k) for k in fields if getattr(task, k) != getattr(current, k)}
        return await self.update_task_state(task.id, changes)

    async def load_task_state(self, task_id: str) -> Task | None:
        try:
            return await self.store.get_task(task_id)
        except TaskNotFound:
            return None

    async def update_task_state(self, task_id: str, updates: dict[str, Any]) -> Task:
        result = await self.store.commit(Commit(patches=[TaskPatch(task_id, dict(updates))]))
        return result.tasks[task_id]

    async def delete_task_state(self, task_id: str) -> None:
        await self.store.delete_task(task_id)

    async def list_task_states(self) -> list[Task]:
        out: list[Task] = []
        cursor = None
        while True:
            page = await self.store.list_tasks(TaskQuery(limit=500, cursor=cursor))
            out += page.tasks
            if page.next_cursor is None:
                return out
            cursor = page.next_cursor

    # API messages
    async def save_api_messages(self, task_id: str, messages: Sequence[ApiMessage]) -> None:
        """Replace the task's messages: the rollback voids every entry so far, and so
        every compaction (store/_views.py), whose mark on the row goes with it."""
        for _ in range(10):
            task = await self.store.get_task(task_id)
            entries = [_void(task_id, task.last_seq, "api")] if task.last_seq else []
            entries += [_api_entry(task_id, m) for m in messages]
            patches = []
            if "compacted" in task.config:  # the view is read from the start again
                config = {k: v for k, v in task.config.items() if k != "compacted"}
                patches = [TaskPatch(task_id, {"config": config}, expect_version=task.version)]
            try:
                await self.store.commit(Commit(entries=entries, patches=patches))
            except Conflict:
                continue  # the row changed meanwhile: read it again
            return
        raise Conflict(f"task {task_id!r} kept changing; its messages were not replaced")

    async def load_api_messages(self, task_id: str) -> list[ApiMessage]:
        return await self.store.model_view(task_id)

    async def append_api_message(self, task_id: str, message: ApiMessage) -> None:
        await self.store.commit(Commit(entries=[_api_entry(task_id, message)]))

    async def delete_api_messages(self, task_id: str) -> None:
        await self.save_api_messages(task_id, [])

    # UI messages
    async def save_user_messages(self, task_id: str, messages: Sequence[UIMessage]) -> None:
        task = await self.store.get_task(task_id)
        entries = [_void(task_id, task.last_seq, "ui")] if task.last_seq else []
        entries += [
            NewEntry(task_id=task_id, kind=EntryKind.UI_MESSAGE, payload=dump_message(m))
            for m in messages
        ]
        await self.store.commit(Commit(entries=entries))

    async def load_user_messages(self, task_id: str) -> list[UIMessage]:
        return await self.store.ui_messages(task_id)

    async def delete_user_messages(self, task_id: str) -> None:
        await self.save_user_messages(task_id, [])

    # task input
    async def save_task_input(self, task_id: str, task_input: Any) -> None:
        await self.update_task_state(task_id, {"input": task_input})

    async def load_task_input(self, task_id: str) -> Any:
        task = await self.load_task_state(task_id)
        return None if task is None else task.input

    async def delete_task_input(self, task_id: str) -> None:
        await self.update_task_state(task_id, {"input": None})


__all__ = ["API_MESSAGE", "UI_MESSAGE", "SeedPersistence"]
