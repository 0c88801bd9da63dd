"""HTTP problems (RFC 9457, docs/http-api.md) raised as duragent's own errors.

Each problem `type` has a class here that is also the library's error of that kind:
a 404 `/problems/task-not-found` is a `TaskNotFound` (and a `NotFound`), a 409
`/problems/task-finished` an `InvalidTransition`, a 503 a `StoreUnavailable`; so
`except duragent.errors.NotFound` reads the same around a Runtime and a client.
Every one is also an `ApiError`, with the problem's status, type, title and detail.
"""

from __future__ import annotations

from typing import Any

from duragent import errors

# Re-exported by duragent.client, the front door.
__all__ = [
    "ApiError",
    "BadRequest",
    "BodyTooLarge",
    "ClientError",
    "Conflict",
    "DuplicateRequest",
    "Forbidden",
    "IncompatibleEntry",
    "InvalidArguments",
    "InvalidTransition",
    "LimitReached",
    "MethodNotAllowed",
    "NotFound",
    "QueueNotFound",
    "ScheduleNotFound",
    "ScheduleUnreadable",
    "ServerError",
    "ServerUnreachable",
    "SessionNotFound",
    "StoreUnavailable",
    "TaskBusy",
    "TaskFinished",
    "TaskNotFound",
    "TooManyRequests",
    "Unauthorized",
    "UnknownAgent",
    "ValidationFailed",
]


class ClientError(errors.DuragentError):
    """The client could not get an answer from the server (a network failure)."""


class ServerUnreachable(ClientError):
    """No connection to the server, or it was lost (after the stream's reconnects)."""


class ApiError(ClientError):
    """The server answered with a problem: `status`, `type` (a URI reference such as
    `/problems/task-not-found`, to compare), `title`, `detail` and the whole `problem`."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        self.status = status
        self.problem = problem
        self.type = str(problem.get("type", "about:blank"))
        self.title = str(problem.get("title", ""))
        self.detail = str(problem.get("detail") or self.title or f"HTTP {status}")
        # Not super().__init__: the library's classes below take other arguments.
        Exception.__init__(self, f"{self.detail} ({status} {self.type})")


class BadRequest(ApiError, errors.UsageError):
    """400: the request is well-formed but cannot be acted on."""


class UnknownAgent(ApiError, errors.UnknownAgent):
    """400: no agent of that name runs on the server."""


class Unauthorized(ApiError, errors.UsageError):
    """401: no token, or one the server does not know."""


class Forbidden(ApiError, errors.UsageError):
    """403: only an admin may do this."""


class NotFound(ApiError, errors.NotFound):
    """404: no such route or thing."""


class TaskNotFound(ApiError, errors.TaskNotFound):
    """404: no such task, or not the caller's."""


class SessionNotFound(ApiError, errors.SessionNotFound):
    """404: no such session, or not the caller's."""


class QueueNotFound(ApiError, errors.QueueNotFound):
    """404: no such queue."""


class ScheduleNotFound(ApiError, errors.ScheduleNotFound):
    """404: no such schedule, or not the caller's."""


class MethodNotAllowed(ApiError, errors.UsageError):
    """405: the route takes other methods."""


class Conflict(ApiError, errors.Conflict):
    """409: the task changed under the request, or an approval expired."""


class InvalidTransition(ApiError, errors.InvalidTransition):
    """409: the task's status does not allow this (e.g. resuming a completed task)."""


class TaskFinished(InvalidTransition):
    """409: a message to a finished task (continue its session or fork it instead)."""


class TaskBusy(ApiError, errors.TaskBusy):
    """409: a message under `reject` while a turn runs."""


class DuplicateRequest(ApiError, errors.DuplicateRequest):
    """409: the request_id was used for another request."""


class IncompatibleEntry(ApiError, errors.IncompatibleEntry):
    """409: the task holds entries the server's version cannot read."""


class LimitReached(ApiError, errors.UsageError):
    """409: more schedules or ticks than one user may have."""


class ScheduleUnreadable(ApiError, errors.ScheduleUnreadable):
    """409: the stored schedule cannot be read; delete it."""


class BodyTooLarge(ApiError, errors.UsageError):
    """413: the request body is over the server's limit."""


class ValidationFailed(ApiError, errors.InvalidOption):
    """422: the request does not fit the schema; `problem["errors"]` says where."""


class InvalidArguments(ApiError, errors.InvalidArguments):
    """422: edited arguments that don't fit the tool's schema."""


class TooManyRequests(ApiError, errors.UsageError):
    """429: wait `retry_after` seconds (None: the server did not say)."""

    retry_after: float | None = None


class ServerError(ApiError):
    """500: a bug in the server; its log has the details."""


class StoreUnavailable(ApiError, errors.StoreUnavailable):
    """503: the server's store cannot be reached now; retry."""


# Each problem type's class (server/_problem_types.py lists the types).
BY_TYPE: dict[str, type[ApiError]] = {
    "/problems/bad-request": BadRequest,
    "/problems/unknown-agent": UnknownAgent,
    "/problems/unauthorized": Unauthorized,
    "/problems/forbidden": Forbidden,
    "/problems/not-found": NotFound,
    "/problems/task-not-found": TaskNotFound,
    "/problems/session-not-found": SessionNotFound,
    "/problems/queue-not-found": QueueNotFound,
    "/problems/schedule-not-found": ScheduleNotFound,
    "/problems/method-not-allowed": MethodNotAllowed,
    "/problems/conflict": Conflict,
    "/problems/invalid-transition": InvalidTransition,
    "/problems/task-finished": TaskFinished,
    "/problems/task-busy": TaskBusy,
    "/problems/request-id-reused": DuplicateRequest,
    "/problems/entry-too-new": IncompatibleEntry,
    "/problems/limit-reached": LimitReached,
    "/problems/schedule-unreadable": ScheduleUnreadable,
    "/problems/body-too-large": BodyTooLarge,
    "/problems/validation-error": ValidationFailed,
    "/problems/invalid-tool-arguments": InvalidArguments,
    "/problems/too-many-requests": TooManyRequests,
    "/problems/internal-error": ServerError,
    "/problems/store-unavailable": StoreUnavailable,
}

# A problem of a type this client does not know (a newer server's), by its status.
BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    409: Conflict,
    413: BodyTooLarge,
    422: ValidationFailed,
    429: TooManyRequests,
    500: ServerError,
    503: StoreUnavailable,
}


def api_error(status: int, body: Any, headers: dict[str, str]) -> ApiError:
    """The error for an answer of `status` whose JSON body is `body` (a problem
    document, or anything else: a proxy's page, uvicorn's plain-text 503)."""
    problem: dict[str, Any] = body if isinstance(body, dict) else {"detail": str(body)[:500]}
    cls = BY_TYPE.get(str(problem.get("type"))) or BY_STATUS.get(status, ApiError)
    error = cls(status, problem)
    if isinstance(error, TooManyRequests):
        try:
            error.retry_after = float(headers.get("retry-after", ""))
        except ValueError:
            error.retry_after = None
    return error
