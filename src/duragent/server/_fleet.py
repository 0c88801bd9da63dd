"""REST routes for running many tasks: counts per queue and status, queue limits, and
schedules under /v1/schedules. Counts and schedules are the caller's own.

Queue limits are shared by every user of the store, so only an admin
(`create_app(..., admins=)`, `duragent serve --admin USER`) may set or remove
them; anyone signed in may read them, with counts of their own tasks (an
admin's counts are everyone's)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from duragent.errors import QueueNotFound
from duragent.runtime._runtime import Runtime
from duragent.runtime._schedules import MAX_EVERY, MIN_EVERY, Schedule
from duragent.server._deps import AdminDep, RuntimeDep, UserDep, is_admin
from duragent.server._limits import LimitReached, ServerLimits, check_task_sizes
from duragent.server._problems import BadRequest, problem_responses
from duragent.server._schemas import iso_time_only
from duragent.server._strict_json import StrictJsonRoute
from duragent.store._queues import Queue

router = APIRouter(prefix="/v1", tags=["queues and schedules"], route_class=StrictJsonRoute)

_NAME = Annotated[str, Field(min_length=1, max_length=200)]
_TEN_YEARS = 10 * 365 * 86400
_MAX_SLOTS = 1_000_000


def _not_text(value: Any) -> Any:
    """Whole numbers are not strict (JSON Schema calls 3.0 an integer); text and
    booleans are still refused."""
    if isinstance(value, str | bool):
        raise ValueError("a whole number, not text or a boolean")
    return value


QueueName = Annotated[str, Path(min_length=1, max_length=200, description="A queue's name.")]
ScheduleName = Annotated[
    str, Path(min_length=1, max_length=200, description="One of my schedules' names.")
]


class CountsOut(BaseModel):
    counts: dict[str, dict[str, int]] = Field(
        description="Tasks per queue, then per status: {queue: {status: n}}."
    )
    total: int


class Rate(BaseModel):
    """Tasks started per period, all workers together (a token bucket in the store)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    tasks: int = Field(ge=1, le=1_000_000_000, strict=False)
    seconds: float = Field(gt=0, le=_TEN_YEARS)

    _whole = field_validator("tasks", mode="before")(_not_text)


class QueueSet(BaseModel):
    """A queue's limits, replacing the ones it had; a limit left out (or null) is none."""

    model_config = ConfigDict(extra="forbid", strict=True)

    concurrency: int | None = Field(
        None, ge=1, le=_MAX_SLOTS, strict=False, description="Running at once, all workers."
    )
    per_worker: int | None = Field(
        None, ge=1, le=_MAX_SLOTS, strict=False, description="Running at once on one worker."
    )
    per_owner: int | None = Field(
        None, ge=1, le=_MAX_SLOTS, strict=False, description="Running at once for one user."
    )
    rate: Rate | None = None
    ttl: float | None = Field(
        None, gt=0, le=_TEN_YEARS, description="Seconds a finished task is kept, then purged."
    )

    _whole = field_validator("concurrency", "per_worker", "per_owner", mode="before")(_not_text)


class QueueOut(BaseModel):
    name: str
    concurrency: int | None
    per_worker: int | None
    per_owner: int | None
    rate: Rate | None
    ttl: float | None
    counts: dict[str, int] = Field(
        description="Tasks in the queue per status: mine, or everyone's for an admin."
    )

    @classmethod
    def of(cls, q: Queue, counts: dict[str, int]) -> QueueOut:
        rate = None if q.rate is None else Rate(tasks=q.rate[0], seconds=q.rate[1])
        return cls(**{**q.definition(), "rate": rate}, counts=counts)


class QueuesOut(BaseModel):
    queues: list[QueueOut] = Field(
        description="Queues with limits, and the queues holding tasks counted here."
    )
    counts_of: Literal["mine", "everyone"]


class ScheduleCreate(BaseModel):
    # Strict like every request body: "5" is not a number, 0 is not a time.
    model_config = ConfigDict(extra="forbid", strict=True)

    name: _NAME
    agent: _NAME
    input: Any = None
    cron: str | None = Field(None, max_length=200, description="5 fields, UTC.")
    every: float | None = Field(
        None,
        ge=MIN_EVERY,
        le=MAX_EVERY,
        strict=False,
        allow_inf_nan=False,
        description=f"Seconds between ticks, at least {MIN_EVERY:g}.",
    )
    overlap: Literal["skip", "queue", "allow"] = "skip"
    queue: str | None = Field(None, max_length=200)
    priority: int = Field(0, ge=-1000, le=1000, description="Higher is claimed first.")
    metadata: dict[str, str | int | float | bool] | None = Field(None, max_length=32)
    start_at: datetime | None = Field(None, strict=False, description="ISO 8601, with a zone.")

    _times_are_text = field_validator("start_at", mode="before")(iso_time_only)


class ScheduleOut(BaseModel):
    name: str
    agent: str
    input: Any
    cron: str | None
    every: float | None
    overlap: str
    queue: str | None
    priority: int
    metadata: dict[str, Any]
    paused: bool
    next_at: datetime
    last_tick: datetime | None
    last_task_id: str | None

    @classmethod
    def of(cls, s: Schedule) -> ScheduleOut:
        return cls(**s.model_dump(exclude={"owner", "created_at"}))


class SchedulesOut(BaseModel):
    schedules: list[ScheduleOut]


@router.get(
    "/counts",
    response_model=CountsOut,
    summary="How many of my tasks are in each queue and status",
    responses=problem_responses(401, 422),
)
async def counts(
    user: UserDep,
    runtime: RuntimeDep,
    queue: Annotated[str | None, Query(max_length=200)] = None,
    agent: Annotated[str | None, Query(max_length=200)] = None,
) -> CountsOut:
    got = await runtime.counts(owner=user, queue=queue, agent=agent)
    return CountsOut(counts=got, total=sum(sum(v.values()) for v in got.values()))


async def _queue_views(
    runtime: Runtime, owner: str | None, name: str | None = None
) -> list[QueueOut]:
    """Queues with limits and queues with tasks (of `owner`; None: everyone's), by name."""
    defined = {q.name: q for q in await runtime.queues() if name is None or q.name == name}
    counts = await runtime.counts(owner=owner, queue=name)
    names = sorted(defined.keys() | counts.keys())
    return [QueueOut.of(defined.get(n) or Queue(n), counts.get(n, {})) for n in names]


def _counted_owner(request: Request, user: str) -> str | None:
    return None if is_admin(request, user) else user


@router.get(
    "/queues",
    response_model=QueuesOut,
    summary="Queues: their limits and how many tasks each holds",
    responses=problem_responses(401),
)
async def queues(request: Request, user: UserDep, runtime: RuntimeDep) -> QueuesOut:
    owner = _counted_owner(request, user)
    return QueuesOut(
        queues=await _queue_views(runtime, owner),
        counts_of="mine" if owner is not None else "everyone",
    )


@router.get(
    "/queues/{name}",
    response_model=QueueOut,
    summary="One queue: its limits and how many tasks it holds",
    responses=problem_responses(401, 404, 422),
)
async def get_queue(
    name: QueueName, request: Request, user: UserDep, runtime: RuntimeDep
) -> QueueOut:
    found = await _queue_views(runtime, _counted_owner(request, user), name)
    if not found:
        raise QueueNotFound(name)
    return found[0]


@router.put(
    "/queues/{name}",
    response_model=QueueOut,
    summary="Set a queue's limits, for every worker (admins only)",
    responses=problem_responses(401, 403, 422),
)
async def set_queue(
    name: QueueName, body: QueueSet, admin: AdminDep, runtime: RuntimeDep
) -> QueueOut:
    rate = None if body.rate is None else (body.rate.tasks, body.rate.seconds)
    await runtime.queue(name, **{**body.model_dump(), "rate": rate})
    (view,) = await _queue_views(runtime, None, name)
    return view


@router.delete(
    "/queues/{name}",
    status_code=204,
    summary="Remove a queue's limits; its tasks stay (admins only)",
    responses=problem_responses(401, 403, 404, 422),
)
async def delete_queue(name: QueueName, admin: AdminDep, runtime: RuntimeDep) -> Response:
    await runtime.delete_queue(name)
    return Response(status_code=204)


@router.post(
    "/schedules",
    status_code=201,
    response_model=ScheduleOut,
    summary="Create (or replace) a schedule of mine",
    responses=problem_responses(400, 401, 409, 422),
)
async def create_schedule(
    body: ScheduleCreate, user: UserDep, runtime: RuntimeDep, request: Request
) -> ScheduleOut:
    limits: ServerLimits = request.app.state.limits
    # Every tick submits a task with this input and metadata: the same limits.
    check_task_sizes(body.input, None, limits, body.metadata)
    others = [s for s in await runtime.schedules(owner=user) if s.name != body.name]
    _check_schedule_share(others, body.every, limits)
    try:
        sched = await runtime.schedule(
            body.name,
            body.agent,
            body.input,
            cron=body.cron,
            every=body.every,
            overlap=body.overlap,
            owner=user,
            queue=body.queue,
            priority=body.priority,
            metadata=body.metadata,
            start_at=body.start_at,
        )
    except (ValueError, ValidationError) as exc:
        raise BadRequest(_first_line(exc)) from None
    return ScheduleOut.of(sched)


def ticks_per_minute(every: float | None) -> float:
    """How many tasks a schedule submits per minute at most (cron: once a minute)."""
    return 1.0 if every is None else 60.0 / every


def _check_schedule_share(
    others: list[Schedule], every: float | None, limits: ServerLimits
) -> None:
    """One user's schedules, with the new one, stay within their number and their
    combined ticks per minute (each tick is a task everyone's workers run)."""
    if len(others) + 1 > limits.max_schedules:
        raise LimitReached(
            f"you have {len(others)} schedules, the most this server keeps per user "
            f"(serve --max-schedules); delete one first"
        )
    rate = sum(ticks_per_minute(s.every) for s in others) + ticks_per_minute(every)
    if rate > limits.max_schedule_ticks_per_minute + 1e-9:
        raise LimitReached(
            f"your schedules would tick {rate:g} times a minute together; this server "
            f"allows {limits.max_schedule_ticks_per_minute} per user "
            "(serve --max-schedule-ticks-per-minute): use a longer every"
        )


@router.get(
    "/schedules",
    response_model=SchedulesOut,
    summary="My schedules",
    responses=problem_responses(401),
)
async def list_schedules(user: UserDep, runtime: RuntimeDep) -> SchedulesOut:
    return SchedulesOut(schedules=[ScheduleOut.of(s) for s in await runtime.schedules(owner=user)])


async def _my_schedule(name: ScheduleName, user: UserDep, runtime: RuntimeDep) -> Schedule:
    """The signed-in user's schedule of that name; another user's is 'not found',
    exactly like one that does not exist."""
    return await runtime.get_schedule(name, owner=user)


MySchedule = Annotated[Schedule, Depends(_my_schedule)]


@router.get(
    "/schedules/{name}",
    response_model=ScheduleOut,
    summary="One of my schedules",
    responses=problem_responses(401, 404, 422),
)
async def get_schedule(sched: MySchedule) -> ScheduleOut:
    return ScheduleOut.of(sched)


@router.post(
    "/schedules/{name}/pause",
    response_model=ScheduleOut,
    summary="Stop ticking until resumed",
    responses=problem_responses(401, 404, 422),
)
async def pause_schedule(sched: MySchedule, runtime: RuntimeDep) -> ScheduleOut:
    return ScheduleOut.of(await runtime.pause_schedule(sched.name, owner=sched.owner))


@router.post(
    "/schedules/{name}/resume",
    response_model=ScheduleOut,
    summary="Tick again from the next tick after now",
    responses=problem_responses(401, 404, 422),
)
async def resume_schedule(sched: MySchedule, runtime: RuntimeDep) -> ScheduleOut:
    return ScheduleOut.of(await runtime.resume_schedule(sched.name, owner=sched.owner))


@router.delete(
    "/schedules/{name}",
    status_code=204,
    summary="Delete a schedule (tasks it submitted stay)",
    responses=problem_responses(401, 404, 422),
)
async def delete_schedule(name: ScheduleName, user: UserDep, runtime: RuntimeDep) -> Response:
    # By name, not read first: a stored schedule that no longer reads can still go.
    await runtime.delete_schedule(name, owner=user)
    return Response(status_code=204)


def _first_line(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(str(e["msg"]) for e in exc.errors())
    return str(exc)
