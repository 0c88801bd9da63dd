"""Values no store could give back are refused by the Python API before anything is
stored, on every store (issue 12: a deeply nested input made a task nobody could read)."""

from __future__ import annotations

from typing import Any

import pytest

from duragent import Agent, BuiltinTools, Runtime, ScriptedModel, UsageError
from duragent._storable import MAX_JSON_DEPTH, check_storable
from duragent.errors import InvalidValue
from duragent.store import Store


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"k": value}
    return value


BAD_VALUES = {
    "too deep": nested(MAX_JSON_DEPTH + 1),
    "far too deep": nested(5000),
    "nan": [1.0, float("nan")],
    "infinity": {"x": float("inf")},
    "nul": "a\x00b",
    "lone surrogate": ["ok", "\ud800"],
    "surrogate key": {"\udc00": 1},
}


@pytest.mark.parametrize("name", sorted(BAD_VALUES))
async def test_submit_refuses_unstorable_input_and_context(store: Store, name: str) -> None:
    agent = Agent(name="a", model=ScriptedModel(["done"]), builtin_tools=BuiltinTools(plan=False))
    async with Runtime(store, [agent], run_worker=False) as rt:
        with pytest.raises(InvalidValue) as info:
            await rt.submit("a", BAD_VALUES[name], session_id="s")
        assert str(info.value).startswith("input")
        assert isinstance(info.value, UsageError)
        with pytest.raises(InvalidValue, match=r"^context"):
            await rt.submit("a", "hi", context={"v": BAD_VALUES[name]}, session_id="s")
        assert (await rt.list_tasks(session_id="s")).tasks == []
        # The deepest value allowed is stored and reads back.
        ok = nested(MAX_JSON_DEPTH - 1)
        sub = await rt.submit("a", ok, session_id="s")
        assert (await rt.get(sub.task_id)).input == ok


def test_the_first_problem_is_named_with_its_path() -> None:
    with pytest.raises(InvalidValue) as info:
        check_storable({"a": [1, {"b": "x\x00"}]}, "input")
    assert str(info.value).startswith("input['a'][1]['b']: contains a NUL")
    assert info.value.path == ("input", "a", 1, "b")
    check_storable({"a": [1.5, None, True, "text ✓ 😀"]}, "input")
