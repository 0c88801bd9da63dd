"""Schedules: submit a task on a cron expression or every N seconds, exactly once per tick.

A schedule is a document in the store (scope `duragent:schedules`, one per
owner and name), so it survives restarts and every worker sees the same one.
A worker that runs the schedule's agent fires a due tick with ONE commit that
creates the task (request id `schedule:<name>:<tick time>`) and moves the
schedule's `next_at` on, guarded by the document's version: two workers
firing the same tick race on that version and only one commit lands; a worker
killed before its commit leaves the tick due for the next one. Either way
each tick submits exactly one task.

Missed ticks (every worker down, or the schedule paused): only the latest
missed tick runs, once, when a worker is back; the ones before it are skipped.
Overlap, when the previous run of the schedule is still active: "skip" drops
the tick, "queue" keeps it due until the previous run ends (then it runs, once),
"allow" runs it anyway.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field, ValidationError, model_validator

from duragent.errors import (
    Conflict,
    InvalidOption,
    ScheduleNotFound,
    ScheduleUnreadable,
    StoreError,
    TaskNotFound,
    UsageError,
    invalid_option,
)
from duragent.runtime._agent import Agent
from duragent.runtime._submit import new_task
from duragent.store._commits import Commit, DocumentWrite
from duragent.store._protocol import Store
from duragent.types import JSON, Document, utcnow

if TYPE_CHECKING:
    from croniter import croniter  # untyped: Any to mypy, named for the reader

SCHEDULES_SCOPE = "duragent:schedules"

# The shortest and longest `every`: below a second a schedule is a busy loop
# (and below a microsecond its step is zero), past ten years a time overflows.
MIN_EVERY = 1.0
MAX_EVERY = 10 * 365 * 86400.0


Overlap = Literal["skip", "queue", "allow"]


class Schedule(BaseModel):
    name: str = Field(min_length=1)
    agent: str
    input: JSON = None
    owner: str | None = None
    cron: str | None = None  # standard 5 fields, UTC (needs the `schedules` extra: croniter)
    every: float | None = Field(
        default=None, ge=MIN_EVERY, le=MAX_EVERY, allow_inf_nan=False
    )  # seconds
    overlap: Overlap = "skip"
    queue: str | None = None
    priority: int = 0
    metadata: dict[str, JSON] = Field(default_factory=dict)
    paused: bool = False
    next_at: datetime
    last_tick: datetime | None = None
    last_task_id: str | None = None
    created_at: datetime = Field(default_factory=utcnow)

    @model_validator(mode="after")
    def _one_clock(self) -> Schedule:
        if (self.cron is None) == (self.every is None):
            raise InvalidOption("a schedule needs exactly one of cron= or every=")
        if self.cron is not None:
            _croniter(self.cron, self.next_at)  # a bad expression fails here, not at a tick
        return self

    def following(self, after: datetime) -> datetime:
        """The first tick strictly after `after`."""
        if self.every is not None:
            step = timedelta(seconds=self.every)
            if after < self.next_at:
                return self.next_at
            missed = (after - self.next_at) // step
            return self.next_at + (missed + 1) * step
        return _croniter(str(self.cron), after).get_next(datetime)  # type: ignore[no-any-return]

    def latest_due(self, now: datetime) -> datetime:
        """The latest tick at or before `now` (the one a catch-up runs)."""
        if self.every is not None:
            step = timedelta(seconds=self.every)
            return self.next_at + ((now - self.next_at) // step) * step
        prev = _croniter(str(self.cron), now + timedelta(microseconds=1)).get_prev(datetime)
        return max(self.next_at, prev)  # type: ignore[no-any-return]

    def request_id(self, tick: datetime) -> str:
        return f"schedule:{self.name}:{tick.isoformat()}"


def _croniter(expr: str, start: datetime) -> croniter:
    try:
        from croniter import croniter
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise UsageError(
            "cron schedules need croniter: pip install 'duragent[schedules]' (or use every=)"
        ) from exc
    if len(expr.split()) != 5:
        raise InvalidOption(
            f"cron expression {expr!r} must have 5 fields (minute hour dom month dow)"
        )
    try:
        return croniter(expr, start)
    except (ValueError, KeyError) as exc:
        raise InvalidOption(f"invalid cron expression {expr!r}: {exc}") from exc


def check_every(every: float) -> float:
    """`every` as a number of seconds a schedule can tick on, or InvalidOption."""
    if isinstance(every, bool) or not isinstance(every, int | float):
        raise InvalidOption(f"every is a number of seconds, not {every!r}")
    if not math.isfinite(every) or not MIN_EVERY <= every <= MAX_EVERY:
        raise InvalidOption(
            f"every must be between {MIN_EVERY:g} and {MAX_EVERY:g} seconds, not {every!r}"
        )
    return float(every)


def schedule_key(owner: str | None, name: str) -> str:
    return json.dumps([owner or "", name])


def new_schedule(
    name: str,
    agent: str,
    input: Any,
    *,
    cron: str | None = None,
    every: float | timedelta | None = None,
    overlap: Overlap = "skip",
    owner: str | None = None,
    queue: str | None = None,
    priority: int = 0,
    metadata: Mapping[str, Any] | None = None,
    start_at: datetime | None = None,
) -> Schedule:
    """A schedule whose first tick is `start_at`, else one period (or cron step) from now."""
    if isinstance(every, timedelta):
        every = every.total_seconds()
    if every is not None:
        every = check_every(every)
    now = utcnow()
    if start_at is not None and start_at.tzinfo is None:
        raise InvalidOption("start_at must be timezone-aware (e.g. datetime.now(UTC))")
    if start_at is not None and start_at > now + timedelta(seconds=MAX_EVERY):
        raise InvalidOption("start_at is more than ten years away")
    if start_at is None and every is not None:
        start_at = now + timedelta(seconds=every)
    if start_at is None and cron is not None:
        start_at = _croniter(cron, now).get_next(datetime)
    try:
        return Schedule(
            name=name,
            agent=agent,
            input=input,
            owner=owner,
            cron=cron,
            every=every,
            overlap=overlap,
            queue=queue,
            priority=priority,
            metadata=dict(metadata or {}),
            next_at=start_at or now,
        )
    except ValidationError as exc:
        raise invalid_option("schedule", exc) from None


async def put_schedule(store: Store, schedule: Schedule) -> Schedule:
    key = schedule_key(schedule.owner, schedule.name)
    value = schedule.model_dump(mode="json")
    await store.commit(Commit(documents=[DocumentWrite(SCHEDULES_SCOPE, key, value)]))
    return schedule


async def list_schedules(store: Store, owner: str | None = None) -> list[Schedule]:
    """Every schedule, or one owner's (`owner=""` is the schedules without an owner)."""
    out = []
    for doc in await store.list_documents(SCHEDULES_SCOPE):
        with contextlib.suppress(ScheduleUnreadable):  # it never fires; only delete it
            out.append(_from_doc(doc))
    if owner is not None:
        out = [s for s in out if (s.owner or "") == owner]
    return out


async def get_schedule(store: Store, name: str, owner: str | None = None) -> Schedule:
    doc = await store.get_document(SCHEDULES_SCOPE, schedule_key(owner, name))
    if doc is None:
        raise ScheduleNotFound(name)
    return _from_doc(doc)


async def set_paused(store: Store, name: str, owner: str | None, paused: bool) -> Schedule:
    """Pause or resume; on resume the next tick is the first one after now (missed ones skip)."""
    for _ in range(10):
        doc = await store.get_document(SCHEDULES_SCOPE, schedule_key(owner, name))
        if doc is None:
            raise ScheduleNotFound(name)
        sched = _from_doc(doc)
        update: dict[str, Any] = {"paused": paused}
        if not paused and sched.paused:
            update["next_at"] = sched.following(utcnow())
        sched = sched.model_copy(update=update)
        try:
            await _replace(store, doc, sched)
        except Conflict:
            continue
        return sched
    raise Conflict(f"schedule {name!r} kept changing")


async def delete_schedule(store: Store, name: str, owner: str | None = None) -> None:
    key = schedule_key(owner, name)
    if await store.get_document(SCHEDULES_SCOPE, key) is None:
        raise ScheduleNotFound(name)
    await store.commit(Commit(documents=[DocumentWrite(SCHEDULES_SCOPE, key, delete=True)]))


BadRow = Callable[[Document, Exception], None]


async def fire_due(
    store: Store,
    agents: Mapping[str, Agent],
    now: datetime | None = None,
    on_bad: BadRow | None = None,
) -> tuple[list[str], datetime | None]:
    """Fire every due tick of the schedules of `agents`; return (task ids, next due time).

    One schedule that cannot be read or fired (a row written around validation,
    a time past year 9999) is told to `on_bad` and skipped: it must not stop
    every other owner's schedules. Store errors still end the pass (all rows
    share the store)."""
    now = now or utcnow()
    fired: list[str] = []
    soonest: datetime | None = None
    for doc in await store.list_documents(SCHEDULES_SCOPE):
        try:
            sched = _from_doc(doc)
            agent = agents.get(sched.agent)
            if agent is None or sched.paused:
                continue
            if sched.next_at <= now:
                task_id = await _fire(store, agent, doc, sched, now)
                if task_id is not None:
                    fired.append(task_id)
                continue  # re-read next time round: its next_at moved (or it waits for a run)
        except StoreError:
            raise
        except Exception as exc:  # one bad row, not the loop
            if on_bad is not None:
                on_bad(doc, exc)
            continue
        soonest = sched.next_at if soonest is None else min(soonest, sched.next_at)
    return fired, soonest


async def _fire(
    store: Store, agent: Agent, doc: Document, sched: Schedule, now: datetime
) -> str | None:
    tick = sched.latest_due(now)
    following = sched.following(now)
    if sched.overlap != "allow" and sched.last_task_id is not None:
        try:
            previous = await store.get_task(sched.last_task_id)
        except TaskNotFound:
            previous = None
        if previous is not None and not previous.status.terminal:
            if sched.overlap == "queue":
                return None  # stays due; runs once the previous run has ended
            skipped = sched.model_copy(update={"next_at": following})
            with contextlib.suppress(Conflict):  # else another worker moved it on
                await _replace(store, doc, skipped)
            return None
    task, first = new_task(agent, sched.input, owner=sched.owner, request_id=sched.request_id(tick))
    task.queue = sched.queue or agent.name
    task.priority = sched.priority
    task.metadata = {**sched.metadata, "schedule": sched.name}
    moved = sched.model_copy(
        update={"next_at": following, "last_tick": tick, "last_task_id": task.id}
    )
    write = DocumentWrite(
        SCHEDULES_SCOPE,
        doc.key,
        moved.model_dump(mode="json"),
        expect_version=doc.version,
    )
    try:
        await store.commit(Commit(new_tasks=[task], entries=[first], documents=[write]))
    except Conflict:
        return None  # another worker fired this tick first
    return task.id


async def _replace(store: Store, doc: Document, sched: Schedule) -> None:
    write = DocumentWrite(
        SCHEDULES_SCOPE, doc.key, sched.model_dump(mode="json"), expect_version=doc.version
    )
    await store.commit(Commit(documents=[write]))


def _from_doc(doc: Document) -> Schedule:
    try:
        return Schedule.model_validate(doc.value)
    except (ValidationError, ValueError, TypeError) as exc:
        raise ScheduleUnreadable(doc.key, _reasons(exc)) from None


def _reasons(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}".lstrip(": ") for e in exc.errors()
        )
    return str(exc)
