"""The `duragent` command.

Each command group lives in its own module (`duragent/cli_*.py`) and registers
itself on `app`; this module assembles them and owns what every command
shares: how an error reaches the terminal (one line, never a traceback; set
DURAGENT_DEBUG=1 for the library's logs with tracebacks) and the path
`--agents module:attr` is imported from.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import logging
import os
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import typer
from typer.core import TyperGroup

from duragent.errors import DuragentError, MissingExtra

T = TypeVar("T")

DEBUG_ENV = "DURAGENT_DEBUG"


class _Commands(TyperGroup):
    """Shows flags as `--keep` and `--crash/--no-crash` in help, without a `<bool>` type
    column (typer's rich help labels every flag, `--help` included, with one).

    Typed loosely: typer ships its own copy of click, whose classes are private.
    """

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            _untype_flags(command.get_params(ctx))
        return command

    def get_params(self, ctx: Any) -> Any:
        params = super().get_params(ctx)
        _untype_flags(params)
        return params


def _untype_flags(params: list[Any]) -> None:
    for param in params:
        if getattr(param, "is_flag", False) and getattr(param, "metavar", "") is None:
            param.metavar = ""


app = typer.Typer(cls=_Commands, no_args_is_help=True, help="Durable AI agent tasks.")

COMMAND_MODULES = (
    "cli_tasks",
    "cli_serve",
    "cli_worker",
    "cli_run",
    "cli_store",
    "cli_steering",
    "cli_approvals",
    "cli_fleet",
)


# --- what every command shares ------------------------------------------------------


def exit_code(exc: BaseException) -> int:
    """2 for what the command line itself got wrong (a malformed URL, a missing extra);
    1 for everything else duragent refused."""
    return 2 if isinstance(exc, (MissingExtra, ValueError)) else 1


def fail(exc: BaseException) -> NoReturn:
    """One line on stderr and the exit code, instead of a traceback."""
    from duragent.terminal import clean  # the message may quote model or web text

    typer.secho(f"error: {clean(str(exc))}", fg=typer.colors.RED, err=True)
    raise typer.Exit(exit_code(exc))


def run_async(make: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine; a duragent error or a malformed store URL (ValueError)
    is one line on stderr and exit code `exit_code(...)`."""
    try:
        return asyncio.run(make)
    except (DuragentError, ValueError) as exc:
        fail(exc)


def import_from_cwd() -> None:
    """Let `--agents myagents:AGENTS` find ./myagents.py, as `python -m` and uvicorn do.

    The `duragent` script's own directory is first on sys.path, not the
    directory the user is in.
    """
    cwd = os.getcwd()
    if not any(os.path.abspath(p or ".") == cwd for p in sys.path):
        sys.path.insert(0, cwd)


def _quiet_logs() -> None:
    """The library logs a failing task with its traceback; the terminal commands say
    what happened in one line, so those records go nowhere unless asked for (`worker`
    and `serve` configure logging themselves)."""
    if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
        logging.basicConfig(level=logging.DEBUG, format="%(asctime)s %(name)s %(message)s")
    else:
        logging.getLogger("duragent").addHandler(logging.NullHandler())


# --- commands -------------------------------------------------------------------------


@app.command()
def version() -> None:
    """Print the version."""
    from duragent import __version__

    typer.echo(__version__)


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
    from duragent.demo import run_demo

    raise typer.Exit(run_demo(store, crash=crash, keep=keep, fresh=fresh))


def _register() -> None:
    for name in COMMAND_MODULES:
        if importlib.util.find_spec(f"duragent.{name}") is not None:
            importlib.import_module(f"duragent.{name}")


def main() -> None:
    _register()
    _quiet_logs()
    try:
        app()
    except DuragentError as exc:  # from a command without its own handler
        try:
            fail(exc)
        except typer.Exit as done:
            sys.exit(done.exit_code)
