"""The Store protocol, the Commit it applies, and the rules every backend shares.

A backend decides how bytes reach disk; the rules of what a commit means
(fencing, status transitions, seq assignment, the model's view) live here so
that every backend applies them identically.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple, Protocol, runtime_checkable

import pydantic_core

from duragent.errors import Conflict, IncompatibleEntry, InvalidOption, StaleLease, StoreCorrupt
from duragent.heap import collector_paused
from duragent.llm.messages import in_call_order
from duragent.payloads import is_marker, is_voided, voided_ranges
from duragent.types import (
    API_KINDS,
    API_MESSAGES,
    PATCHABLE,
    UI_MESSAGE,
    ApiMessage,
    Document,
    Entry,
    EntryKind,
    NewEntry,
    Task,
    TaskStatus,
    UiMessage,
    Usage,
    check_transition,
    updated,
)

# Version 2: session documents are scoped per owner (`session:<owner>:<id>`).
# Version 3: queues, priorities and metadata on tasks (QUEUES_MIGRATION).
# Version 4: a fork's copied entries reference their source's payloads (PostgreSQL;
# a JSONL log is unchanged but for its header, rewritten once).
# Version 5: entries keyed by one integer, `entry_key` (PostgreSQL; a JSONL log
# is unchanged but for its header, rewritten once).
SCHEMA_VERSION = 5

# The SQL stores key an entry by one integer, its `eid`: its task's number in
# the high bits, its seq in the low SEQ_BITS (so a task holds at most MAX_SEQ).
SEQ_BITS = 32
MAX_SEQ = (1 << SEQ_BITS) - 1


def entry_key(task_num: int, seq: int) -> int:
    """An entry's `eid`: its task's number and its seq in one integer."""
    return (task_num << SEQ_BITS) | seq


def entry_range(task_id: str, first: int = 0, last: int = MAX_SEQ) -> tuple[str, int, str, int]:
    """The parameters of a store's ENTRY_RANGE: the entries of `task_id` with
    first <= seq <= last (a task's number is looked up by its id in the query)."""
    return (task_id, first, task_id, last)


@dataclass(slots=True)
class TaskPatch:
    """Change fields of an existing task row, optionally only if it is in an expected state."""

    task_id: str
    set: dict[str, Any]
    expect_status: Sequence[TaskStatus] | None = None
    expect_version: int | None = None


@dataclass(slots=True)
class DocumentWrite:
    scope: str
    key: str
    value: Any = None
    expect_version: int | None = None  # 0 = must not exist yet
    delete: bool = False


@dataclass(slots=True)
class Commit:
    """One atomic write: everything in it is applied, or nothing is.

    `fence` maps each task the writer owns to the lease epoch it holds; if any
    epoch is stale the whole commit is refused with StaleLease.
    """

    entries: list[NewEntry] = field(default_factory=list)
    patches: list[TaskPatch] = field(default_factory=list)
    documents: list[DocumentWrite] = field(default_factory=list)
    new_tasks: list[Task] = field(default_factory=list)
    fence: dict[str, int] = field(default_factory=dict)
    # A commit queued by `Store.commit_soon` that this one must follow: if that
    # one failed, this one fails with its error and writes nothing.
    after: PendingCommit | None = None


class PendingCommit:
    """A commit `Store.commit_soon` queued; `await pending` gives its result.

    It lands before any commit this store is asked for after it. A commit made
    with `after=pending` never lands without it: the store sets `failed` the
    moment the commit's fate is known as a failure, before it runs the next
    job, and refuses every commit that names it with that error.
    """

    __slots__ = ("failed", "future")

    def __init__(self) -> None:
        self.failed: BaseException | None = None
        self.future: asyncio.Future[CommitResult] | None = None

    def __await__(self) -> Any:
        # Shielded: a caller that stops waiting (a timeout) leaves the commit queued.
        assert self.future is not None
        return asyncio.shield(self.future).__await__()


def follows(commit: Commit) -> None:
    """Refuse `commit` if the commit it follows failed (see PendingCommit)."""
    if commit.after is not None and commit.after.failed is not None:
        raise commit.after.failed


def mark_failed(
    links: Iterable[PendingCommit | None], outcomes: Iterable[tuple[bool, Any]]
) -> None:
    """Note, on their PendingCommit, the queued commits whose batch failed."""
    for link, (ok, value) in zip(links, outcomes, strict=True):
        if link is not None and not ok:
            link.failed = value


@dataclass(slots=True)
class CommitResult:
    entries: list[Entry]
    tasks: dict[str, Task]  # every task row the commit touched, as now stored
    documents: list[Document]


@dataclass(slots=True)
class LeaseRenewal:
    """What one `renew_leases` call found: the leases still ours (renewed, with
    the rows as now stored, so a control request on them is seen) and the
    ones lost (another epoch or owner holds the task, or it is gone)."""

    kept: dict[str, Task]
    lost: set[str]


class EntryHead(NamedTuple):
    """An entry without its payload, but with its message role (None if it has none):
    what a fork reads of its source to plan the copy (a tuple: thousands are built)."""

    seq: int
    kind: EntryKind
    round: int
    role: str | None


@dataclass(frozen=True, slots=True)
class CopyEntries:
    """In a new task's log, the entries of `source_id` with seqs `first_seq`..`last_seq`,
    a kind in `kinds` and a round up to `max_round`, copied inside the store in
    seq order. `count`, if given, is how many the planner saw there: a store
    finding another number refuses the write (the source changed meanwhile)."""

    source_id: str
    first_seq: int
    last_seq: int
    kinds: tuple[EntryKind, ...]
    max_round: int
    count: int | None = None


# Told the id of a task whose control (pause/abort) was just requested, from
# any process; None when notifications may have been missed (re-check all).
ControlCallback = Callable[[str | None], None]


@dataclass(slots=True)
class TaskQuery:
    owner: str | None = None
    no_owner: bool = False  # only tasks without an owner (`owner` must then be None)
    status: TaskStatus | Sequence[TaskStatus] | None = None
    session_id: str | None = None
    parent_id: str | None = None
    root_id: str | None = None
    agent: str | None = None
    limit: int = 50
    cursor: str | None = None  # opaque; from TaskPage.next_cursor
    queue: str | None = None
    metadata: dict[str, Any] | None = None  # every key must hold exactly this value
    created_after: datetime | None = None  # ranges: after is inclusive, before exclusive
    created_before: datetime | None = None
    updated_after: datetime | None = None
    updated_before: datetime | None = None

    def equal_filters(self) -> list[tuple[str, str]]:
        """The (field, value) pairs a task must match exactly: the ones that are set."""
        fields = ("owner", "session_id", "parent_id", "root_id", "agent", "queue")
        return [(f, v) for f in fields if (v := getattr(self, f)) is not None]

    def null_filters(self) -> list[str]:
        """The fields a task must have unset."""
        if self.no_owner and self.owner is not None:
            raise InvalidOption("a TaskQuery with no_owner=True cannot name an owner")
        return ["owner"] if self.no_owner else []

    def range_filters(self) -> list[tuple[str, str, datetime]]:
        """(column, operator, bound) of the time ranges that are set."""
        out = []
        for column in ("created_at", "updated_at"):
            stem = column.removesuffix("_at")
            if (lo := getattr(self, f"{stem}_after")) is not None:
                out.append((column, ">=", lo))
            if (hi := getattr(self, f"{stem}_before")) is not None:
                out.append((column, "<", hi))
        return out

    def matches(self, task: Task) -> bool:
        """Whether a task passes every filter (stores that cannot ask SQL use this)."""
        statuses = self.statuses()
        if statuses is not None and task.status.value not in statuses:
            return False
        if any(getattr(task, f) != v for f, v in self.equal_filters()):
            return False
        if any(getattr(task, f) is not None for f in self.null_filters()):
            return False
        for column, op, bound in self.range_filters():
            value: datetime = getattr(task, column)
            if (op == ">=" and value < bound) or (op == "<" and value >= bound):
                return False
        return all(
            k in task.metadata and task.metadata[k] == v for k, v in (self.metadata or {}).items()
        )

    def statuses(self) -> list[str] | None:
        if self.status is None:
            return None
        if isinstance(self.status, TaskStatus | str):
            return [TaskStatus(self.status).value]
        return [TaskStatus(s).value for s in self.status]


@dataclass(slots=True)
class TaskPage:
    tasks: list[Task]
    next_cursor: str | None


@runtime_checkable
class Store(Protocol):
    """Everything duragent persists goes through one of these.

    `open_store(url)` returns one; `docs/architecture.md` §5 groups the methods
    (writing, reading, ownership, waiting). Every backend passes the same
    conformance suite (`tests/test_store_conformance.py`). A missing task is
    `TaskNotFound`; a store that cannot be reached is `StoreUnavailable`.
    """

    url: str

    async def open(self) -> None:
        """Connect, creating or migrating the schema if needed; call before anything
        else (`async with store:` does). A constructor only checks its arguments;
        opening an open store does nothing."""
        ...

    async def close(self) -> None:
        """Flush and release files, connections and locks; the store is unusable after."""
        ...

    async def commit(self, commit: Commit) -> CommitResult:
        """Apply a `Commit` atomically: entries, task patches, documents and new tasks.

        Fenced: a commit whose lease epoch is not current raises `StaleLease`
        and writes nothing; a patch whose expectation fails raises `Conflict`.
        """
        ...

    def commit_soon(self, commit: Commit) -> PendingCommit:
        """Queue `commit` without waiting for it to be durable; `await` the result.

        It lands before any commit asked for after it. A runner uses it for the
        commit that closes a round, so the next model call starts while it
        syncs; its next commit names it (`Commit.after`) and so never lands
        without it. Call it from the event loop the store is used on.
        """
        ...

    async def create_task(self, task: Task, entries: Sequence[NewEntry] = ()) -> tuple[Task, bool]:
        """Insert a pending task with its first entries; `(task, created)`.

        A task with the `(owner, request_id)` of an existing one is not created:
        the existing one is returned with `False` (the caller compares inputs).
        """
        ...

    async def get_task(self, task_id: str) -> Task:
        """The task row as stored now; `TaskNotFound` if there is none."""
        ...

    async def list_tasks(self, query: TaskQuery | None = None) -> TaskPage:
        """Tasks matching `query`, newest first, one cursor-paged `TaskPage` at a time."""
        ...

    async def count_tasks(self, query: TaskQuery | None = None) -> dict[tuple[str, str], int]:
        """How many tasks match `query`, keyed by `(queue or agent, status)`."""
        ...

    async def entries(
        self,
        task_id: str,
        *,
        after_seq: int = 0,
        kinds: Iterable[EntryKind] | None = None,
        limit: int | None = None,
    ) -> list[Entry]:
        """A task's log entries after `after_seq`, in seq order, of `kinds` if given."""
        ...

    async def entry_heads(self, task_id: str, *, kinds: Iterable[EntryKind]) -> list[EntryHead]:
        """Seq, kind, round and role of a task's entries of `kinds`, without payloads."""
        ...

    async def create_fork(
        self, task: Task, log: Sequence[NewEntry | CopyEntries]
    ) -> tuple[Task, bool]:
        """Like `create_task`, with `CopyEntries` runs copied from another task inside
        the store; a source that changed since the plan refuses the write (`Conflict`)."""
        ...

    async def model_view(self, task_id: str) -> list[ApiMessage]:
        """The messages a model sees for this task (voided rounds left out), typed."""
        ...

    async def model_view_data(self, task_id: str) -> list[dict[str, Any]]:
        """`model_view` as plain dicts in their wire form, decoded but not validated."""
        ...

    async def ui_messages(self, task_id: str) -> list[UiMessage]:
        """The task's conversation as the page and the API show it (voided rounds kept)."""
        ...

    async def get_document(self, scope: str, key: str) -> Document | None:
        """The document at `(scope, key)`, or None."""
        ...

    async def list_documents(self, scope: str) -> list[Document]:
        """Every document in `scope`, ordered by key."""
        ...

    async def claim_task(
        self,
        worker_id: str,
        *,
        agents: Iterable[str] | None = None,
        ttl: float = 30.0,
        task_id: str | None = None,
        queues: Iterable[str] | None = None,
    ) -> Task | None:
        """Take the lease of one runnable task (of `agents`/`queues`, or exactly
        `task_id`) for `ttl` seconds; None if there is none. See `claim_tasks`."""
        ...

    async def claim_tasks(
        self,
        worker_id: str,
        n: int = 1,
        *,
        agents: Iterable[str] | None = None,
        ttl: float = 30.0,
        task_id: str | None = None,
        queues: Iterable[str] | None = None,
    ) -> list[Task]:
        """Take the leases of up to `n` runnable tasks in claim order, within every
        queue's limits. Each claim bumps the lease epoch, so the previous owner's
        commits are refused from then on (recovery goes through this same claim)."""
        ...

    async def renew_lease(self, task_id: str, worker_id: str, epoch: int, ttl: float) -> Task:
        """Extend a held lease by `ttl` seconds; `StaleLease` if `epoch` is no longer current."""
        ...

    async def renew_leases(
        self, worker_id: str, leases: Mapping[str, int], ttl: float
    ) -> LeaseRenewal:
        """Renew many leases (task id to epoch) in one transaction; lost ones are
        reported in the `LeaseRenewal`, not raised."""
        ...

    async def release_lease(self, task_id: str, epoch: int) -> None:
        """Give a lease up so another worker may claim the task at once."""
        ...

    async def next_wake_at(
        self, agents: Iterable[str] | None = None, queues: Iterable[str] | None = None
    ) -> datetime | None:
        """The earliest time a task of `agents`/`queues` becomes claimable (a delayed
        start, a timer or deadline, a lease expiring); None if nothing is scheduled."""
        ...

    async def delete_task(self, task_id: str) -> None:
        """Delete a task and its sub-tasks, with their entries and task documents."""
        ...

    async def purge_tasks(self, query: TaskQuery) -> int:
        """Delete up to `query.limit` matching tasks (and their sub-tasks); how many went."""
        ...

    async def reclaim_space(self) -> None:
        """Give the space of deleted rows back (VACUUM, compaction); a no-op where none."""
        ...

    async def wait_for_change(self, timeout: float) -> None:
        """Return when a commit that may matter happened (in any process, for shared
        backends), or after `timeout` seconds."""
        ...

    def watch_controls(self, callback: ControlCallback) -> Callable[[], None]:
        """Call `callback(task_id)` when a commit sets a control request on a task
        (None: some task, re-read them all); returns the function that stops it."""
        ...


# --- rules every backend applies --------------------------------------------


def check_fence(task: Task, epoch: int) -> None:
    if task.lease.epoch != epoch:
        raise StaleLease(task.id, epoch, task.lease.epoch)


def apply_patch(task: Task, patch: TaskPatch, now: datetime) -> tuple[Task, NewEntry | None]:
    """Return the patched task and, when the status changed, the status entry to log."""
    if patch.expect_status is not None and task.status not in patch.expect_status:
        raise Conflict(
            f"task {task.id!r} is {task.status.value}, expected "
            + " or ".join(TaskStatus(s).value for s in patch.expect_status)
        )
    if patch.expect_version is not None and task.version != patch.expect_version:
        raise Conflict(
            f"task {task.id!r} is at version {task.version}, expected {patch.expect_version}"
        )
    unknown = set(patch.set) - PATCHABLE
    if unknown:
        raise InvalidOption(f"these task fields cannot be patched: {sorted(unknown)}")
    changes = dict(patch.set)
    status_entry = None
    if "status" in changes:
        new_status = TaskStatus(changes["status"])
        reason = changes.get("status_reason")
        if new_status != task.status or reason != task.status_reason:
            check_transition(task.status, new_status, reason)
            status_entry = status_change_entry(task, new_status, reason, changes.get("error"))
            changes.setdefault("status_reason", None)
            if new_status is TaskStatus.PAUSED:
                changes.setdefault("paused_at", now)
            if new_status.terminal:
                changes.setdefault("completed_at", now)
                changes.setdefault("control", None)
    changes["updated_at"] = now
    changes["version"] = task.version + 1
    # Values already of their field's type are taken as they are (the common
    # case, checked cheaply here); any other is validated as its field's type,
    # so a patch of "waiting" or a usage dict is stored as TaskStatus / Usage,
    # exactly like a fresh task.
    plain = {k: v for k, v in changes.items() if _is_typed(k, v)}
    patched = updated(task, plain)
    for name, value in changes.items():
        if name not in plain:
            Task.__pydantic_validator__.validate_assignment(patched, name, value)
    return patched, status_entry


def _is_typed(name: str, value: Any) -> bool:
    """True when `value` is already what validating it as task field `name` gives."""
    kind = _FIELD_KINDS.get(name)
    if kind is None:
        return False
    if value is None:
        return name in _NULLABLE
    if kind is datetime:
        return type(value) is datetime and value.tzinfo is not None
    if kind is dict:
        return type(value) is dict and all(type(k) is str for k in value)
    if kind is object:
        return True  # JSON: anything
    return type(value) is kind


_FIELD_KINDS: dict[str, type] = {
    "status": TaskStatus,
    "status_reason": str,
    "error": str,
    "iterations": int,
    "restarts": int,
    "round_seq": int,
    "version": int,
    "updated_at": datetime,
    "paused_at": datetime,
    "completed_at": datetime,
    "wake_at": datetime,
    "config": dict,
    "context": dict,
    "control": dict,
    "output": object,
    "input": object,
    "usage": Usage,
}
_NULLABLE = frozenset(
    {"status_reason", "error", "paused_at", "completed_at", "wake_at", "control", "output", "input"}
)


def status_change_entry(
    task: Task, new: TaskStatus, reason: str | None, error: str | None = None, **extra: Any
) -> NewEntry:
    payload: dict[str, Any] = {"from": task.status.value, "to": new.value, **extra}
    if reason is not None:
        payload["reason"] = reason
    if error is not None:
        payload["error"] = error
    return NewEntry(task_id=task.id, kind=EntryKind.STATUS, payload=payload)


def claimable(task: Task, now: datetime) -> bool:
    """Runnable = pending, running with an expired lease, or waiting with its wake-up due
    (a `ctx.sleep`, an approval's time limit or a deadline: `wake_at` is the first of them)."""
    if task.status is TaskStatus.PENDING:
        return task.wake_at is None or task.wake_at <= now  # a delayed start waits
    if task.status is TaskStatus.RUNNING:
        return task.lease.expires_at is None or task.lease.expires_at <= now
    return task.status is TaskStatus.WAITING and task.wake_at is not None and task.wake_at <= now


def claim_order(task: Task) -> tuple[int, float, str]:
    """The order claims take runnable tasks in: higher priority first, then oldest."""
    return (-task.priority, task.created_at.timestamp(), task.id)


def claim(task: Task, worker_id: str, ttl: float, now: datetime) -> tuple[Task, NewEntry]:
    """The task as a new owner holds it, and the status entry recording the claim.

    Raises InvalidTransition for a task that may not run (paused, blocked or
    ended): a takeover is running -> running, a claim pending or waiting -> running.
    """
    check_transition(task.status, TaskStatus.RUNNING)
    takeover = task.status is TaskStatus.RUNNING
    restarts = task.restarts + (1 if takeover else 0)
    lease = updated(
        task.lease,
        {
            "owner": worker_id,
            "expires_at": now + timedelta(seconds=ttl),
            "epoch": task.lease.epoch + 1,
        },
    )
    entry = status_change_entry(
        task,
        TaskStatus.RUNNING,
        None,
        worker=worker_id,
        epoch=lease.epoch,
        takeover=takeover,
    )
    claimed = updated(
        task,
        {
            "status": TaskStatus.RUNNING,
            "status_reason": None,
            "wake_at": None,
            "restarts": restarts,
            "lease": lease,
            "updated_at": now,
            "version": task.version + 1,
        },
    )
    return claimed, entry


def renewed(task: Task, worker_id: str, epoch: int, ttl: float, now: datetime) -> Task:
    check_fence(task, epoch)
    if task.lease.owner != worker_id:
        raise StaleLease(task.id, epoch, task.lease.epoch)
    lease = updated(task.lease, {"expires_at": now + timedelta(seconds=ttl)})
    return updated(task, {"lease": lease})


def released(task: Task, epoch: int, now: datetime) -> tuple[Task, NewEntry | None]:
    """Drop the lease; a task still `running` goes back to `pending` for the next worker."""
    check_fence(task, epoch)
    update: dict[str, Any] = {"lease": updated(task.lease, {"owner": None})}
    entry = None
    if task.status is TaskStatus.RUNNING:
        check_transition(task.status, TaskStatus.PENDING)
        entry = status_change_entry(task, TaskStatus.PENDING, None, released=True)
        update.update(status=TaskStatus.PENDING, updated_at=now, version=task.version + 1)
    return updated(task, update), entry


def check_new_child(task: Task) -> None:
    if task.status is not TaskStatus.PENDING:
        raise InvalidOption(f"new task {task.id!r} must start pending, not {task.status.value}")


# --- the model's view: one place decides what the model sees -----------------


def build_model_view(rows: Iterable[tuple[int, str, str]]) -> list[ApiMessage]:
    """API messages in seq order, skipping every range voided by a rollback marker;
    a round's tool results in the order of its calls (`in_call_order`).

    `rows` are (seq, kind, payload JSON text) for API kinds and rollback markers.
    Payload texts are joined and validated in one call: a 10,000-message history
    parses in milliseconds.
    """
    return parse_messages(view_text(rows))


def view_text(rows: Iterable[tuple[int, str, str]]) -> str:
    """The payloads the model sees as one JSON array text (see build_model_view)."""
    rows = list(rows)
    voided = voided_ranges(json.loads(p) for _s, k, p in rows if k == EntryKind.ROLLBACK)
    parts = []
    for seq, kind, payload in rows:
        if kind == EntryKind.ROLLBACK:
            continue
        if voided and is_voided(seq, voided):
            continue
        # A tool_result payload is the tool message plus an `outcome` field the
        # message model ignores, so every payload text parses as a message.
        parts.append(payload)
    return "[" + ",".join(parts) + "]"


def parse_messages(text: str) -> list[ApiMessage]:
    """A JSON array of API messages as typed messages, in one validation call.

    A long history builds thousands of small objects, none of them garbage
    (see `duragent.heap`).
    """
    with collector_paused():
        return in_call_order(API_MESSAGES.validate_json(text))


def view_data(text: str) -> list[dict[str, Any]]:
    """The model's view as plain data: a JSON array of API messages decoded in one
    call, in their wire form (as `dump_message` stored them, minus a tool
    result's `outcome`), not validated.

    The runtime resumes a long task from this and builds typed messages only
    when a model call asks for them (`duragent.llm.messages`). Text that is not
    a JSON array of objects is a damaged store: `StoreCorrupt`.
    """
    with collector_paused():
        try:
            # Keys only: every message repeats a few keys, while their texts are
            # mostly unique (caching those too costs more than it saves).
            data = pydantic_core.from_json(text, cache_strings="keys")
        except ValueError:
            try:  # what only Python's decoder takes (an escaped lone surrogate)
                data = json.loads(text)
            except ValueError as exc:
                raise StoreCorrupt(f"the model's view of a task is not valid JSON: {exc}") from exc
    if type(data) is not list:
        raise StoreCorrupt("the model's view of a task is not a list of message objects")
    for m in data:
        if type(m) is not dict:
            raise StoreCorrupt("the model's view of a task is not a list of message objects")
        if "outcome" in m:
            del m["outcome"]
    return in_call_order(data)


def build_ui_view(rows: Iterable[tuple[int, str]]) -> list[UiMessage]:
    """UI messages in seq order; only a `scope: "ui"` rollback (a deleted message) hides them."""
    data = [(seq, payload, json.loads(payload)) for seq, payload in rows]
    hidden = voided_ranges((d for _s, _p, d in data), "ui")
    return [
        UI_MESSAGE.validate_json(p)
        for s, p, d in data
        if not is_marker(d) and not is_voided(s, hidden)
    ]


VIEW_KINDS = tuple(k.value for k in (*API_KINDS, EntryKind.ROLLBACK))


# --- payloads on disk ----------------------------------------------------------
#
# Two fields are left out of the stored payload when they hold their default: an
# intent's `replay` ("never") and a result's `outcome` ("ok"), two of a round's
# three rows at every round. Reading an entry gives them back, so above the SQL
# stores a payload is exactly as it was written, and a row written before, which
# has them, reads the same. Only `Store.entries` reads these kinds' payloads;
# the model view drops a result's `outcome` anyway.
STORED_DEFAULTS: dict[EntryKind, tuple[str, str]] = {
    EntryKind.TOOL_INTENT: ("replay", "never"),
    EntryKind.TOOL_RESULT: ("outcome", "ok"),
}


class UnknownKind(str):
    """An entry kind a later version wrote, kept as it is so a file store still
    loads (and rewrites) it; reading that task's entries raises IncompatibleEntry."""

    __slots__ = ()

    @property
    def value(self) -> str:
        return str(self)


def kind_as_stored(raw: str) -> EntryKind | UnknownKind:
    """A stored kind: known, or kept as written (see UnknownKind)."""
    try:
        return EntryKind(raw)
    except ValueError:
        return UnknownKind(raw)


def entry_kind(task_id: str, seq: int, raw: str) -> EntryKind:
    """The kind of entry `seq` of a task as read back, or IncompatibleEntry naming it."""
    try:
        return EntryKind(raw)
    except ValueError:
        raise IncompatibleEntry(task_id, seq, str(raw)) from None


def packed(kind: EntryKind, payload: dict[str, Any]) -> dict[str, Any]:
    """The payload as stored: without the field its kind leaves out at its default."""
    default = STORED_DEFAULTS.get(kind)
    if default is None or payload.get(default[0], default) != default[1]:
        return payload
    key = default[0]
    return {k: v for k, v in payload.items() if k != key}


def unpacked(kind: EntryKind, payload: dict[str, Any]) -> dict[str, Any]:
    """A stored payload (a dict of its own, just parsed) as it was written."""
    default = STORED_DEFAULTS.get(kind)
    if default is not None:
        payload.setdefault(*default)
    return payload


def dumps(value: Any) -> str:
    """Compact JSON text: the one encoder the SQL stores write with.

    pydantic's encoder, in one call of compiled code: `json.dumps` builds an
    encoder object per call and costs about five times as much on a message.
    For JSON values its text is what `json.dumps(value, separators=(",", ":"),
    ensure_ascii=False)` writes but for the spelling of some floats (`1e-7`
    for `1e-07`); NaN and infinities are written as Python writes them. What
    reaches a store was made JSON before (API models, `storable` values); of
    the rest, pydantic writes sets, bytes and datetimes as arrays and text
    where `json.dumps` refused them, and refuses other objects as it did.
    """
    return pydantic_core.to_json(value, inf_nan_mode="constants").decode()


def to_ts(dt: datetime | None) -> float | None:
    return None if dt is None else dt.timestamp()


def from_ts(ts: float | None) -> datetime | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC)


def ts_to_dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


def encode_cursor(task: Task) -> str:
    return f"{task.created_at.timestamp():.6f}|{task.id}"


def decode_cursor(cursor: str) -> tuple[float, str]:
    try:
        ts, task_id = cursor.split("|", 1)
        return float(ts), task_id
    except ValueError as exc:
        raise InvalidOption(f"invalid cursor {cursor!r}") from exc


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


async def iter_entries(
    store: Store, task_id: str, *, after_seq: int = 0, page: int = 500
) -> AsyncIterator[Entry]:
    """Stream a task's entries in pages so a huge log never sits in memory at once."""
    while True:
        batch = await store.entries(task_id, after_seq=after_seq, limit=page)
        for entry in batch:
            yield entry
        if len(batch) < page:
            return
        after_seq = batch[-1].seq
