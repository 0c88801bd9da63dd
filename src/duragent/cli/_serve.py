"""`duragent serve`: the HTTP API and web page, with an optional in-process worker."""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Annotated, Any

import typer

from duragent.cli._common import STORE, fail, log_to_terminal, prepare_store
from duragent.cli._worker import load_agents
from duragent.errors import InvalidOption, MissingExtra, UsageError

if TYPE_CHECKING:
    from duragent.runtime._agent import Agent
    from duragent.runtime._engine import TraceHook
    from duragent.store import Store

app = typer.Typer()

NO_AGENTS = (
    "warning: no --agents: the API and the page start, but no task can be started or run "
    "here; pass --agents module:attr naming your agents (e.g. --agents myagents:AGENTS)"
)


def _server_modules() -> tuple[ModuleType, ModuleType]:
    """uvicorn and duragent.server, or MissingExtra when the `server` extra is missing."""
    try:
        import uvicorn

        import duragent.server as server
    except ImportError as exc:
        raise MissingExtra("duragent serve", "server") from exc
    return uvicorn, server


# --- the options, in the order `duragent serve --help` lists them ----------------

Agents = Annotated[
    str | None,
    typer.Option(help="module:attr naming the agents (needed to start tasks and to run them)."),
]
Workers = Annotated[
    int,
    typer.Option(
        min=0,
        help="Tasks this process runs at once; 0 = API only (run `duragent worker` separately).",
    ),
]
Host = Annotated[str, typer.Option(help="Interface to listen on.")]
Port = Annotated[int, typer.Option(help="Port to listen on.")]
Tokens = Annotated[
    Path | None,
    typer.Option(
        help="File of API tokens: lines 'user:token' or a JSON object. "
        "Default: the DURAGENT_TOKENS variable, same format (alice:TOKEN1,bob:TOKEN2). "
        "Tokens need 16 characters or more; the file is read again when it changes.",
    ),
]
LeaseTtl = Annotated[float, typer.Option(help="Seconds a task lease lasts without renewal.")]
LogLevel = Annotated[str, typer.Option(help="uvicorn log level.")]


def _limit(help: str) -> Any:
    """A --max-… option: unset, the server's default (duragent.server.ServerLimits,
    not imported here: it needs the extra) applies."""
    return typer.Option(min=1, help=help)


MaxBody = Annotated[int | None, _limit("Bytes of one request body; more gets 413. [default: 1 MB]")]
MaxInput = Annotated[
    int | None, _limit("Bytes of a task's input as JSON; more gets 422. [default: 512 KB]")
]
MaxContext = Annotated[
    int | None, _limit("Bytes of a task's context as JSON; more gets 422. [default: 64 KB]")
]
MaxMetadata = Annotated[
    int | None,
    _limit("Bytes of a task's or schedule's metadata as JSON; more gets 422. [default: 4 KB]"),
]
MaxPage = Annotated[
    int | None,
    _limit(
        "Bytes of one page of a task list; a longer page ends early with a next_cursor. "
        "[default: 2 MB]"
    ),
]
MaxSchedules = Annotated[
    int | None, _limit("Schedules one user may have; more gets 409. [default: 100]")
]
MaxScheduleTicks = Annotated[
    int | None,
    _limit(
        "Ticks per minute of one user's schedules together (60/every each, cron 1); "
        "more gets 409. [default: 60]"
    ),
]
StreamsPerUser = Annotated[
    int | None,
    _limit("Event streams one user may hold open; more gets 429. [default: 32]"),
]
AuthFailures = Annotated[
    int | None,
    _limit(
        "Wrong tokens one address may send in a minute, then 429 for the rest of it. [default: 30]"
    ),
]
MaxConnections = Annotated[
    int, typer.Option(min=1, help="Open connections; past it a request gets 503.")
]
MaxConnectionsPerAddress = Annotated[
    int,
    typer.Option(
        min=1,
        help="Open connections from one client address; past it a new one gets 429 "
        "and is closed (trusted proxies are exempt: limit per client there).",
    ),
]
ForwardedAllowIps = Annotated[
    str | None,
    typer.Option(
        help="Comma-separated IPs or networks of your reverse proxies ('*' for any): "
        "only their X-Forwarded-For is believed. Default: none (the TCP peer is the client).",
    ),
]
HeaderTimeout = Annotated[
    float, typer.Option(min=0.1, help="Seconds a client has to send a request's headers.")
]
KeepAliveTimeout = Annotated[
    int, typer.Option(min=1, help="Seconds an idle kept-alive connection stays open.")
]
MetricsPort = Annotated[
    int | None,
    typer.Option(
        help="Serve Prometheus metrics at /metrics on this separate port (extra `metrics`).",
    ),
]
MetricsHost = Annotated[
    str, typer.Option(help="Interface for --metrics-port (keep it private: no auth).")
]
Admins = Annotated[
    list[str] | None,
    typer.Option(
        "--admin",
        help="A user (as named in the tokens) who may change what all users share: "
        "queue limits (PUT/DELETE /v1/queues/NAME). Repeat for more. Default: nobody.",
    ),
]


@dataclass(frozen=True)
class Listener:
    """Where `serve` listens and how it treats each connection (uvicorn's part)."""

    sock: socket.socket  # bound already (`listen`)
    host: str
    port: int
    log_level: str
    max_connections: int
    max_connections_per_address: int
    forwarded_allow_ips: str | None
    header_timeout: float
    keep_alive_timeout: int


@app.command()
def serve(
    store: str = STORE,
    agents: Agents = None,
    workers: Workers = 4,
    host: Host = "127.0.0.1",
    port: Port = 8000,
    tokens: Tokens = None,
    lease_ttl: LeaseTtl = 30.0,
    log_level: LogLevel = "info",
    max_body: MaxBody = None,
    max_input: MaxInput = None,
    max_context: MaxContext = None,
    max_metadata: MaxMetadata = None,
    max_page: MaxPage = None,
    max_schedules: MaxSchedules = None,
    max_schedule_ticks_per_minute: MaxScheduleTicks = None,
    streams_per_user: StreamsPerUser = None,
    auth_failures_per_minute: AuthFailures = None,
    max_connections: MaxConnections = 1000,
    max_connections_per_address: MaxConnectionsPerAddress = 100,
    forwarded_allow_ips: ForwardedAllowIps = None,
    header_timeout: HeaderTimeout = 10.0,
    keep_alive_timeout: KeepAliveTimeout = 5,
    metrics_port: MetricsPort = None,
    metrics_host: MetricsHost = "127.0.0.1",
    admin: Admins = None,
) -> None:
    """Serve the REST API under /v1, live events, and the web page at /."""
    log_to_terminal()
    _server_modules()  # a missing extra is said before anything else
    # Bound before anything starts: a port in use is one line, never a started
    # server ("startup complete") that then exits.
    sock = listen(host, port)
    if agents is None:
        typer.secho(NO_AGENTS, fg=typer.colors.YELLOW, err=True)
    given = {
        "max_body": max_body,
        "max_input": max_input,
        "max_context": max_context,
        "max_metadata": max_metadata,
        "max_page": max_page,
        "max_schedules": max_schedules,
        "max_schedule_ticks_per_minute": max_schedule_ticks_per_minute,
        "streams_per_user": streams_per_user,
        "auth_failures_per_minute": auth_failures_per_minute,
    }
    listener = Listener(
        sock=sock,
        host=host,
        port=port,
        log_level=log_level,
        max_connections=max_connections,
        max_connections_per_address=max_connections_per_address,
        forwarded_allow_ips=forwarded_allow_ips,
        header_timeout=header_timeout,
        keep_alive_timeout=keep_alive_timeout,
    )
    prepare_store(store)
    try:
        asyncio.run(
            serve_forever(
                store,
                agents,
                listener,
                workers=workers,
                tokens_file=tokens,
                lease_ttl=lease_ttl,
                limits={name: value for name, value in given.items() if value is not None},
                admins=admin,
                metrics_port=metrics_port,
                metrics_host=metrics_host,
            )
        )
    except UsageError as exc:  # MissingExtra, no tokens, a bad tokens file
        fail(exc, code=2)
    finally:
        sock.close()


# --- serving -------------------------------------------------------------------------


async def serve_forever(
    store_url: str,
    agents_spec: str | None,
    listener: Listener,
    *,
    workers: int,
    tokens_file: Path | None,
    lease_ttl: float,
    limits: dict[str, int] | None = None,
    admins: list[str] | None = None,
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
) -> None:
    """Serve on `listener` until stopped."""
    uvicorn, server = _server_modules()
    from duragent.runtime._runtime import Runtime
    from duragent.server import _connections as connections

    # A tokens file is re-read when it changes (a removed token stops working at once).
    tokens = (
        server.WatchedTokenFile(tokens_file)
        if tokens_file is not None
        else server.TokenStore.load(None)
    )
    proxies = connections.Proxies(listener.forwarded_allow_ips)
    counts = connections.AddressCounts(listener.max_connections_per_address, proxies)
    fd_limit = connections.raise_fd_limit()
    connections.quiet_accept_errors(asyncio.get_running_loop())
    agents = load_agents(agents_spec) if agents_spec else []
    _say_where(listener.sock)
    store, trace, stop_metrics = await _with_metrics(
        store_url, agents, lease_ttl, metrics_port, metrics_host
    )
    try:
        # Built inside the try: a Runtime that refuses its options still closes
        # what _with_metrics opened.
        runtime = Runtime(
            store,
            agents,
            run_worker=workers > 0,
            concurrency=max(workers, 1),
            lease_ttl=lease_ttl,
            poll_interval=0.2,
            trace=trace,
        )
        async with runtime:
            api = server.create_app(
                runtime, tokens, server.ServerLimits(**(limits or {})), admins=admins or ()
            )
            config = uvicorn.Config(
                api,
                host=listener.host,
                port=listener.port,
                log_level=listener.log_level,
                log_config=None,  # its records go through log_to_terminal's cleaning handler
                lifespan="on",
                timeout_graceful_shutdown=5,
                # Past this many connections a request is answered 503 at once.
                limit_concurrency=connections.connection_limit(listener.max_connections, fd_limit),
                timeout_keep_alive=listener.keep_alive_timeout,
                http=connections.protocol_with_header_timeout(listener.header_timeout, counts),
                # X-Forwarded-For is believed from the configured proxies only (uvicorn's
                # default trusts loopback: any local client could pick its address).
                proxy_headers=bool(proxies),
                forwarded_allow_ips=proxies.spec or "",
            )
            await uvicorn.Server(config).serve(sockets=[listener.sock])
    finally:
        if stop_metrics is not None:
            stop_metrics()
        if not isinstance(store, str):
            await store.close()


def _say_where(sock: socket.socket) -> None:
    """Log the address served (uvicorn says where it listens only when it binds itself)."""
    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    logging.getLogger("duragent.serve").info("listening on http://%s:%d", shown, bound_port)


async def _with_metrics(
    store_url: str, agents: list[Agent], lease_ttl: float, port: int | None, host: str
) -> tuple[str | Store, TraceHook | None, Callable[[], None] | None]:
    """With --metrics-port: the store wrapped by the metrics (opened here), their trace
    hook for the runtime, and how to stop their exporter; else just the store's URL."""
    if port is None:
        return store_url, None, None
    # On their own port: API tokens are per user, metrics are not.
    from duragent.metrics import Metrics
    from duragent.store import open_store

    metrics = Metrics(
        open_store(store_url), heartbeat=lease_ttl / 3, queues=[a.name for a in agents]
    )
    await metrics.store.open()
    return metrics.store, metrics.trace, metrics.serve(port, host).shutdown


def listen(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (not yet listening), or a one-line error."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        raise InvalidOption(f"--host {host!r}: {exc.strerror or exc}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        why = exc.strerror or str(exc)
        hint = "; stop what uses it or pick another --port" if exc.errno == errno.EADDRINUSE else ""
        raise UsageError(f"cannot listen on {host}:{port}: {why.lower()}{hint}") from None
    sock.set_inheritable(True)
    return sock
