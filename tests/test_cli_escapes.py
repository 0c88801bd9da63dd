"""No command prints terminal control sequences it was handed (issue 37, item 8).

A schedule's name renamed the operator's tmux pane; `ESC[2J` cleared the screen.
Every command of the `duragent` app, found by walking the app (a new command is
walked too), runs as a real process with hostile text in every argument, and
the commands that show stored data run against a store whose names, inputs,
outputs, errors and tool arguments are all hostile. Nothing of it may reach
stdout or stderr raw, and no command answers with a traceback.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import click
import pytest
import typer.main

from duragent import Runtime
from duragent.cli import app
from duragent.types import TaskStatus
from hostile_agents import EVIL, NAME, agents
from support.server_live import CLI, child_env, duragent, stop

CONTROLS = ("\x1b", "\x07", "\x9b", "\x08")

# Commands that show what a store holds: run against the hostile store. {T} is a
# completed task, {F} a failed one, {W} one waiting for an approval, {S} the store.
SEEDED: dict[str, list[list[str]]] = {
    "ls": [[], ["--json"], ["--owner", NAME], ["--meta", f"{NAME}={EVIL}"]],
    "counts": [[], ["--json"]],
    "show": [["{T}"], ["{F}"], ["{W}"], ["{T}", "--json"], ["{T}", "--follow"]],
    "history": [["{T}"], ["{W}"], ["{T}", "--json"]],
    "export": [["{T}"]],
    "steps": [["{T}"], ["{W}"], ["{T}", "--json"]],
    "tree": [["{T}"], ["{W}"], ["{T}", "--json"]],
    "approvals": [["{W}"], ["{W}", "--json"]],
    "approve": [["{W}", "--reason", EVIL]],
    "deny": [["{W}", "--reason", EVIL]],
    "pause": [["{T}"]],
    "resume": [["{F}"]],
    "retry": [["{T}"]],
    "abort": [["{T}", "--reason", EVIL]],
    "send": [["{T}", EVIL], ["{W}", EVIL, "--request-id", EVIL]],
    "fork": [["{T}", "--at", "1", "--append-user", EVIL, "--request-id", EVIL]],
    "queue ls": [[], ["--json"]],
    "queue set": [[NAME, "--concurrency", "2"]],
    "queue rm": [[NAME]],
    "schedule ls": [[], ["--json"], ["--owner", NAME]],
    "schedule add": [[NAME, "--agent", NAME, "--input", EVIL, "--every", "60"]],
    "schedule pause": [[NAME, "--owner", NAME]],
    "schedule resume": [[NAME, "--owner", NAME]],
    "schedule rm": [[NAME, "--owner", NAME]],
    "purge": [["--older-than", "0s", "--owner", NAME]],
    "erase-owner": [[NAME, "--yes"]],
    "migrate": [[], ["--to", "v2", "--dry-run", "--agent", EVIL]],
    "bulk": [["retry", "--dry-run"], ["migrate", "--to", "v2", "--dry-run", "--json"]],
    "run": [[EVIL, "--model", "scripted:demo", "--agent-tools", "none", "--workdir", "{D}"]],
    "continue": [["{T}"]],
    "plan": [["{T}", "--step", EVIL], ["{T}", "--step", EVIL, "--json"]],
    "sessions": [[], ["--json"], ["--owner", NAME]],
    "session": [[NAME], [NAME, "--owner", NAME, "--json"]],
}
# Commands that never print what a store holds; the pass with hostile arguments
# (below, for every command) is what they get.
ARGUMENTS_ONLY = {"compact", "demo", "serve", "version", "worker"}
# So that the hostile-argument pass ends at once where a command would otherwise
# run on: a server, a worker (their agents module raises with hostile text).
EXTRA = {
    "serve": ["--port", "0", "--agents", "hostile_agents:raising"],
    "worker": ["--agents", "hostile_agents:raising"],
}


def commands() -> Iterator[tuple[str, Any]]:
    """Every command of the app, as the path typed after `duragent`."""

    def walk(command: Any, path: list[str]) -> Iterator[tuple[str, Any]]:
        subs = getattr(command, "commands", None)
        if subs is None:
            yield " ".join(path), command
            return
        for name, sub in sorted(subs.items()):
            yield from walk(sub, [*path, name])

    yield from walk(typer.main.get_command(app), [])


def hostile_args(path: str, command: Any, store: str) -> list[str]:
    """The command with every argument and required option hostile text (a number
    where it takes a number), on `store`."""
    args = path.split()
    for param in command.params:
        if param.param_type_name == "argument":
            args.append(EVIL)
        elif param.required and param.opts != ["--store"]:
            number = isinstance(param.type, click.types.IntParamType | click.types.FloatParamType)
            args += [param.opts[0], "1" if number else EVIL]
    if any("--store" in p.opts for p in command.params):
        args += ["--store", store]
    return args + EXTRA.get(path, [])


def cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-c", CLI, *args],
        capture_output=True,
        env=child_env(COLUMNS="100"),
        cwd=cwd,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def leaks(args: list[str], result: subprocess.CompletedProcess[bytes]) -> str | None:
    """What the run printed raw that it should not have, or None."""
    out = result.stdout.decode(errors="replace") + result.stderr.decode(errors="replace")
    if any(control in out for control in CONTROLS) or "Traceback" in out:
        return f"{args!r}:\n{out!r}"
    return None


async def _seed(url: str) -> dict[str, str]:
    async with Runtime(url, agents(), poll_interval=0.05) as rt:
        done = await rt.submit(NAME, EVIL, owner=NAME, queue=NAME, metadata={NAME: EVIL})
        failed = await rt.submit(f"{NAME}-fails", EVIL, owner=NAME)
        asks = await rt.submit(f"{NAME}-asks", EVIL, owner=NAME)
        assert (await done.wait(timeout=30)).status is TaskStatus.COMPLETED
        assert (await failed.wait(timeout=30)).status is TaskStatus.FAILED
        waiting = await rt.wait(
            asks.task_id, timeout=30, until=lambda t: t.status is TaskStatus.WAITING
        )
        await rt.queue(NAME, concurrency=1)
        await rt.schedule(NAME, NAME, EVIL, every=3600, owner=NAME)
        return {"{T}": done.task_id, "{F}": failed.task_id, "{W}": waiting.id}


@pytest.fixture
def hostile_store(tmp_path: Path) -> tuple[str, dict[str, str]]:
    # The store's own path is hostile too: errors quote it.
    folder = tmp_path / NAME
    folder.mkdir()
    url = f"sqlite:///{folder}/h.db"
    return url, {**asyncio.run(_seed(url)), "{S}": url, "{D}": str(folder)}


def test_every_command_is_walked() -> None:
    paths = {path for path, _ in commands()}
    assert {"ls", "schedule ls", "queue ls", "counts", "show"} <= paths
    missing = paths - SEEDED.keys() - ARGUMENTS_ONLY
    assert not missing, f"new commands: add them to SEEDED or ARGUMENTS_ONLY: {missing}"
    assert not (SEEDED.keys() | ARGUMENTS_ONLY) - paths  # no stale names either


@pytest.mark.slow
def test_no_command_prints_hostile_text_raw(
    hostile_store: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    url, names = hostile_store
    # `demo --store` takes a file: the hostile store's, which it refuses (not its own).
    demo_file = url.removeprefix("sqlite:///")
    runs = [
        hostile_args(path, command, demo_file if path == "demo" else url)
        for path, command in commands()
    ]
    for path, variants in SEEDED.items():
        for variant in variants:
            args = [*path.split(), *(names.get(a, a) for a in variant)]
            runs.append(args if "--store" in args else [*args, "--store", url])
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(lambda args: cli(args, tmp_path), runs))
    leaked = [leak for a, r in zip(runs, results, strict=True) if (leak := leaks(a, r))]
    assert not leaked, "\n\n".join(leaked)
    shown = {" ".join(a): r.stdout.decode() for a, r in zip(runs, results, strict=True)}
    # The names are there, made inert: the sequences gone, markup shown as written.
    for listing in ("ls", "counts", "queue ls", "schedule ls"):
        assert "h[b]" in shown[f"{listing} --store {url}"], listing


@pytest.mark.slow
def test_worker_logs_hostile_errors_as_plain_text(tmp_path: Path) -> None:
    """A task's error (what a model or tool raised) reaches the worker's log cleaned."""
    url = f"sqlite:///{tmp_path}/w.db"

    async def submit() -> str:
        async with Runtime(url, agents(), run_worker=False) as rt:
            return (await rt.submit(f"{NAME}-fails", EVIL, owner=NAME)).task_id

    async def failed(task_id: str) -> TaskStatus:
        async with Runtime(url, agents(), run_worker=False) as rt:
            return (await rt.wait(task_id, timeout=60)).status

    task_id = asyncio.run(submit())
    log = tmp_path / "worker.log"
    worker = duragent(
        "worker", "--store", url, "--agents", "hostile_agents:agents", "--poll-interval", "0.1",
        log=log,
    )  # fmt: skip
    try:
        assert asyncio.run(failed(task_id)) is TaskStatus.FAILED
    finally:
        stop(worker)
    text = log.read_text(errors="replace")
    assert f"task {task_id} failed: RuntimeError: x" in text, text
    assert not any(control in text for control in CONTROLS), repr(text)
    assert "Traceback" not in text
