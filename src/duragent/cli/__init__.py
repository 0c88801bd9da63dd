"""The `duragent` command.

Each command group lives in its own module of this package and exposes its
commands as a Typer app, `app`; this module adds each of them to the one
`duragent` app, by name, so a missing module is an ImportError, never a
command that silently is not there. What every command shares (the one-line
errors, the `--store` option) is in `_common`; how tasks and entries look on
the terminal is in `_format`.
"""

from __future__ import annotations

import os
import sys

import typer

from duragent.cli import (
    _approvals as approvals,
    _bulk as bulk,
    _demo as demo,
    _fleet as fleet,
    _run as run,
    _serve as serve,
    _sessions as sessions,
    _steering as steering,
    _store as store,
    _tasks as tasks,
    _views as views,
    _worker as worker,
)
from duragent.cli._common import DEBUG_ENV, Commands, debugging, fail, quiet_logs
from duragent.errors import DuragentError

__all__ = ["app", "main"]


app = typer.Typer(cls=Commands, no_args_is_help=True, help="Durable AI agent tasks.")


def _print_version(asked: bool) -> None:
    if asked:
        from duragent import __version__

        typer.echo(__version__)
        raise typer.Exit()


@app.callback()
def options(
    version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_print_version, help="Print the version."
    ),
    debug: bool = typer.Option(
        False,
        "--debug",
        help=f"Tracebacks and DEBUG logs instead of one-line errors (also {DEBUG_ENV}=1).",
    ),
) -> None:
    """Durable AI agent tasks."""
    if debug:
        os.environ[DEBUG_ENV] = "1"  # read by the commands, and by child processes they start
        quiet_logs()


@app.command()
def version() -> None:
    """Print the version."""
    _print_version(True)


# In the order `duragent --help` lists them.
for _module in (
    demo,
    tasks,
    views,
    sessions,
    worker,
    serve,
    run,
    store,
    steering,
    approvals,
    fleet,
    bulk,
):
    app.add_typer(_module.app)


def main() -> None:
    quiet_logs()
    try:
        app()
    except DuragentError as exc:  # from a command without its own handler
        if debugging():
            raise
        try:
            fail(exc)
        except typer.Exit as done:
            sys.exit(done.exit_code)
