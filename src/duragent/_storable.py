"""What a JSON value must be for every store to keep it and give it back.

A task's input and context are client data that every store writes as JSON and
every reader parses again. Values that one layer accepts and another cannot
read are refused before anything is stored:

- nesting deeper than `MAX_JSON_DEPTH` levels (encoders and parsers recurse;
  past a few hundred levels a stored task could be written but not read back);
- `NaN` and `Infinity` (not JSON; PostgreSQL refuses them, browsers show `null`);
- NUL characters (PostgreSQL text and jsonb cannot hold them);
- lone UTF-16 surrogates (`"\\ud800"`: no UTF-8 encoding exists for them).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from typing import Any

from duragent.errors import InvalidValue

MAX_JSON_DEPTH = 64
"""Levels of arrays and objects a task's input or context may nest (docs/workers-server-cli.md)."""

_UNSTORABLE_CHARS = re.compile("[\x00\ud800-\udfff]")

Path = tuple[str | int, ...]


def value_problems(value: Any, max_depth: int = MAX_JSON_DEPTH) -> Iterator[tuple[Path, str]]:
    """(where, what is wrong) for every part of `value` no store can keep.

    Iterative, so a value nested thousands of levels deep is reported, not a RecursionError."""
    stack: list[tuple[Any, Path, int]] = [(value, (), 0)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, str):
            if (msg := _string_problem(item)) is not None:
                yield path, msg
        elif isinstance(item, bool) or item is None or isinstance(item, int):
            continue
        elif isinstance(item, float):
            if not math.isfinite(item):
                yield (
                    path,
                    "NaN and Infinity are not JSON numbers; send a finite number or a string",
                )
        elif isinstance(item, dict | list | tuple):
            if depth >= max_depth:
                yield path, f"nested more than {max_depth} levels deep (the most this server keeps)"
                continue
            if isinstance(item, dict):
                for key, child in item.items():
                    if isinstance(key, str) and (msg := _string_problem(key)) is not None:
                        yield (*path, key), f"key {msg}"
                    stack.append((child, (*path, str(key)), depth + 1))
            else:
                stack.extend((child, (*path, i), depth + 1) for i, child in enumerate(item))


def _string_problem(text: str) -> str | None:
    found = _UNSTORABLE_CHARS.search(text)
    if found is None:
        return None
    if found.group() == "\x00":
        return "contains a NUL character (\\u0000), which stores cannot keep"
    return (
        "contains a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape), which is not text"
    )


def check_storable(value: Any, what: str, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Raise InvalidValue naming the first part of `value` no store can keep."""
    for path, msg in value_problems(value, max_depth):
        where = what + "".join(f"[{p!r}]" for p in path)
        raise InvalidValue(f"{where}: {msg}", path=(what, *path))
