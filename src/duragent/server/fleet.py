"""REST routes for running many tasks: counts per queue and status, queue limits, and
schedules under /v1/schedules. Counts and schedules are the caller's own."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from duragent.runtime.schedules import Schedule
from duragent.server.deps import RuntimeDep, UserDep
from duragent.server.problems import BadRequest, problem_responses
from duragent.server.schemas import iso_time_only
from duragent.store.queues import Queue

router = APIRouter(prefix="/v1", tags=["queues and schedules"])

_NAME = Annotated[str, Field(min_length=1, max_length=200)]


class CountsOut(BaseModel):
    counts: dict[str, dict[str, int]] = Field(
        description="Tasks per queue, then per status: {queue: {status: n}}."
    )
    total: int


class QueueOut(BaseModel):
    name: str
    concurrency: int | None
    per_worker: int | None
    per_owner: int | None
    rate: tuple[int, float] | None
    ttl: float | None

    @classmethod
    def of(cls, q: Queue) -> QueueOut:
        return cls(**q.definition())


class QueuesOut(BaseModel):
    queues: list[QueueOut]


class ScheduleCreate(BaseModel):
    # Strict like every request body: "5" is not a number, 0 is not a time.
    model_config = ConfigDict(extra="forbid", strict=True)

    name: _NAME
    agent: _NAME
    input: Any = None
    cron: str | None = Field(None, max_length=200, description="5 fields, UTC.")
    every: float | None = Field(
        None, gt=0, le=10 * 365 * 86400, strict=False, description="Seconds between ticks."
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


@router.get(
    "/queues",
    response_model=QueuesOut,
    summary="Queues with limits (set by the operator)",
    responses=problem_responses(401),
)
async def queues(user: UserDep, runtime: RuntimeDep) -> QueuesOut:
    return QueuesOut(queues=[QueueOut.of(q) for q in await runtime.queues()])


@router.post(
    "/schedules",
    status_code=201,
    response_model=ScheduleOut,
    summary="Create (or replace) a schedule of mine",
    responses=problem_responses(400, 401, 422),
)
async def create_schedule(body: ScheduleCreate, user: UserDep, runtime: RuntimeDep) -> ScheduleOut:
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


@router.get(
    "/schedules",
    response_model=SchedulesOut,
    summary="My schedules",
    responses=problem_responses(401),
)
async def list_schedules(user: UserDep, runtime: RuntimeDep) -> SchedulesOut:
    return SchedulesOut(schedules=[ScheduleOut.of(s) for s in await runtime.schedules(owner=user)])


@router.get(
    "/schedules/{name}",
    response_model=ScheduleOut,
    summary="One of my schedules",
    responses=problem_responses(401, 404, 422),
)
async def get_schedule(name: str, user: UserDep, runtime: RuntimeDep) -> ScheduleOut:
    return ScheduleOut.of(await runtime.get_schedule(name, owner=user))


@router.post(
    "/schedules/{name}/pause",
    response_model=ScheduleOut,
    summary="Stop ticking until resumed",
    responses=problem_responses(401, 404, 422),
)
async def pause_schedule(name: str, user: UserDep, runtime: RuntimeDep) -> ScheduleOut:
    return ScheduleOut.of(await runtime.pause_schedule(name, owner=user))


@router.post(
    "/schedules/{name}/resume",
    response_model=ScheduleOut,
    summary="Tick again from the next tick after now",
    responses=problem_responses(401, 404, 422),
)
async def resume_schedule(name: str, user: UserDep, runtime: RuntimeDep) -> ScheduleOut:
    return ScheduleOut.of(await runtime.resume_schedule(name, owner=user))


@router.delete(
    "/schedules/{name}",
    status_code=204,
    summary="Delete a schedule (tasks it submitted stay)",
    responses=problem_responses(401, 404, 422),
)
async def delete_schedule(name: str, user: UserDep, runtime: RuntimeDep) -> Response:
    await runtime.delete_schedule(name, owner=user)
    return Response(status_code=204)


def _first_line(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(str(e["msg"]) for e in exc.errors())
    return str(exc)
