"""What a running tool call may use of the runner of its task.

`ToolContext`, its durable steps and `run_call` (runtime/_calls.py) are handed the
rounds of the task's runner (`Rounds`, runtime/_round.py); they see them through
these protocols, so they depend on what they use and not on the runner, which
imports them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from duragent.runtime._held import Held
from duragent.runtime._state import DebouncedState
from duragent.store._commits import CommitResult
from duragent.store._protocol import Store
from duragent.types import NewEntry, Task


class StepHost(Protocol):
    """What a durable step (runtime/_steps.py) uses: commit its record, and trace."""

    async def commit(self, entries: Iterable[NewEntry] = ()) -> CommitResult: ...

    async def trace_point(self, point: str, **info: Any) -> None: ...


class TaskHost(StepHost, Protocol):
    """What a tool's `ToolContext` (runtime/_context.py) uses of its task's runner."""

    @property
    def task(self) -> Task: ...

    @property
    def store(self) -> Store: ...

    @property
    def state(self) -> DebouncedState: ...

    async def tool_progress(self, call_id: str, text: str) -> None: ...

    async def tool_event(self, call_id: str, name: str, data: Any, n: int) -> None: ...

    @property
    def held(self) -> Held:
        """What the task's tools keep open until its run ends (runtime/_held.py)."""
        ...

    @property
    def worker_held(self) -> Held | None:
        """What tools keep open until the worker running the task stops, if one does."""
        ...
