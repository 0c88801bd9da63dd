"""`duragent serve`: the HTTP API and web page, with an optional in-process worker."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import typer

from duragent.cli import app
from duragent.cli_worker import load_agents
from duragent.errors import MissingExtra, UsageError


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
) -> None:
    uvicorn, server = _server_modules()
    from duragent.runtime.runtime import Runtime

    tokens = server.TokenStore.load(tokens_file)
    agents = load_agents(agents_spec) if agents_spec else []
    runtime = Runtime(
        store_url,
        agents,
        run_worker=workers > 0,
        concurrency=max(workers, 1),
        lease_ttl=lease_ttl,
        poll_interval=0.2,
    )
    async with runtime:
        api = server.create_app(runtime, tokens)
        config = uvicorn.Config(
            api,
            host=host,
            port=port,
            log_level=log_level,
            lifespan="on",
            timeout_graceful_shutdown=5,
        )
        await uvicorn.Server(config).serve()


@app.command()
def serve(
    store: str = typer.Option("sqlite:///duragent.db", help="Store URL."),
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
        "Default: the DURAGENT_TOKENS variable, same format (alice:tok1,bob:tok2).",
    ),
    lease_ttl: float = typer.Option(30.0, help="Seconds a task lease lasts without renewal."),
    log_level: str = typer.Option("info", help="uvicorn log level."),
) -> None:
    """Serve the REST API under /v1, live events, and the web page at /."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
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
            )
        )
    except UsageError as exc:  # MissingExtra, no tokens, a bad tokens file
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
