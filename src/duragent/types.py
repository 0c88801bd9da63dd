"""The data model: tasks, entries, messages and documents.

Every type here round-trips through JSON exactly (enums, datetimes, nested
dicts come back as the same types), so the restore path never guesses.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, Literal
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from duragent._model_internals import constructed, hidden_value, updated, with_hidden_value
from duragent.errors import InvalidTransition

JSON = Any


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_id(prefix: str = "t") -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class TaskStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    PAUSED = "paused"
    WAITING = "waiting"
    COMPLETED = "completed"
    FAILED = "failed"
    ABORTED = "aborted"
    BLOCKED = "blocked"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.ABORTED})


class WaitReason(StrEnum):
    SUBTASK = "subtask"
    TIMER = "timer"
    INPUT = "input"


class BlockReason(StrEnum):
    RESTART_LIMIT = "restart_limit"
    MISSING_DEFINITION = "missing_definition"
    INCOMPATIBLE_STORE = "incompatible_store"
    PINNED = "pinned"  # the worker's agent would break the task's pin (runtime/_pins.py)
    LOST_COMMITS = "lost_commits"  # the store lost commits it had acknowledged (a failover)


class FailReason(StrEnum):
    """Why a task failed, where the runtime says (status_reason of a failed task)."""

    DEADLINE = "deadline"  # its wall-clock limit passed (runtime/_ending.py)
    GUARDRAIL = "guardrail"  # a guardrail tripped with action "fail" (runtime/_checks.py)
    OUTPUT_INVALID = "output_invalid"  # the answer never matched output_type (runtime/_checks.py)


_S = TaskStatus
# Which status may follow which. Every status change in every store goes
# through check_transition; nothing else decides this.
TRANSITIONS: dict[TaskStatus, frozenset[TaskStatus]] = {
    _S.PENDING: frozenset({_S.RUNNING, _S.PAUSED, _S.ABORTED, _S.BLOCKED, _S.FAILED}),
    _S.RUNNING: frozenset(
        {
            _S.RUNNING,  # a new owner takes over an expired lease
            _S.PENDING,  # released on graceful shutdown
            _S.PAUSED,
            _S.WAITING,
            _S.COMPLETED,
            _S.FAILED,
            _S.ABORTED,
            _S.BLOCKED,
        }
    ),
    _S.PAUSED: frozenset({_S.PENDING, _S.ABORTED}),
    _S.WAITING: frozenset({_S.WAITING, _S.PENDING, _S.RUNNING, _S.PAUSED, _S.ABORTED, _S.FAILED}),
    _S.BLOCKED: frozenset({_S.PENDING, _S.ABORTED}),
    _S.COMPLETED: frozenset(),
    _S.FAILED: frozenset({_S.PENDING}),  # retry: continue from the last commit
    _S.ABORTED: frozenset(),
}

_REASONS: dict[TaskStatus, type[StrEnum]] = {_S.WAITING: WaitReason, _S.BLOCKED: BlockReason}


def check_transition(old: TaskStatus, new: TaskStatus, reason: str | None = None) -> None:
    """Raise InvalidTransition unless a task may go from `old` to `new` (with `reason`)."""
    if new not in TRANSITIONS[old]:
        raise InvalidTransition(old.value, new.value)
    kind = _REASONS.get(new)
    if kind is not None:
        if reason is None or reason not in kind.__members__.values():
            allowed = ", ".join(m.value for m in kind)
            raise InvalidTransition(
                old.value, new.value, f"status {new.value!r} needs a reason, one of: {allowed}"
            )
    elif reason is not None and new is not _S.FAILED:
        raise InvalidTransition(old.value, new.value, f"status {new.value!r} takes no reason")


class Usage(BaseModel):
    input_tokens: int = 0
    output_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
        )


class Lease(BaseModel):
    owner: str | None = None
    expires_at: datetime | None = None
    # Bumped by every claim and never reset, so a stale writer can be fenced.
    epoch: int = 0


class Task(BaseModel):
    model_config = ConfigDict(validate_assignment=False)

    id: str = Field(default_factory=new_id)
    parent_id: str | None = None
    root_id: str | None = None
    session_id: str | None = None
    owner: str | None = None
    agent: str
    # The queue it waits in (default: its agent's name) and its priority there
    # (higher first); both fixed at creation, like `metadata` (labels to filter by).
    queue: str | None = None
    priority: int = 0
    # The version of its agent it runs on (`Agent.version`), recorded at creation
    # and changed only by a migration (`Runtime.migrate`); None (a task from before
    # versions): any worker of its agent runs it.
    agent_version: str | None = None
    metadata: dict[str, JSON] = Field(default_factory=dict)
    status: TaskStatus = TaskStatus.PENDING
    status_reason: str | None = None
    input: JSON = None
    config: dict[str, JSON] = Field(default_factory=dict)
    context: dict[str, JSON] = Field(default_factory=dict)
    output: JSON = None
    error: str | None = None
    iterations: int = 0
    usage: Usage = Field(default_factory=Usage)
    restarts: int = 0
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)
    paused_at: datetime | None = None
    completed_at: datetime | None = None
    wake_at: datetime | None = None
    request_id: str | None = None
    lease: Lease = Field(default_factory=Lease)
    # A control request from outside the owning worker ("pause", "abort"),
    # heard by the owner at once (Store.watch_controls), and at its next commit
    # or lease renewal should the notice be lost.
    control: dict[str, JSON] | None = None
    last_seq: int = 0
    # A lower bound for the seqs of the current round's entries, so recovery
    # reads only the tail of the log.
    round_seq: int = 0
    version: int = 0

    def model_post_init(self, __context: Any) -> None:
        if self.root_id is None:
            self.root_id = self.id
        if self.queue is None:
            self.queue = self.agent

    @property
    def partial_output(self) -> str | None:
        """While it runs: the text of the current round's answer streamed so far, as
        committed (its progress entries); else None. `Runtime.get` reads it from the
        log, so no commit writes anything more for it; a row as a store returns it
        has none (see `with_partial_output`)."""
        text = hidden_value(self, _PARTIAL)
        return None if text is None else str(text)

    @property
    def deadline(self) -> datetime | None:
        """The wall-clock limit the task fails at, if any (kept in `config`, see
        duragent.runtime._deadlines)."""
        record = self.config.get("deadline")
        if not isinstance(record, dict) or not record.get("at"):
            return None
        return datetime.fromisoformat(str(record["at"]))


# Fields a TaskPatch may change. id, input, created_at, request_id, owner,
# parent/root/session and agent are fixed at creation; lease and last_seq are
# the store's own.
PATCHABLE = frozenset(
    {
        "input",  # only the save_task_input helper rewrites it
        "status",
        "status_reason",
        "config",
        "context",
        "output",
        "error",
        "iterations",
        "usage",
        "restarts",
        "updated_at",
        "paused_at",
        "completed_at",
        "wake_at",
        "control",
        "round_seq",
        "agent_version",  # only a migration (runtime/_versions.py) moves it
    }
)


class EntryKind(StrEnum):
    API_MESSAGE = "api_message"
    UI_MESSAGE = "ui_message"
    TOOL_INTENT = "tool_intent"
    TOOL_RESULT = "tool_result"
    PROGRESS = "progress"
    ROLLBACK = "rollback"
    STATUS = "status"
    CHECKPOINT = "checkpoint"
    # The model's view of entries up to a seq replaced by a shorter head (a summary,
    # large tool results elided): runtime/_compaction.py; the entries stay stored.
    COMPACTION = "compaction"
    # The task went on with another agent (runtime/_handoffs.py): the model took a
    # transfer tool; the last handoff in force names the agent of the next rounds.
    HANDOFF = "handoff"


# Entries whose payload is an API message and so part of the model's view.
API_KINDS = frozenset({EntryKind.API_MESSAGE, EntryKind.TOOL_RESULT})


class Entry(BaseModel):
    task_id: str
    seq: int
    kind: EntryKind
    round: int = 0
    payload: dict[str, JSON]
    created_at: datetime = Field(default_factory=utcnow)


@dataclass(slots=True, kw_only=True)
class NewEntry:
    """An entry to append; the store assigns seq and created_at.

    A plain dataclass, not a model: it is built several times per round, and
    its payload is validated where it is made (an API or UI message model).
    """

    task_id: str
    kind: EntryKind
    payload: dict[str, JSON]
    round: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.kind, EntryKind):
            self.kind = EntryKind(self.kind)
        if not isinstance(self.payload, dict):
            raise TypeError(f"an entry's payload must be a dict, not {type(self.payload).__name__}")


# --- the commit path's entries -----------------------------------------------

# Every field of an entry: the fields set all stored entries share, which none
# adds to (see duragent._model_internals).
_ENTRY_FIELDS = {"task_id", "seq", "kind", "round", "payload", "created_at"}

# Where a task read by `Runtime.get` keeps its partial output: beside its fields,
# not one of them, so no store writes it and no copy on the commit path pays for it.
_PARTIAL = "_partial_output"


def with_partial_output(task: Task, text: str | None) -> Task:
    """A copy of `task` whose `partial_output` is `text` (the row read stays as it is:
    a store may hand the same object to others)."""
    return updated(task, {}) if text is None else with_hidden_value(task, _PARTIAL, text)


def stored_entry(
    task_id: str, seq: int, kind: EntryKind, round: int, payload: dict[str, JSON], at: datetime
) -> Entry:
    """`Entry.model_construct(...)` of an entry a store assigned `seq` and `at` to."""
    values = {
        "task_id": task_id,
        "seq": seq,
        "kind": kind,
        "round": round,
        "payload": payload,
        "created_at": at,
    }
    return constructed(Entry, values, _ENTRY_FIELDS)


# --- API messages: the OpenAI chat shape -----------------------------------


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text, exactly as the model produced it


class ToolCallData(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class SystemMessage(BaseModel):
    role: Literal["system"] = "system"
    content: str


class UserMessage(BaseModel):
    role: Literal["user"] = "user"
    content: str


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[ToolCallData] | None = None


class ToolMessage(BaseModel):
    role: Literal["tool"] = "tool"
    tool_call_id: str
    content: str


ApiMessage = Annotated[
    SystemMessage | UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")
]
API_MESSAGE: TypeAdapter[ApiMessage] = TypeAdapter(ApiMessage)
API_MESSAGES: TypeAdapter[list[ApiMessage]] = TypeAdapter(list[ApiMessage])


def dump_message(message: BaseModel) -> dict[str, JSON]:
    return message.model_dump(mode="json", exclude_none=True)


# --- UI messages: what a person sees ----------------------------------------


class UIText(BaseModel):
    type: Literal["text"] = "text"
    role: Literal["user", "assistant", "system"] = "assistant"
    text: str
    voided: bool = False  # part of a round a rollback took out of the model's view


class UIToolCard(BaseModel):
    type: Literal["tool"] = "tool"
    call_id: str
    name: str
    arguments: dict[str, JSON] = Field(default_factory=dict)
    state: Literal["intent", "running", "ok", "error", "interrupted", "waiting", "rolled_back"] = (
        "intent"
    )
    result: str | None = None
    voided: bool = False  # the call's round was rolled back out of the model's view
    # Set when a person edited the arguments before approving: the model's own;
    # `arguments` are then the ones the call ran with.
    original_arguments: dict[str, JSON] | None = None


class UIError(BaseModel):
    type: Literal["error"] = "error"
    message: str
    detail: str | None = None


class UINotice(BaseModel):
    type: Literal["notice"] = "notice"
    message: str


UIMessage = Annotated[UIText | UIToolCard | UIError | UINotice, Field(discriminator="type")]
UI_MESSAGE: TypeAdapter[UIMessage] = TypeAdapter(UIMessage)


# --- documents --------------------------------------------------------------


class Document(BaseModel):
    scope: str  # "task:<id>" or "session:<owner>:<id>"
    key: str
    value: JSON
    version: int = 1
    updated_at: datetime = Field(default_factory=utcnow)


def task_scope(task_id: str) -> str:
    return f"task:{task_id}"


def session_scope(owner: str | None, session_id: str) -> str:
    """One owner's session: `session:<owner>:<session id>`.

    A session id names a session only within its owner's tasks, so another
    owner's id reaches a scope of their own. The owner is percent-encoded (it
    never holds a `:`), so no (owner, session id) pair spells another's scope.
    No owner and the empty owner are one owner, as they are for request ids.
    """
    return f"session:{quote(owner or '', safe='')}:{session_id}"
