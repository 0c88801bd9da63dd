"""`duragent demo`: a task survives a SIGKILL in the middle of a round.

The parent runs the demo agent in a child process, kills it with SIGKILL
while a tool is running, starts it again, and prints what the log shows:
what was committed, what recovery did, and that the side-effecting tool ran
exactly once.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from duragent.cli._common import make_console
from duragent.cli._format import timeline
from duragent.llm.scripted import ScriptedModel, ToolCall, Turn
from duragent.runtime import Agent, Runtime, ToolContext, tool
from duragent.store import open_store
from duragent.store.sqlite_wake import wake_dir
from duragent.terminal import safe
from duragent.types import Entry

app = typer.Typer()

REQUEST_ID = "demo-trip"
AGENT_NAME = "trip-planner"
KILL_MARK = "DEMO-AT-KILL-POINT"


def _ledger_append(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def build_agent(ledger: str, hold: bool) -> Agent:
    @tool(replay="safe")
    async def search_flights(origin: str, destination: str) -> list[dict[str, Any]]:
        """Search flights between two cities."""
        await asyncio.sleep(0.2)
        return [{"flight": "DA 101", "from": origin, "to": destination, "price": 420}]

    @tool(replay="safe")
    async def get_weather(city: str, ctx: ToolContext) -> str:
        """Get the weather forecast for a city (slow)."""
        if hold and ctx.attempt == 1:
            print(KILL_MARK, flush=True)  # the demo kills the process here
            await asyncio.sleep(3600)
        await asyncio.sleep(0.3)
        return f"{city}: sunny, 24°C"

    @tool  # replay="never": booking twice would cost the user twice
    async def book_hotel(city: str, nights: int, ctx: ToolContext) -> str:
        """Book a hotel. Has a side effect: it charges a card."""
        _ledger_append(ledger, f"book_hotel {ctx.idempotency_key} {city} {nights}")
        return f"Booked 'Hotel Durable' in {city} for {nights} nights (ref HD-{ctx.call_id})."

    model = ScriptedModel(
        [
            Turn(
                text="I'll look for flights to Lisbon first. ",
                tool_calls=[
                    ToolCall("search_flights", {"origin": "Berlin", "destination": "Lisbon"})
                ],
            ),
            Turn(
                text="Flight DA 101 looks good. I'll book the hotel and check the weather. ",
                tool_calls=[
                    ToolCall("book_hotel", {"city": "Lisbon", "nights": 3}),
                    ToolCall("get_weather", {"city": "Lisbon"}),
                ],
            ),
            "Your trip is set: flight DA 101 Berlin→Lisbon (€420), 3 nights at Hotel Durable, "
            "and the forecast is sunny, 24°C.",
        ],
        chunk_delay=0.03,
        chunk_size=5,
    )
    return Agent(
        name=AGENT_NAME,
        model=model,
        instructions="You plan trips.",
        tools=[search_flights, get_weather, book_hotel],
        progress_interval=0.1,
    )


async def _child(url: str, ledger: str, hold: bool) -> None:
    agent = build_agent(ledger, hold)
    async with Runtime(url, agents=[agent], lease_ttl=2.0, poll_interval=0.1) as rt:
        sub = await rt.submit(
            "trip-planner",
            "Plan a 3-night trip from Berlin to Lisbon.",
            request_id=REQUEST_ID,
            owner="demo",
        )
        task = await sub.wait(timeout=120)
        print(f"DEMO-DONE {task.id} {task.status.value}", flush=True)


def _spawn(url: str, ledger: str, hold: bool) -> subprocess.Popen[str]:
    # Not `-m duragent.cli.demo`: the package imports this module before runpy would.
    run_child = "import sys; from duragent.cli.demo import child_main; child_main(sys.argv[1:])"
    args = [sys.executable, "-c", run_child, url, ledger, "hold" if hold else "run"]
    return subprocess.Popen(args, stdout=subprocess.PIPE, text=True)


async def _log(url: str) -> tuple[list[Entry], int]:
    """The demo task's entries and its completed rounds."""
    store = open_store(url)
    try:
        task = (await store.list_tasks()).tasks[0]
        return await store.entries(task.id), task.iterations
    finally:
        await store.close()


def made_by_demo(path: Path) -> bool:
    """Whether `path` is a SQLite store holding only this demo's tasks (read-only look)."""
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            agents = {row[0] for row in conn.execute("SELECT DISTINCT agent FROM tasks")}
        finally:
            conn.close()
    except sqlite3.Error:
        return False
    return agents == {AGENT_NAME}


def run_demo(
    store_path: Path, *, crash: bool = True, keep: bool = False, fresh: bool = False
) -> int:
    console = make_console()
    if store_path.exists() and not fresh and not made_by_demo(store_path):
        # The demo starts from an empty store: never delete a file it did not make.
        console.print(
            f"[red]error:[/] {escape(str(store_path))} exists and is not a store this demo "
            "made; the demo would delete it. Choose another --store, or pass --fresh to "
            "delete it."
        )
        return 2
    _remove_store(store_path)
    ledger = Path(f"{store_path}.bookings")
    ledger.unlink(missing_ok=True)
    url = f"sqlite:///{store_path.resolve()}"
    console.print(f"[bold]duragent demo[/] — store: {safe(store_path.resolve())}")
    killed_after = 0
    if crash:
        console.print("1. Running the trip-planner agent in a child process…")
        child = _spawn(url, str(ledger), hold=True)
        assert child.stdout is not None
        for line in child.stdout:
            if line.startswith(KILL_MARK):
                break
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        killed_after = asyncio.run(_last_seq(url))
        console.print(
            f"2. [red]SIGKILL[/] while get_weather was running (pid {child.pid}); "
            f"{killed_after} entries were committed."
        )
        console.print("3. Starting a new process; it takes the task over when the lease expires…")
    else:
        console.print("Running the trip-planner agent (no crash)…")
    child = _spawn(url, str(ledger), hold=False)
    out, _ = child.communicate(timeout=120)
    if child.returncode != 0 or "DEMO-DONE" not in out:
        console.print(f"[red]the demo task did not finish[/]: {safe(out)}")
        return 1
    entries, rounds = asyncio.run(_log(url))
    title = "The task's log (every line a committed entry)"
    console.print(timeline(entries, title=title, restarted_after=killed_after if crash else None))
    bookings = ledger.read_text().splitlines() if ledger.exists() else []
    rerun = "; get_weather is replay-safe and was re-run after the crash" if crash else ""
    console.print(
        f"The side-effecting tool book_hotel ran [bold]{len(bookings)}[/] time(s) "
        f"(ledger: {ledger}){rerun}."
    )
    console.print(f"[green]Task completed in {rounds} rounds.[/]")
    if keep:
        console.print(
            f"Store kept at {store_path.resolve()} (try: duragent show --store {url} ...)"
        )
    else:
        _remove_store(store_path)
        ledger.unlink(missing_ok=True)
        console.print("Store removed (use --keep to keep it).")
    return 0 if len(bookings) == 1 else 1


@app.command()
def demo(
    crash: bool = typer.Option(True, "--crash/--no-crash", help="SIGKILL the agent mid-round."),
    keep: bool = typer.Option(False, "--keep", help="Keep the store file afterwards."),
    store: Path = typer.Option(Path("duragent-demo.db"), help="SQLite file for the demo."),
    fresh: bool = typer.Option(
        False, "--fresh", help="Delete --store first, even if the demo did not create it."
    ),
) -> None:
    """Run a demo agent, kill it mid-round with SIGKILL, and finish the task after restart."""
    raise typer.Exit(run_demo(store, crash=crash, keep=keep, fresh=fresh))


async def _last_seq(url: str) -> int:
    store = open_store(url)
    try:
        page = await store.list_tasks()
        return page.tasks[0].last_seq if page.tasks else 0
    finally:
        await store.close()


def _remove_store(store_path: Path) -> None:
    """The SQLite file, its -wal and -shm, and its folder of wake-ups."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{store_path}{suffix}").unlink(missing_ok=True)
    shutil.rmtree(wake_dir(str(store_path)), ignore_errors=True)


def child_main(argv: list[str]) -> None:
    """The demo's child process: `URL LEDGER hold|run`."""
    url, ledger, mode = argv
    asyncio.run(_child(url, ledger, mode == "hold"))
