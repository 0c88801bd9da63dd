"""How a store tells its waiters a commit happened: one wake-up per commit for
`wait_for_change`, and the callbacks of `watch_controls` and `watch_tasks`."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

# Told the id of a task whose control (pause/abort) was just requested, from
# any process; None when notifications may have been missed (re-check all).
ControlCallback = Callable[[str | None], None]

# Told the ids of the tasks a commit wrote or deleted, from any process; None
# when commits may have gone unheard (re-read every task you watch).
TasksCallback = Callable[[frozenset[str] | None], None]


class ChangeSignal:
    """Wakes local waiters after each commit; cross-process backends add polling."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.fired = 0  # how many times it woke its waiters (for tests and diagnostics)

    def notify(self) -> None:
        self.fired += 1
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, timeout: float) -> None:
        event = self._event
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)


class ControlWatchers:
    """The callbacks of `watch_controls`: each is told every controlled task id."""

    def __init__(self) -> None:
        self._callbacks: list[ControlCallback] = []

    def __bool__(self) -> bool:
        return bool(self._callbacks)

    def add(self, callback: ControlCallback) -> Callable[[], None]:
        self._callbacks.append(callback)

        def remove() -> None:
            with contextlib.suppress(ValueError):
                self._callbacks.remove(callback)

        return remove

    def fire(self, task_id: str | None) -> None:
        for callback in list(self._callbacks):
            callback(task_id)


class TaskWatchers:
    """The callbacks of `watch_tasks`: each is told the tasks every commit moved."""

    def __init__(self) -> None:
        self._callbacks: list[TasksCallback] = []

    def __bool__(self) -> bool:
        return bool(self._callbacks)

    def add(self, callback: TasksCallback) -> Callable[[], None]:
        self._callbacks.append(callback)

        def remove() -> None:
            with contextlib.suppress(ValueError):
                self._callbacks.remove(callback)

        return remove

    def fire(self, task_ids: frozenset[str] | None) -> None:
        if task_ids is not None and not task_ids:
            return
        for callback in list(self._callbacks):
            callback(task_ids)
