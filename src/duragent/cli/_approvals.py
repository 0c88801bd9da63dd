"""Approval commands: `approvals` (what is open), `approve` (optionally with edited
arguments, several at once) and `deny`."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import typer
from rich.table import Table

from duragent._payloads import WaitCheckpoint
from duragent._terminal import safe
from duragent.cli._common import (
    JSON,
    STORE,
    emit_json,
    fail,
    make_console,
    require_store,
    run_async,
)
from duragent.cli._format import clip, status_markup
from duragent.errors import UsageError
from duragent.runtime._approvals import Decision
from duragent.runtime._runtime import Runtime
from duragent.runtime._waits import open_waits
from duragent.types import Task

app = typer.Typer()

CALL = typer.Option(
    [], "--call", help="A call id to decide (repeat for several; default: the only open one)."
)
ALL = typer.Option(False, "--all", help="Decide every open approval of the task.")
REASON = typer.Option(None, "--reason", help="Why; the model sees it.")


def _agents(spec: str | None) -> list[Any]:
    if spec is None:
        return []
    from duragent.cli._worker import load_agents

    return load_agents(spec)


async def _open_approvals(rt: Runtime, task: Task) -> dict[str, WaitCheckpoint]:
    waits = await open_waits(rt.store, task)
    return {c: w for c, w in waits.items() if w["wait"] == "approval"}


async def _decide(
    store: str,
    agents: str | None,
    task_id: str,
    calls: list[str],
    every: bool,
    make: Any,
) -> tuple[Task, list[str]]:
    require_store(store)
    async with Runtime(store, _agents(agents), run_worker=False) as rt:
        task = await rt.get(task_id)
        if every:
            calls = sorted(await _open_approvals(rt, task))
            if not calls:
                raise UsageError(f"task {task_id!r} has no open approval")
        if len(calls) <= 1:
            call_id = calls[0] if calls else None
            d: Decision = make()
            task = await rt.respond(
                task_id,
                approve=d.approve,
                reason=d.reason,
                arguments=d.arguments,
                call_id=call_id,
            )
            return task, calls
        task = await rt.respond(task_id, decisions={c: make() for c in calls})
        return task, calls


def _verdict(task: Task, calls: list[str], what: str) -> None:
    which = ", ".join(safe(c) for c in calls) or "the open call"
    make_console().print(f"{what} {which}; task {safe(task.id)} is {status_markup(task)}")


@app.command()
def approvals(
    task_id: str = typer.Argument(..., help="The task's id."),
    store: str = STORE,
    as_json: bool = JSON,
) -> None:
    """List a task's open approvals: the call, its tool and arguments, when it expires."""

    async def go() -> dict[str, WaitCheckpoint]:
        require_store(store)
        async with Runtime(store, run_worker=False) as rt:
            return await _open_approvals(rt, await rt.get(task_id))

    waits = run_async(go())
    if as_json:
        emit_json(waits)
        return
    if not waits:
        make_console().print(f"task {safe(task_id)} has no open approval")
        return
    table = Table(title=f"Open approvals of {safe(task_id)}", title_justify="left")
    for col in ("call", "tool", "arguments", "expires"):
        table.add_column(col, no_wrap=col != "arguments")
    for cid, w in waits.items():
        expires = w.get("expires_at")
        when = datetime.fromisoformat(expires).strftime("%Y-%m-%d %H:%M:%S") if expires else ""
        args = w.get("arguments")
        shown = json.dumps(args, ensure_ascii=False) if args is not None else w.get("question")
        table.add_row(safe(cid), safe(w.get("tool") or ""), safe(clip(shown, 100)), when)
    make_console().print(table)


@app.command()
def approve(
    task_id: str = typer.Argument(..., help="The task's id."),
    call: list[str] = CALL,
    every: bool = ALL,
    args: str | None = typer.Option(
        None,
        "--args",
        help="A JSON object: run the call with these arguments instead of the model's "
        "(one call; checked against the tool's schema, so --agents is needed).",
    ),
    agents: str | None = typer.Option(
        None, "--agents", help="module:attr naming the task's agent (to check --args)."
    ),
    reason: str | None = REASON,
    store: str = STORE,
) -> None:
    """Approve a task's waiting tool call(s); several are decided in one commit."""
    arguments = None
    if args is not None:
        try:
            arguments = json.loads(args)
        except ValueError as exc:
            fail(UsageError(f"--args is not JSON: {exc}"))
        if not isinstance(arguments, dict):
            fail(UsageError('--args must be a JSON object, e.g. \'{"to": "bob"}\''))
        if every or len(call) > 1:
            fail(UsageError("--args edits one call: pass a single --call"))

    def make() -> Decision:
        return Decision(approve=True, reason=reason, arguments=arguments)

    task, calls = run_async(_decide(store, agents, task_id, list(call), every, make))
    _verdict(task, calls, "approved" + (" with edited arguments" if arguments else ""))


@app.command()
def deny(
    task_id: str = typer.Argument(..., help="The task's id."),
    call: list[str] = CALL,
    every: bool = ALL,
    reason: str | None = REASON,
    store: str = STORE,
) -> None:
    """Deny a task's waiting tool call(s); the model is told, with the reason."""

    def make() -> Decision:
        return Decision(approve=False, reason=reason)

    task, calls = run_async(_decide(store, None, task_id, list(call), every, make))
    _verdict(task, calls, "denied")
