"""The front door: `from duragent import ...` exposes exactly `__all__`."""

from __future__ import annotations

import types

import duragent


def test_all_matches_the_public_names() -> None:
    public = {
        name
        for name, value in vars(duragent).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType)
        and name != "annotations"
    }
    assert public == set(duragent.__all__) - {"__version__"}
    for name in duragent.__all__:
        assert getattr(duragent, name) is not None


def test_the_design_examples_names_are_exported() -> None:
    for name in (
        "Agent",
        "Runtime",
        "ScriptedModel",
        "ToolCall",
        "ToolContext",
        "tool",
        "open_store",
        "Task",
        "TaskStatus",
        "Worker",
        "Submission",
    ):
        assert name in duragent.__all__
