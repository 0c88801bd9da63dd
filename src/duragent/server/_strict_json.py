"""JSON request bodies parsed once, strictly, before FastAPI validates them.

`json.loads` takes `NaN`, `1e999`, `"\\u0000"`, lone surrogates and nesting
until the recursion limit; each of those got a 500 somewhere later (a store,
a response encoder). A route of this class reads the body (within the gate's
size limit), parses it, and answers 422 naming the first bad places before
the endpoint runs or anything is stored. FastAPI then uses the parsed value.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute

from duragent._storable import MAX_JSON_DEPTH, value_problems

MAX_REPORTED = 5


def _is_json(request: Request) -> bool:
    content_type = request.headers.get("content-type")
    if not content_type:
        return True  # FastAPI parses a body without a content type as JSON too
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


def _error(loc: tuple[Any, ...], msg: str, kind: str = "value_error") -> dict[str, Any]:
    return {"loc": ("body", *loc), "msg": msg, "type": kind}


async def parse_strictly(request: Request, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Parse a JSON body into `request._json` (where Starlette caches it), or raise
    RequestValidationError for a value no store could keep."""
    body = await request.body()
    if not body or not _is_json(request):
        return
    try:
        value = json.loads(body)
    except RecursionError:
        msg = f"nested more than {max_depth} levels deep (the most this server keeps)"
        raise RequestValidationError([_error((), msg)]) from None
    except UnicodeDecodeError:
        raise RequestValidationError(
            [_error((), "the body is not UTF-8 text", "json_invalid")]
        ) from None
    except json.JSONDecodeError:
        return  # FastAPI reports the syntax error with its position
    problems = []
    for path, msg in value_problems(value, max_depth):
        problems.append(_error(path, msg))
        if len(problems) == MAX_REPORTED:
            break
    if problems:
        raise RequestValidationError(problems)
    request._json = value


class StrictJsonRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        if self.body_field is None:
            return handler

        async def strict_handler(request: Request) -> Response:
            limits = getattr(request.app.state, "limits", None)
            await parse_strictly(request, limits.max_depth if limits else MAX_JSON_DEPTH)
            return await handler(request)

        return strict_handler
