"""Server-sent events of a task's committed entries.

Each event is `id: <seq>`, `event: <kind>`, `data: <entry JSON>`. A client that
reconnects with `Last-Event-ID` (or `?after=`) gets every entry after that
seq: nothing missed, nothing repeated, because seqs are gap-free per task and
entries are only ever read after they are committed. The stream ends with an
`end` event once the task is terminal and its last entry was sent. Other
processes' commits arrive through the store's `wait_for_change` (polling for
SQLite, LISTEN/NOTIFY for PostgreSQL).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse

from duragent.errors import TaskNotFound
from duragent.server._deps import OwnedTask, RuntimeDep, UserDep
from duragent.server._limits import MAX_SEQ
from duragent.server._problems import BadRequest, problem_responses
from duragent.server._streams import SlotStreamingResponse, StreamSlots
from duragent.server._strict_json import StrictJsonRoute
from duragent.store._protocol import Store
from duragent.types import Entry

router = APIRouter(prefix="/v1/tasks", tags=["events"], route_class=StrictJsonRoute)

KEEPALIVE = 15.0  # seconds of silence before a comment line keeps proxies from closing
RETRY_MS = 1000


def format_event(entry: Entry) -> str:
    # model_dump_json escapes newlines, so the data is always one line.
    return f"id: {entry.seq}\nevent: {entry.kind.value}\ndata: {entry.model_dump_json()}\n\n"


def _end(status: str | None, last_seq: int) -> str:
    return f"event: end\ndata: {json.dumps({'status': status, 'last_seq': last_seq})}\n\n"


async def entry_events(
    store: Store,
    task_id: str,
    after_seq: int = 0,
    *,
    keepalive: float = KEEPALIVE,
    page: int = 500,
) -> AsyncIterator[str]:
    """SSE text for every entry of `task_id` after `after_seq`, live until the task ends."""
    yield f"retry: {RETRY_MS}\n\n"
    quiet_since = time.monotonic()
    while True:
        # The task row first: a change elsewhere in the store wakes every stream,
        # and most have nothing new, which its last_seq tells in one read.
        try:
            task = await store.get_task(task_id)
            batch = []
            if task.last_seq > after_seq:
                batch = await store.entries(task_id, after_seq=after_seq, limit=page)
        except TaskNotFound:  # deleted while watched
            yield _end(None, after_seq)
            return
        if batch:
            for entry in batch:
                after_seq = entry.seq
                yield format_event(entry)
            quiet_since = time.monotonic()
            continue
        # Entries and the status change that ends a task land in one commit, so a
        # terminal task whose last_seq we have sent has nothing more to send.
        if task.status.terminal and task.last_seq <= after_seq:
            yield _end(task.status.value, after_seq)
            return
        if time.monotonic() - quiet_since >= keepalive:
            yield ": keep-alive\n\n"
            quiet_since = time.monotonic()
        await store.wait_for_change(min(keepalive, 1.0))


def _start_seq(last_event_id: str | None, after: int | None) -> int:
    # The header wins: a browser's automatic reconnect keeps the original URL.
    if last_event_id is not None and last_event_id.strip():
        try:
            seq = int(last_event_id.strip())
        except ValueError:
            raise BadRequest(
                f"Last-Event-ID must be the seq of an event, not {last_event_id!r}"
            ) from None
        if not 0 <= seq <= MAX_SEQ:
            raise BadRequest(f"Last-Event-ID must be a seq from 0 to {MAX_SEQ}")
        return seq
    return after or 0


@router.get(
    "/{task_id}/events",
    summary="Live committed entries (server-sent events)",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "`id: <seq>`, `event: <entry kind>`, `data: <entry JSON>`; "
            "ends with `event: end` once the task is terminal",
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        },
        **problem_responses(400, 401, 404, 422, 429),
    },
)
async def task_events(
    task: OwnedTask,
    runtime: RuntimeDep,
    user: UserDep,
    request: Request,
    after: Annotated[
        int | None, Query(ge=0, le=MAX_SEQ, description="Send entries after this seq.")
    ] = None,
    last_event_id: Annotated[
        str | None, Header(alias="Last-Event-ID", max_length=40, include_in_schema=True)
    ] = None,
) -> StreamingResponse:
    start = _start_seq(last_event_id, after)
    slots: StreamSlots = request.app.state.streams
    release = slots.acquire(user)  # 429 when this user holds too many streams
    return SlotStreamingResponse(
        entry_events(runtime.store, task.id, start),
        release,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
