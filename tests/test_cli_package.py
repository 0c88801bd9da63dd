"""The `duragent` command is assembled from its modules explicitly."""

from __future__ import annotations

import importlib
import pkgutil

import duragent.cli
from duragent.cli import app


def test_every_command_module_is_registered() -> None:
    registered = {id(info.typer_instance) for info in app.registered_groups}
    modules = [
        m.name for m in pkgutil.iter_modules(duragent.cli.__path__) if not m.name.startswith("_")
    ]
    assert modules
    for name in modules:
        module = importlib.import_module(f"duragent.cli.{name}")
        assert id(module.app) in registered, f"duragent.cli.{name}.app is not added to the CLI"
