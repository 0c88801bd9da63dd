"""`duragent worker`: run tasks from a store in this process."""

from __future__ import annotations

import asyncio
import importlib
import logging
import signal
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import typer

from duragent.cli._common import (
    DEBUG_ENV,
    STORE,
    debugging,
    import_from_cwd,
    log_to_terminal,
    prepare_store,
    run_async,
)
from duragent.errors import InvalidOption
from duragent.runtime._agent import Agent, agents_by_name
from duragent.runtime._calls import exception_text

if TYPE_CHECKING:
    from duragent.runtime._worker import Worker, WorkerOptions
    from duragent.store._protocol import Store

log = logging.getLogger(__name__)
app = typer.Typer()


def load_agents(spec: str) -> list[Agent]:
    """`module:attr` naming an Agent, a list of Agents, or a function returning either;
    the module is looked for in the current directory too.

    A module that raises while it loads (or a function that raises) is one line
    naming the module and the error; DURAGENT_DEBUG=1 (or --debug) lets the
    traceback through instead."""
    module_name, _, attr = spec.partition(":")
    if not attr:
        raise InvalidOption(f"--agents {spec!r} should be 'module:attribute'")
    import_from_cwd()
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        if isinstance(exc, ModuleNotFoundError) and exc.name == module_name:
            raise InvalidOption(f"--agents {spec!r}: there is no module {module_name!r}") from None
        if debugging():
            raise
        raise _failed(spec, f"importing module {module_name!r}", exc) from None
    try:
        value: Any = getattr(module, attr)
    except AttributeError:
        raise InvalidOption(
            f"--agents {spec!r}: module {module_name!r} has no attribute {attr!r}"
        ) from None
    if callable(value) and not isinstance(value, Agent):
        try:
            value = value()
        except Exception as exc:
            if debugging():
                raise
            raise _failed(spec, f"calling {module_name}.{attr}()", exc) from None
    agents = [value] if isinstance(value, Agent) else list(value)
    if not agents or not all(isinstance(a, Agent) for a in agents):
        raise InvalidOption(f"--agents {spec!r} is not an Agent or a list of Agents")
    agents_by_name(agents)  # two agents with one name: said here, before anything starts
    return agents


def _failed(spec: str, doing: str, exc: Exception) -> InvalidOption:
    """One line for an agents module that raised: what was done, and the error."""
    what = " ".join(exception_text(exc).split())
    return InvalidOption(
        f"--agents {spec!r}: {doing} raised {what} ({DEBUG_ENV}=1 shows the traceback)"
    )


async def run_worker(
    store_url: str,
    agents: Iterable[Agent],
    options: WorkerOptions,
    *,
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
) -> int:
    """Run a worker until it is stopped; the process's exit code (0: drained)."""
    from duragent.runtime._bulk_run import bulk_agent
    from duragent.runtime._outage import when_reachable
    from duragent.runtime._runtime import Runtime
    from duragent.runtime._worker import Worker
    from duragent.store import open_store

    agents = list(agents)  # read twice: the worker's, and the metrics' queue names

    async def opened() -> Store:
        store = open_store(store_url)
        try:
            await store.open()
        except BaseException:
            await store.close()
            raise
        return store

    # A server that is down or out of reach is waited for (said once), as a
    # worker started beside a database that is still starting must.
    store = await when_reachable(opened, "starting the worker", log)
    # Every worker runs bulk operations too (runtime/_bulk.py), through a runtime
    # of its store for the verbs they use.
    agents.append(bulk_agent(Runtime(store, run_worker=False, lease_ttl=options.lease_ttl)))
    exporter = None
    if metrics_port is not None:
        from duragent.metrics import Metrics

        metrics = Metrics(
            store,
            heartbeat=options.heartbeat or options.lease_ttl / 3,
            queues=[a.name for a in agents],
        )
        exporter = metrics.serve(metrics_port, metrics_host)
        worker = Worker(metrics.store, agents, options, trace=metrics.trace)
    else:
        worker = Worker(store, agents, options)
    log.info(
        "worker %s started: store %s, agents %s, %d at once, queues %s",
        worker.id,
        without_password(store_url),
        ", ".join(sorted(worker.agents)),
        worker.options.concurrency,
        ", ".join(worker.queues) if worker.queues else "all",
    )
    hard: list[int] = []  # the signal that stopped it at once, if one did
    stopping = _on_signals(worker, hard)
    try:
        await worker.run()
        for job in stopping:
            await job
    finally:
        if exporter is not None:
            exporter.shutdown()
        await store.close()
    return 128 + hard[0] if hard else 0


def _on_signals(worker: Worker, hard: list[int]) -> list[asyncio.Task[None]]:
    """SIGTERM/SIGINT drains the worker (`Worker.stop`); a second one stops it at once
    (its exit code is then 128 + that signal's number, as if it had killed it)."""
    loop = asyncio.get_running_loop()
    stopping: list[asyncio.Task[None]] = []

    def shutdown(sig: int) -> None:
        if not stopping:
            grace = worker.options.shutdown_grace
            log.info(
                "stopping: draining; running tasks go back to the queue at their next safe "
                "point (grace %s); a second signal stops at once",
                "unlimited" if grace is None else f"{grace:g} s",
            )
            stopping.append(asyncio.ensure_future(worker.stop(graceful=True)))
        elif not hard:
            hard.append(sig)
            log.warning(
                "stopping at once: running tasks are left to their leases "
                "(another worker takes them over once they expire)"
            )
            stopping.append(asyncio.ensure_future(worker.stop(graceful=False)))

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, shutdown, sig)
    return stopping


@app.command()
def worker(
    store: str = STORE,
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
    grace: float = typer.Option(
        30.0,
        help="On SIGTERM/SIGINT, seconds running tasks get to reach a safe point and be "
        "handed back; past it, their running tools are cancelled and they are handed back.",
    ),
) -> None:
    """Claim and run tasks until SIGTERM or SIGINT, which drains: no more claims, running
    tasks handed back at a safe point within --grace, exit 0. A second signal stops at
    once (exit 128 + signal; its tasks are taken over once their leases expire)."""
    from duragent.runtime._worker import WorkerOptions

    only = None if queues is None else parse_queues(queues)
    log_to_terminal()
    prepare_store(store)
    code = run_async(
        run_worker(
            store,
            load_agents(agents),
            WorkerOptions(
                concurrency=concurrency,
                lease_ttl=lease_ttl,
                poll_interval=poll_interval,
                worker_id=worker_id,
                missing_agent_grace=missing_agent_grace,
                queues=only,
                shutdown_grace=grace,
            ),
            metrics_port=metrics_port,
            metrics_host=metrics_host,
        )
    )
    if code:
        raise typer.Exit(code)


def without_password(url: str) -> str:
    """The store URL to show: a password in it is replaced by ***."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@")))


def parse_queues(text: str) -> list[str]:
    """'emails, reports' -> ['emails', 'reports']; an empty name is a mistake."""
    names = [name.strip() for name in text.split(",")]
    if not all(names):
        raise typer.BadParameter(f"--queues {text!r}: queue names separated by commas, e.g. a,b")
    return names
