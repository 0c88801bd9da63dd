"""The `duragent` command.

Each command group lives in its own module (`duragent/cli_*.py`) and registers
itself on `app`; this module only assembles them.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

import typer

app = typer.Typer(no_args_is_help=True, help="Durable AI agent tasks.")

COMMAND_MODULES = ("cli_tasks", "cli_serve", "cli_worker", "cli_run", "cli_store")


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
) -> None:
    """Run a demo agent, kill it mid-round with SIGKILL, and finish the task after restart."""
    from duragent.demo import run_demo

    raise typer.Exit(run_demo(store, crash=crash, keep=keep))


def _register() -> None:
    for name in COMMAND_MODULES:
        if importlib.util.find_spec(f"duragent.{name}") is not None:
            importlib.import_module(f"duragent.{name}")


def main() -> None:
    _register()
    app()
