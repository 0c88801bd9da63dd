"""The front door: `from duragent import ...` exposes exactly `__all__`."""

from __future__ import annotations

import importlib
import inspect
import pickle
import pkgutil
import types
from typing import Any

import pytest

import duragent
import duragent.errors


def test_all_matches_the_public_names() -> None:
    public = {
        name
        for name, value in vars(duragent).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType)
        and name != "annotations"
    }
    assert public == set(duragent.__all__) - {"__version__"}
    assert len(duragent.__all__) == len(set(duragent.__all__)), "a name is listed twice"


def test_star_import_gives_every_name_in_all_and_each_is_duragents_own() -> None:
    namespace: dict[str, Any] = {}
    exec("from duragent import *", namespace)  # raises if a listed name does not resolve
    namespace.pop("__builtins__")
    assert set(namespace) == set(duragent.__all__)
    for name, value in namespace.items():
        if name == "__version__":
            continue
        # Defined in duragent, not a lower library's class passed through the front door.
        home = getattr(value, "__module__", None) or ""
        assert home.split(".")[0] == "duragent", f"duragent.{name} comes from {home!r}"


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


def _error_classes() -> list[type[BaseException]]:
    return [
        value
        for value in vars(duragent).values()
        if isinstance(value, type) and issubclass(value, BaseException)
    ]


# One instance of each exported error, built the way duragent raises it.
_EXAMPLES: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {
    "InvalidTransition": (("completed", "running", "it ended"), {}),
    "TaskNotFound": (("t-1",), {}),
    "ScheduleNotFound": (("nightly",), {}),
    "QueueNotFound": (("emails",), {}),
    "ScheduleUnreadable": (("alice/nightly", "every: below 1 s"), {}),
    "SessionNotFound": (("s1",), {}),
    "IncompatibleEntry": (("t-1", 7, "hologram"), {}),
    "UnknownAgent": (("writer", ["reader"]), {}),
    "InvalidValue": (("NaN is not JSON",), {"path": ("input", 0)}),
    "DuplicateRequest": (("r-1", "t-1"), {}),
    "TaskBusy": (("t-1", "running"), {}),
    "TaskFailed": (("t-1", "failed", "output guardrail tripped"), {}),
    "WaitTimedOut": (("t-1", "running", 5.0, "it to end"), {}),
    "ControlPending": (("t-1", "pause", 60.0, "host:1, lease ends in 20 s"), {}),
    "MissingExtra": (("the postgresql:// store", "postgres"), {}),
    "MissingCredential": (("OpenAI", "OPENAI_API_KEY"), {}),
    "StaleLease": (("t-1", 3, 4), {}),
    "LostCommits": (("t-1", 3, 7), {}),
    "StoreVersionError": (("the store", 9, 3), {}),
    "StoreFull": (("/tmp/x.db", 0, "ENOSPC"), {}),
    "StoreNotFound": (("/no/such/dir", "create it first"), {}),
    "ModelError": (("provider said no",), {"retry_after": 2.5}),
    "RetryableModelError": (("overloaded",), {"retry_after": 1.0}),
    "MalformedModelOutput": (("garbled event",), {}),
    "StepFailed": (("charge", "card declined"), {}),
}


def test_every_error_is_a_duragent_error_exported_from_the_front_door() -> None:
    names = {cls.__name__ for cls in _error_classes()}
    assert names == {
        name
        for name in vars(duragent.errors)
        if isinstance(getattr(duragent.errors, name), type)
        and issubclass(getattr(duragent.errors, name), duragent.DuragentError)
    }
    for cls in _error_classes():
        assert issubclass(cls, duragent.DuragentError), cls


@pytest.mark.slow  # imports every module, the optional extras too
def test_no_duragent_error_is_left_unexported() -> None:
    # Every error a user can catch is importable from the front door, or from
    # its optional extra's module (duragent.mcp); the server's own are internal.
    for info in pkgutil.walk_packages(duragent.__path__, "duragent."):
        if info.name.startswith("duragent.server") or info.name == "duragent.__main__":
            continue
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # an optional extra that is not installed
            continue
        for name, value in vars(module).items():
            if (
                isinstance(value, type)
                and issubclass(value, duragent.DuragentError)
                and value.__module__ == info.name
                and not name.startswith("_")
            ):
                where = set(duragent.__all__) | set(getattr(module, "__all__", ()))
                assert name in where, f"{info.name}.{name} is not exported"


def test_misuse_errors_are_still_the_builtin_they_replace() -> None:
    assert issubclass(duragent.InvalidOption, ValueError)
    assert issubclass(duragent.InvalidStoreURL, ValueError)
    assert issubclass(duragent.InvalidType, TypeError)
    for cls in (duragent.InvalidOption, duragent.InvalidStoreURL, duragent.InvalidType):
        assert issubclass(cls, duragent.UsageError)


@pytest.mark.parametrize("cls", _error_classes(), ids=lambda cls: cls.__name__)
def test_every_exported_error_pickles_with_its_message_and_attributes(
    cls: type[BaseException],
) -> None:
    args, kwargs = _EXAMPLES.get(cls.__name__, (("something went wrong",), {}))
    error = cls(*args, **kwargs)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is cls
    assert str(copy) == str(error)
    assert copy.args == error.args
    assert vars(copy) == vars(error)


def test_every_miss_is_a_not_found_and_only_a_task_miss_a_task_not_found() -> None:
    misses = (
        duragent.TaskNotFound("t-1"),
        duragent.QueueNotFound("emails"),
        duragent.ScheduleNotFound("nightly"),
        duragent.SessionNotFound("s1"),
    )
    for miss in misses:
        assert isinstance(miss, duragent.NotFound) and isinstance(miss, duragent.UsageError)
    assert [isinstance(m, duragent.TaskNotFound) for m in misses] == [True, False, False, False]
    assert issubclass(duragent.ToolArgumentError, ValueError)


def test_open_store_names_a_bad_url_as_a_duragent_error() -> None:
    for url in ("nowhere", "ftp://x", "sqlite:///"):
        with pytest.raises(duragent.InvalidStoreURL):
            duragent.open_store(url)


def test_misuses_raise_duragent_errors_that_say_what_is_wrong() -> None:
    from duragent.runtime._schedules import new_schedule

    def spread(*args: int) -> int:
        """Takes anything."""
        return len(args)

    with pytest.raises(duragent.InvalidOption, match="invalid queue: rate: rate is"):
        duragent.Queue("q", rate=(0, 1.0))
    with pytest.raises(duragent.InvalidOption, match="exactly one of cron= or every="):
        new_schedule("nightly", "chat", "x")
    with pytest.raises(duragent.InvalidType, match=r"\*args/\*\*kwargs"):
        duragent.tool(spread)


def test_no_internal_class_is_exported_from_a_public_module() -> None:
    import duragent.runtime
    import duragent.store

    internals = {"TaskRunner", "Control"}
    for module in (duragent, duragent.runtime, duragent.store):
        assert not internals & set(module.__all__), module.__name__
        for name in module.__all__:
            value = getattr(module, name)
            home = getattr(value, "__module__", "") or ""
            assert "engine" not in home.split("."), f"{module.__name__}.{name} is from {home}"


def test_every_public_name_has_a_docstring() -> None:
    for name in duragent.__all__:
        value = getattr(duragent, name)
        if isinstance(value, type) or inspect.isfunction(value):
            assert inspect.getdoc(value), f"duragent.{name} has no docstring"


def test_every_store_protocol_method_has_a_docstring() -> None:
    from duragent.store._protocol import Store

    methods = [
        name for name, value in vars(Store).items() if not name.startswith("_") and callable(value)
    ]
    assert methods
    missing = [name for name in methods if not inspect.getdoc(getattr(Store, name))]
    assert not missing, f"Store methods without a docstring: {missing}"


def test_store_classes_and_model_adapters_are_reached_through_their_packages() -> None:
    """The modules that hold them are internal (a leading underscore); the packages
    name them, imported on first use, and a name they do not have is an AttributeError."""
    import duragent.llm
    import duragent.store

    for name in ("MemoryStore", "SQLiteStore", "JSONLStore", "PostgresStore"):
        assert getattr(duragent.store, name).__name__ == name
    for name in ("OpenAIChat", "AnthropicChat"):
        assert getattr(duragent.llm, name).__name__ == name
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        duragent.store.Nope  # noqa: B018
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        duragent.llm.Nope  # noqa: B018
