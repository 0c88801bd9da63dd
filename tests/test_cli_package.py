"""The `duragent` command is assembled from its modules explicitly."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import duragent.cli
from duragent.cli import app


def test_every_command_module_is_registered() -> None:
    """A module of the cli package that makes a Typer app is a command group, and
    the one `duragent` app adds it (the helpers, such as the transcript, make none)."""
    registered = {id(info.typer_instance) for info in app.registered_groups}
    modules = [
        m.name
        for m in pkgutil.iter_modules(duragent.cli.__path__)
        if "app = typer.Typer(" in Path(duragent.cli.__path__[0], f"{m.name}.py").read_text()
    ]
    assert len(modules) >= 10
    for name in modules:
        module = importlib.import_module(f"duragent.cli.{name}")
        assert id(module.app) in registered, f"duragent.cli.{name}.app is not added to the CLI"
