"""`duragent sessions` (one owner's conversations) and `duragent session ID` (its
turns and transcript): the library's `Runtime.sessions` and `Runtime.session`
at the terminal, as tables or `--json`. A new turn is `duragent run`/`submit`'s
business (or `Runtime.continue_session`, REST `POST /v1/sessions/{id}/messages`)."""

from __future__ import annotations

from dataclasses import asdict

import typer
from rich.table import Table

from duragent._terminal import safe
from duragent.cli._common import JSON, STORE, emit_json, make_console, operator_runtime, run_async
from duragent.cli._format import clip, count, status_markup, when
from duragent.runtime._sessions import Session, SessionSummary

app = typer.Typer()

OWNER = typer.Option(None, help="Whose sessions (default: those of tasks without an owner).")


@app.command()
def sessions(owner: str | None = OWNER, store: str = STORE, as_json: bool = JSON) -> None:
    """List an owner's sessions, the most recently active first."""

    async def go() -> list[SessionSummary]:
        async with operator_runtime(store) as rt:
            return await rt.sessions(owner=owner)

    found = run_async(go())
    if as_json:
        emit_json([asdict(s) for s in found])
        return
    console = make_console()
    if not found:
        console.print("no sessions")
        return
    table = Table()
    for col in ("session", "turns", "latest task", "status", "updated"):
        table.add_column(col)
    for s in found:
        table.add_row(
            safe(s.session_id),
            str(s.turns),
            safe(s.latest_task_id),
            safe(s.latest_status.value),
            when(s.updated_at),
        )
    console.print(table)


@app.command()
def session(
    session_id: str = typer.Argument(..., help="The session's id."),
    owner: str | None = OWNER,
    store: str = STORE,
    as_json: bool = JSON,
) -> None:
    """Show a session: its turns (tasks) and its transcript."""

    async def go() -> Session:
        async with operator_runtime(store) as rt:
            return await rt.session(session_id, owner=owner)

    got = run_async(go())
    if as_json:
        emit_json(
            {
                "session_id": got.session_id,
                "owner": got.owner,
                "tasks": [t.model_dump(mode="json") for t in got.tasks],
                "transcript": [m.model_dump(mode="json") for m in got.transcript],
            }
        )
        return
    console = make_console()
    console.print(f"session {safe(got.session_id)}: {count(len(got.tasks), 'turn')}")
    for t in got.tasks:
        console.print(f"  {safe(t.id)}  {safe(t.agent)}  {status_markup(t)}")
    for m in got.transcript:
        console.print(f"{safe(m.role)}: {safe(clip(m.content or '', 400))}")
