"""Callbacks given for one task when it is loaded (`Runtime.load_task(id, callbacks=)`).

Seed 000's `loadTask(taskId, context, callbacks)`: what an application wants
to hear about one task, as this process runs it. Process-wide hooks
(`Runtime(on_status_change=)`, `trace=`) hear every task; these hear only
theirs. They are called from the worker of the Runtime they were given to,
after the commit they report; a coroutine function is awaited, its calls one
after another in the order of the commits (with the process-wide status
hook's); an error one raises is logged, never the task's.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from duragent.types import Entry, Task, TaskStatus

Result = Awaitable[None] | None


@dataclass
class TaskCallbacks:
    """`on_status(task, old, new)`: a status change; `on_entry(entry)`: an entry its
    runner committed, in order (progress, messages, tool calls and results, notices;
    the status entries a store writes are `on_status`'s); `on_end(task)`: the task
    ended (completed, failed or aborted), the last call."""

    on_status: Callable[[Task, TaskStatus, TaskStatus], Result] | None = None
    on_entry: Callable[[Entry], Result] | None = None
    on_end: Callable[[Task], Result] | None = None


# A runner's committed entries: (its task as the commit left it, the entries).
EntriesHook = Callable[[Task, list[Entry]], None]
