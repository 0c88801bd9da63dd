"""The SQL stores' one JSON encoder writes what `json.dumps` wrote, and every
value it writes reads back equal."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from duragent.store._codec import dumps

text = st.text(st.characters(exclude_categories=["Cs"]), max_size=20)  # no lone surrogates
scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | text
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=20,
)
with_floats = st.recursive(
    scalars | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=20,
)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(value=json_values)
def test_text_is_json_dumps_compact(value: Any) -> None:
    assert dumps(value) == json.dumps(value, separators=(",", ":"), ensure_ascii=False)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(value=with_floats)
def test_every_value_reads_back_equal(value: Any) -> None:
    assert json.loads(dumps(value)) == value


def test_nan_and_infinities_are_written_as_python_writes_them() -> None:
    text_ = dumps({"x": [math.nan, math.inf, -math.inf]})
    assert text_ == '{"x":[NaN,Infinity,-Infinity]}'
