"""What a tool sees of its task while it runs, and the durable waits it can ask for."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from duragent.errors import UsageError
from duragent.runtime._held import Held
from duragent.runtime._host import TaskHost
from duragent.runtime._steps import CallSteps, StepRecord
from duragent.store._commits import DocumentWrite
from duragent.store._protocol import Store
from duragent.types import session_scope, task_scope, utcnow

MAX_EVENT_BYTES = 16 * 1024  # a custom event's data, as JSON

# --- durable waits: a tool returns one of these instead of a result ----------


@dataclass
class Suspend:
    """Base of the markers a tool returns to park the task durably."""


@dataclass
class WaitForInput(Suspend):
    question: str
    kind: str = "question"  # "question" (ask_user) or "approval"
    # An approval: the call it asks about, and when it expires (if it may).
    tool: str | None = None
    arguments: dict[str, Any] | None = None
    timeout: float | None = None
    expires_at: datetime | None = None
    # An approval the tool asks for itself (from inside its run, as a hosted loop
    # does): decided either way, the call runs again and reads the decision
    # (`ToolContext.decision`); a denial is not the call's result.
    rerun: bool = False

    def details(self) -> dict[str, Any]:
        """The wait entry's fields besides call id and kind."""
        out: dict[str, Any] = {"question": self.question}
        if self.tool is not None:
            out.update(tool=self.tool, arguments=self.arguments or {})
        if self.rerun:
            out["rerun"] = True
        if self.expires_at is not None:
            out.update(timeout=self.timeout, expires_at=self.expires_at.isoformat())
        return out


@dataclass
class SleepUntil(Suspend):
    wake_at: datetime


@dataclass
class SpawnSubtask(Suspend):
    agent: str
    input: Any
    context: dict[str, Any] = field(default_factory=dict)


class FailTask(Exception):
    """Raised by a tool to fail its task with its call left unanswered, the
    message the task's error. A retry (`Runtime.retry`) then runs the call
    again, as recovery after a crash would: a `replay="resume"` tool replays the
    steps it recorded and goes on from the first one not recorded (a hosted
    loop's failed run, duragent.pydantic_ai)."""


class Documents:
    """Named JSON documents in one scope. Writes are staged and committed
    together with the tool's result, so a crash never leaves half of them."""

    def __init__(self, store: Store, scope: str) -> None:
        self._store = store
        self.scope = scope
        self.staged: dict[str, DocumentWrite] = {}

    async def get(self, key: str, default: Any = None) -> Any:
        if key in self.staged:
            w = self.staged[key]
            return default if w.delete else w.value
        doc = await self._store.get_document(self.scope, key)
        return default if doc is None else doc.value

    def put(self, key: str, value: Any) -> None:
        self.staged[key] = DocumentWrite(self.scope, key, value)

    def delete(self, key: str) -> None:
        self.staged[key] = DocumentWrite(self.scope, key, delete=True)

    def take(self) -> list[DocumentWrite]:
        writes, self.staged = list(self.staged.values()), {}
        return writes


class ToolContext:
    """Passed to a tool that asks for it (a parameter annotated `ToolContext`)."""

    def __init__(
        self,
        host: TaskHost,
        call_id: str,
        round: int,
        attempt: int,
        *,
        replay: str = "never",
        steps: StepRecord | None = None,
        called_at: datetime | None = None,
        emitted: frozenset[int] = frozenset(),
    ) -> None:
        self._host = host
        # When the model made this call (its intent's commit): ctx.sleep counts
        # from it, so a call run again after a crash sleeps to the same deadline.
        self.called_at = called_at or utcnow()
        self.replay = replay  # the tool's replay policy: "never", "safe" or "resume"
        self._steps = CallSteps(host, host.task.id, round, call_id, replay, steps or StepRecord())
        self.task_id = host.task.id
        self.call_id = call_id
        self.round = round
        self.attempt = attempt  # 1, or more when a replay-safe call is re-run after a crash
        self.owner = host.task.owner
        self.session_id = host.task.session_id
        # Stable across restarts: hand it to external services to make calls idempotent.
        self.idempotency_key = f"{host.task.id}:{round}:{call_id}"
        self.documents = Documents(host.store, task_scope(host.task.id))
        self.session_documents = (
            Documents(host.store, session_scope(host.task.owner, host.task.session_id))
            if host.task.session_id
            else None
        )
        self.partial: list[str] = []
        # Custom events: how many this call emitted, and the numbers of those the
        # log already holds from an earlier run of it (not committed again).
        self._emits = 0
        self._emitted = emitted

    @property
    def context(self) -> dict[str, Any]:
        """The task's context (read it; change it with update_state)."""
        ctx: dict[str, Any] = self._host.state.state["context"]
        return ctx

    def update_state(self, **changes: Any) -> None:
        """Merge keys into the task context now; persisted debounced (and at every commit)."""
        self._host.state.update(context={**self.context, **changes})

    async def report(self, text: str) -> None:
        """Partial output; committed as progress so an interrupted call can show it."""
        self.partial.append(text)
        await self._host.tool_progress(self.call_id, text)

    async def emit(self, name: str, data: Any = None) -> None:
        """Commit a custom event: `name` and JSON `data` (up to 16 KB), seen on the
        task's event stream (a `progress` entry with `event`), on its page, in its
        history and by its webhook (`task.event`).

        Once per call: when a replay-safe call runs again after a crash, the
        events its earlier run committed are not committed again (the n-th emit
        of the re-run is the n-th of the first run).
        """
        if not isinstance(name, str) or not 0 < len(name) <= 100:
            raise UsageError(f"an event name is a string of 1 to 100 characters, not {name!r}")
        try:
            size = len(json.dumps(data, allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise UsageError(f"event {name!r}: its data must be JSON ({exc})") from None
        if size > MAX_EVENT_BYTES:
            raise UsageError(
                f"event {name!r}: its data is {size} bytes of JSON; at most {MAX_EVENT_BYTES}"
            )
        self._emits += 1
        if self._emits in self._emitted:
            return  # committed by an earlier run of this call (its n is in the log)
        await self._host.tool_event(self.call_id, name, data, self._emits)

    async def step(
        self,
        name: str,
        fn: Callable[..., Any],
        /,
        *args: Any,
        safe: bool | None = None,
        **kwargs: Any,
    ) -> Any:
        """Run `fn(*args, **kwargs)` once per call and commit its result under `name`.

        When the call is run again after a crash (tools with `replay="safe"` or
        `replay="resume"`), a recorded step is not run: its recorded result is
        returned (a recorded failure is raised again as StepFailed). A step that
        began and was not recorded runs again only if it is safe (`safe=True`, or
        by default when the tool is `replay="safe"`); otherwise the call ends with
        an "interrupted in step" result the model sees. Results must be JSON data.
        """
        return await self._steps.run(name, fn, args, kwargs, safe)

    def held(self, scope: str) -> Held | None:
        """Where a tool keeps what it opens for later calls (an MCP session): the
        task's run's (`"task"`) or its worker's (`"worker"`); None where nothing
        is kept (no worker, or its holder has closed)."""
        holder = self._host.held if scope == "task" else self._host.worker_held
        return None if holder is None or holder.closed else holder

    def wait_for_input(self, question: str) -> WaitForInput:
        return WaitForInput(question)

    def sleep(self, seconds: float) -> SleepUntil:
        """A durable timer, `seconds` from when the model made this call (`called_at`)."""
        return SleepUntil(self.called_at + timedelta(seconds=seconds))

    def wait_until(self, when: datetime) -> SleepUntil:
        return SleepUntil(when)

    def spawn(self, agent: str, input: Any, context: dict[str, Any] | None = None) -> SpawnSubtask:
        return SpawnSubtask(agent, input, dict(context or {}))

    def staged_documents(self) -> list[DocumentWrite]:
        writes = self.documents.take()
        if self.session_documents is not None:
            writes += self.session_documents.take()
        return writes
