"""Steering commands: `history` (a task round by round), `fork` (a new task from a
round) and `send` (a message into a live task)."""

from __future__ import annotations

import shlex

import typer
from rich.console import Console
from rich.table import Table

from duragent._terminal import safe
from duragent.cli._common import (
    JSON,
    STORE,
    emit_json,
    fail,
    make_console,
    operator_runtime,
    run_async,
)
from duragent.cli._format import clip, count, status_markup
from duragent.errors import InvalidTransition, UsageError
from duragent.runtime._inbox import STRATEGIES, MultitaskStrategy
from duragent.runtime._steering import Edit, History
from duragent.types import Task

app = typer.Typer()

_ROUND_STYLE = {"complete": "green", "open": "magenta", "voided": "dim"}


def history_table(history: History) -> Table:
    table = Table(title=f"Rounds of {safe(history.task_id)}", title_justify="left")
    for col in ("round", "seqs", "status", "agent", "model said", "tool calls"):
        table.add_column(col, no_wrap=col in ("round", "seqs", "status"))
    for r in history.rounds:
        status = r.status + (" (rolled back)" if r.voided and r.status != "voided" else "")
        said = "".join(f"user: {clip(u, 60)}\n" for u in r.user) + clip(r.assistant or "", 80)
        calls = "\n".join(
            f"{c.name}({clip(c.arguments, 40)}) → [{c.outcome or 'no result yet'}] "
            f"{clip(c.result or '', 50)}"
            for c in r.calls
        )
        agent = r.agent or ""
        if r.handoff is not None:  # the round's handoff: the next rounds' agent
            agent += f"\n→ {r.handoff.to_agent}"
        table.add_row(
            str(r.round),
            f"{r.first_seq}–{r.last_seq}",
            f"[{_ROUND_STYLE[r.status]}]{safe(status)}[/]",
            safe(agent),
            safe(said.strip()),
            safe(calls),
        )
    return table


@app.command()
def history(
    task_id: str = typer.Argument(..., help="The task's id."),
    store: str = STORE,
    as_json: bool = JSON,
) -> None:
    """Show a task round by round: what the model said, its tool calls and their results."""

    async def go() -> tuple[Task, History]:
        async with operator_runtime(store) as rt:
            return await rt.get(task_id), await rt.history(task_id)

    task, hist = run_async(go())
    if as_json:
        emit_json(hist)
        return
    console: Console = make_console()
    status = status_markup(task)
    console.print(f"task {safe(task.id)} is {status}; {count(task.iterations, 'complete round')}")
    if hist.forked_from is not None:
        src = hist.forked_from
        console.print(f"forked from {safe(src.task_id)} at round {src.round}")
    if not hist.rounds:
        console.print("no rounds yet")
        return
    console.print(history_table(hist))
    console.print(f"[dim]fork with: duragent fork {safe(task.id)} --at N[/]")


@app.command()
def fork(
    task_id: str = typer.Argument(..., help="The task to fork (it is not changed)."),
    at: int = typer.Option(..., "--at", min=1, help="Continue from the end of this round."),
    store: str = STORE,
    replace_last_user: str | None = typer.Option(
        None, "--replace-last-user", help="Replace the last user message with this text."
    ),
    append_user: str | None = typer.Option(
        None, "--append-user", help="Add this user message for the next round."
    ),
    drop_last_assistant: bool = typer.Option(
        False, "--drop-last-assistant", help="Drop the last model message and its tool results."
    ),
    request_id: str | None = typer.Option(
        None, "--request-id", help="Idempotency key: the same one returns the same fork."
    ),
) -> None:
    """Start a new task from the end of round N of a task; a worker runs it."""
    try:
        edit = Edit(
            replace_last_user=replace_last_user,
            append_user=append_user,
            drop_last_assistant=drop_last_assistant,
        )
    except ValueError as exc:
        fail(UsageError(f"invalid edit: {exc.errors()[0]['msg']}"))  # type: ignore[attr-defined]

    async def go() -> tuple[Task, bool]:
        async with operator_runtime(store) as rt:
            sub = await rt.fork(task_id, at, edit=edit, request_id=request_id)
            return await rt.get(sub.task_id), sub.created

    task, created = run_async(go())
    verb = "forked" if created else "already forked (same request id)"
    status = status_markup(task)
    make_console().print(
        f"{verb}: task {safe(task.id)} from {safe(task_id)} at round {at}; it is {status}"
    )


@app.command()
def send(
    task_id: str = typer.Argument(..., help="The live task (pending, running, waiting, paused)."),
    text: str = typer.Argument(..., help="The user message."),
    store: str = STORE,
    strategy: str | None = typer.Option(
        None,
        "--strategy",
        help=f"What it does while a turn runs ({', '.join(STRATEGIES)}; default: the task's).",
    ),
    request_id: str | None = typer.Option(
        None,
        "--request-id",
        help="Idempotency key: the same one with the same text sends nothing again.",
    ),
) -> None:
    """Send a user message into a live task; it is taken once, at a safe point."""

    async def go() -> Task:
        async with operator_runtime(store) as rt:
            chosen: MultitaskStrategy | None = strategy  # type: ignore[assignment]
            try:
                return await rt.send(
                    task_id, text, multitask_strategy=chosen, request_id=request_id
                )
            except InvalidTransition:
                task = await rt.get(task_id)
                if not task.status.terminal:
                    raise
            # The library's hint names Python calls; at the terminal it is a command.
            if task.iterations == 0:  # no complete round to fork from
                how = "it has no complete round to fork from: start a new task instead"
            else:
                at = str(task.iterations)
                fork_it = ["duragent", "fork", task.id, "--at", at, "--append-user", text]
                how = f"continue its conversation in a new task with: {shlex.join(fork_it)}"
            raise InvalidTransition(
                task.status.value, "running", f"a finished task takes no messages; {how}"
            )

    task = run_async(go())
    queued = task.config.get("inbox")
    items = [m for m in queued if isinstance(m, dict)] if isinstance(queued, list) else []
    if request_id is not None:
        items = [m for m in items if m.get("request_id") == request_id]
        if not items:  # a repeat: the task took the message already
            make_console().print(
                f"task {safe(task.id)} ({status_markup(task)}) already took the message "
                f"sent with request id {safe(request_id)}; not sent again"
            )
            return
    last = items[-1] if items else {}
    when = "at the next safe point"
    if task.status.value in ("paused", "blocked"):
        when = "when it is resumed"
    elif isinstance(last, dict) and last.get("at") == "turn_end":
        when = "after the current turn's answer"
    status = status_markup(task)
    make_console().print(f"sent to task {safe(task.id)} ({status}); it takes the message {when}")
