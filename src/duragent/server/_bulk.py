"""REST routes for bulk operations under /v1/bulk: one action on every task a filter matches.

An operation acts on the caller's own tasks only (another owner's are never
matched) and is seen only by the user who started it (another user's answers
404); an admin may name any owner in the filter (or none: everyone's tasks)
and sees every operation.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.config import JsonDict

from duragent.runtime._bulk import BulkOperation, TaskFilter
from duragent.runtime._bulk_run import ACTIONS
from duragent.runtime._versions import VERSION_PATTERN
from duragent.server._deps import RuntimeDep, UserDep, is_admin
from duragent.server._problems import Forbidden, problem_responses
from duragent.server._strict_json import StrictJsonRoute
from duragent.server._tasks import CURSOR_PATTERN

router = APIRouter(prefix="/v1/bulk", tags=["bulk operations"], route_class=StrictJsonRoute)

BulkId = Annotated[str, Path(min_length=1, max_length=200, description="A bulk operation's id.")]


# to_version: required for migrate, refused for the other actions (`_options`).
_TO_VERSION_RULE: JsonDict = {
    "if": {"properties": {"action": {"const": "migrate"}}, "required": ["action"]},
    "then": {"required": ["to_version"], "properties": {"to_version": {"type": "string"}}},
    "else": {"properties": {"to_version": {"type": "null"}}},  # absent or null
}


class BulkRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra=_TO_VERSION_RULE)

    action: str = Field(
        description="What to do to each matching task.",
        json_schema_extra={"enum": list(ACTIONS)},
    )
    filter: TaskFilter = Field(
        default_factory=TaskFilter,
        description="Which tasks: every field given must match. `status` defaults to every "
        "status the action applies to.",
    )
    dry_run: bool = Field(
        default=False, description="Only count the tasks that would be touched (200 {count})."
    )
    to_version: str | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        pattern=VERSION_PATTERN,
        description="migrate (required there, refused for the other actions): the version "
        "of their agent the tasks go on with; a task already on it is skipped.",
    )

    @field_validator("action")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in ACTIONS:
            raise ValueError(f"unknown bulk action {value!r}; one of: {', '.join(ACTIONS)}")
        return value

    @model_validator(mode="after")
    def _options(self) -> BulkRequest:
        if self.action == "migrate" and self.to_version is None:
            raise ValueError("migrate needs to_version: the version to move the tasks to")
        if self.action != "migrate" and self.to_version is not None:
            raise ValueError(f"{self.action} takes no to_version (only migrate does)")
        return self

    def options(self) -> dict[str, Any]:
        """The action's options (`Runtime.bulk(options=)`) this body gives."""
        return {} if self.to_version is None else {"to": self.to_version}


class BulkCount(BaseModel):
    count: int = Field(description="How many tasks the operation would touch now.")


class BulkError(BaseModel):
    task_id: str
    error: str


class BulkOut(BaseModel):
    id: str
    action: str
    filter: TaskFilter
    status: Literal["running", "done", "failed"]
    total: int = Field(description="Tasks matching when the operation started.")
    done: int = Field(description="Tasks acted on.")
    skipped: int = Field(description="Tasks no longer in a status the action applies to.")
    failed: int = Field(description="Tasks the action failed on (`errors`: the first few).")
    owner: str | None
    created_at: datetime
    errors: list[BulkError] = Field(default_factory=list)
    error: str | None = Field(None, description="Why a failed operation stopped.")
    to_version: str | None = Field(None, description="migrate: the version the tasks go to.")

    @classmethod
    def of(cls, op: BulkOperation) -> BulkOut:
        fields: dict[str, Any] = {
            name: getattr(op, name)
            for name in ("id", "action", "filter", "status", "total", "done", "skipped")
        }
        return cls(
            **fields,
            failed=op.failed,
            owner=op.owner,
            created_at=op.created_at,
            errors=[BulkError(**e) for e in op.errors],
            error=op.error,
            to_version=op.options.get("to"),
        )


class BulkPageOut(BaseModel):
    operations: list[BulkOut]
    next_cursor: str | None


def _seen_by(request: Request, user: str) -> str | None:
    """Whose operations the caller sees: an admin everyone's, others their own."""
    return None if is_admin(request, user) else user


@router.post(
    "",
    status_code=202,
    response_model=BulkOut,
    summary="Start a bulk operation, or count what it would touch",
    description="Retry, abort, pause, resume, migrate (to `to_version`) or purge every "
    "task the filter matches, as one durable operation (a crash finishes the rest "
    "once). `dry_run` answers 200 with the count and touches nothing. Others' tasks "
    "are never matched; an admin may name any `owner` in the filter, or none for everyone's.",
    responses={
        200: {"model": BulkCount, "description": "dry_run: how many tasks would be touched"},
        **problem_responses(400, 401, 403, 422),
    },
)
async def start_bulk(
    body: BulkRequest, user: UserDep, runtime: RuntimeDep, request: Request
) -> BulkOut | JSONResponse:
    flt = body.filter
    if not is_admin(request, user):
        if flt.owner is not None and flt.owner != user:
            raise Forbidden(
                f"only an admin may act on another owner's tasks, and {user!r} is not one"
            )
        flt = flt.model_copy(update={"owner": user})
    if body.dry_run:
        count = await runtime.bulk(body.action, flt, dry_run=True, options=body.options())
        return JSONResponse(BulkCount(count=count).model_dump(), status_code=200)
    return BulkOut.of(await runtime.bulk(body.action, flt, owner=user, options=body.options()))


@router.get(
    "",
    response_model=BulkPageOut,
    summary="List bulk operations, newest first",
    responses=problem_responses(401, 422),
)
async def list_bulk(
    user: UserDep,
    runtime: RuntimeDep,
    request: Request,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[
        str | None,
        Query(pattern=CURSOR_PATTERN, description="A next_cursor from the previous page."),
    ] = None,
) -> BulkPageOut:
    ops, next_cursor = await runtime.bulk_operations(
        owner=_seen_by(request, user), limit=limit, cursor=cursor
    )
    return BulkPageOut(operations=[BulkOut.of(op) for op in ops], next_cursor=next_cursor)


@router.get(
    "/{op_id}",
    response_model=BulkOut,
    summary="A bulk operation and its progress",
    responses=problem_responses(401, 404, 422),
)
async def get_bulk(op_id: BulkId, user: UserDep, runtime: RuntimeDep, request: Request) -> BulkOut:
    return BulkOut.of(await runtime.bulk_operation(op_id, owner=_seen_by(request, user)))
