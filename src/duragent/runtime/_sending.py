"""The Runtime's verb for messages into a live task (double texting, runtime/_inbox.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic_core import to_jsonable_python

from duragent._payloads import checkpoint_of
from duragent._storable import check_storable
from duragent.errors import Conflict, DuplicateRequest, InvalidTransition, TaskBusy, UsageError
from duragent.runtime._engine import Control
from duragent.runtime._inbox import (
    BUSY,
    MAX_MESSAGE_CHARS,
    MultitaskStrategy,
    check_strategy,
    cut_plan,
    send_commit,
    sent_before,
    strategy_of,
)
from duragent.runtime._submit import input_text
from duragent.runtime._waits import open_round
from duragent.types import EntryKind, Task, TaskStatus

if TYPE_CHECKING:
    from collections.abc import Sequence

    from duragent.runtime._worker import Worker
    from duragent.store._protocol import Store


class SendsMessages:
    """Mixed into Runtime (_runtime.py), whose store, worker and verbs these use."""

    store: Store
    worker: Worker | None

    if TYPE_CHECKING:

        async def get(self, task_id: str, *, owner: str | None = None) -> Task: ...
        def start_worker(self) -> None: ...
        def _wake(self) -> None: ...
        async def _session_tasks(
            self, session_id: str, owner: str | None, status: Sequence[TaskStatus], limit: int
        ) -> list[Task]: ...

    async def send(
        self,
        task_id: str,
        text: str,
        *,
        owner: str | None = None,
        multitask_strategy: MultitaskStrategy | None = None,
        request_id: str | None = None,
    ) -> Task:
        """Send a user message into a pending, running, waiting, paused or blocked task.

        The message is committed before this returns (a crash loses nothing) and
        the task takes it exactly once, at a safe point: never between a tool
        call and its result. While a turn runs (pending, running, waiting), the
        task's `multitask_strategy` (or this call's) decides when: `enqueue` after
        the turn's answer, `interrupt` / `rollback` at the next safe point after
        stopping as `pause` / `pause(rollback=True)` would, `reject` not at all
        (`TaskBusy`). Under `interrupt` / `rollback` a task waiting for a timer,
        an answer or an approval stops waiting (the calls are answered
        "interrupted"; an unapproved call never runs); one waiting for a sub-task
        takes the message when the sub-task ends. A paused or blocked task keeps
        the message until it is resumed. A finished task takes none
        (`InvalidTransition`): continue its conversation with
        `submit(..., continue_session=True)` or `fork`.
        With `owner`, another owner's task is reported as not found.

        The same `request_id` sent to the same task again (a retried request) sends
        nothing and returns the task, also after the message was taken and the task
        ended; with another text it raises `DuplicateRequest`. The task's log keeps
        the request id with the message.
        """
        if not isinstance(text, str) or not text.strip():
            raise UsageError("a message needs some text")
        if len(text) > MAX_MESSAGE_CHARS:
            raise UsageError(f"a message holds at most {MAX_MESSAGE_CHARS} characters")
        if request_id is not None and (not isinstance(request_id, str) or not request_id):
            raise UsageError("a request_id is a non-empty string")
        return await self._send(task_id, text, owner, multitask_strategy, request_id)

    async def _send(
        self,
        task_id: str,
        text: str,
        owner: str | None,
        multitask_strategy: MultitaskStrategy | None,
        request_id: str | None = None,
    ) -> Task:
        # The checks submit makes of an input: continue_session sends one through here.
        check_storable(text, "text")
        if multitask_strategy is not None:
            check_strategy(multitask_strategy)
        for _ in range(20):
            task = await self.get(task_id, owner=owner)
            if request_id is not None:
                # Read after the row: the commit below expects its version, so a
                # message with this id sent meanwhile makes it look again.
                before = sent_before(task, request_id) or await self._sent_message(
                    task_id, request_id
                )
                if before is not None:
                    if before.get("text") != text:
                        raise DuplicateRequest(
                            request_id,
                            task_id,
                            f"request_id {request_id!r} already sent task {task_id!r} another "
                            "message; use a new request_id for a new message (the same "
                            "request_id with the same text sends nothing again)",
                        )
                    return task
            if task.status.terminal:
                raise InvalidTransition(
                    task.status.value,
                    "running",
                    "a finished task takes no messages; continue its conversation with "
                    "submit(..., session_id=..., continue_session=True), or fork it with "
                    "fork(task_id, at_round=N, edit=Edit(append_user=...))",
                )
            strategy = check_strategy(multitask_strategy or strategy_of(task))
            if strategy == "reject" and task.status in BUSY:
                raise TaskBusy(task.id, task.status.value)
            commit, _ = send_commit(task, text, strategy, request_id)
            if strategy in ("interrupt", "rollback") and task.status is TaskStatus.WAITING:
                # The message ends the wait, in the same commit (runtime/_inbox.py).
                rs = await open_round(self.store, task)
                cut = cut_plan(task, rs, strategy == "rollback", commit.entries)
                if cut is not None:
                    commit.entries += cut[0]
                    commit.patches[0].set.update(cut[1])
            try:
                res = await self.store.commit(commit)
            except Conflict:
                continue  # it moved (a commit of its runner, another message): look again
            stored = res.tasks[task_id]
            runner = self.worker.runner(task_id) if self.worker else None
            if runner is not None and stored.control:
                runner.request(Control.from_row(stored.control))
            if stored.status is not TaskStatus.PAUSED:
                self.start_worker()
                self._wake()
            return stored
        raise Conflict(f"task {task_id!r} kept changing while sending it a message")

    async def _sent_message(self, task_id: str, request_id: str) -> dict[str, Any] | None:
        """The log's record of the message sent to the task with `request_id`, if any."""
        after = 0
        while True:
            page = await self.store.entries(
                task_id, after_seq=after, kinds=[EntryKind.CHECKPOINT], limit=500
            )
            for e in page:
                c = checkpoint_of(e)
                if c["type"] == "message" and c.get("request_id") == request_id:
                    return dict(c)
            if len(page) < 500:
                return None
            after = page[-1].seq

    async def _send_into_session(
        self,
        live: Task,
        agent: str,
        input: Any,
        multitask_strategy: MultitaskStrategy | None,
        request_id: str | None,
    ) -> bool:
        """Send a `continue_session` submission's input into the session's live task;
        False if that task is the one this request_id started (a retried submission)."""
        if request_id is not None and live.request_id == request_id:
            same = live.agent == agent and to_jsonable_python(live.input) == to_jsonable_python(
                input
            )
            if not same:
                raise DuplicateRequest(request_id, live.id)
            return False
        await self._send(live.id, input_text(input), None, multitask_strategy, request_id)
        return True

    async def _live_session_task(self, session_id: str, owner: str | None) -> Task | None:
        """The session's latest top-level task that runs a turn (its sub-tasks share
        the session id but are no turn of it)."""
        found = await self._session_tasks(session_id, owner, BUSY, 100)
        top = [t for t in found if t.parent_id is None]
        return max(top, key=lambda t: t.created_at) if top else None
