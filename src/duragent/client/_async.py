"""`AsyncClient`: the HTTP API of `duragent serve` from an async Python app."""

from __future__ import annotations

import asyncio
import builtins
import math
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from contextlib import aclosing
from datetime import datetime
from types import TracebackType
from typing import Any, Literal, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic_core import to_jsonable_python

from duragent.client._errors import ClientError, ServerUnreachable, api_error
from duragent.client._models import (
    BulkCount,
    BulkOut,
    BulkPageOut,
    StreamEnd,
    StreamTokenOut,
    TaskOut,
    TaskPageOut,
    TaskStreamEvent,
    TaskSummary,
    TaskWaitOut,
)
from duragent.client._sse import SseDecoder
from duragent.errors import InvalidOption
from duragent.types import TaskStatus

M = TypeVar("M", bound=BaseModel)
Strategy = Literal["enqueue", "reject", "interrupt", "rollback"]
Deadline = datetime | float

MAX_WAIT = 300.0  # the server's longest /wait
# Consecutive failed reconnects (no event in between) before a stream gives up.
RECONNECTS = 5


def _time(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _deadline(value: Deadline | None) -> str | float | None:
    return value.isoformat() if isinstance(value, datetime) else value


def _body(**fields: Any) -> dict[str, Any]:
    """A request body without the fields left out (None): the server's defaults apply."""
    return {k: v for k, v in fields.items() if v is not None}


class AsyncClient:
    """A `duragent serve` at `base_url`, as `token`'s owner (None: a server without
    tokens). Every method raises an `ApiError` subclass for a problem answer (e.g.
    `TaskNotFound`, which is also `duragent.errors.TaskNotFound`) and
    `ServerUnreachable` when no answer comes. Use it as an async context manager, or
    call `aclose()`; `http` is an httpx.AsyncClient of your own (its base_url and
    headers are used as they are)."""

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        token: str | None = None,
        *,
        timeout: float = 30.0,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.timeout = timeout
        self._owns_http = http is None
        self._http = http or httpx.AsyncClient(
            base_url=base_url.rstrip("/"), headers=headers, timeout=timeout
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    # --- one request, one answer ---------------------------------------------------

    async def _call(
        self,
        method: str,
        path: str,
        model: type[M],
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> M:
        try:
            r = await self._http.request(
                method,
                path,
                json=json,
                params={k: v for k, v in (params or {}).items() if v is not None},
                timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
            )
        except httpx.TransportError as exc:
            raise ServerUnreachable(f"{method} {path}: {exc!r}") from exc
        if r.status_code >= 400:
            raise _problem(r)
        try:
            return model.model_validate_json(r.content)
        except ValidationError as exc:  # not the API's answer (a proxy's page, another server)
            raise ClientError(
                f"{method} {path}: the answer ({r.status_code}) is not a {model.__name__}: "
                f"{r.text[:200]!r}"
            ) from exc

    # --- tasks ---------------------------------------------------------------------

    async def submit(
        self,
        agent: str,
        input: Any,
        *,
        request_id: str | None = None,
        session_id: str | None = None,
        continue_session: bool = False,
        context: dict[str, Any] | None = None,
        multitask_strategy: Strategy | None = None,
        queue: str | None = None,
        priority: int = 0,
        metadata: dict[str, str | int | float | bool] | None = None,
        start_at: datetime | None = None,
        deadline: Deadline | None = None,
    ) -> TaskOut:
        """Start a task (POST /v1/tasks). With a `request_id` already used, the same
        task comes back; with `continue_session` while a turn runs, that task."""
        body = _body(
            agent=agent,
            request_id=request_id,
            session_id=session_id,
            continue_session=continue_session or None,
            context=context,
            multitask_strategy=multitask_strategy,
            queue=queue,
            priority=priority or None,
            metadata=metadata,
            start_at=_time(start_at),
            deadline=_deadline(deadline),
        )
        return await self._call("POST", "/v1/tasks", TaskOut, json={**body, "input": input})

    async def get(self, task_id: str) -> TaskOut:
        return await self._call("GET", f"/v1/tasks/{_seg(task_id)}", TaskOut)

    async def list(
        self,
        *,
        status: TaskStatus | str | Sequence[TaskStatus | str] | None = None,
        agent: str | None = None,
        session_id: str | None = None,
        queue: str | None = None,
        metadata: Mapping[str, str | int | float | bool] | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        updated_after: datetime | None = None,
        updated_before: datetime | None = None,
        limit: int = 50,
        cursor: str | None = None,
        id_prefix: str | None = None,
        version: str | None = None,
    ) -> TaskPageOut:
        """One page of the caller's tasks, newest first; pass the page's
        `next_cursor` as `cursor` for the next (`tasks()` walks them all)."""
        statuses = [status] if isinstance(status, str) else builtins.list(status or [])
        params = {
            "status": [str(s) for s in statuses] or None,
            "agent": agent,
            "session_id": session_id,
            "queue": queue,
            "meta": [f"{k}:{_meta(v)}" for k, v in (metadata or {}).items()] or None,
            "created_after": _time(created_after),
            "created_before": _time(created_before),
            "updated_after": _time(updated_after),
            "updated_before": _time(updated_before),
            "limit": limit,
            "cursor": cursor,
            "id_prefix": id_prefix,
            "version": version,
        }
        return await self._call("GET", "/v1/tasks", TaskPageOut, params=params)

    async def tasks(self, **filters: Any) -> AsyncIterator[TaskSummary]:
        """Every task `list(**filters)` finds, page after page."""
        cursor = filters.pop("cursor", None)
        while True:
            page = await self.list(**filters, cursor=cursor)
            for task in page.tasks:
                yield task
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def wait(
        self,
        task_id: str,
        *,
        until: Literal["finished", "input"] = "finished",
        timeout: float | None = None,
    ) -> TaskWaitOut:
        """The task once it is finished (`until="input"`: or waits for a person, is
        paused or blocked), or after `timeout` seconds (None: no limit) with
        `timed_out` true. Long-polls GET /wait, up to 300 s a call."""
        if timeout is not None and not (timeout > 0 and math.isfinite(timeout)):
            raise InvalidOption(f"timeout must be a number of seconds above 0, not {timeout!r}")
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            left = MAX_WAIT if end is None else min(MAX_WAIT, max(end - time.monotonic(), 0.001))
            got = await self._call(
                "GET",
                f"/v1/tasks/{_seg(task_id)}/wait",
                TaskWaitOut,
                params={"until": until, "timeout": round(left, 3)},
                timeout=left + self.timeout,
            )
            if not got.timed_out or (end is not None and time.monotonic() >= end):
                return got

    async def stream(self, task_id: str, *, after: int = 0) -> AsyncIterator[TaskStreamEvent]:
        """The task's committed entries after seq `after`, live, then its `StreamEnd`
        (the iteration ends with it). A dropped connection is opened again with
        Last-Event-ID, so no entry is missed or repeated; after 5 failed attempts in a
        row, `ServerUnreachable`."""
        last, failures = after, 0
        while True:
            received = False
            try:
                async with aclosing(self._stream_once(task_id, last)) as events:
                    async for event in events:
                        received, failures = True, 0
                        yield event
                        if isinstance(event, StreamEnd):
                            return
                        last = event.seq
            except (httpx.TransportError, _StreamCut) as exc:
                failures = 0 if received else failures + 1
                if failures >= RECONNECTS:
                    raise ServerUnreachable(f"the event stream of {task_id}: {exc!r}") from exc
                await asyncio.sleep(0 if received else min(0.1 * 2**failures, 1.0))

    async def _stream_once(self, task_id: str, after: int) -> AsyncGenerator[TaskStreamEvent]:
        path = f"/v1/tasks/{_seg(task_id)}/events"
        headers = {"Accept": "text/event-stream", "Last-Event-ID": str(after)}
        # No read limit: the server sends a keep-alive every 15 s while the task is quiet.
        timeout = httpx.Timeout(self.timeout, read=60.0)
        async with self._http.stream("GET", path, headers=headers, timeout=timeout) as r:
            if r.status_code >= 400:
                await r.aread()
                raise _problem(r)
            decoder = SseDecoder()
            async for line in r.aiter_lines():
                sse = decoder.feed(line)
                if sse is None:
                    continue
                try:
                    event = _EVENT.validate_json(sse.data)
                except ValidationError as exc:  # a newer server's kind of entry, say
                    raise ClientError(f"an event this client cannot read: {exc}") from exc
                yield event
                if isinstance(event, StreamEnd):
                    return
        raise _StreamCut("the stream ended before its end event")

    async def stream_token(self, task_id: str) -> StreamTokenOut:
        """A short-lived token that opens this task's event stream only (for a browser)."""
        return await self._call("POST", f"/v1/tasks/{_seg(task_id)}/stream-token", StreamTokenOut)

    # --- answering and steering ------------------------------------------------------

    async def respond(
        self,
        task_id: str,
        *,
        approve: bool | None = None,
        arguments: dict[str, Any] | None = None,
        reason: str | None = None,
        answer: str | None = None,
        call_id: str | None = None,
        decisions: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> TaskOut:
        """Approve (with edited `arguments`, checked against the tool's schema) or deny
        an approval, answer a question, or decide several approvals by call id
        (`decisions={call_id: {"approve": True, "arguments": {...}}}`)."""
        body = _body(
            approve=approve,
            arguments=arguments,
            reason=reason,
            answer=answer,
            call_id=call_id,
            decisions=None if decisions is None else {k: dict(v) for k, v in decisions.items()},
        )
        return await self._call("POST", f"/v1/tasks/{_seg(task_id)}/respond", TaskOut, json=body)

    async def send(
        self,
        task_id: str,
        text: str,
        *,
        request_id: str | None = None,
        multitask_strategy: Strategy | None = None,
    ) -> TaskOut:
        """A user message into a live task, taken once at a safe point; the same
        `request_id` with the same text sends nothing again."""
        body = _body(text=text, request_id=request_id, multitask_strategy=multitask_strategy)
        return await self._call("POST", f"/v1/tasks/{_seg(task_id)}/messages", TaskOut, json=body)

    async def fork(
        self,
        task_id: str,
        at_round: int,
        *,
        edit: Mapping[str, Any] | None = None,
        request_id: str | None = None,
    ) -> TaskOut:
        """A new task from the end of round `at_round` of this one (which is untouched)."""
        body = _body(
            at_round=at_round, edit=None if edit is None else dict(edit), request_id=request_id
        )
        return await self._call("POST", f"/v1/tasks/{_seg(task_id)}/fork", TaskOut, json=body)

    async def retry(self, task_id: str, *, deadline: Deadline | None = None) -> TaskOut:
        """Continue a failed task from its last commit."""
        body = _body(deadline=_deadline(deadline))
        return await self._call("POST", f"/v1/tasks/{_seg(task_id)}/retry", TaskOut, json=body)

    async def migrate(self, task_id: str, to_version: str) -> TaskOut:
        """Move the task to another version of its agent (recorded; a running task is
        handed back at its next safe point and goes on in a worker of that version)."""
        body = _body(to_version=to_version)
        return await self._call("POST", f"/v1/tasks/{_seg(task_id)}/migrate", TaskOut, json=body)

    async def pause(self, task_id: str, *, rollback: bool = False) -> TaskOut:
        body = _body(rollback=rollback or None)
        return await self._call("POST", f"/v1/tasks/{_seg(task_id)}/pause", TaskOut, json=body)

    async def resume(self, task_id: str) -> TaskOut:
        return await self._call("POST", f"/v1/tasks/{_seg(task_id)}/resume", TaskOut)

    async def abort(self, task_id: str, *, reason: str | None = None) -> TaskOut:
        body = _body(reason=reason)
        return await self._call("POST", f"/v1/tasks/{_seg(task_id)}/abort", TaskOut, json=body)

    # --- bulk operations -----------------------------------------------------------

    async def bulk(
        self,
        action: str,
        filter: Mapping[str, Any] | None = None,
        *,
        dry_run: bool = False,
        to_version: str | None = None,
    ) -> BulkOut | BulkCount:
        """Retry, abort, pause, resume, migrate (to `to_version`) or purge every task
        of mine `filter` matches (`status`, `agent`, `version`, `queue`, `metadata`,
        `created_after`, ..., `owner` for an admin): the started operation, or with
        `dry_run` only the count (`BulkCount`)."""
        body = {"action": action, "filter": dict(filter or {}), "dry_run": dry_run}
        if to_version is not None:
            body["to_version"] = to_version
        model: type[BulkOut] | type[BulkCount] = BulkCount if dry_run else BulkOut
        return await self._call("POST", "/v1/bulk", model, json=to_jsonable_python(body))

    async def bulk_operation(self, op_id: str) -> BulkOut:
        """A bulk operation of mine, as it stands."""
        return await self._call("GET", f"/v1/bulk/{_seg(op_id)}", BulkOut)

    async def bulk_operations(self, *, limit: int = 50, cursor: str | None = None) -> BulkPageOut:
        """My bulk operations, newest first (an admin's: everyone's)."""
        return await self._call(
            "GET", "/v1/bulk", BulkPageOut, params={"limit": limit, "cursor": cursor}
        )


# An entry's kind is an EntryKind, the end's the literal "end": the union tells them apart.
_EVENT: TypeAdapter[TaskStreamEvent] = TypeAdapter(TaskStreamEvent)


class _StreamCut(Exception):
    """The stream closed cleanly before its end event (a proxy's or a server's restart)."""


def _seg(task_id: str) -> str:
    """A task id as one path segment (quoted), so no id reaches another route."""
    if not isinstance(task_id, str) or task_id in {"", ".", ".."}:
        raise InvalidOption(f"not a task id: {task_id!r}")
    return quote(task_id, safe="")


def _meta(value: str | int | float | bool) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _problem(r: httpx.Response) -> Exception:
    try:
        body: Any = r.json()
    except ValueError:
        body = r.text
    return api_error(r.status_code, body, dict(r.headers))
