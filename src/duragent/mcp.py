"""MCP tool servers as duragent tools: `Agent(tools=[mcp_tools("stdio:cmd args")])`.

Uses the official `mcp` SDK (`pip install 'duragent[mcp]'`). The server's tools
are listed once, when `mcp_tools` is called, and become ordinary duragent
tools: each call is committed as an intent before it is sent, so after a crash
it follows the tool's replay policy, `"never"` unless you say otherwise per
tool name. The call's idempotency key is sent in the request's `_meta`
(`io.duragent/idempotency-key`) and, when the tool's input schema has an
`idempotency_key` argument, as that argument (hidden from the model).

Every call opens its own session (for `stdio:` that starts the server
process), so no connection outlives a task's worker or crosses event loops.
"""

from __future__ import annotations

import asyncio
import shlex
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ConfigDict

from duragent.errors import MCPServerError, MissingExtra, ToolArgumentError, UsageError
from duragent.runtime._tools import Replay, Tool

if TYPE_CHECKING:
    from duragent.runtime._context import ToolContext

T = TypeVar("T")
IDEMPOTENCY_ARG = "idempotency_key"
IDEMPOTENCY_META = "io.duragent/idempotency-key"
POLICIES = ("never", "safe", "resume")


class _AnyArgs(BaseModel):
    model_config = ConfigDict(extra="allow")


@dataclass(frozen=True)
class MCPServer:
    """Where a server is: `stdio:command args` or an http(s) streamable-HTTP URL."""

    spec: str
    env: Mapping[str, str] | None = None
    timeout: float = 60.0

    def __post_init__(self) -> None:
        if self.spec.startswith("stdio:"):
            if not shlex.split(self.spec[len("stdio:") :]):
                raise UsageError("an MCP stdio server needs a command: 'stdio:command args'")
        elif not self.spec.startswith(("http://", "https://")):
            raise UsageError(
                f"an MCP server is 'stdio:command args' or an http(s):// URL, not {self.spec!r}"
            )

    def connect(self) -> AbstractAsyncContextManager[Any]:
        """An open, initialised ClientSession (an async context manager)."""
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
            async with transport as (read, write), ClientSession(read, write) as s:
                await s.initialize()
                yield s

        return session()

    async def call(self, use: Callable[[Any], Awaitable[T]]) -> T:
        """Run `use(session)` on a fresh session; lower errors become MCPServerError."""
        try:
            async with asyncio.timeout(self.timeout):
                async with self.connect() as session:
                    return await use(session)
        except (asyncio.CancelledError, MCPServerError, MissingExtra):
            raise
        except TimeoutError as exc:
            raise MCPServerError(f"MCP server {self.spec!r} did not answer in time") from exc
        except BaseException as exc:
            # The SDK raises its own errors, OSError, and (anyio) exception groups.
            if not isinstance(exc, Exception):
                raise
            raise MCPServerError(f"MCP server {self.spec!r} failed: {_reason(exc)}") from exc


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

        result = await self.server.call(use)
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
) -> list[Tool]:
    """The tools of an MCP server, as duragent tools.

    `server` is `"stdio:command args"` or a streamable-HTTP URL. `replay` is one
    policy for every tool, or a mapping from tool name to policy (tools not in it
    are `"never"`). `prefix` is put before each name (to tell servers apart),
    `only` keeps the named tools. The tools are listed now, once.
    """
    where = MCPServer(server, env, timeout)
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
