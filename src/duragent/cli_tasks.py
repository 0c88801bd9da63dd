"""Operator commands on a store: ls, show (--follow), pause, resume, abort, export, migrate."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from duragent.cli import app, run_async
from duragent.runtime.runtime import Runtime
from duragent.store import DEFAULT_URL, SCHEMA_VERSION, Store, TaskQuery, open_store
from duragent.terminal import clean, safe
from duragent.types import Entry, EntryKind, Task, TaskStatus, session_scope, task_scope

T = TypeVar("T")
_C1 = re.compile(r"[\x7f-\x9f]")

STORE = typer.Option(DEFAULT_URL, "--store", help="Store URL.")
STATUS_STYLE = {
    "pending": "cyan",
    "running": "bold blue",
    "paused": "yellow",
    "waiting": "magenta",
    "completed": "green",
    "failed": "bold red",
    "aborted": "red",
    "blocked": "bold yellow",
}


def _console() -> Console:
    return Console(highlight=False)


def _run(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a command's coroutine; an error is one line (see `duragent.cli.run_async`)."""
    return run_async(make())


@asynccontextmanager
async def _runtime(url: str) -> AsyncIterator[Runtime]:
    # No worker: operator commands act on the store; the workers run the tasks.
    async with Runtime(url, run_worker=False) as rt:
        yield rt


def _when(dt: datetime | None) -> str:
    return "" if dt is None else dt.strftime("%Y-%m-%d %H:%M:%S")


def _status(task: Task) -> str:
    text = task.status.value + (f" ({task.status_reason})" if task.status_reason else "")
    return f"[{STATUS_STYLE.get(task.status.value, '')}]{safe(text)}[/]"


def _step(task: Task) -> str:
    if task.status.terminal:
        return f"{task.iterations} done"
    return f"{task.iterations + 1}"


def _clip(value: Any, n: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


def describe(e: Entry) -> str:
    """One line saying what an entry records."""
    p = e.payload
    if e.kind is EntryKind.API_MESSAGE:
        if p.get("role") == "assistant":
            calls = ", ".join(c["function"]["name"] for c in p.get("tool_calls") or ())
            said = _clip(p.get("content") or "", 70)
            return f"assistant: {said}" + (f"  → calls {calls}" if calls else "")
        return f"{p.get('role')}: {_clip(p.get('content'), 70)}"
    if e.kind is EntryKind.TOOL_INTENT:
        return f"intent {p.get('name')} ({p.get('call_id')}, replay={p.get('replay')})"
    if e.kind is EntryKind.TOOL_RESULT:
        return f"result {p.get('tool_call_id')} [{p.get('outcome')}]: {_clip(p.get('content'))}"
    if e.kind is EntryKind.PROGRESS:
        who = f"tool {p['call_id']} " if "call_id" in p else ""
        return f"{who}streamed '{_clip(p.get('text', ''), 70)}'"
    if e.kind is EntryKind.STATUS:
        line = f"status {p.get('from')} → {p.get('to')}"
        if p.get("reason"):
            line += f" ({p['reason']})"
        if p.get("takeover"):
            line += " (took over from a dead worker)"
        if p.get("error"):
            line += f": {_clip(p['error'])}"
        return line
    if e.kind is EntryKind.ROLLBACK:
        return f"rollback ({p.get('scope', 'api')}) of seqs {p.get('from_seq')}–{p.get('to_seq')}"
    if e.kind is EntryKind.CHECKPOINT:
        kind = p.get("type")
        if kind == "wait":
            what = p.get("question") or p.get("child_id") or p.get("wake_at") or ""
            return f"waits for {p.get('wait')} ({p.get('call_id')}): {_clip(what)}"
        if kind == "decision":
            verdict = f"{'approved' if p.get('approved') else 'denied'} {p.get('call_id')}"
            if p.get("arguments") is not None:
                verdict += f" with edited arguments {_clip(p['arguments'], 50)}"
            return verdict + (f": {p['reason']}" if p.get("reason") else "")
        return f"{kind} {p.get('call_id', '')}".strip()
    if e.kind is EntryKind.UI_MESSAGE:
        text = p.get("message") or p.get("text") or ""
        return f"{p.get('type', 'ui')}: {_clip(text, 70)}" + (
            f" — {_clip(p['detail'])}" if p.get("detail") else ""
        )
    return _clip(p, 80)


def timeline(entries: list[Entry]) -> Table:
    """The log as a table; consecutive progress batches of one stream collapse into a row."""
    table = Table(title="Committed entries", title_justify="left")
    for col in ("seq", "round", "kind", "at", "what"):
        table.add_column(col, no_wrap=col != "what")
    rows: list[list[str]] = []
    last_kind = None
    for e in entries:
        p = e.payload
        streamed = e.kind is EntryKind.PROGRESS and "call_id" not in p
        if streamed and last_kind == ("progress", e.round) and rows:
            row = rows[-1]
            row[0] = f"{row[0].split('–')[0]}–{e.seq}"
            row[4] = row[4][:-1] + clean(p.get("text", "")) + "'"
            continue
        last_kind = ("progress", e.round) if streamed else None
        what = f"streamed '{clean(p.get('text', ''))}'" if streamed else clean(describe(e))
        at = e.created_at.strftime("%H:%M:%S.%f")[:-3]
        rows.append([str(e.seq), str(e.round or "-"), e.kind.value, at, what])
    for row in rows:
        # Text, not markup: pieces escaped one by one could join into a live tag
        # ("x [lin" + "k=...]"), so the joined text is never parsed at all.
        table.add_row(*row[:4], Text(row[4]))
    return table


def task_header(task: Task) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    grid.add_row("task", safe(task.id))
    grid.add_row("agent", safe(task.agent))
    if task.owner:
        grid.add_row("owner", safe(task.owner))
    grid.add_row("status", _status(task))
    grid.add_row("step", f"{_step(task)} (rounds completed: {task.iterations})")
    grid.add_row("tokens", f"{task.usage.input_tokens} in, {task.usage.output_tokens} out")
    grid.add_row("created", _when(task.created_at))
    grid.add_row("updated", _when(task.updated_at))
    if task.parent_id:
        grid.add_row("parent", safe(task.parent_id))
    if task.session_id:
        grid.add_row("session", safe(task.session_id))
    grid.add_row("input", safe(_clip(task.input, 120)))
    if task.output is not None:
        grid.add_row("output", safe(_clip(task.output, 400)))
    if task.error:
        grid.add_row("error", f"[red]{safe(task.error)}[/]")
    return grid


# --- commands ----------------------------------------------------------------


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
) -> None:
    """List tasks, newest first."""
    from duragent.cli_fleet import parse_age  # the command modules import each other lazily

    labels = {}
    for pair in meta or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"--meta {pair!r} should be key=value")
        labels[key] = value
    after = datetime.now(UTC) - parse_age(since) if since else None

    async def go() -> list[Task]:
        async with _runtime(store) as rt:
            page = await rt.list(
                owner=owner,
                status=status or None,
                agent=agent,
                limit=limit,
                queue=queue,
                metadata=labels or None,
                created_after=after,
            )
            return list(page.tasks)

    tasks = _run(go)
    console = _console()
    if not tasks:
        console.print("no tasks")
        return
    table = Table()
    table.add_column("id", no_wrap=True, min_width=max(len(t.id) for t in tasks))
    for col in ("agent", "owner", "status", "step", "updated"):
        table.add_column(col, no_wrap=True)
    table.add_column("output / error", ratio=1, min_width=16)
    for t in tasks:
        tail = f"[red]{safe(_clip(t.error))}[/]" if t.error else safe(_clip(t.output or ""))
        table.add_row(
            safe(t.id),
            safe(t.agent),
            safe(t.owner or ""),
            _status(t),
            _step(t),
            t.updated_at.strftime("%m-%d %H:%M:%S"),
            tail,
        )
    console.print(table)


@app.command()
def show(
    task_id: str = typer.Argument(..., help="The task's id."),
    store: str = STORE,
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing until it ends."),
) -> None:
    """Show a task and the timeline of its committed entries."""
    console = _console()

    async def go() -> None:
        async with _runtime(store) as rt:
            task = await rt.get(task_id)
            entries = await rt.store.entries(task_id)
            console.print(task_header(task))
            console.print(timeline(entries))
            if follow:
                await _follow(rt, task_id, entries[-1].seq if entries else 0, console)

    _run(go)


async def _follow(rt: Runtime, task_id: str, after: int, console: Console) -> None:
    """Print entries as they are committed; streamed text appears as it streams."""
    streaming = False
    async for e in rt.subscribe(task_id, after_seq=after):
        if e.kind is EntryKind.PROGRESS and "call_id" not in e.payload:
            if not streaming:
                console.print(f"[dim]{e.seq:>5} r{e.round}[/] ", end="")
                streaming = True
            console.print(safe(e.payload.get("text", "")), end="", soft_wrap=True)
            continue
        if streaming:
            console.print()
            streaming = False
        console.print(f"[dim]{e.seq:>5} r{e.round}[/] {e.kind.value:<12} {safe(describe(e))}")
    if streaming:
        console.print()
    task = await rt.get(task_id)
    console.print(f"task {task.id} is {_status(task)}")
    if task.output is not None:
        console.print(safe(_clip(task.output, 2000)))


@app.command()
def pause(
    task_id: str = typer.Argument(..., help="The task's id."),
    store: str = STORE,
    rollback: bool = typer.Option(False, "--rollback", help="Void the incomplete round."),
    timeout: float = typer.Option(60.0, help="Seconds to wait for the task to reach a safe point."),
) -> None:
    """Pause a task at its next safe point (its worker may be another process)."""

    async def go() -> Task:
        async with _runtime(store) as rt:
            return await rt.pause(task_id, rollback=rollback, timeout=timeout)

    task = _run(go)
    _console().print(f"task {task.id} is {_status(task)}")


@app.command()
def resume(task_id: str = typer.Argument(..., help="The task's id."), store: str = STORE) -> None:
    """Make a paused or blocked task runnable again; a worker picks it up."""

    async def go() -> Task | None:
        async with _runtime(store) as rt:
            return await rt.resume(task_id)

    task = _run(go)
    assert task is not None
    _console().print(f"task {task.id} is {_status(task)}; a worker will continue it")


@app.command()
def retry(task_id: str = typer.Argument(..., help="The task's id."), store: str = STORE) -> None:
    """Continue a failed task from its last commit; a worker picks it up."""

    async def go() -> Task:
        async with _runtime(store) as rt:
            return await rt.retry(task_id)

    task = _run(go)
    _console().print(f"task {task.id} is {_status(task)}; a worker will continue it")


@app.command()
def abort(
    task_id: str = typer.Argument(..., help="The task's id."),
    store: str = STORE,
    reason: str | None = typer.Option(None, help="Why (kept as the task's error)."),
    timeout: float = typer.Option(60.0, help="Seconds to wait for its worker to stop it."),
) -> None:
    """End a task for good (its sub-tasks too)."""

    async def go() -> Task:
        async with _runtime(store) as rt:
            return await rt.abort(task_id, reason=reason, timeout=timeout)

    task = _run(go)
    _console().print(f"task {task.id} is {_status(task)}")


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
        async with _runtime(store) as rt:
            return await export_task(rt.store, task_id)

    # C1 controls are legal raw in JSON text but commands to a terminal: escape them.
    text = _C1.sub(
        lambda m: f"\\u{ord(m.group()):04x}", json.dumps(_run(go), indent=2, ensure_ascii=False)
    )
    if output is None:
        typer.echo(text)
    else:
        output.write_text(text + "\n", encoding="utf-8")
        typer.echo(f"wrote {output}", err=True)


@app.command()
def migrate(store: str = STORE) -> None:
    """Open the store, bringing its schema to this duragent's version; report before/after."""

    async def go() -> tuple[int | None, int]:
        s = open_store(store)  # file stores migrate on opening, servers on open()
        await s.open()
        try:
            found = getattr(s, "migrated_from", None)
            # Each backend has its own schema history.
            current = getattr(s, "schema_version", SCHEMA_VERSION)
            return (found if isinstance(found, int) else None), int(current)
        finally:
            await s.close()

    before, after = _run(go)
    console = _console()
    if before is None:
        console.print(f"schema version: {after} (this backend has no migrations)")
    elif before == after:
        console.print(f"schema version before: {before}, after: {after} (up to date)")
    else:
        was = "new store" if before == 0 else "migrated"
        console.print(f"schema version before: {before}, after: {after} ({was})")
