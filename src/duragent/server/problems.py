"""Errors as `application/problem+json`: duragent errors get a status and a clear title."""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from duragent.errors import (
    Conflict,
    DuplicateRequest,
    DuragentError,
    InvalidTransition,
    StoreError,
    TaskNotFound,
    UnknownAgent,
    UsageError,
)
from duragent.server.schemas import Problem

log = logging.getLogger("duragent.server")

MEDIA_TYPE = "application/problem+json"


class NotAuthenticated(Exception):
    """No bearer token, or one nobody owns."""

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(detail)


class BadRequest(UsageError):
    """A request the server can parse but not act on (a bad cursor, a bad Last-Event-ID)."""


# Most specific first: the first class the exception is an instance of decides.
_MAPPING: list[tuple[type[Exception], int, str]] = [
    (TaskNotFound, 404, "Task not found"),
    (InvalidTransition, 409, "Invalid status transition"),
    (Conflict, 409, "Conflict"),
    (DuplicateRequest, 409, "Request id already used"),
    (UnknownAgent, 400, "Unknown agent"),
    (UsageError, 400, "Bad request"),
    (StoreError, 503, "Store unavailable"),
]


def problem(
    status: int,
    title: str,
    detail: str | None = None,
    *,
    headers: dict[str, str] | None = None,
    errors: list[dict[str, Any]] | None = None,
) -> JSONResponse:
    body = Problem(title=title, status=status, detail=detail, errors=errors)
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


def _duragent_error(request: Request, exc: Exception) -> JSONResponse:
    for cls, status, title in _MAPPING:
        if isinstance(exc, cls):
            if status >= 500:
                log.error("%s %s: %s", request.method, request.url.path, exc)
            return problem(status, title, str(exc))
    log.exception("unhandled duragent error", exc_info=exc)
    return problem(500, "Internal error", "The server failed; see its log.")


def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [
        {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type"))}
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


def _allowed_methods(request: Request) -> list[str]:
    # Starlette names only the first route matching the path; a path served by
    # several routes (GET and POST /v1/tasks) must list all their methods.
    methods: set[str] = set()
    for route in request.app.router.routes:
        match, _ = route.matches(request.scope)
        if match is not Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    return sorted(methods)


def _not_authenticated(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, NotAuthenticated)
    return problem(
        401, "Unauthorized", exc.detail, headers={"WWW-Authenticate": 'Bearer realm="duragent"'}
    )


def complete_openapi(app: FastAPI, agent_names: list[str]) -> None:
    """Register the Problem schema the `problem_responses` refer to, and name the
    agents this server knows, so /openapi.json says exactly what it accepts."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            schemas = schema.setdefault("components", {}).setdefault("schemas", {})
            schemas["Problem"] = Problem.model_json_schema()
            agent = schemas.get("TaskCreate", {}).get("properties", {}).get("agent")
            if agent is not None and agent_names:
                agent["enum"] = sorted(agent_names)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def install(app: FastAPI, agent_names: list[str]) -> None:
    complete_openapi(app, agent_names)
    app.add_exception_handler(DuragentError, _duragent_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(NotAuthenticated, _not_authenticated)
