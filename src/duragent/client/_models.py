"""What the HTTP API answers, as the clients read it: the response bodies of
docs/http-api.md as pydantic models, without FastAPI (the server's own models live
in server/_schemas.py, which needs it). Fields a newer server adds are ignored, so
an older client keeps working; tests/test_client.py holds these to the server's
document."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from duragent._payloads import WaitKind
from duragent.types import Entry, TaskStatus, Usage


class OpenWait(BaseModel):
    """An open wait of a waiting task: an approval, a question, a timer, a sub-task."""

    call_id: str
    wait: WaitKind
    question: str | None = None
    child_id: str | None = None
    wake_at: datetime | None = None
    tool: str | None = None
    arguments: dict[str, Any] | None = None
    expires_at: datetime | None = None
    editable: bool = True  # false: an approval asked inside a tool's run, decided as it is


class WaitingOn(BaseModel):
    wait: WaitKind
    tool: str | None = None


class TaskSummary(BaseModel):
    """A task as lists show it."""

    id: str
    agent: str
    status: TaskStatus
    status_reason: str | None
    session_id: str | None
    parent_id: str | None
    iterations: int
    current_step: int | None
    error: str | None
    created_at: datetime
    updated_at: datetime
    queue: str
    priority: int
    metadata: dict[str, Any]
    waiting_on: list[WaitingOn] = Field(default_factory=list)
    agent_version: str | None = None
    unserved: str | None = None  # while pending: "waiting for a@v3: no worker serves it"


class TaskOut(TaskSummary):
    """A task: its status, output, open waits and the seq of its last entry."""

    root_id: str | None
    request_id: str | None
    input: Any
    output: Any
    context: dict[str, Any]
    usage: Usage
    restarts: int
    last_seq: int
    paused_at: datetime | None
    completed_at: datetime | None
    wake_at: datetime | None
    deadline: datetime | None
    lease_expires_at: datetime | None = None
    lease_worker_seen_at: datetime | None = None
    lease_worker_gone_after: datetime | None = None
    waiting_for: list[OpenWait] = Field(default_factory=list)
    forked_from: dict[str, str | int] | None = None
    partial_output: str | None = None


class TaskWaitOut(TaskOut):
    """A task as `wait` left it; `timed_out`: the timeout came first."""

    timed_out: bool


class TaskPageOut(BaseModel):
    """One page of tasks; pass `next_cursor` as `cursor` for the next (None: the last)."""

    tasks: list[TaskSummary]
    next_cursor: str | None


class StreamEnd(BaseModel):
    """A stream's last event: the task is finished (`status` None: it was deleted)."""

    kind: Literal["end"] = "end"
    status: TaskStatus | None
    last_seq: int


class StreamTokenOut(BaseModel):
    """Opens one task's event stream, without the bearer token, until `expires_at`."""

    token: str
    expires_at: datetime
    events_url: str


class BulkError(BaseModel):
    task_id: str
    error: str


class BulkOut(BaseModel):
    """A bulk operation as it stands (docs/many-tasks.md): `total` matched when it
    started; `done` acted on, `skipped` no longer in a status the action applies to,
    `failed` refused (`errors`: the first few)."""

    id: str
    action: str
    filter: dict[str, Any]
    status: Literal["running", "done", "failed"]
    total: int
    done: int
    skipped: int
    failed: int
    owner: str | None
    created_at: datetime
    errors: list[BulkError] = Field(default_factory=list)
    error: str | None = None
    to_version: str | None = None  # migrate: the version the tasks go to


class BulkCount(BaseModel):
    """A bulk operation's dry run: how many tasks it would touch now."""

    count: int


class BulkPageOut(BaseModel):
    """One page of bulk operations, newest first; `next_cursor` asks for the next."""

    operations: list[BulkOut]
    next_cursor: str | None


# What a task's event stream yields: its committed entries, then one StreamEnd.
TaskStreamEvent = Entry | StreamEnd
