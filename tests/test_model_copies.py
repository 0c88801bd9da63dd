"""duragent._model_internals gives what pydantic's own methods give: its copies
(`updated`, `constructed`, `stored_entry`) what `model_copy` and `model_construct`
give (the same fields, the same fields set, the same JSON, the original left as
it was), its setters what assignment gives. These are the invariants it relies
on; the pydantic versions this file passed on bound pydantic in pyproject.toml."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st
from pydantic import BaseModel, ConfigDict, PrivateAttr, ValidationError

from duragent._model_internals import (
    constructed,
    given_in_full,
    hidden_value,
    set_field,
    updated,
    validated_set,
    with_hidden_value,
)
from duragent.types import (
    AssistantMessage,
    Entry,
    EntryKind,
    Lease,
    Task,
    TaskStatus,
    Usage,
    UserMessage,
    stored_entry,
    with_partial_output,
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


def test_constructed_is_model_construct_of_every_field() -> None:
    values = dict(Task(agent="a", iterations=4).__dict__)  # every field
    theirs = Task.model_construct(**values)
    fields = set(Task.model_fields)
    mine = constructed(Task, values, fields)
    assert _state(mine) == _state(theirs)
    assert mine == theirs
    assert mine.__pydantic_fields_set__ is fields  # shared, as the caller asked
    assert Task.model_validate_json(mine.model_dump_json()) == mine


def test_given_in_full_is_a_row_read_back() -> None:
    task = Task(agent="a")
    read_back = Task.model_validate_json(task.model_dump_json())
    assert given_in_full(task) is task
    assert _state(task) == _state(read_back)


@settings(max_examples=100, deadline=None)
@given(update=task_updates)
def test_set_field_is_assignment(update: dict[str, Any]) -> None:
    fresh, full = Task(agent="a"), given_in_full(Task(agent="a"))
    for task in (fresh, full):
        before = _state(task)
        mine, theirs = updated(task, {}), task.model_copy()
        for name, value in update.items():
            set_field(mine, name, value)
            setattr(theirs, name, value)
        assert _state(mine) == _state(theirs)
        assert _state(task) == before  # a copy's own fields set, or a full one shared


def test_set_field_leaves_a_shared_full_fields_set_as_it_was() -> None:
    entry = stored_entry("t", 1, EntryKind.STATUS, 0, {}, NOW)
    shared = entry.__pydantic_fields_set__
    set_field(entry, "created_at", NOW + timedelta(seconds=1))
    assert entry.__pydantic_fields_set__ is shared and shared == set(Entry.model_fields)
    assert entry.created_at == NOW + timedelta(seconds=1)


class _Validated(BaseModel):
    model_config = ConfigDict(validate_assignment=True)
    status: TaskStatus = TaskStatus.PENDING
    usage: Usage = Usage()


def test_validated_set_is_validating_assignment() -> None:
    task = Task(agent="a")
    validated_set(task, "status", "waiting")
    validated_set(task, "usage", {"input_tokens": 3})
    theirs = _Validated()
    theirs.status = "waiting"  # type: ignore[assignment]
    theirs.usage = {"input_tokens": 3}  # type: ignore[assignment]
    assert (task.status, task.usage) == (theirs.status, theirs.usage)
    assert type(task.status) is TaskStatus and type(task.usage) is Usage
    assert {"status", "usage"} <= task.model_fields_set
    with pytest.raises(ValidationError):
        validated_set(task, "iterations", "many")


def test_a_hidden_value_is_carried_by_copies_and_nowhere_else() -> None:
    task = Task(agent="a")
    shown = with_hidden_value(task, "_note", "so far")
    assert hidden_value(shown, "_note") == "so far" and hidden_value(task, "_note") is None
    assert shown == task and shown.model_dump() == task.model_dump()
    assert shown.model_dump_json() == task.model_dump_json()
    assert _state(shown)[1] == _state(task)[1]
    assert hidden_value(updated(shown, {"iterations": 1}), "_note") == "so far"
    assert hidden_value(shown.model_copy(), "_note") == "so far"
    assert with_partial_output(task, "abc").partial_output == "abc"
    assert with_partial_output(task, None).partial_output is None
    assert task.partial_output is None


def test_a_models_fields_are_its_instance_dict() -> None:
    # llm.messages.in_call_order reads a message's tool_calls from its __dict__.
    assistant, user = AssistantMessage(content="x"), UserMessage(content="y")
    assert assistant.__dict__ == {"role": "assistant", "content": "x", "tool_calls": None}
    assert "tool_calls" not in user.__dict__
    assert user.__pydantic_extra__ is None and user.__pydantic_private__ is None
