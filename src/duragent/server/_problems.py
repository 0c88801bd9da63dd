"""Errors as `application/problem+json`: duragent errors get a status and a clear title."""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match, Mount

from duragent.errors import (
    Conflict,
    DuplicateRequest,
    DuragentError,
    IncompatibleEntry,
    InvalidArguments,
    InvalidTransition,
    NotFound,
    QueueNotFound,
    ScheduleNotFound,
    ScheduleUnreadable,
    SessionNotFound,
    StoreError,
    TaskBusy,
    TaskNotFound,
    UnknownAgent,
    UsageError,
)
from duragent.server._limits import LimitReached
from duragent.server._problem_types import GENERIC, PROBLEM_TYPES, type_uri
from duragent.server._schemas import Problem

log = logging.getLogger("duragent.server")

MEDIA_TYPE = "application/problem+json"


class NotAuthenticated(Exception):
    """No bearer token, or one nobody owns."""

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(detail)


class Forbidden(Exception):
    """A signed-in user asking for what only an admin may do."""

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(detail)


class BadRequest(UsageError):
    """A request the server can parse but not act on (a bad cursor, a bad Last-Event-ID)."""


class TaskFinished(InvalidTransition):
    """A message sent to a finished task: said in REST terms (the library's own error
    names Python calls)."""

    def __init__(self, task_id: str, status: str) -> None:
        super().__init__(
            status,
            "running",
            "a finished task takes no messages; continue its conversation with "
            "POST /v1/sessions/{session_id}/messages (or POST /v1/tasks with session_id "
            f"and continue_session=true), or fork it with POST /v1/tasks/{task_id}/fork",
        )


# Most specific first: the first class the exception is an instance of decides.
_MAPPING: list[tuple[type[Exception], str]] = [
    (ScheduleNotFound, "schedule-not-found"),
    (ScheduleUnreadable, "schedule-unreadable"),
    (LimitReached, "limit-reached"),
    (QueueNotFound, "queue-not-found"),
    (SessionNotFound, "session-not-found"),
    (TaskNotFound, "task-not-found"),
    (NotFound, "not-found"),
    (TaskFinished, "task-finished"),
    (InvalidTransition, "invalid-transition"),
    (TaskBusy, "task-busy"),
    (Conflict, "conflict"),
    (DuplicateRequest, "request-id-reused"),
    (IncompatibleEntry, "entry-too-new"),
    (UnknownAgent, "unknown-agent"),
    (InvalidArguments, "invalid-tool-arguments"),
    (UsageError, "bad-request"),
    (StoreError, "store-unavailable"),
]


def problem(
    status: int,
    title: str,
    detail: str | None = None,
    *,
    headers: dict[str, str] | None = None,
    errors: list[dict[str, Any]] | None = None,
    kind: str | None = None,
) -> JSONResponse:
    """A problem response; `kind` is its slug in PROBLEM_TYPES (default: the status's)."""
    kind = kind or GENERIC.get(status)
    body = Problem(
        type=type_uri(kind) if kind else "about:blank",
        title=title,
        status=status,
        detail=detail,
        errors=errors,
    )
    return JSONResponse(
        body.model_dump(exclude_none=True),
        status_code=status,
        headers=headers,
        media_type=MEDIA_TYPE,
    )


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses=` documenting these error statuses as problem details."""
    out: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        out[status] = {
            "description": HTTPStatus(status).phrase,
            "content": {MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        }
    return out


# A 5xx says what happened, never how: store messages name files, hosts, database
# users and library internals, which belong in the server log only.
_SERVER_SIDE = "The server could not do this now; its log has the details."


def _duragent_error(request: Request, exc: Exception) -> JSONResponse:
    for cls, kind in _MAPPING:
        if isinstance(exc, cls):
            status, title, _ = PROBLEM_TYPES[kind]
            if status >= 500:
                log.error("%s %s: %s", request.method, request.url.path, exc)
                return problem(status, title, _SERVER_SIDE, kind=kind)
            return problem(status, title, str(exc), kind=kind)
    log.exception("unhandled duragent error", exc_info=exc)
    return problem(500, "Internal error", _SERVER_SIDE)


def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    # Starlette logs the traceback after this response is sent.
    return problem(500, "Internal error", _SERVER_SIDE)


def _printable(text: str) -> str:
    # A lone surrogate in a JSON key becomes part of `loc`; it has no UTF-8 form.
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [
        {
            "loc": [_printable(p) if isinstance(p, str) else p for p in e.get("loc", ())],
            "msg": _printable(str(e.get("msg", ""))),
            "type": str(e.get("type")),
        }
        for e in exc.errors()
    ]
    where = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors[:5])
    return problem(422, "Validation error", where or "the request is not valid", errors=errors)


def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    try:
        title = HTTPStatus(exc.status_code).phrase
    except ValueError:
        title = "Error"
    detail = exc.detail if isinstance(exc.detail, str) and exc.detail != title else None
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        headers["Allow"] = ", ".join(_allowed_methods(request))
    return problem(exc.status_code, title, detail, headers=headers)


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def _allowed_methods(request: Request) -> list[str]:
    # Starlette names only the first route matching the path, and FastAPI's included
    # routers have no `methods` of their own: ask every route which methods it would
    # take for this path. A mount (the static files) serves GET and HEAD.
    methods: set[str] = set()
    for route in request.app.router.routes:
        if isinstance(route, Mount):
            if route.matches(dict(request.scope))[0] is not Match.NONE:
                methods |= {"GET", "HEAD"}
            continue
        for method in _METHODS:
            if route.matches({**request.scope, "method": method})[0] is Match.FULL:
                methods.add(method)
    return sorted(methods) or ["GET", "HEAD"]


def _not_authenticated(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, NotAuthenticated)
    return problem(
        401, "Unauthorized", exc.detail, headers={"WWW-Authenticate": 'Bearer realm="duragent"'}
    )


def _forbidden(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, Forbidden)
    return problem(403, "Forbidden", exc.detail)


def install(app: FastAPI) -> None:
    app.add_exception_handler(Exception, _unexpected_error)
    app.add_exception_handler(DuragentError, _duragent_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(NotAuthenticated, _not_authenticated)
    app.add_exception_handler(Forbidden, _forbidden)
