"""Commands for running many tasks: counts, queues, schedules, purge and erase-owner."""

from __future__ import annotations

import json
from typing import Any

import typer
from rich import box
from rich.table import Table

from duragent._terminal import safe
from duragent.cli._common import (
    JSON,
    STORE,
    Commands,
    emit_json,
    make_console,
    operator_runtime,
    parse_age,
    run_async,
)
from duragent.cli._worker import load_agents
from duragent.errors import UnknownAgent, UsageError
from duragent.runtime._presence import served_agents
from duragent.runtime._runtime import Runtime
from duragent.runtime._schedules import (
    Schedule,
    delete_schedule,
    list_schedules,
    new_schedule,
    put_schedule,
    set_paused,
)
from duragent.store._purge import PurgeResult
from duragent.store._queues import Queue
from duragent.types import TaskStatus

app = typer.Typer()
schedule_app = typer.Typer(
    cls=Commands, help="Schedules: submit a task on cron or every N seconds."
)
queue_app = typer.Typer(
    cls=Commands,
    help="Queues: limits shared by every worker. Running workers apply a change at their "
    "next claim, no restart needed.",
)
app.add_typer(schedule_app, name="schedule")
app.add_typer(queue_app, name="queue")


def show_age(seconds: float) -> str:
    """The other way from parse_age: 2592000 -> '30d', 90 -> '90s' (the largest
    unit that divides it)."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


@app.command()
def counts(
    store: str = STORE,
    owner: str | None = typer.Option(None, help="Only this user's tasks."),
    queue: str | None = typer.Option(None, help="Only this queue."),
    agent: str | None = typer.Option(None, help="Only this agent's tasks."),
    as_json: bool = JSON,
) -> None:
    """How many tasks are in each queue and status."""

    async def go() -> dict[str, dict[str, int]]:
        async with operator_runtime(store) as rt:
            return await rt.counts(owner=owner, queue=queue, agent=agent)

    got = run_async(go())
    if as_json:
        emit_json(got)
        return
    statuses = [s.value for s in TaskStatus if any(s.value in v for v in got.values())]
    table = Table()
    table.add_column("queue")
    for s in statuses:
        table.add_column(s, justify="right")
    for name, row in got.items():
        table.add_row(safe(name), *(str(row.get(s, 0)) for s in statuses))
    console = make_console()
    console.print(table if got else "no tasks")


@app.command()
def purge(
    store: str = STORE,
    older_than: str = typer.Option(..., help="Last changed longer ago than this: 30d, 12h..."),
    status: list[TaskStatus] | None = typer.Option(
        None, help="Only this finished status (default: completed, failed, aborted)."
    ),
    owner: str | None = typer.Option(None, help="Only this user's tasks."),
    queue: str | None = typer.Option(None, help="Only this queue's tasks."),
    agent: str | None = typer.Option(None, help="Only this agent's tasks."),
    batch: int = typer.Option(100, min=1, help="Tasks deleted per transaction."),
) -> None:
    """Delete finished tasks for good, with their logs, documents and sub-tasks."""
    age = parse_age(older_than)

    async def go() -> PurgeResult:
        async with operator_runtime(store) as rt:
            return await rt.purge(
                before=age,
                status=status or None,
                owner=owner,
                queue=queue,
                agent=agent,
                batch=batch,
            )

    result = run_async(go())
    make_console().print(f"deleted {result.tasks} tasks in {result.batches} batches")


@app.command("erase-owner")
def erase_owner(
    owner: str = typer.Argument(..., help="The user whose tasks and schedules go."),
    store: str = STORE,
    yes: bool = typer.Option(False, "--yes", help="Do not ask for confirmation."),
) -> None:
    """Abort and delete every task and schedule of one user (erasure on request)."""
    if not yes:
        typer.confirm(f"delete every task and schedule of {owner!r}?", abort=True)

    async def go() -> PurgeResult:
        async with operator_runtime(store) as rt:
            return await rt.erase_owner(owner)

    result = run_async(go())
    make_console().print(f"deleted {result.tasks} tasks of {safe(owner)}")


# --- queues ---


@queue_app.command("set")
def queue_set(
    name: str = typer.Argument(..., help="The queue's name."),
    store: str = STORE,
    concurrency: int | None = typer.Option(None, min=1, help="Running at once, all workers."),
    per_worker: int | None = typer.Option(None, min=1, help="Running at once on one worker."),
    per_owner: int | None = typer.Option(None, min=1, help="Running at once for one user."),
    rate: str | None = typer.Option(None, help="Starts per period: N/SECONDS, e.g. 10/60."),
    ttl: str | None = typer.Option(None, help="Purge finished tasks after: 30d, 12h..."),
) -> None:
    """Define (or redefine) a queue's limits."""
    limit = None
    if rate is not None:
        n, _, per = rate.partition("/")
        try:
            limit = (int(n), float(per))
        except ValueError:
            raise typer.BadParameter(f"rate {rate!r} should be N/SECONDS, e.g. 10/60") from None
    keep = parse_age(ttl).total_seconds() if ttl else None

    async def go() -> Queue:
        async with operator_runtime(store, create=True) as rt:
            return await rt.queue(
                name,
                concurrency=concurrency,
                per_worker=per_worker,
                per_owner=per_owner,
                rate=limit,
                ttl=keep,
            )

    q = run_async(go())
    make_console().print(safe(f"queue {q.name}: {json.dumps(q.definition())}"))


@queue_app.command("ls")
def queue_ls(store: str = STORE, as_json: bool = JSON) -> None:
    """Queues with limits or tasks: the limits, and the tasks in each status (all users)."""

    async def go() -> tuple[list[Queue], dict[str, dict[str, int]]]:
        async with operator_runtime(store) as rt:
            return await rt.queues(), await rt.counts()

    defined, counts = run_async(go())
    by_name = {q.name: q for q in defined}
    names = sorted(by_name.keys() | counts.keys())
    if as_json:
        emit_json(
            [
                {**(by_name.get(n) or Queue(n)).definition(), "tasks": counts.get(n, {})}
                for n in names
            ]
        )
        return
    console = make_console()
    if not names:
        console.print("no queues")
        return
    # Narrow headers and a folding name: the table fits 80 columns.
    table = Table(box=box.SIMPLE_HEAD, show_edge=False)
    for col in ("queue", "at once", "worker", "owner", "rate", "ttl", "tasks"):
        table.add_column(col, overflow="fold")
    for name in names:
        q = by_name.get(name) or Queue(name)
        table.add_row(
            safe(name),
            *(str(v) if v is not None else "-" for v in (q.concurrency, q.per_worker, q.per_owner)),
            "-" if q.rate is None else f"{q.rate[0]}/{q.rate[1]:g}s",
            "-" if q.ttl is None else show_age(q.ttl),
            ", ".join(f"{s} {n}" for s, n in counts.get(name, {}).items()) or "none",
        )
    console.print(table)


@queue_app.command("rm")
def queue_rm(name: str = typer.Argument(..., help="The queue's name."), store: str = STORE) -> None:
    """Remove a queue's limits (its tasks stay, and run unlimited)."""

    async def go() -> None:
        async with operator_runtime(store) as rt:
            await rt.delete_queue(name)

    run_async(go())
    make_console().print(safe(f"queue {name}: limits removed"))


# --- schedules ---


@schedule_app.command("add")
def schedule_add(
    name: str = typer.Argument(..., help="The schedule's name (per owner)."),
    agent: str = typer.Option(..., help="The agent to run (a worker must serve it)."),
    input: str = typer.Option(..., "--input", help="The task's input (text, or JSON)."),
    store: str = STORE,
    cron: str | None = typer.Option(None, help="5-field cron expression, UTC."),
    every: float | None = typer.Option(None, help="Seconds between ticks."),
    overlap: str = typer.Option("skip", help="If the last run is still going: skip, queue, allow."),
    owner: str | None = typer.Option(None, help="The user the tasks belong to."),
    queue: str | None = typer.Option(None, help="Queue for its tasks (default: the agent's)."),
    agents: str | None = typer.Option(
        None,
        "--agents",
        help="module:attr naming the agents, to check --agent against "
        "(default: the agents the running workers serve).",
    ),
) -> None:
    """Create (or replace) a schedule; its agent must be one a worker serves."""
    try:
        value: Any = json.loads(input)
    except ValueError:
        value = input
    if overlap not in ("skip", "queue", "allow"):
        raise typer.BadParameter("--overlap is skip, queue or allow")

    named = None if agents is None else {a.name for a in load_agents(agents)}

    async def go() -> Schedule:
        # Checked before the store is opened (or made): a bad schedule touches nothing.
        new = new_schedule(
            name,
            agent,
            value,
            cron=cron,
            every=every,
            overlap=overlap,  # type: ignore[arg-type]
            owner=owner,
            queue=queue,
        )
        async with operator_runtime(store, create=True) as rt:
            await _check_agent(rt, agent, named)
            return await put_schedule(rt.store, new)

    sched = run_async(go())
    make_console().print(f"schedule {safe(sched.name)}: next tick {sched.next_at.isoformat()}")


async def _check_agent(rt: Runtime, agent: str, named: set[str] | None) -> None:
    """Refuse a schedule for an agent nobody runs: its ticks would never fire."""
    if named is not None:
        if agent not in named:
            raise UnknownAgent(agent, sorted(named))
        return
    served = await served_agents(rt.store)
    if agent not in served:
        who = f"they serve {', '.join(sorted(served))}" if served else "no worker is running"
        raise UsageError(
            f"no running worker serves agent {agent!r} ({who}), so the schedule would "
            "never fire; start a worker that runs it first, or pass --agents module:attr "
            "naming the agents your workers will run"
        )


@schedule_app.command("ls")
def schedule_ls(
    store: str = STORE,
    owner: str | None = typer.Option(None, help="Only this user's."),
    as_json: bool = JSON,
) -> None:
    """List schedules."""

    async def go() -> list[Schedule]:
        async with operator_runtime(store) as rt:
            return await list_schedules(rt.store, owner)

    scheds = run_async(go())
    if as_json:
        emit_json([sched.model_dump(mode="json") for sched in scheds])
        return
    console = make_console()
    if not scheds:
        console.print("no schedules")
        return
    # Fits 80 columns: long names and agents fold; the last task is in --json.
    table = Table(box=box.SIMPLE_HEAD, show_edge=False)
    owners = any(sched.owner for sched in scheds)
    for col in ("name", *(("owner",) if owners else ()), "agent", "when", "state", "next tick"):
        table.add_column(col, overflow="fold", no_wrap=col == "next tick")
    for sched in scheds:
        when = sched.cron if sched.cron else f"every {show_age(sched.every or 0)}"
        state = "paused" if sched.paused else "active"
        table.add_row(
            safe(sched.name),
            *((safe(sched.owner or ""),) if owners else ()),
            safe(sched.agent),
            safe(when),
            f"{state}, overlap {sched.overlap}",
            sched.next_at.strftime("%m-%d %H:%M:%S UTC"),
        )
    console.print(table)


def _set(name: str, store: str, owner: str | None, paused: bool) -> None:
    async def go() -> Schedule:
        async with operator_runtime(store) as rt:
            return await set_paused(rt.store, name, owner, paused)

    s = run_async(go())
    state = "paused" if s.paused else f"active, next tick {s.next_at.isoformat()}"
    make_console().print(f"schedule {safe(s.name)}: {state}")


@schedule_app.command("pause")
def schedule_pause(
    name: str, store: str = STORE, owner: str | None = typer.Option(None, help="Its user.")
) -> None:
    """Stop a schedule ticking."""
    _set(name, store, owner, True)


@schedule_app.command("resume")
def schedule_resume(
    name: str, store: str = STORE, owner: str | None = typer.Option(None, help="Its user.")
) -> None:
    """Tick again, from the next tick after now."""
    _set(name, store, owner, False)


@schedule_app.command("rm")
def schedule_rm(
    name: str, store: str = STORE, owner: str | None = typer.Option(None, help="Its user.")
) -> None:
    """Delete a schedule (the tasks it submitted stay)."""

    async def go() -> None:
        async with operator_runtime(store) as rt:
            await delete_schedule(rt.store, name, owner)

    run_async(go())
    make_console().print(f"schedule {safe(name)} deleted")
