"""The kinds of error the HTTP API answers: each problem's stable `type` URI.

A problem's `type` is `/problems/<slug>`, a URI reference relative to the server:
an identifier to compare (`problem.type == "/problems/task-finished"`), never
reworded. docs/http-api.md lists each; a test holds that list to this one.
"""

from __future__ import annotations

PREFIX = "/problems/"

# slug: (status, title, when). The title is the one every problem of the kind has.
PROBLEM_TYPES: dict[str, tuple[int, str, str]] = {
    "bad-request": (400, "Bad request", "The request is well-formed but cannot be acted on."),
    "unknown-agent": (400, "Unknown agent", "No agent of that name runs on this server."),
    "unauthorized": (401, "Unauthorized", "No bearer token, or one nobody owns."),
    "forbidden": (403, "Forbidden", "Only an admin may do this."),
    "not-found": (404, "Not found", "No such route or thing."),
    "task-not-found": (404, "Task not found", "No such task, or not the caller's."),
    "session-not-found": (404, "Session not found", "No such session, or not the caller's."),
    "queue-not-found": (404, "Queue not found", "No such queue."),
    "schedule-not-found": (404, "Schedule not found", "No such schedule, or not the caller's."),
    "method-not-allowed": (405, "Method Not Allowed", "The route takes other methods (Allow)."),
    "conflict": (409, "Conflict", "The task changed under the request, or an approval expired."),
    "invalid-transition": (
        409,
        "Invalid status transition",
        "The task's status does not allow this (e.g. resuming a completed task).",
    ),
    "task-finished": (
        409,
        "Invalid status transition",
        "A message to a finished task: continue its session or fork it instead.",
    ),
    "task-busy": (409, "Task is busy", "A message under `reject` while a turn runs."),
    "request-id-reused": (
        409,
        "Request id already used",
        "The request_id was used for another request; use a new one.",
    ),
    "entry-too-new": (
        409,
        "Entry written by a newer version",
        "The task holds entries this server's version cannot read.",
    ),
    "limit-reached": (409, "Limit reached", "More schedules or ticks than one user may have."),
    "schedule-unreadable": (409, "Schedule unreadable", "The stored schedule cannot be read."),
    "body-too-large": (413, "Request Entity Too Large", "The body is over serve --max-body."),
    "validation-error": (
        422,
        "Validation error",
        "The request does not fit the schema; `errors` says where.",
    ),
    "invalid-tool-arguments": (
        422,
        "Invalid tool arguments",
        "Edited arguments that don't fit the tool's schema.",
    ),
    "too-many-requests": (
        429,
        "Too many requests",
        "Too many open streams, wrong tokens or connections; wait for Retry-After.",
    ),
    "internal-error": (500, "Internal error", "A bug: the server log has the details."),
    "store-unavailable": (503, "Store unavailable", "The store cannot be reached now; retry."),
}

# The kind of a problem named only by its status.
GENERIC: dict[int, str] = {
    400: "bad-request",
    401: "unauthorized",
    403: "forbidden",
    404: "not-found",
    405: "method-not-allowed",
    409: "conflict",
    413: "body-too-large",
    422: "validation-error",
    429: "too-many-requests",
    500: "internal-error",
    503: "store-unavailable",
}


def type_uri(slug: str) -> str:
    if slug not in PROBLEM_TYPES:
        raise KeyError(f"unknown problem type {slug!r}: add it to PROBLEM_TYPES")
    return PREFIX + slug


def types_of(status: int) -> list[str]:
    """Every type URI a problem of this status may carry."""
    return [PREFIX + slug for slug, (s, _, _) in PROBLEM_TYPES.items() if s == status]
