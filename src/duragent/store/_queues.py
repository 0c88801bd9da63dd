"""Queues: where tasks wait, and the limits that decide which of them may start.

A queue is a name on each task (default: its agent's name) plus, when it has
limits, a definition kept in the store as a document (scope `duragent:queues`,
key = the queue's name), so every worker on every machine reads the same
limits, and the rate limit's token bucket is one shared row. The claim
transaction reads the definitions (PostgreSQL: `FOR UPDATE`, so claims of
limited queues take turns; SQLite: `BEGIN IMMEDIATE` already serialises),
counts the running tasks, admits candidates against the limits and writes the
bucket back, all in one transaction: concurrent claims can never exceed a limit.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel, Field, ValidationError, field_validator

from duragent.errors import InvalidOption, QueueNotFound, invalid_option
from duragent.store._commits import Commit, DocumentWrite
from duragent.store._protocol import Store
from duragent.types import Task, TaskStatus

QUEUES_SCOPE = "duragent:queues"
MAX_SECONDS = 10 * 365 * 86400.0  # the longest ttl or rate period: later times overflow


class Queue(BaseModel):
    """`Queue("emails", concurrency=3, per_worker=1, per_owner=1, rate=(10, 60))`.

    concurrency: tasks of the queue running at once, across all workers and machines.
    per_worker: running at once on one worker. per_owner: running at once for one
    owner (tenant), so one owner cannot take every slot. rate: (n, seconds) tasks
    started per period (a token bucket of n, refilled continuously; a task resumed
    after a timer or taken over after a crash is not a new start). ttl: seconds a
    finished task of the queue is kept before workers purge it.
    """

    name: str = Field(min_length=1)
    concurrency: int | None = Field(default=None, ge=1)
    per_worker: int | None = Field(default=None, ge=1)
    per_owner: int | None = Field(default=None, ge=1)
    rate: tuple[int, float] | None = None
    ttl: float | None = Field(default=None, gt=0, le=MAX_SECONDS, allow_inf_nan=False)
    # The shared token bucket of the rate limit: the store's, not the user's.
    tokens: float | None = None
    refilled_at: float | None = None

    def __init__(self, name: str | None = None, /, **data: Any) -> None:
        if name is not None:
            data["name"] = name
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise invalid_option("queue", exc) from None

    @field_validator("rate")
    @classmethod
    def _rate(cls, value: tuple[int, float] | None) -> tuple[int, float] | None:
        if value is not None and not (
            1 <= value[0] <= 1_000_000_000 and 0 < value[1] <= MAX_SECONDS
        ):  # `not`, so a NaN period fails too
            raise InvalidOption(
                "rate is (tasks, seconds) with 1 <= tasks <= 10^9 and 0 < seconds <= 10 years"
            )
        return value

    @property
    def limited(self) -> bool:
        return any(
            v is not None for v in (self.concurrency, self.per_worker, self.per_owner, self.rate)
        )

    def definition(self) -> dict[str, Any]:
        """What a user set: the document value, without the bucket's state."""
        return self.model_dump(mode="json", exclude={"tokens", "refilled_at"})


def queue_from_value(value: Any) -> Queue:
    return Queue.model_validate(value)


class Row(Protocol):
    """A database row read by column name (sqlite3.Row, psycopg's dict rows)."""

    def __getitem__(self, key: str, /) -> Any: ...


_R = TypeVar("_R", bound=Row)


@dataclass(slots=True)
class Candidate:
    """A runnable task as the claim query found it; parsed (`load`) only if admitted."""

    id: str
    status: TaskStatus
    queue: str
    owner: str | None
    priority: int
    created: float  # seconds since the epoch
    load: Callable[[], Task]

    def order(self) -> tuple[int, float, str]:
        """Claim order: higher priority first, then oldest."""
        return (-self.priority, self.created, self.id)

    @classmethod
    def from_row(cls, row: _R, parse: Callable[[_R], Task | None]) -> Candidate:
        """A candidate from a claim query's row (columns id, status, queue, owner,
        priority, created_at as seconds or a datetime); `parse` reads its task."""

        def load() -> Task:
            task = parse(row)
            assert task is not None
            return task

        created = row["created_at"]
        return cls(
            row["id"],
            TaskStatus(row["status"]),
            row["queue"],
            row["owner"],
            row["priority"],
            created.timestamp() if isinstance(created, datetime) else created,
            load,
        )


def candidate_of(task: Task) -> Candidate:
    return Candidate(
        task.id,
        task.status,
        task.queue or task.agent,
        task.owner,
        task.priority,
        task.created_at.timestamp(),
        lambda: task,
    )


class ClaimBudget:
    """The limits of one claim transaction: admits candidates and books what they take.

    `running` rows are (queue, owner, lease owner, count) of tasks now running
    in the limited queues, read inside the same transaction as the claim.
    """

    def __init__(self, queues: Iterable[Queue], worker_id: str, now: datetime) -> None:
        self.queues = {q.name: q for q in queues if q.limited}
        self.worker_id = worker_id
        self.now = now.timestamp()
        self.running: Counter[str] = Counter()
        self.mine: Counter[str] = Counter()
        self.by_owner: Counter[tuple[str, str]] = Counter()
        self.spent: set[str] = set()
        for q in self.queues.values():
            if q.rate is not None:
                n, period = q.rate
                tokens = n if q.tokens is None else q.tokens
                elapsed = max(0.0, self.now - (q.refilled_at or self.now))
                q.tokens = min(float(n), tokens + elapsed * n / period)
                q.refilled_at = self.now

    def count(self, rows: Iterable[tuple[str, str | None, str | None, int]]) -> None:
        for queue, owner, lease_owner, n in rows:
            self.running[queue] += n
            self.by_owner[(queue, owner or "")] += n
            if lease_owner == self.worker_id:
                self.mine[queue] += n

    def closed(self) -> set[str]:
        """Queues in which nothing new may start now (a takeover still may)."""
        out = set()
        for name, q in self.queues.items():
            if (
                (q.concurrency is not None and self.running[name] >= q.concurrency)
                or (q.per_worker is not None and self.mine[name] >= q.per_worker)
                or (q.rate is not None and (q.tokens or 0.0) < 1.0)
            ):
                out.add(name)
        return out

    def admit(self, task: Candidate) -> bool:
        """Whether the task may start now; if so, its share is booked."""
        name = task.queue
        q = self.queues.get(name)
        if q is None:
            return True
        takeover = task.status is TaskStatus.RUNNING  # already counted as running
        fresh = task.status is TaskStatus.PENDING
        owner = (name, task.owner or "")
        if q.per_worker is not None and self.mine[name] >= q.per_worker:
            return False
        if not takeover:
            if q.concurrency is not None and self.running[name] >= q.concurrency:
                return False
            if q.per_owner is not None and self.by_owner[owner] >= q.per_owner:
                return False
            if fresh and q.rate is not None and (q.tokens or 0.0) < 1.0:
                return False
            self.running[name] += 1
            self.by_owner[owner] += 1
            if fresh and q.rate is not None:
                q.tokens = (q.tokens or 0.0) - 1.0
                self.spent.add(name)
        self.mine[name] += 1
        return True

    def spent_buckets(self) -> list[Queue]:
        """The queues whose token bucket this claim drew from, to write back."""
        return [self.queues[name] for name in sorted(self.spent)]


async def define_queue(store: Store, queue: Queue) -> Queue:
    """Create or replace a queue's definition. The rate limit's bucket carries on
    while the rate stays the same (so restarting workers never refills it)."""
    value = queue.definition()
    current = await store.get_document(QUEUES_SCOPE, queue.name)
    if current is not None:
        old = queue_from_value(current.value)
        if old.rate == queue.rate and old.tokens is not None:
            value.update(tokens=old.tokens, refilled_at=old.refilled_at)
        if old.model_dump(mode="json") == value:
            return old
    await store.commit(Commit(documents=[DocumentWrite(QUEUES_SCOPE, queue.name, value)]))
    return Queue.model_validate(value)


async def list_queues(store: Store) -> list[Queue]:
    return [queue_from_value(d.value) for d in await store.list_documents(QUEUES_SCOPE)]


async def delete_queue(store: Store, name: str) -> None:
    if await store.get_document(QUEUES_SCOPE, name) is None:
        raise QueueNotFound(name)
    await store.commit(Commit(documents=[DocumentWrite(QUEUES_SCOPE, name, delete=True)]))
