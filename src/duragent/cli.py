"""The `duragent` command."""

from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True, help="Durable AI agent tasks.")


@app.command()
def version() -> None:
    """Print the version."""
    from duragent import __version__

    typer.echo(__version__)


def main() -> None:
    app()
