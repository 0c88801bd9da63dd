"""`duragent bulk ACTION [filters]`: one action on every matching task, with a count first
(`duragent migrate --to V [filters]` is `duragent bulk migrate --to V [filters]`).

The operation is a task of the built-in agent `duragent.bulk` (runtime/_bulk.py):
this command starts it and runs it here, showing its progress; stopped (Ctrl-C,
a crash), it is finished by any worker of the store (`duragent worker`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import datetime

import typer
from pydantic import ValidationError

from duragent._terminal import safe
from duragent.cli._common import (
    JSON,
    STORE,
    emit_json,
    make_console,
    operator_runtime,
    parse_duration as _duration,
    run_async,
)
from duragent.runtime._bulk import BulkOperation, TaskFilter
from duragent.runtime._bulk_run import ACTIONS, BULK_AGENT
from duragent.runtime._runtime import Runtime
from duragent.types import Task, TaskStatus, utcnow

app = typer.Typer()

# Huge on purpose: the worker this command runs serves bulk operations only, and
# must never block other agents' tasks as "no worker serves them".
_NEVER = 3e8  # about 9.5 years: the longest a WorkerOptions takes is 10


def when(text: str | None, option: str) -> datetime | None:
    """A time: ISO 8601 with a zone, or an age (2h, 30d: that long ago)."""
    if text is None:
        return None
    try:
        if text[-1:] in ("s", "m", "h", "d") and text[:-1].replace(".", "", 1).isdigit():
            return utcnow() - _duration(text, "an age")
        at = datetime.fromisoformat(text)
    except (ValueError, OverflowError):  # not a time, or an age reaching before year 1
        at = None
    if at is None or at.tzinfo is None:
        raise typer.BadParameter(
            f"{option} {text!r} is not a time with a zone (2030-01-01T09:00:00Z) or an age (2h)"
        )
    return at


def meta_labels(meta: list[str] | None) -> dict[str, str]:
    """`--meta key=value` options (repeated) as a dict; a usage error names a bad one."""
    labels = {}
    for pair in meta or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"--meta {pair!r} should be key=value")
        labels[key] = value
    return labels


def task_filter(
    status: list[TaskStatus] | None,
    agent: str | None,
    queue: str | None,
    meta: list[str] | None,
    owner: str | None,
    times: dict[str, str | None],
    version: str | None = None,
) -> TaskFilter:
    labels = meta_labels(meta)
    bounds = {k: when(v, "--" + k.replace("_", "-")) for k, v in times.items()}
    try:
        return TaskFilter.model_validate(
            {
                "status": status or None,
                "agent": agent,
                "version": version,
                "queue": queue,
                "metadata": labels or None,
                "owner": owner,
                **bounds,
            }
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        raise typer.BadParameter(f"{'.'.join(map(str, first['loc']))}: {first['msg']}") from None


def line(op: BulkOperation) -> str:
    return (
        f"{op.action}: {op.done + op.skipped + op.failed}/{op.total} "
        f"({op.done} done, {op.skipped} skipped, {op.failed} failed) {op.status}"
    )


def moved_from(version: int) -> Callable[[Task], bool]:
    return lambda task: task.version != version


async def run_here(url: str, op_id: str, show: bool) -> BulkOperation:
    """Run the operation in this process until it ends, printing each change."""
    console = make_console()
    async with Runtime(url, worker_queues=[BULK_AGENT], missing_agent_grace=_NEVER) as rt:
        rt.worker_options = dataclasses.replace(rt.worker_options, housekeeping=False)
        await rt.resume()
        last = ""
        while True:
            # One read for what is shown and the version waited past: an operation
            # that ends between two reads would be waited for forever.
            task = await rt.get(op_id)
            op = BulkOperation.of(task)
            if show and line(op) != last:
                last = line(op)
                console.print(last)
            if op.status != "running":
                return op
            await rt.wait(op_id, timeout=None, until=moved_from(task.version))


STATUS = typer.Option(
    None, help="Only tasks in this status (repeat; default: every status the action applies to)."
)
AGENT = typer.Option(None, help="Only this agent's tasks.")
VERSION = typer.Option(None, "--version", help="Only tasks on this version of their agent.")
QUEUE = typer.Option(None, help="Only this queue's tasks.")
META = typer.Option(None, help="key=value: metadata equal to (repeat).")
OWNER = typer.Option(None, help="Only this user's tasks (default: everyone's).")
TIME = typer.Option(None, help="A time (ISO 8601) or an age (2h).")
DRY_RUN = typer.Option(False, "--dry-run", help="Only count; touch nothing.")
YES = typer.Option(False, "--yes", help="Do not ask for confirmation.")
PAGE_SIZE = typer.Option(100, min=1, max=1000, help="Tasks per committed page.")


def run_bulk(
    store: str,
    action: str,
    flt: TaskFilter,
    options: dict[str, str],
    *,
    dry_run: bool,
    yes: bool,
    page_size: int,
    as_json: bool,
) -> None:
    """Count, ask (unless `yes`), start the operation and run it here to its end."""

    async def count() -> int:
        async with operator_runtime(store) as rt:
            return await rt.bulk(action, flt, dry_run=True, options=options)

    n = run_async(count())
    what = f"{action} to {options['to']}" if "to" in options else action
    if dry_run:
        if as_json:
            emit_json({"count": n})
        else:
            make_console().print(f"{what} would touch {n} tasks (dry run: nothing changed)")
        return
    if not yes:
        # With --json, stdout is for the JSON alone: asked on stderr.
        typer.confirm(f"{what} {n} tasks?", abort=True, err=as_json)

    async def start() -> BulkOperation:
        async with operator_runtime(store) as rt:
            return await rt.bulk(action, flt, page_size=page_size, options=options)

    op = run_async(start())
    if not as_json:
        make_console().print(f"bulk operation {safe(op.id)} started")
    done = run_async(run_here(store, op.id, not as_json))
    if as_json:
        emit_json(dataclasses.asdict(done) | {"filter": done.filter.model_dump(mode="json")})
    if done.status != "done":
        make_console(stderr=True).print(f"error: the operation failed: {done.error}")
        raise typer.Exit(1)


@app.command()
def bulk(
    action: str = typer.Argument(..., help=f"What to do: {', '.join(ACTIONS)}."),
    store: str = STORE,
    status: list[TaskStatus] | None = STATUS,
    agent: str | None = AGENT,
    version: str | None = VERSION,
    queue: str | None = QUEUE,
    meta: list[str] | None = META,
    owner: str | None = OWNER,
    created_after: str | None = TIME,
    created_before: str | None = TIME,
    updated_after: str | None = TIME,
    updated_before: str | None = TIME,
    to: str | None = typer.Option(None, "--to", help="migrate: the version the tasks go on with."),
    dry_run: bool = DRY_RUN,
    yes: bool = YES,
    page_size: int = PAGE_SIZE,
    as_json: bool = JSON,
) -> None:
    """Retry, abort, pause, resume, migrate (--to V) or purge every matching task, as
    one durable operation."""
    if action not in ACTIONS:
        raise typer.BadParameter(f"{action!r} is not one of: {', '.join(ACTIONS)}")
    times = {
        "created_after": created_after,
        "created_before": created_before,
        "updated_after": updated_after,
        "updated_before": updated_before,
    }
    flt = task_filter(status, agent, queue, meta, owner, times, version)
    options = {} if to is None else {"to": to}
    run_bulk(
        store, action, flt, options, dry_run=dry_run, yes=yes, page_size=page_size, as_json=as_json
    )
