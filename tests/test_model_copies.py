"""The commit path's copies (`updated`, `stored_entry`) give what pydantic's
`model_copy` and `model_construct` give: the same fields, the same fields set,
the same JSON, and the original left as it was."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, PrivateAttr

from duragent.types import (
    Entry,
    EntryKind,
    Lease,
    Task,
    TaskStatus,
    Usage,
    stored_entry,
    updated,
)

NOW = datetime(2026, 12, 2, 1, 30, tzinfo=UTC)

task_updates = st.fixed_dictionaries(
    {},
    optional={
        "status": st.sampled_from(list(TaskStatus)),
        "iterations": st.integers(0, 10_000),
        "round_seq": st.integers(0, 10_000),
        "last_seq": st.integers(0, 10_000),
        "version": st.integers(0, 10_000),
        "updated_at": st.integers(0, 10**6).map(lambda s: NOW + timedelta(seconds=s)),
        "context": st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
        "usage": st.builds(
            Usage, input_tokens=st.integers(0, 99), output_tokens=st.integers(0, 99)
        ),
        "lease": st.builds(Lease, owner=st.none() | st.text(max_size=5), epoch=st.integers(0, 9)),
        "wake_at": st.none() | st.just(NOW),
    },
)


def _state(model: BaseModel) -> tuple[Any, ...]:
    return (dict(model.__dict__), set(model.__pydantic_fields_set__), model.model_dump_json())


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(update=task_updates)
def test_updated_is_model_copy(update: dict[str, Any]) -> None:
    task = Task(agent="a", input={"q": 1}, context={"k": [1, 2]})
    before = _state(task)
    mine, theirs = updated(task, update), task.model_copy(update=update)
    assert type(mine) is Task
    assert _state(mine) == _state(theirs)
    assert mine == theirs
    assert _state(task) == before  # the original is untouched
    assert mine.__dict__ is not task.__dict__  # nor shares what a later copy changes
    assert mine.__pydantic_fields_set__ is not task.__pydantic_fields_set__


def test_updated_takes_pydantics_path_for_private_attributes() -> None:
    class WithPrivate(BaseModel):
        x: int
        _note: str = PrivateAttr(default="kept")

    model = WithPrivate(x=1)
    copy = updated(model, {"x": 2})
    assert copy.x == 2 and copy._note == "kept" and model.x == 1


def test_stored_entry_is_model_construct() -> None:
    args: dict[str, Any] = {
        "task_id": "t_1",
        "seq": 7,
        "kind": EntryKind.TOOL_RESULT,
        "round": 3,
        "payload": {"role": "tool", "tool_call_id": "c", "content": "ok"},
        "created_at": NOW,
    }
    mine = stored_entry(*args.values())
    theirs = Entry.model_construct(**args)
    assert _state(mine) == _state(theirs)
    assert mine == theirs
    assert Entry.model_validate_json(mine.model_dump_json()) == theirs


def test_a_copy_shares_the_fields_set_only_when_it_holds_every_field() -> None:
    partial = Task(agent="a")
    assert updated(partial, {"iterations": 1}).__pydantic_fields_set__ is not (
        partial.__pydantic_fields_set__
    )
    full = Task.model_validate_json(partial.model_dump_json())  # as a store reads a row
    every = set(Task.model_fields)
    assert full.__pydantic_fields_set__ == every
    copy = updated(full, {"iterations": 3})
    assert copy.__pydantic_fields_set__ is full.__pydantic_fields_set__
    copy.output = "x"  # pydantic adds an assigned field to the set: it is there already
    assert full.__pydantic_fields_set__ == every
    assert full.output is None and full.iterations == 0
