"""MCP tool servers as duragent tools: `Agent(tools=[mcp_tools("stdio:cmd args")])`.

Uses the official `mcp` SDK (`pip install 'duragent[mcp]'`). The server's tools
are listed once, when `mcp_tools` is called, and become ordinary duragent
tools: each call is committed as an intent before it is sent, so after a crash
it follows the tool's replay policy, `"never"` unless you say otherwise per
tool name. The call's idempotency key is sent in the request's `_meta`
(`io.duragent/idempotency-key`) and, when the tool's input schema has an
`idempotency_key` argument, as that argument (hidden from the model).

Sessions stay open between calls. With `scope="task"` (the default) each
running task has one session per server, opened at its first call (for
`stdio:` that starts the server process) and closed when the task's run ends:
it finished, parked, or was handed back; a stateful server keeps its state
across the calls of one run (not across a park or a crash: the next run opens
a new session). `scope="worker"` shares one session per server among the
tasks of a worker, closed when the worker stops: for stateless servers.
`scope="call"` opens a session for every call. A session whose server went
away (its process died, its connection dropped) is opened again at the next
call; a call it cut off is reported as an error, and sent again on the new
session only if its tool is replay-safe.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict

from duragent.errors import MCPServerError, MissingExtra, ToolArgumentError, UsageError
from duragent.runtime._tools import Replay, Tool

if TYPE_CHECKING:
    from duragent.runtime._context import ToolContext
    from duragent.runtime._held import Held

T = TypeVar("T")
IDEMPOTENCY_ARG = "idempotency_key"
IDEMPOTENCY_META = "io.duragent/idempotency-key"
POLICIES = ("never", "safe", "resume")
Scope = Literal["task", "worker", "call"]
SCOPES = ("task", "worker", "call")
log = logging.getLogger("duragent.mcp")


class _AnyArgs(BaseModel):
    model_config = ConfigDict(extra="allow")


@dataclass(frozen=True)
class MCPServer:
    """Where a server is (`stdio:command args` or an http(s) streamable-HTTP URL)
    and how long a session with it lives (`scope`, see the module's docstring)."""

    spec: str
    env: Mapping[str, str] | None = None
    timeout: float = 60.0
    scope: Scope = "task"

    def __post_init__(self) -> None:
        if self.spec.startswith("stdio:"):
            if not shlex.split(self.spec[len("stdio:") :]):
                raise UsageError("an MCP stdio server needs a command: 'stdio:command args'")
        elif not self.spec.startswith(("http://", "https://")):
            raise UsageError(
                f"an MCP server is 'stdio:command args' or an http(s):// URL, not {self.spec!r}"
            )
        if self.scope not in SCOPES:
            raise UsageError(f"scope must be 'task', 'worker' or 'call', not {self.scope!r}")

    @property
    def key(self) -> tuple[Any, ...]:
        """What its sessions are held under: one per server and environment."""
        return ("mcp", self.spec, tuple(sorted((self.env or {}).items())))

    def connect(self, on_end: Callable[[], None] | None = None) -> AbstractAsyncContextManager[Any]:
        """An open, initialised ClientSession (an async context manager);
        `on_end` is called when the server's side of it ends."""
        try:
            from mcp import ClientSession, StdioServerParameters, stdio_client
            from mcp.client.streamable_http import streamable_http_client
        except ImportError as exc:
            raise MissingExtra("MCP tools", "mcp") from exc
        import contextlib

        @contextlib.asynccontextmanager
        async def session() -> AsyncIterator[Any]:
            if self.spec.startswith("stdio:"):
                command, *args = shlex.split(self.spec[len("stdio:") :])
                params = StdioServerParameters(
                    command=command, args=args, env=dict(self.env) if self.env else None
                )
                transport: Any = stdio_client(params)
            else:
                transport = streamable_http_client(self.spec)
            async with transport as (read, write):
                watched = read if on_end is None else _Watched(read, on_end)
                async with ClientSession(watched, write) as s:
                    await s.initialize()
                    yield s

        return session()

    async def call(
        self,
        use: Callable[[Any], Awaitable[T]],
        ctx: ToolContext | None = None,
        rerun: bool = False,
    ) -> T:
        """Run `use(session)`; lower errors become MCPServerError.

        With a tool call's `ctx` the session is the one its task (or worker) holds
        for this server, opened if it has none or the one it had ended. A call cut
        off by a dropped connection is sent again on a new session only if `rerun`
        (its tool is replay-safe); without `ctx`, or with scope "call", the call
        has a session of its own.
        """
        held = None if ctx is None or self.scope == "call" else ctx.held(self.scope)
        try:
            async with asyncio.timeout(self.timeout):
                if held is None:
                    async with self.connect() as session:
                        return await use(session)
                return await self._through(held, use, rerun)
        except (asyncio.CancelledError, MCPServerError, MissingExtra):
            raise
        except TimeoutError as exc:
            raise MCPServerError(f"MCP server {self.spec!r} did not answer in time") from exc
        except BaseException as exc:
            # The SDK raises its own errors, OSError, and (anyio) exception groups.
            if not isinstance(exc, Exception):
                raise
            raise MCPServerError(f"MCP server {self.spec!r} failed: {_reason(exc)}") from exc

    async def _through(self, held: Held, use: Callable[[Any], Awaitable[T]], rerun: bool) -> T:
        """`use` on the held session; one that failed under it is dropped (the next
        call opens another) and, for a replay-safe tool, the call is sent once more."""
        for attempt in (1, 2):
            session = await held.get(self.key, lambda: _Session.open(self), _Session.usable)
            try:
                return await use(session.client)
            except BaseException as exc:
                lost = not session.usable()  # the server's side ended (before it is dropped)
                if not lost and (_answered(exc) or _given_up(exc)):
                    # The server answered with an error, or this caller stopped
                    # waiting (cancelled: an abort, a drain; its timeout): the
                    # session is fine, and other calls may be in flight on it.
                    raise
                # Gone, timed out or cancelled: the server's state is unknown.
                await held.drop(self.key, session)
                if not isinstance(exc, Exception):
                    raise
                if rerun and attempt == 1:
                    continue
                if lost:
                    why = "sent twice" if rerun else "not sent again: the tool is not replay-safe"
                    raise MCPServerError(
                        f"MCP server {self.spec!r} went away during the call ({_reason(exc)});"
                        f" it was {why}"
                    ) from exc
                raise
        raise AssertionError("unreachable")  # pragma: no cover


def _given_up(exc: BaseException) -> bool:
    """The caller stopped waiting for its answer; nothing is known to be wrong
    with the session."""
    return isinstance(exc, asyncio.CancelledError | TimeoutError)


def _answered(exc: BaseException) -> bool:
    """An error the server sent back (the session still works), not a lost connection."""
    try:
        from mcp.shared.exceptions import MCPError
        from mcp.types import CONNECTION_CLOSED
    except ImportError:  # pragma: no cover - the SDK raised it, so it is there
        return False
    return isinstance(exc, MCPError) and exc.code != CONNECTION_CLOSED


class _Session:
    """One open session, entered and left by a task of its own (anyio's task
    groups must be left by the task that entered them), so calls from any task
    may share it. It ends when closed or when the server's side ends."""

    def __init__(self, server: MCPServer) -> None:
        self.server = server
        self.client: Any = None
        self.lost = False
        self._leave = asyncio.Event()
        self._owner: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, server: MCPServer) -> _Session:
        self = cls(server)
        ready: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._owner = asyncio.create_task(self._own(ready), name=f"duragent-mcp {server.spec}")
        try:
            self.client = await ready
        except BaseException:
            await self.aclose()
            raise
        return self

    def usable(self) -> bool:
        return not self.lost and self._owner is not None and not self._owner.done()

    def _ended(self) -> None:
        self.lost = True
        self._leave.set()

    async def _own(self, ready: asyncio.Future[Any]) -> None:
        try:
            async with self.server.connect(on_end=self._ended) as client:
                if not ready.done():
                    ready.set_result(client)
                await self._leave.wait()
        except asyncio.CancelledError:
            if not ready.done():
                ready.cancel()
            raise
        except Exception as exc:
            if not ready.done():
                ready.set_exception(exc)
            else:
                log.debug("MCP session with %r ended: %s", self.server.spec, _reason(exc))
        finally:
            self.lost = True

    async def aclose(self) -> None:
        self._leave.set()
        owner = self._owner
        if owner is None:
            return
        if self.client is None:
            owner.cancel()  # still opening
        await asyncio.wait([owner])


class _Watched:
    """A session's read stream that says when it ends (the server went away)."""

    def __init__(self, inner: Any, on_end: Callable[[], None]) -> None:
        self._inner = inner
        self._on_end = on_end

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def receive(self) -> Any:
        import anyio

        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._on_end()
            raise

    def __aiter__(self) -> _Watched:
        return self

    async def __anext__(self) -> Any:
        import anyio

        try:
            return await self._inner.__anext__()
        except (StopAsyncIteration, anyio.ClosedResourceError):
            self._on_end()
            raise

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _Watched:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._inner.aclose()


def _reason(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@dataclass
class MCPTool(Tool):
    """A tool that calls a tool of an MCP server."""

    server: MCPServer | None = None
    remote_name: str = ""
    takes_idempotency_key: bool = False

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(arguments, dict):
            raise ToolArgumentError(f"invalid arguments for {self.name}: expected an object")
        missing = [n for n in self.parameters.get("required", []) if n not in arguments]
        if missing:
            raise ToolArgumentError(
                f"invalid arguments for {self.name}: missing {', '.join(sorted(missing))}"
            )
        return dict(arguments)

    async def invoke(self, arguments: dict[str, Any], ctx: ToolContext) -> Any:
        assert self.server is not None
        args = self.validate(arguments)
        if self.takes_idempotency_key:
            args[IDEMPOTENCY_ARG] = ctx.idempotency_key
        meta = {IDEMPOTENCY_META: ctx.idempotency_key}

        async def use(session: Any) -> Any:
            return await session.call_tool(self.remote_name, args, meta=meta)

        rerun = self.replay in ("safe", "resume")
        result = await self.server.call(use, ctx, rerun)
        return _result(self.remote_name, result)


def _result(name: str, result: Any) -> Any:
    texts = [c.text for c in getattr(result, "content", None) or () if hasattr(c, "text")]
    if getattr(result, "isError", False) or getattr(result, "is_error", False):
        raise MCPServerError(f"tool {name!r} reported an error: {' '.join(texts) or 'no detail'}")
    if texts:  # what the server wrote for a model to read
        return "\n".join(texts)
    return _field(result, "structuredContent", "structured_content") or ""


def _field(obj: Any, *names: str) -> Any:
    for n in names:
        value = getattr(obj, n, None)
        if value is not None:
            return value
    return None


def _run(coro_factory: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine to the end from sync code, even inside a running event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro_factory())  # type: ignore[arg-type]
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(coro_factory())  # type: ignore[arg-type]
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=target, name="duragent-mcp-list")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


def mcp_tools(
    server: str,
    replay: Replay | Mapping[str, Replay] = "never",
    *,
    prefix: str = "",
    env: Mapping[str, str] | None = None,
    timeout: float = 60.0,
    only: list[str] | None = None,
    scope: Scope = "task",
) -> list[Tool]:
    """The tools of an MCP server, as duragent tools.

    `server` is `"stdio:command args"` or a streamable-HTTP URL. `replay` is one
    policy for every tool, or a mapping from tool name to policy (tools not in it
    are `"never"`). `prefix` is put before each name (to tell servers apart),
    `only` keeps the named tools. The tools are listed now, once. `scope` is
    how long a session lives: `"task"` (the default), `"worker"` or `"call"`.
    """
    where = MCPServer(server, env, timeout, scope)
    if isinstance(replay, str):
        default, per_tool = replay, {}
    else:
        default, per_tool = "never", dict(replay)
    for policy in (default, *per_tool.values()):
        if policy not in POLICIES:
            raise UsageError(f"replay must be 'never', 'safe' or 'resume', not {policy!r}")

    async def listing(session: Any) -> list[Any]:
        tools: list[Any] = []
        cursor = None
        while True:
            page = await session.list_tools(params=None if cursor is None else {"cursor": cursor})
            tools += page.tools
            cursor = _field(page, "nextCursor", "next_cursor")
            if not cursor:
                return tools

    listed = _run(lambda: where.call(listing))
    names = {t.name for t in listed}
    unknown = (set(per_tool) | set(only or ())) - names
    if unknown:
        raise UsageError(
            f"MCP server {server!r} has no tool named {sorted(unknown)}; it has {sorted(names)}"
        )
    out: list[Tool] = []
    for remote in listed:
        if only is not None and remote.name not in only:
            continue
        schema = dict(_field(remote, "inputSchema", "input_schema") or {"type": "object"})
        props = dict(schema.get("properties") or {})
        takes_key = IDEMPOTENCY_ARG in props
        if takes_key:  # duragent fills it in; the model never sees it
            props.pop(IDEMPOTENCY_ARG)
            schema["properties"] = props
            if IDEMPOTENCY_ARG in schema.get("required", []):
                schema["required"] = [r for r in schema["required"] if r != IDEMPOTENCY_ARG]
        out.append(
            MCPTool(
                name=prefix + remote.name,
                description=remote.description or remote.name,
                fn=_unused,
                parameters=schema,
                args_model=_AnyArgs,
                replay=per_tool.get(remote.name, default),
                metadata={"mcp_server": server},
                server=where,
                remote_name=remote.name,
                takes_idempotency_key=takes_key,
            )
        )
    return out


def _unused(**_: Any) -> None:  # pragma: no cover - MCPTool.invoke replaces it
    raise RuntimeError("an MCP tool is called through its server")


__all__ = ["MCPServer", "MCPTool", "mcp_tools"]
