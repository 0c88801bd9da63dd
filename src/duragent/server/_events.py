"""Server-sent events of a task's committed entries.

Each event is `id: <seq>`, `event: <kind>`, `data: <entry JSON>`. A client that
reconnects with `Last-Event-ID` (or `?after=`) gets every entry after that
seq: nothing missed, nothing repeated, because seqs are gap-free per task and
entries are only ever read after they are committed. The stream ends with an
`end` event once the task is terminal and its last entry was sent. The app's
TaskWatch (server/_watch.py) hears which tasks each commit moved, by any
process, reads each once and hands its new entries to every stream of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse

from duragent.errors import TaskNotFound
from duragent.server._deps import OwnedTask, RuntimeDep, UserDep
from duragent.server._limits import MAX_SEQ
from duragent.server._openapi import stream_responses
from duragent.server._problems import BadRequest, problem_responses
from duragent.server._schemas import StreamTokenOut
from duragent.server._stream_tokens import StreamTokens
from duragent.server._streams import SlotStreamingResponse, StreamSlots
from duragent.server._strict_json import StrictJsonRoute
from duragent.server._watch import TaskWatch
from duragent.store._protocol import Store
from duragent.types import Entry, Task

router = APIRouter(prefix="/v1/tasks", tags=["events"], route_class=StrictJsonRoute)

KEEPALIVE = 15.0  # seconds of silence before a comment line keeps proxies from closing
RETRY_MS = 1000


def format_event(entry: Entry) -> str:
    # model_dump_json escapes newlines, so the data is always one line.
    return f"id: {entry.seq}\nevent: {entry.kind.value}\ndata: {entry.model_dump_json()}\n\n"


def _end(status: str | None, last_seq: int) -> str:
    data = {"kind": "end", "status": status, "last_seq": last_seq}  # a StreamEnd
    return f"event: end\ndata: {json.dumps(data)}\n\n"


async def entry_events(
    source: Store | TaskWatch,
    task_id: str,
    after_seq: int = 0,
    *,
    keepalive: float = KEEPALIVE,
    page: int = 500,
) -> AsyncIterator[str]:
    """SSE text for every entry of `task_id` after `after_seq`, live until the task ends.

    `source`: the app's TaskWatch, which hands the stream what each commit to
    its task added (a store: one made for this stream alone). The stream reads
    the store itself only to catch up: from `after_seq` when it opens, and
    when it fell behind what the watcher holds for it.
    """
    watch = source if isinstance(source, TaskWatch) else TaskWatch(source)
    store = watch.store
    yield f"retry: {RETRY_MS}\n\n"
    try:
        task: Task | None = await store.get_task(task_id)
    except TaskNotFound:
        task = None
    if task is None:
        yield _end(None, after_seq)
        return
    async with watch.feed(task) as feed:
        quiet_since = time.monotonic()
        while True:
            fresh, lost = feed.take()
            if feed.deleted:  # deleted while watched
                yield _end(None, after_seq)
                return
            task = feed.task or task
            for entry in fresh:
                if entry.seq == after_seq + 1:
                    after_seq = entry.seq
                    yield format_event(entry)
                    quiet_since = time.monotonic()
            if task.last_seq > after_seq or lost:  # behind: catch up from the store
                batch = await store.entries(task_id, after_seq=after_seq, limit=page)
                watch.reads += 1
                for entry in batch:
                    after_seq = entry.seq
                    yield format_event(entry)
                if batch:
                    quiet_since = time.monotonic()
                    continue
            # Entries and the status change that ends a task land in one commit, so a
            # terminal task whose last_seq we have sent has nothing more to send.
            if task.status.terminal and task.last_seq <= after_seq:
                yield _end(task.status.value, after_seq)
                return
            left = keepalive - (time.monotonic() - quiet_since)
            if left <= 0:
                yield ": keep-alive\n\n"
                quiet_since = time.monotonic()
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(feed.ready.wait(), left)


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
    description="Each event's data is a TaskStreamEvent (`x-sse-events` names the schema "
    "of each `event:`). A browser's EventSource, which cannot send the Authorization "
    "header, passes `?stream_token=` from POST /v1/tasks/{task_id}/stream-token instead.",
    response_class=StreamingResponse,
    responses={**stream_responses(), **problem_responses(400, 401, 404, 422, 429)},
    openapi_extra={"security": [{"HTTPBearer": []}, {"StreamToken": []}]},
)
async def stream_events(
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
    # Read by the gate (server/_gate.py); declared so the route takes it. In the
    # document it is the StreamToken security scheme.
    stream_token: Annotated[str | None, Query(include_in_schema=False)] = None,
) -> StreamingResponse:
    start = _start_seq(last_event_id, after)
    slots: StreamSlots = request.app.state.streams
    release = slots.acquire(user)  # 429 when this user holds too many streams
    return SlotStreamingResponse(
        entry_events(request.app.state.task_watch, task.id, start),
        release,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@router.post(
    "/{task_id}/stream-token",
    response_model=StreamTokenOut,
    summary="A short-lived token that opens this task's event stream",
    description="For a browser's EventSource: `new EventSource(events_url)`. The token "
    "opens only this task's /events, and only until expires_at (a stream opened before "
    "goes on); every other route refuses it. Ask for a new one to reconnect after that.",
    responses=problem_responses(401, 404, 422),
)
async def create_stream_token(task: OwnedTask, user: UserDep, request: Request) -> StreamTokenOut:
    tokens: StreamTokens = request.app.state.stream_tokens
    grant = tokens.mint(task.id, user)
    token = tokens.token(grant)
    return StreamTokenOut(
        token=token,
        expires_at=datetime.fromtimestamp(grant.expires_at, UTC),
        events_url=f"/v1/tasks/{quote(task.id, safe='')}/events?stream_token={token}",
    )
