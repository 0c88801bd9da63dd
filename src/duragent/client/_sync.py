"""`Client`: the same calls as `AsyncClient`, blocking, for code without an event loop.

A thin wrapper: each method runs its `AsyncClient` twin to the end on a private
event loop of this client's (so one `Client` serves one thread at a time, and is not
for use inside a running event loop: use `AsyncClient` there).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, TypeVar

import httpx

from duragent.client._async import AsyncClient
from duragent.client._models import TaskStreamEvent, TaskSummary
from duragent.errors import UsageError

P = ParamSpec("P")
T = TypeVar("T")


def _blocking(
    method: Callable[Concatenate[AsyncClient, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[Client, P], T]:
    def run(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._run(method(self._async, *args, **kwargs))

    run.__name__ = method.__name__
    run.__doc__ = method.__doc__
    return run


class Client:
    """A `duragent serve` at `base_url`, as `token`'s owner: `AsyncClient`'s methods,
    blocking. Use it as a context manager, or call `close()`."""

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        token: str | None = None,
        *,
        timeout: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._runner = asyncio.Runner()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"), headers=headers, timeout=timeout, transport=transport
        )
        self._http = http
        self._async = AsyncClient(timeout=timeout, http=http)

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        try:
            self._run(self._http.aclose())
        finally:
            self._runner.close()

    def _run(self, call: Coroutine[Any, Any, T]) -> T:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return self._runner.run(call)
        call.close()
        raise UsageError("Client blocks its thread: inside async code, use AsyncClient")

    submit = _blocking(AsyncClient.submit)
    get = _blocking(AsyncClient.get)
    list = _blocking(AsyncClient.list)
    wait = _blocking(AsyncClient.wait)
    stream_token = _blocking(AsyncClient.stream_token)
    respond = _blocking(AsyncClient.respond)
    send = _blocking(AsyncClient.send)
    fork = _blocking(AsyncClient.fork)
    retry = _blocking(AsyncClient.retry)
    migrate = _blocking(AsyncClient.migrate)
    pause = _blocking(AsyncClient.pause)
    resume = _blocking(AsyncClient.resume)
    abort = _blocking(AsyncClient.abort)
    bulk = _blocking(AsyncClient.bulk)
    bulk_operation = _blocking(AsyncClient.bulk_operation)
    bulk_operations = _blocking(AsyncClient.bulk_operations)

    def stream(self, task_id: str, *, after: int = 0) -> Iterator[TaskStreamEvent]:
        """`AsyncClient.stream`, blocking: entries, then the StreamEnd; reconnects."""
        return self._iterate(self._async.stream(task_id, after=after))

    def tasks(self, **filters: Any) -> Iterator[TaskSummary]:
        """Every task `list(**filters)` finds, page after page."""
        return self._iterate(self._async.tasks(**filters))

    def _iterate(self, source: Any) -> Iterator[Any]:
        try:
            while True:
                try:
                    yield self._run(source.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            self._run(source.aclose())
