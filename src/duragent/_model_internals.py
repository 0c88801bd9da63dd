"""The one module that reaches into pydantic models' internals, and why.

The commit path copies its task several times a round (each patch, the seq it
reached, the runner's prediction) and builds an Entry per appended entry.
`model_copy` and `model_construct` are general (extra fields, private
attributes, defaults, a fields set per instance) and cost two to three times
what the few dict operations here do (tests/test_model_copies.py checks that
both give the same models; bench/RESULTS.md has the commit path's timings).

What this relies on, for a model with neither extra fields nor private
attributes (`updated` takes pydantic's own path for any other):

- its field values are its instance `__dict__`, keyed by field name, and
  nothing else holds them;
- `__pydantic_fields_set__` is the set of field names given (explicitly set),
  read only by `model_dump(exclude_unset=True)`, `model_fields_set` and
  copies; `__pydantic_extra__` and `__pydantic_private__` are None;
- an instance made by `object.__new__` and those four attributes set is a
  complete model (what `model_construct` does, without defaults).

tests/test_model_copies.py asserts each against pydantic's own methods; the
pydantic versions it passed on bound the dependency in pyproject.toml.

A copy shares its original's fields set when that set holds every field, so
nothing can be added to it: a set per copy is one more object for the garbage
collector to trace, and with many tasks in flight most copies live long enough
to be traced. Rows a store wrote or read have every field given (see
`given_in_full`).

One read stays outside: `llm.messages.in_call_order` reads `m.__dict__`
inline, as a call per message would cost a resume's history read a quarter
of its time.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel

_M = TypeVar("_M", bound=BaseModel)
_new = object.__new__
_setattr = object.__setattr__
_FIELD_COUNTS: dict[type, int] = {}


def _field_count(cls: type[BaseModel]) -> int:
    count = _FIELD_COUNTS.get(cls)
    if count is None:
        count = _FIELD_COUNTS[cls] = len(cls.model_fields)
    return count


def constructed(cls: type[_M], values: dict[str, Any], fields_set: set[str]) -> _M:
    """`cls.model_construct(**values)` when `values` holds every field: an instance
    holding `values` (not copied), `fields_set` as its fields set (shared: the
    caller passes a set no one adds to, or one of the instance's own)."""
    model = _new(cls)
    _setattr(model, "__dict__", values)
    _setattr(model, "__pydantic_fields_set__", fields_set)
    _setattr(model, "__pydantic_extra__", None)
    _setattr(model, "__pydantic_private__", None)
    return model


def updated(model: _M, update: dict[str, Any]) -> _M:
    """`model.model_copy(update=update)`: a shallow copy, values taken as given."""
    if model.__pydantic_extra__ is not None or model.__pydantic_private__ is not None:
        return model.model_copy(update=update)
    fields_set = model.__pydantic_fields_set__
    if len(fields_set) != _field_count(type(model)):
        fields_set = fields_set | update.keys()
    return constructed(type(model), {**model.__dict__, **update}, fields_set)


def given_in_full(model: _M) -> _M:
    """`model`, its fields set holding every field, as a row read back from JSON has."""
    _setattr(model, "__pydantic_fields_set__", set(type(model).model_fields))
    return model


def set_field(model: BaseModel, name: str, value: Any) -> None:
    """`model.<name> = value` without validation, for a model no one else holds yet
    (a copy this transaction or runner made): pydantic's `__setattr__` looks the
    name up, checks it is not frozen and validates; the caller's value is
    already of the field's type."""
    model.__dict__[name] = value
    model.__pydantic_fields_set__.add(name)  # a no-op on a shared set, which is full


def validated_set(model: BaseModel, name: str, value: Any) -> None:
    """`model.<name> = value` as a model with `validate_assignment` sets it: `value`
    validated as field `name`'s type (a "waiting" given for a TaskStatus is stored
    as TaskStatus.WAITING)."""
    type(model).__pydantic_validator__.validate_assignment(model, name, value)


def hidden_value(model: BaseModel, key: str) -> Any:
    """What `with_hidden_value` attached to `model` under `key`, or None."""
    return model.__dict__.get(key)


def with_hidden_value(model: _M, key: str, value: Any) -> _M:
    """A copy of `model` carrying `value` under `key`, not a field: no dump writes
    it and no validation sees it, yet copies (`updated`, `model_copy`) carry it.
    `key` must be no field's name (a leading underscore keeps it apart)."""
    copy = updated(model, {})
    copy.__dict__[key] = value
    return copy
