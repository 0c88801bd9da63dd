"""What a store is asked to write and to read: a Commit and its parts, the
commit `Store.commit_soon` queues, what a write returns, and a task query."""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
from collections.abc import Generator, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from duragent.errors import InvalidOption
from duragent.types import Document, Entry, EntryKind, NewEntry, Task, TaskStatus


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
    # The worker holding the leases `fence` names: a lease of the same epoch held
    # by another worker is not its own (epochs can repeat after a failover that
    # lost a claim). None: the epoch alone decides.
    owner: str | None = None
    # Task id -> the last seq the writer was told is stored: a store whose log of
    # the task ends before it has lost acknowledged commits (a failover), and
    # refuses the commit with LostCommits.
    seen: dict[str, int] = field(default_factory=dict)
    # A commit queued by `Store.commit_soon` that this one must follow: if that
    # one failed, this one fails with its error and writes nothing.
    after: PendingCommit | None = None


class PendingCommit:
    """A commit `Store.commit_soon` queued; `await pending` gives its result.

    It lands before any commit this store is asked for after it that touches one
    of its tasks, or writes anything but task rows and entries. (Commits of
    other tasks only may land beside it: PostgreSQL's lanes,
    store/_postgres_lanes.py.) Order across tasks is asked for by naming it: a commit made
    with `after=pending` never lands without it: the store sets `failed` the
    moment the commit's fate is known as a failure, before it runs the next
    job, and refuses every commit that names it with that error.
    """

    __slots__ = ("failed", "future")

    def __init__(self) -> None:
        self.failed: BaseException | None = None
        self.future: asyncio.Future[CommitResult] | None = None

    def __await__(self) -> Generator[Any, None, CommitResult]:
        # Shielded: a caller that stops waiting (a timeout) leaves the commit queued.
        assert self.future is not None
        return asyncio.shield(self.future).__await__()


def follows(commit: Commit) -> None:
    """Refuse `commit` if the commit it follows failed (see PendingCommit)."""
    if commit.after is not None and commit.after.failed is not None:
        raise commit.after.failed
    watch = WATCH.get()
    if watch is not None and commit.after is not None and commit.after in watch.links:
        watch.hit = True


class Watch:
    """The commits in the air or left waiting while the PostgreSQL writer picks
    a lane (store/_postgres_lanes.py `pick`): a job whose
    commit names one of them (`Commit.after`) must not land before it."""

    __slots__ = ("hit", "links")

    def __init__(self, links: set[PendingCommit]) -> None:
        self.links = links
        self.hit = False


# Set while `pick` runs its jobs; `follows` looks.
WATCH: contextvars.ContextVar[Watch | None] = contextvars.ContextVar("duragent_watch", default=None)


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


# The fields of a TaskQuery the kept counts answer (and the paging, which a count ignores).
_COUNT_KEYS = frozenset({"owner", "no_owner", "status", "agent", "queue", "limit", "cursor"})


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
    id_prefix: str | None = None  # the task id starts with this text (compared exactly)
    agent_version: str | None = None  # the version the task is pinned to (`Task.agent_version`)

    def equal_filters(self) -> list[tuple[str, str]]:
        """The (field, value) pairs a task must match exactly: the ones that are set."""
        fields = ("owner", "session_id", "parent_id", "root_id", "agent", "queue", "agent_version")
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
        if self.id_prefix is not None and not task.id.startswith(self.id_prefix):
            return False
        return all(
            k in task.metadata and task.metadata[k] == v for k, v in (self.metadata or {}).items()
        )

    def id_range(self) -> tuple[str, str | None]:
        """`id_prefix` as a range of ids, [low, high) (high None: no end), for an
        index of ids in code point order (SQLite's BINARY, PostgreSQL's "C" on
        UTF-8) to serve the search; the prefix is still compared exactly."""
        prefix = self.id_prefix or ""
        head = prefix
        while head:  # the first text after every one that starts with the prefix
            code = ord(head[-1]) + 1
            if code <= 0x10FFFF:
                code = 0xE000 if 0xD800 <= code <= 0xDFFF else code  # no surrogates
                return prefix, head[:-1] + chr(code)
            head = head[:-1]
        return prefix, None

    def counted(self) -> bool:
        """Whether the counts a store keeps per (owner, agent, queue, status) answer
        this query's count: it filters by nothing else. Every other field is
        named by what it is not, so that a filter added later reads the tasks."""
        return all(
            getattr(self, f.name) == f.default
            for f in dataclasses.fields(self)
            if f.name not in _COUNT_KEYS
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


def counted_filters(q: TaskQuery, mark: str) -> tuple[list[str], list[Any]]:
    """The WHERE terms and parameters of a `counted` query over the counts a store
    keeps, whose owner column `okey` is '' for no owner and '.' + the owner else;
    `mark` is the driver's placeholder."""
    where: list[str] = []
    params: list[Any] = []
    if q.null_filters():
        where.append("okey = ''")
    if q.owner is not None:
        where.append(f"okey = {mark}")
        params.append("." + q.owner)
    elif not q.null_filters():
        # Every owner: a bound every key meets, so that the key's index serves
        # the read. On PostgreSQL a scan of the table would read every dead
        # version the counts' updates left since the last vacuum (27 ms at a
        # million changes against 0.1, bench/list_scale.py).
        where.append("okey >= ''")
    for column in ("agent", "queue"):
        if (value := getattr(q, column)) is not None:
            where.append(f"{column} = {mark}")
            params.append(value)
    statuses = q.statuses()
    if statuses is not None:
        where.append("status IN (" + ", ".join([mark] * len(statuses)) + ")")
        params.extend(statuses)
    return where, params
