"""Request dependencies: the runtime, the signed-in user, and a task that user owns."""

from __future__ import annotations

from typing import Annotated, get_args, get_origin

from fastapi import Depends, Path, Request
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from duragent.runtime._runtime import Runtime
from duragent.server._gate import TokenLookup
from duragent.server._problems import Forbidden, NotAuthenticated
from duragent.types import Task

bearer = HTTPBearer(auto_error=False, description="An API token: `Authorization: Bearer <token>`")


def _query_names(dependant: Dependant) -> set[str]:
    names = {field.alias for field in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return names


def _repeatable(dependant: Dependant) -> set[str]:
    """The query parameters that take a list (`?meta=a:1&meta=b:2`)."""
    names = {
        field.alias
        for field in dependant.query_params
        if get_origin(field.field_info.annotation) is list
        or any(get_origin(a) is list for a in get_args(field.field_info.annotation))
    }
    for sub in dependant.dependencies:
        names |= _repeatable(sub)
    return names


def known_query(request: Request) -> None:
    """Refuse query parameters the route does not take: `?stauts=running` is a
    mistake to report, not a filter to ignore silently."""
    route = request.scope.get("route")
    if not isinstance(route, APIRoute) or not request.query_params:
        return
    names = _query_names(route.dependant)
    unknown = sorted(set(request.query_params) - names)
    repeated = sorted(
        {
            k
            for k, _ in request.query_params.multi_items()
            if len(request.query_params.getlist(k)) > 1
        }
        - _repeatable(route.dependant)
    )
    if repeated:
        raise RequestValidationError(
            [
                {"loc": ("query", name), "msg": "given more than once", "type": "value_error"}
                for name in repeated
            ]
        )
    if unknown:
        takes = ", ".join(sorted(names)) or "none"
        raise RequestValidationError(
            [
                {
                    "loc": ("query", name),
                    "msg": f"unknown query parameter (this endpoint takes: {takes})",
                    "type": "extra_forbidden",
                }
                for name in unknown
            ]
        )


def get_runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


def current_user(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> str:
    checked = request.scope.get("state", {}).get("user")
    if isinstance(checked, str):  # the gate checked the token before the body was read
        return checked
    if credentials is None:
        raise NotAuthenticated("this endpoint needs an 'Authorization: Bearer <token>' header")
    tokens: TokenLookup = request.app.state.tokens
    user = tokens.user_for(credentials.credentials)
    if user is None:
        raise NotAuthenticated("the bearer token is not valid")
    return user


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
UserDep = Annotated[str, Depends(current_user)]


def is_admin(request: Request, user: str) -> bool:
    """Admins (`duragent serve --admin USER`) may change what every user shares: queue limits."""
    admins: frozenset[str] = request.app.state.admins
    return user in admins


def admin_user(request: Request, user: UserDep) -> str:
    if not is_admin(request, user):
        raise Forbidden(
            f"only an admin may change fleet-wide settings, and {user!r} is not one "
            "(the server names its admins: duragent serve --admin USER)"
        )
    return user


AdminDep = Annotated[str, Depends(admin_user)]
TaskId = Annotated[str, Path(min_length=1, max_length=200, description="A task id.")]


async def owned_task(task_id: TaskId, user: UserDep, runtime: RuntimeDep) -> Task:
    """The task, if the signed-in user owns it; another user's task is 'not found', exactly
    like a task that does not exist."""
    return await runtime.get(task_id, owner=user)


OwnedTask = Annotated[Task, Depends(owned_task)]
