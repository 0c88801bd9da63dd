"""Operator commands on a store: ls, show (--follow), pause, resume, abort, export, migrate."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from duragent._payloads import progress_of
from duragent._terminal import clean, safe
from duragent.cli import _bulk as bulk_cli
from duragent.cli._common import (
    JSON,
    STORE,
    emit_json,
    fail,
    make_console,
    operator_runtime,
    parse_age,
    parse_duration,
    prepare_store,
    run_async,
)
from duragent.cli._format import (
    STATUS_STYLE,
    clip,
    describe,
    lease_left,
    status_markup,
    status_text,
    step,
    timeline,
    when,
)
from duragent.errors import UsageError
from duragent.runtime._runtime import Runtime
from duragent.runtime._versions import label
from duragent.runtime._worker import lease_alive
from duragent.store import Store, TaskQuery, open_store
from duragent.types import EntryKind, Task, TaskStatus, session_scope, task_scope

app = typer.Typer()
_C1 = re.compile(r"[\x7f-\x9f]")


def task_header(task: Task, unserved: str | None = None) -> Table:
    """The task's fields; `unserved`: why it will not start (`Runtime.unserved`)."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    grid.add_row("task", safe(task.id))
    grid.add_row("agent", safe(task.agent))
    grid.add_row("version", safe(task.agent_version or "any (from before versions)"))
    if task.owner:
        grid.add_row("owner", safe(task.owner))
    grid.add_row("status", status_markup(task))
    if unserved:
        grid.add_row("", f"[yellow]{safe(unserved)}[/]")
    grid.add_row("step", f"{step(task)} (rounds completed: {task.iterations})")
    grid.add_row("tokens", f"{task.usage.input_tokens} in, {task.usage.output_tokens} out")
    grid.add_row("created", when(task.created_at))
    grid.add_row("updated", when(task.updated_at))
    if task.parent_id:
        grid.add_row("parent", safe(task.parent_id))
    if task.session_id:
        grid.add_row("session", safe(task.session_id))
    grid.add_row("input", safe(clip(task.input, 120)))
    if task.partial_output is not None:
        grid.add_row("so far", safe(clip(task.partial_output, 400)))
    if task.output is not None:
        grid.add_row("output", safe(clip(task.output, 400)))
    if task.deadline:
        grid.add_row("deadline", when(task.deadline))
    if task.error:
        grid.add_row("error", f"[red]{safe(task.error)}[/]")
    return grid


UPDATED = "%m-%d %H:%M:%S"


def task_lines(tasks: list[Task], width: int, unserved: dict[str, str] | None = None) -> list[Text]:
    """`ls` at any width: a line with the whole id (to copy), status, step and when it
    last changed; under it, indented, agent, owner and output or error (or why it
    will not start: `unserved`, task id -> reason), cut to `width`.

    Nothing wraps: an 80-column terminal gets every id whole and the rest cut.
    """
    gap = "  "
    id_width = max(len(clean(t.id)) for t in tasks)
    steps = [step(t) for t in tasks]
    step_width = max(len("step"), *(len(s) for s in steps))
    updated_width = len(tasks[0].updated_at.strftime(UPDATED))
    room = width - id_width - step_width - updated_width - 3 * len(gap)
    statuses = [clip(status_text(t), max(room, len("completed"))) for t in tasks]
    status_width = max(len(s) for s in statuses)
    columns = ("id", id_width), ("status", status_width), ("step", step_width), ("updated", 0)
    head = Text(gap.join(name.ljust(w) for name, w in columns), style="bold")
    lines = [head]
    for t, status, done in zip(tasks, statuses, steps, strict=True):
        line = Text(clean(t.id).ljust(id_width) + gap)
        line.append(status.ljust(status_width), STATUS_STYLE.get(t.status.value, ""))
        line.append(gap + done.ljust(step_width) + gap + t.updated_at.strftime(UPDATED))
        # Agent and owner are cut short so that the output has room too.
        detail = Text("    ")
        detail.append(clip(clean(t.agent), 24), "cyan")
        if t.owner:
            detail.append(" · " + clip(clean(t.owner), 20))
        why = (unserved or {}).get(t.id)
        if why:
            detail.append(" · ")
            detail.append(clip(clean(why), width), "yellow")
        elif t.error:
            detail.append(" · ")
            detail.append(clip(clean(t.error), width), "red")
        elif t.output is not None:
            detail.append(" · " + clip(clean(t.output), width))
        detail.truncate(width, overflow="ellipsis")
        lines += [line, detail]
    return lines


# --- commands ----------------------------------------------------------------


def migrate_task(store: str, task_id: str, to_version: str) -> Task:
    """`duragent migrate TASK --to V`: one task, as `Runtime.migrate` moves it; printed."""

    async def go() -> Task:
        async with operator_runtime(store) as rt:
            return await rt.migrate(task_id, to_version, by="cli")

    task = run_async(go())
    make_console().print(
        f"task {task.id} is {status_markup(task)} on {safe(label(task.agent, task.agent_version))}"
        + (
            "; its worker hands it back at its next safe point"
            if task.status is TaskStatus.RUNNING and task.control
            else ""
        )
    )
    return task


@app.command("ls")
def list_tasks(
    store: str = STORE,
    status: list[TaskStatus] | None = typer.Option(None, help="Only tasks in this status."),
    owner: str | None = typer.Option(None, help="Only this user's tasks."),
    agent: str | None = typer.Option(None, help="Only this agent's tasks."),
    limit: int = typer.Option(50, min=1, help="How many (newest first)."),
    queue: str | None = typer.Option(None, help="Only this queue's tasks."),
    meta: list[str] | None = typer.Option(None, help="key=value: metadata equal to (repeat)."),
    since: str | None = typer.Option(None, help="Created within: 30d, 12h, 15m, 90s."),
    version: str | None = bulk_cli.VERSION,
    as_json: bool = JSON,
) -> None:
    """List tasks, newest first."""
    labels = bulk_cli.meta_labels(meta)
    after = datetime.now(UTC) - parse_age(since) if since else None

    async def go() -> tuple[list[Task], dict[str, str]]:
        async with operator_runtime(store) as rt:
            page = await rt.list_tasks(
                owner=owner,
                status=status or None,
                agent=agent,
                limit=limit,
                queue=queue,
                metadata=labels or None,
                created_after=after,
                version=version,
            )
            return list(page.tasks), await rt.unserved(page.tasks)

    tasks, unserved = run_async(go())
    if as_json:
        emit_json([t.model_dump(mode="json") | {"unserved": unserved.get(t.id)} for t in tasks])
        return
    console = make_console()
    if not tasks:
        console.print("no tasks")
        return
    for line in task_lines(tasks, console.width, unserved):
        console.print(line, no_wrap=True, overflow="ellipsis", soft_wrap=False)


@app.command()
def show(
    task_id: str = typer.Argument(..., help="The task's id."),
    store: str = STORE,
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing until it ends."),
    as_json: bool = typer.Option(
        False, "--json", help="Print the task and its entries as JSON (no --follow)."
    ),
) -> None:
    """Show a task and the timeline of its committed entries."""
    console = make_console()
    if as_json and follow:
        fail(UsageError("--json prints the task as it is now; it does not --follow"))

    async def go() -> None:
        async with operator_runtime(store) as rt:
            task = await rt.get(task_id)
            entries = await rt.store.entries(task_id)
            why = (await rt.unserved([task])).get(task.id)
            if as_json:
                emit_json(
                    {
                        "task": task.model_dump(mode="json")
                        | {"partial_output": task.partial_output, "unserved": why},
                        "entries": [e.model_dump(mode="json") for e in entries],
                    }
                )
                return
            console.print(task_header(task, why))
            console.print(timeline(entries))
            if follow:
                await _follow(rt, task_id, entries[-1].seq if entries else 0, console)

    run_async(go())


async def _follow(rt: Runtime, task_id: str, after: int, console: Console) -> None:
    """Print entries as they are committed; streamed text appears as it streams."""
    streaming = False
    async for e in rt.subscribe(task_id, after_seq=after):
        if e.kind is EntryKind.PROGRESS and "call_id" not in e.payload:
            if not streaming:
                console.print(f"[dim]{e.seq:>5} r{e.round}[/] ", end="")
                streaming = True
            console.print(safe(progress_of(e).get("text", "")), end="", soft_wrap=True)
            continue
        if streaming:
            console.print()
            streaming = False
        console.print(f"[dim]{e.seq:>5} r{e.round}[/] {e.kind.value:<12} {safe(describe(e))}")
    if streaming:
        console.print()
    task = await rt.get(task_id)
    console.print(f"task {task.id} is {status_markup(task)}")
    if task.output is not None:
        console.print(safe(clip(task.output, 2000)))


async def _say_wait(rt: Runtime, task_id: str, action: str, timeout: float) -> None:
    """Before waiting on another process's worker, say so (on stderr): for what, and
    until when a dead one holds the task."""
    task = await rt.get(task_id)
    if lease_alive(task):
        make_console(stderr=True).print(
            f"waiting up to {timeout:g} s for the task's worker to reach a safe point; its "
            f"lease ends in {escape(lease_left(task))}, and if that worker is gone the {action} "
            "applies then…"
        )


@app.command()
def pause(
    task_id: str = typer.Argument(..., help="The task's id."),
    store: str = STORE,
    rollback: bool = typer.Option(False, "--rollback", help="Void the incomplete round."),
    timeout: float = typer.Option(60.0, help="Seconds to wait for the task to reach a safe point."),
) -> None:
    """Pause a task at its next safe point (its worker may be another process)."""

    async def go() -> Task:
        async with operator_runtime(store) as rt:
            await _say_wait(rt, task_id, "pause", timeout)
            return await rt.pause(task_id, rollback=rollback, timeout=timeout)

    task = run_async(go())
    make_console().print(f"task {task.id} is {status_markup(task)}")


@app.command()
def resume(task_id: str = typer.Argument(..., help="The task's id."), store: str = STORE) -> None:
    """Make a paused or blocked task runnable again; a worker picks it up."""

    async def go() -> tuple[Task, bool]:
        async with operator_runtime(store) as rt:
            task = await rt.get(task_id)
            if lease_alive(task):  # its owner runs it, or crashed and its lease has not ended
                return task, False
            resumed = await rt.resume(task_id)
            assert resumed is not None
            return resumed, True

    task, resumed = run_async(go())
    if resumed:
        make_console().print(f"task {task.id} is {status_markup(task)}; a worker will continue it")
    else:
        make_console().print(
            f"task {task.id} is {status_markup(task)}: waiting for the previous owner's lease, "
            f"{escape(lease_left(task))}; if that worker is gone (a crash), a worker with its "
            "agent takes the task over then"
        )


@app.command()
def retry(
    task_id: str = typer.Argument(..., help="The task's id."),
    store: str = STORE,
    deadline: str | None = typer.Option(
        None,
        help="A new deadline from now (90s, 15m, 2h, 1d); without one, a passed deadline "
        "is dropped.",
    ),
) -> None:
    """Continue a failed task from its last commit; a worker picks it up."""
    new = None if deadline is None else parse_duration(deadline, "a deadline")

    async def go() -> Task:
        async with operator_runtime(store) as rt:
            return await rt.retry(task_id, deadline=new)

    task = run_async(go())
    make_console().print(f"task {task.id} is {status_markup(task)}; a worker will continue it")


@app.command()
def abort(
    task_id: str = typer.Argument(..., help="The task's id."),
    store: str = STORE,
    reason: str | None = typer.Option(None, help="Why (kept as the task's error)."),
    timeout: float = typer.Option(60.0, help="Seconds to wait for its worker to stop it."),
) -> None:
    """End a task for good (its sub-tasks too)."""

    async def go() -> Task:
        async with operator_runtime(store) as rt:
            await _say_wait(rt, task_id, "abort", timeout)
            return await rt.abort(task_id, reason=reason, timeout=timeout)

    task = run_async(go())
    make_console().print(f"task {task.id} is {status_markup(task)}")


async def export_task(store: Store, task_id: str) -> dict[str, Any]:
    """The whole task as JSON-ready data: row, entries, documents, and its children's exports."""
    task = await store.get_task(task_id)
    entries = await store.entries(task_id)
    documents = await store.list_documents(task_scope(task_id))
    session_docs = (
        await store.list_documents(session_scope(task.owner, task.session_id))
        if task.session_id
        else []
    )
    page = await store.list_tasks(TaskQuery(parent_id=task_id, limit=10_000))
    children = sorted(page.tasks, key=lambda t: t.created_at)
    return {
        "task": task.model_dump(mode="json"),
        "entries": [e.model_dump(mode="json") for e in entries],
        "documents": [d.model_dump(mode="json") for d in documents],
        "session_documents": [d.model_dump(mode="json") for d in session_docs],
        "children": [await export_task(store, c.id) for c in children],
    }


@app.command()
def export(
    task_id: str = typer.Argument(..., help="The task's id."),
    store: str = STORE,
    output: Path | None = typer.Option(None, "--output", "-o", help="Write here, not stdout."),
) -> None:
    """Export a task as JSON: its row, every entry, its documents and its sub-tasks."""

    async def go() -> dict[str, Any]:
        async with operator_runtime(store) as rt:
            return await export_task(rt.store, task_id)

    # C1 controls are legal raw in JSON text but commands to a terminal: escape them.
    exported = json.dumps(run_async(go()), indent=2, ensure_ascii=False)
    text = _C1.sub(lambda m: f"\\u{ord(m.group()):04x}", exported)
    if output is None:
        typer.echo(text)
    else:
        output.write_text(text + "\n", encoding="utf-8")
        typer.echo(f"wrote {output}", err=True)


@app.command()
def migrate(
    task_id: str | None = typer.Argument(
        None, help="A task to move to another version of its agent (with --to)."
    ),
    to: str | None = typer.Option(
        None, "--to", help="The version the task goes on with (e.g. v4, or a fingerprint)."
    ),
    store: str = STORE,
    status: list[TaskStatus] | None = bulk_cli.STATUS,
    agent: str | None = bulk_cli.AGENT,
    version: str | None = bulk_cli.VERSION,
    queue: str | None = bulk_cli.QUEUE,
    meta: list[str] | None = bulk_cli.META,
    owner: str | None = bulk_cli.OWNER,
    created_after: str | None = bulk_cli.TIME,
    created_before: str | None = bulk_cli.TIME,
    updated_after: str | None = bulk_cli.TIME,
    updated_before: str | None = bulk_cli.TIME,
    dry_run: bool = bulk_cli.DRY_RUN,
    yes: bool = bulk_cli.YES,
    page_size: int = bulk_cli.PAGE_SIZE,
    as_json: bool = JSON,
) -> None:
    """Bring the store's schema to this duragent's version (report before/after); or,
    with TASK --to VERSION, move a task to another version of its agent at its next
    safe point (recorded in its log); or, with --to VERSION and filters (no TASK),
    move every matching task, as one durable bulk operation (`duragent bulk migrate`)."""
    times = {
        "created_after": created_after,
        "created_before": created_before,
        "updated_after": updated_after,
        "updated_before": updated_before,
    }
    filters = [status, agent, version, queue, meta, owner, *times.values()]
    bulk_form = any(f is not None and f != [] for f in filters) or dry_run or yes
    if task_id is not None:
        if to is None:
            fail(UsageError("name a task and its new version: duragent migrate TASK --to v4"))
        if bulk_form:
            fail(UsageError("name a TASK or filters, not both (filters: no TASK)"))
        migrate_task(store, task_id, to)
    elif to is not None:
        flt = bulk_cli.task_filter(status, agent, queue, meta, owner, times, version)
        opts = {"to": to}
        bulk_cli.run_bulk(
            store,
            "migrate",
            flt,
            opts,
            dry_run=dry_run,
            yes=yes,
            page_size=page_size,
            as_json=as_json,
        )
    elif bulk_form:
        fail(UsageError("a migration by filter needs --to: duragent migrate --agent A --to v4"))
    else:
        migrate_schema(store)


def migrate_schema(store: str) -> None:
    """`duragent migrate`: the store's schema brought to this duragent's version."""

    async def go() -> tuple[int | None, int]:
        prepare_store(store)  # migrating a store that is not there yet makes it
        s = open_store(store)  # every store migrates on open()
        await s.open()
        try:
            # Each backend has its own schema history.
            return s.migrated_from, s.schema_version
        finally:
            await s.close()

    before, after = run_async(go())
    console = make_console()
    if before is None:
        console.print(f"schema version: {after} (this backend has no migrations)")
    elif before == after:
        console.print(f"schema version before: {before}, after: {after} (up to date)")
    else:
        was = "new store" if before == 0 else "migrated"
        console.print(f"schema version before: {before}, after: {after} ({was})")
