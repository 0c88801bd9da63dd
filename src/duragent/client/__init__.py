"""Official Python client of `duragent serve`'s HTTP API (docs/http-api.md).

    from duragent.client import Client

    with Client("http://127.0.0.1:8000", token="...") as client:
        task = client.submit("assistant", "Summarise durable execution")
        for event in client.stream(task.id):  # reconnects by Last-Event-ID
            print(event.kind)
        print(client.wait(task.id).output)

`AsyncClient` has the same methods as coroutines. Problems come back as errors that
are also duragent's own (`TaskNotFound` is a `duragent.errors.TaskNotFound`).
Needs httpx (`pip install 'duragent[client]'`).
"""

from __future__ import annotations

from duragent.errors import MissingExtra

try:
    import httpx  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised without the extra installed
    raise MissingExtra("the HTTP client", "client") from exc

from duragent.client._async import AsyncClient
from duragent.client._errors import (
    ApiError,
    BadRequest,
    BodyTooLarge,
    ClientError,
    Conflict,
    DuplicateRequest,
    Forbidden,
    IncompatibleEntry,
    InvalidArguments,
    InvalidTransition,
    LimitReached,
    MethodNotAllowed,
    NotFound,
    QueueNotFound,
    ScheduleNotFound,
    ScheduleUnreadable,
    ServerError,
    ServerUnreachable,
    SessionNotFound,
    StoreUnavailable,
    TaskBusy,
    TaskFinished,
    TaskNotFound,
    TooManyRequests,
    Unauthorized,
    UnknownAgent,
    ValidationFailed,
)
from duragent.client._models import (
    BulkCount,
    BulkOut,
    BulkPageOut,
    OpenWait,
    StreamEnd,
    StreamTokenOut,
    TaskOut,
    TaskPageOut,
    TaskStreamEvent,
    TaskSummary,
    TaskWaitOut,
    WaitingOn,
)
from duragent.client._sync import Client

__all__ = [
    "ApiError",
    "AsyncClient",
    "BadRequest",
    "BodyTooLarge",
    "BulkCount",
    "BulkOut",
    "BulkPageOut",
    "Client",
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
    "OpenWait",
    "QueueNotFound",
    "ScheduleNotFound",
    "ScheduleUnreadable",
    "ServerError",
    "ServerUnreachable",
    "SessionNotFound",
    "StoreUnavailable",
    "StreamEnd",
    "StreamTokenOut",
    "TaskBusy",
    "TaskFinished",
    "TaskNotFound",
    "TaskOut",
    "TaskPageOut",
    "TaskStreamEvent",
    "TaskSummary",
    "TaskWaitOut",
    "TooManyRequests",
    "Unauthorized",
    "UnknownAgent",
    "ValidationFailed",
    "WaitingOn",
]
