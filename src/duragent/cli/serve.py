"""`duragent serve`: the HTTP API and web page, with an optional in-process worker."""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from pathlib import Path
from typing import Any

import typer

from duragent.cli._common import STORE, fail, log_to_terminal, prepare_store
from duragent.cli.worker import load_agents
from duragent.errors import InvalidOption, MissingExtra, UsageError

app = typer.Typer()

NO_AGENTS = (
    "warning: no --agents: the API and the page start, but no task can be started or run "
    "here; pass --agents module:attr naming your agents (e.g. --agents myagents:AGENTS)"
)


def _server_modules() -> tuple[Any, Any]:
    """uvicorn and duragent.server, or MissingExtra when the `server` extra is missing."""
    try:
        import uvicorn

        import duragent.server as server
    except ImportError as exc:
        raise MissingExtra("duragent serve", "server") from exc
    return uvicorn, server


async def serve_forever(
    store_url: str,
    agents_spec: str | None,
    *,
    workers: int,
    host: str,
    port: int,
    tokens_file: Path | None,
    lease_ttl: float,
    log_level: str,
    limits: dict[str, int] | None = None,
    max_connections: int = 1000,
    max_connections_per_address: int = 100,
    forwarded_allow_ips: str | None = None,
    header_timeout: float = 10.0,
    keep_alive_timeout: int = 5,
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
    admins: list[str] | None = None,
    sock: socket.socket | None = None,
) -> None:
    """Serve until stopped; on `sock` if given (bound already), else on host:port."""
    uvicorn, server = _server_modules()
    from duragent.runtime.runtime import Runtime
    from duragent.server import connections
    from duragent.store import Store

    # A tokens file is re-read when it changes (a removed token stops working at once).
    tokens = (
        server.WatchedTokenFile(tokens_file)
        if tokens_file is not None
        else server.TokenStore.load(None)
    )
    proxies = connections.Proxies(forwarded_allow_ips)
    counts = connections.AddressCounts(max_connections_per_address, proxies)
    fd_limit = connections.raise_fd_limit()
    connections.quiet_accept_errors(asyncio.get_running_loop())
    agents = load_agents(agents_spec) if agents_spec else []
    if sock is not None:  # uvicorn says where it listens only when it binds itself
        bound_host, bound_port = sock.getsockname()[:2]
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        logging.getLogger("duragent.serve").info("listening on http://%s:%d", shown, bound_port)
    store: str | Store = store_url
    extra: dict[str, Any] = {}
    exporter = None
    if metrics_port is not None:  # on their own port: API tokens are per user, metrics are not
        from duragent.metrics import Metrics
        from duragent.store import open_store

        metrics = Metrics(
            open_store(store_url), heartbeat=lease_ttl / 3, queues=[a.name for a in agents]
        )
        store, extra["trace"] = metrics.store, metrics.trace
        await store.open()
        exporter = metrics.serve(metrics_port, metrics_host)
    runtime = Runtime(
        store,
        agents,
        run_worker=workers > 0,
        concurrency=max(workers, 1),
        lease_ttl=lease_ttl,
        poll_interval=0.2,
        **extra,
    )
    try:
        async with runtime:
            api = server.create_app(
                runtime, tokens, server.ServerLimits(**(limits or {})), admins=admins or ()
            )
            config = uvicorn.Config(
                api,
                host=host,
                port=port,
                log_level=log_level,
                log_config=None,  # its records go through log_to_terminal's cleaning handler
                lifespan="on",
                timeout_graceful_shutdown=5,
                # Past this many connections a request is answered 503 at once.
                limit_concurrency=connections.connection_limit(max_connections, fd_limit),
                timeout_keep_alive=keep_alive_timeout,
                http=connections.protocol_with_header_timeout(header_timeout, counts),
                # X-Forwarded-For is believed from the configured proxies only (uvicorn's
                # default trusts loopback: any local client could pick its address).
                proxy_headers=bool(proxies),
                forwarded_allow_ips=proxies.spec or "",
            )
            await uvicorn.Server(config).serve(sockets=None if sock is None else [sock])
    finally:
        if exporter is not None:
            exporter.shutdown()
        if not isinstance(store, str):
            await store.close()


@app.command()
def serve(
    store: str = STORE,
    agents: str | None = typer.Option(
        None, help="module:attr naming the agents (needed to start tasks and to run them)."
    ),
    workers: int = typer.Option(
        4,
        min=0,
        help="Tasks this process runs at once; 0 = API only (run `duragent worker` separately).",
    ),
    host: str = typer.Option("127.0.0.1", help="Interface to listen on."),
    port: int = typer.Option(8000, help="Port to listen on."),
    tokens: Path | None = typer.Option(
        None,
        help="File of API tokens: lines 'user:token' or a JSON object. "
        "Default: the DURAGENT_TOKENS variable, same format (alice:TOKEN1,bob:TOKEN2). "
        "Tokens need 16 characters or more; the file is read again when it changes.",
    ),
    lease_ttl: float = typer.Option(30.0, help="Seconds a task lease lasts without renewal."),
    log_level: str = typer.Option("info", help="uvicorn log level."),
    # Limits default to duragent.server.ServerLimits (not imported here: it needs the extra).
    max_body: int | None = typer.Option(
        None, min=1, help="Bytes of one request body; more gets 413. [default: 1 MB]"
    ),
    max_input: int | None = typer.Option(
        None, min=1, help="Bytes of a task's input as JSON; more gets 422. [default: 512 KB]"
    ),
    max_context: int | None = typer.Option(
        None, min=1, help="Bytes of a task's context as JSON; more gets 422. [default: 64 KB]"
    ),
    max_metadata: int | None = typer.Option(
        None,
        min=1,
        help="Bytes of a task's or schedule's metadata as JSON; more gets 422. [default: 4 KB]",
    ),
    max_page: int | None = typer.Option(
        None,
        min=1,
        help="Bytes of one page of a task list; a longer page ends early with a next_cursor. "
        "[default: 2 MB]",
    ),
    max_schedules: int | None = typer.Option(
        None, min=1, help="Schedules one user may have; more gets 409. [default: 100]"
    ),
    max_schedule_ticks_per_minute: int | None = typer.Option(
        None,
        min=1,
        help="Ticks per minute of one user's schedules together (60/every each, cron 1); "
        "more gets 409. [default: 60]",
    ),
    streams_per_user: int | None = typer.Option(
        None, min=1, help="Event streams one user may hold open; more gets 429. [default: 32]"
    ),
    auth_failures_per_minute: int | None = typer.Option(
        None,
        min=1,
        help="Wrong tokens one address may send in a minute, then 429 for the rest of it. "
        "[default: 30]",
    ),
    max_connections: int = typer.Option(
        1000, min=1, help="Open connections; past it a request gets 503."
    ),
    max_connections_per_address: int = typer.Option(
        100,
        min=1,
        help="Open connections from one client address; past it a new one gets 429 "
        "and is closed (trusted proxies are exempt: limit per client there).",
    ),
    forwarded_allow_ips: str | None = typer.Option(
        None,
        help="Comma-separated IPs or networks of your reverse proxies ('*' for any): "
        "only their X-Forwarded-For is believed. Default: none (the TCP peer is the client).",
    ),
    header_timeout: float = typer.Option(
        10.0, min=0.1, help="Seconds a client has to send a request's headers."
    ),
    keep_alive_timeout: int = typer.Option(
        5, min=1, help="Seconds an idle kept-alive connection stays open."
    ),
    metrics_port: int | None = typer.Option(
        None,
        help="Serve Prometheus metrics at /metrics on this separate port (extra `metrics`).",
    ),
    metrics_host: str = typer.Option(
        "127.0.0.1", help="Interface for --metrics-port (keep it private: no auth)."
    ),
    admin: list[str] | None = typer.Option(
        None,
        "--admin",
        help="A user (as named in the tokens) who may change what all users share: "
        "queue limits (PUT/DELETE /v1/queues/NAME). Repeat for more. Default: nobody.",
    ),
) -> None:
    """Serve the REST API under /v1, live events, and the web page at /."""
    log_to_terminal()
    _server_modules()  # a missing extra is said before anything else
    # Bound before anything starts: a port in use is one line, never a started
    # server ("startup complete") that then exits.
    sock = listen(host, port)
    if agents is None:
        typer.secho(NO_AGENTS, fg=typer.colors.YELLOW, err=True)
    limits = {
        name: value
        for name, value in (
            ("max_body", max_body),
            ("max_input", max_input),
            ("max_context", max_context),
            ("max_metadata", max_metadata),
            ("max_page", max_page),
            ("max_schedules", max_schedules),
            ("max_schedule_ticks_per_minute", max_schedule_ticks_per_minute),
            ("streams_per_user", streams_per_user),
            ("auth_failures_per_minute", auth_failures_per_minute),
        )
        if value is not None
    }
    prepare_store(store)
    try:
        asyncio.run(
            serve_forever(
                store,
                agents,
                workers=workers,
                host=host,
                port=port,
                tokens_file=tokens,
                lease_ttl=lease_ttl,
                log_level=log_level,
                limits=limits,
                max_connections=max_connections,
                max_connections_per_address=max_connections_per_address,
                forwarded_allow_ips=forwarded_allow_ips,
                header_timeout=header_timeout,
                keep_alive_timeout=keep_alive_timeout,
                metrics_port=metrics_port,
                metrics_host=metrics_host,
                admins=admin,
                sock=sock,
            )
        )
    except UsageError as exc:  # MissingExtra, no tokens, a bad tokens file
        fail(exc, code=2)
    finally:
        sock.close()


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
