"""`duragent worker`: run tasks from a store in this process."""

from __future__ import annotations

import asyncio
import importlib
import logging
import signal
from collections.abc import Iterable
from typing import Any

import typer

from duragent.cli._common import import_from_cwd, run_async
from duragent.runtime.agent import Agent

log = logging.getLogger(__name__)
app = typer.Typer()


def load_agents(spec: str) -> list[Agent]:
    """`module:attr` naming an Agent, a list of Agents, or a function returning either;
    the module is looked for in the current directory too."""
    module_name, _, attr = spec.partition(":")
    if not attr:
        raise typer.BadParameter(f"{spec!r} should be 'module:attribute'")
    import_from_cwd()
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise typer.BadParameter(f"cannot import {module_name!r}: {exc}") from exc
    try:
        value: Any = getattr(module, attr)
    except AttributeError:
        raise typer.BadParameter(f"module {module_name!r} has no attribute {attr!r}") from None
    if callable(value) and not isinstance(value, Agent):
        value = value()
    agents = [value] if isinstance(value, Agent) else list(value)
    if not agents or not all(isinstance(a, Agent) for a in agents):
        raise typer.BadParameter(f"{spec!r} is not an Agent or a list of Agents")
    return agents


async def run_worker(
    store_url: str,
    agents: Iterable[Agent],
    *,
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
    **options: Any,
) -> None:
    from duragent.runtime.worker import Worker
    from duragent.store import open_store

    agents = list(agents)  # read twice: the worker's, and the metrics' queue names
    store = open_store(store_url)
    await store.open()
    exporter = None
    if metrics_port is not None:
        from duragent.metrics import Metrics

        lease_ttl = options.get("lease_ttl", 30.0)
        metrics = Metrics(
            store,
            heartbeat=options.get("heartbeat") or lease_ttl / 3,
            queues=[a.name for a in agents],
        )
        exporter = metrics.serve(metrics_port, metrics_host)
        worker = Worker(metrics.store, agents, trace=metrics.trace, **options)
    else:
        worker = Worker(store, agents, **options)
    loop = asyncio.get_running_loop()
    stopping: list[asyncio.Task[None]] = []

    def shutdown() -> None:
        if not stopping:  # SIGTERM/SIGINT: finish or hand back in-flight rounds, then exit
            log.info("stopping: running tasks go back to the queue at their next safe point")
            stopping.append(asyncio.ensure_future(worker.stop(graceful=True)))

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, shutdown)
    try:
        await worker.run()
        for job in stopping:
            await job
    finally:
        if exporter is not None:
            exporter.shutdown()
        await store.close()


@app.command()
def worker(
    store: str = typer.Option("sqlite:///duragent.db", help="Store URL."),
    agents: str = typer.Option(..., help="module:attr naming the agents this worker runs."),
    concurrency: int = typer.Option(32, help="Tasks run at once."),
    lease_ttl: float = typer.Option(30.0, help="Seconds a lease lasts without renewal."),
    poll_interval: float = typer.Option(0.5, help="Seconds between looks for new work."),
    worker_id: str | None = typer.Option(None, help="Name of this worker (default host:pid)."),
    missing_agent_grace: float = typer.Option(
        60.0,
        help="Seconds a task may wait for an agent no running worker knows before it is "
        "blocked (missing_definition).",
    ),
    metrics_port: int | None = typer.Option(
        None, help="Serve Prometheus metrics at /metrics on this port (extra `metrics`)."
    ),
    metrics_host: str = typer.Option(
        "127.0.0.1", help="Interface for --metrics-port (keep it private: no auth)."
    ),
    queues: str | None = typer.Option(
        None, help="Claim only from these queues, comma-separated (default: every queue)."
    ),
) -> None:
    """Claim and run tasks until SIGTERM (then stop at a safe point and hand them back)."""
    only = None if queues is None else parse_queues(queues)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    run_async(
        run_worker(
            store,
            load_agents(agents),
            concurrency=concurrency,
            lease_ttl=lease_ttl,
            poll_interval=poll_interval,
            worker_id=worker_id,
            missing_agent_grace=missing_agent_grace,
            metrics_port=metrics_port,
            metrics_host=metrics_host,
            queues=only,
        )
    )


def parse_queues(text: str) -> list[str]:
    """'emails, reports' -> ['emails', 'reports']; an empty name is a mistake."""
    names = [name.strip() for name in text.split(",")]
    if not all(names):
        raise typer.BadParameter(f"--queues {text!r}: queue names separated by commas, e.g. a,b")
    return names
