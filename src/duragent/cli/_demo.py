"""`duragent demo`: a task survives a SIGKILL in the middle of a round.

The parent runs the demo agent in a child process, kills it with SIGKILL
while a tool is running, starts it again, and prints what the log shows:
what was committed, what recovery did, and that the side-effecting tool ran
exactly once.

The story is the same every time: the kill lands at one announced point
(round 2, get_weather running, book_hotel's result committed), which the
child reaches by an event, not a timer, and the model streams in pieces of a
fixed size, each committed, so every run commits the same entries. Each run
has its own files: a temporary directory, or with --keep/--store a named
store that one demo at a time may use (a lock beside it).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from duragent._terminal import clean, safe
from duragent.cli._common import make_console
from duragent.cli._format import count, describe
from duragent.llm._scripted import ScriptedModel, ToolCall, Turn
from duragent.runtime import Agent, Runtime, Timing, ToolContext, tool
from duragent.store import open_store
from duragent.store._sqlite_wake import wake_dir
from duragent.types import Entry, EntryKind, Task

app = typer.Typer()

DEFAULT_STORE = "duragent-demo.db"  # with --keep and no --store
REQUEST_ID = "demo-trip"
AGENT_NAME = "trip-planner"
KILL_MARK = "DEMO-AT-KILL-POINT"
CHUNK = 40  # characters per streamed piece
LEASE = 2.0  # seconds: how long the killed child's lease holds the task


def _ledger_append(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


class KillPoint:
    """Where the demo's child waits for its SIGKILL: get_weather runs, and
    book_hotel's result is committed (the runtime's `result` trace point
    comes after that commit). Without it, the kill could land before that
    result, and the demo would show book_hotel `interrupted` instead."""

    def __init__(self) -> None:
        self.booking_call: str | None = None
        self.booked = asyncio.Event()

    async def trace(self, point: str, **info: Any) -> None:
        if point == "result" and info.get("call_id") == self.booking_call:
            self.booked.set()


def build_agent(ledger: str, hold: bool, kill_point: KillPoint | None = None) -> Agent:
    at = kill_point or KillPoint()

    @tool(replay="safe")
    async def search_flights(origin: str, destination: str) -> list[dict[str, Any]]:
        """Search flights between two cities."""
        await asyncio.sleep(0.2)
        return [{"flight": "DA 101", "from": origin, "to": destination, "price": 420}]

    @tool(replay="safe")
    async def get_weather(city: str, ctx: ToolContext) -> str:
        """Get the weather forecast for a city (slow)."""
        if ctx.attempt == 1:  # a re-run after the crash finds the booking committed
            # The same order every run, crash or not: book_hotel's result first.
            await at.booked.wait()
            if hold:
                print(KILL_MARK, flush=True)  # the demo kills the process here
                await asyncio.sleep(3600)
        await asyncio.sleep(0.3)
        return f"{city}: sunny, 24°C"

    @tool  # replay="never": booking twice would cost the user twice
    async def book_hotel(city: str, nights: int, ctx: ToolContext) -> str:
        """Book a hotel. Has a side effect: it charges a card."""
        at.booking_call = ctx.call_id
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
        chunk_delay=0.01,
        chunk_size=CHUNK,
    )
    return Agent(
        name=AGENT_NAME,
        model=model,
        instructions="You plan trips.",
        tools=[search_flights, get_weather, book_hotel],
        timing=Timing(progress_interval=0),  # every piece committed: the same entries every run
    )


async def _child(url: str, ledger: str, hold: bool) -> None:
    at = KillPoint()
    agent = build_agent(ledger, hold, at)
    async with Runtime(
        url, agents=[agent], lease_ttl=LEASE, poll_interval=0.1, trace=at.trace
    ) as rt:
        sub = await rt.submit(
            "trip-planner",
            "Plan a 3-night trip from Berlin to Lisbon.",
            request_id=REQUEST_ID,
            owner="demo",
        )
        task = await sub.wait(timeout=120)
        print(f"DEMO-DONE {task.id} {task.status.value}", flush=True)


def _spawn(url: str, ledger: str, hold: bool) -> subprocess.Popen[str]:
    # Not `-m duragent.cli._demo`: the package imports this module before runpy would.
    run_child = "import sys; from duragent.cli._demo import child_main; child_main(sys.argv[1:])"
    args = [sys.executable, "-c", run_child, url, ledger, "hold" if hold else "run"]
    return subprocess.Popen(args, stdout=subprocess.PIPE, text=True)


async def _log(url: str) -> tuple[Task, list[Entry]]:
    """The demo task and its entries."""
    store = open_store(url)
    await store.open()
    try:
        task = (await store.list_tasks()).tasks[0]
        return task, await store.entries(task.id)
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


class Busy(Exception):
    """Another demo holds the store's lock."""


@contextlib.contextmanager
def only_demo(store_path: Path) -> Iterator[None]:
    """Hold `STORE.lock` for this run: two demos on one store would delete each
    other's files. The lock file goes at the end; a run that opened it just
    before finds it unlinked and takes the new one."""
    lock = Path(f"{store_path}.lock")
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise Busy(str(lock)) from None
        try:
            current = os.stat(lock).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            current = False
        if current:
            break
        os.close(fd)
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)
        os.close(fd)


def run_demo(
    store_path: Path | None, *, crash: bool = True, keep: bool = False, fresh: bool = False
) -> int:
    """The demo; the process's exit code. Without a store path (and without
    `keep`), the run's files live in a temporary directory of its own."""
    if store_path is None and not keep:
        with tempfile.TemporaryDirectory(prefix="duragent-demo-") as tmp:
            return _demo(Path(tmp) / "demo.db", crash=crash, keep=False, fresh=False)
    path = store_path or Path(DEFAULT_STORE)
    try:
        with only_demo(path):
            return _demo(path, crash=crash, keep=keep, fresh=fresh)
    except Busy as exc:
        make_console(stderr=True).print(
            f"[red]error:[/] another duragent demo is using {escape(str(path))} (its lock "
            f"{escape(str(exc))} is held); wait for it, or run `duragent demo` without "
            "--keep/--store: each run then has files of its own",
            soft_wrap=True,
        )
        return 1


def _demo(store_path: Path, *, crash: bool, keep: bool, fresh: bool) -> int:
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
    what = "a task survives a SIGKILL mid-round" if crash else "a task from start to end"
    console.print(f"[bold]duragent demo[/]: {what}")
    console.print(f"store: {safe(store_path.resolve())}")
    killed_after = 0
    if crash:
        console.print(
            "1. A child process runs the trip-planner agent. The demo kills it with "
            "SIGKILL in round 2, while get_weather runs, once book_hotel's result is "
            "committed."
        )
        child = _spawn(url, str(ledger), hold=True)
        assert child.stdout is not None
        for line in child.stdout:
            if line.startswith(KILL_MARK):
                break
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        killed_after = asyncio.run(_last_seq(url))
        console.print(
            f"2. [red]SIGKILL[/] (pid {child.pid}): {count(killed_after, 'entry', 'entries')} "
            "committed before it."
        )
        console.print(
            "3. A new process takes the task over: at once when it can prove the old one "
            f"is gone (this host, its pid exited), else when its lease ({LEASE:.0f} s) ends…"
        )
    else:
        console.print("A child process runs the trip-planner agent (no crash)…")
    child = _spawn(url, str(ledger), hold=False)
    out, _ = child.communicate(timeout=120)
    if child.returncode != 0 or "DEMO-DONE" not in out:
        console.print(f"[red]the demo task did not finish[/]: {safe(out)}")
        return 1
    task, entries = asyncio.run(_log(url))
    console.print()
    console.print(story(entries, killed_after if crash else None))
    console.print()
    console.print(f"[bold]Final answer[/]: {safe(task.output or '')}")
    bookings = ledger.read_text().splitlines() if ledger.exists() else []
    times = "once" if len(bookings) == 1 else count(len(bookings), "time")
    rerun = "; get_weather is replay-safe and ran again after the crash" if crash else ""
    console.print(f"The side-effecting tool book_hotel ran [bold]{times}[/]{rerun}.")
    console.print(f"[green]Task completed in {count(task.iterations, 'round')}.[/]")
    if keep:
        console.print(
            f"Store kept at {safe(store_path)} (ledger: {safe(ledger)}). Look at the task with:"
        )
        # One line, even past the edge: a command to copy must not be cut in two.
        console.print(
            f"duragent show {task.id} --store sqlite:///{safe(store_path)}", soft_wrap=True
        )
    else:
        _remove_store(store_path)
        ledger.unlink(missing_ok=True)
        console.print("Store removed (use --keep to keep it).")
    if len(bookings) != 1:
        console.print("[red]error: book_hotel must run exactly once; this is a bug[/]")
        return 1
    return 0


def story(entries: list[Entry], restarted_after: int | None) -> Table:
    """The log, narrow enough for 80 columns: one row per entry (a stream's
    pieces in one row), and a line where the process was killed."""
    table = Table(title="The task's log: every row a committed entry", title_justify="left")
    table.add_column("seq", no_wrap=True)
    table.add_column("round", no_wrap=True)
    table.add_column("what")
    rows: list[tuple[int, int, str, int]] = []  # first seq, last seq, text, round
    for e in entries:
        streamed = e.kind is EntryKind.PROGRESS and "call_id" not in e.payload
        after = restarted_after is not None and e.seq > restarted_after
        if restarted_after is not None and after and e.seq == restarted_after + 1:
            rows.append((0, 0, "", 0))  # the kill
        if streamed and rows and rows[-1][2].startswith("streamed") and rows[-1][3] == e.round:
            first, _, _, r = rows[-1]
            rows[-1] = (first, e.seq, f"streamed the answer in {e.seq - first + 1} pieces", r)
            continue
        text = "streamed the answer in 1 piece" if streamed else clean(describe(e))
        rows.append((e.seq, e.seq, text, e.round))
    for first, last, text, r in rows:
        if not first:
            table.add_row("", "", Text("SIGKILL here; a new process took over", style="red"))
            continue
        seq = str(first) if first == last else f"{first}–{last}"
        style = "yellow" if restarted_after is not None and first > restarted_after else None
        # Text, not markup: what a model wrote is never parsed as markup.
        table.add_row(seq, str(r or "-"), Text(text), style=style)
    return table


@app.command()
def demo(
    crash: bool = typer.Option(True, "--crash/--no-crash", help="SIGKILL the agent mid-round."),
    keep: bool = typer.Option(
        False, "--keep", help=f"Keep the store afterwards (default: ./{DEFAULT_STORE})."
    ),
    store: Path | None = typer.Option(
        None,
        help="SQLite file for the demo (default: a temporary directory of this run's own).",
    ),
    fresh: bool = typer.Option(
        False, "--fresh", help="Delete --store first, even if the demo did not create it."
    ),
) -> None:
    """Run a demo agent, kill it mid-round with SIGKILL, and finish the task after restart."""
    raise typer.Exit(run_demo(store, crash=crash, keep=keep, fresh=fresh))


async def _last_seq(url: str) -> int:
    store = open_store(url)
    await store.open()
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
