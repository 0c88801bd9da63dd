"""An agent's version when it declares none: a fingerprint of what makes it answer
(runtime/_versions.py says what versions do)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from typing import Any

from duragent.errors import InvalidOption
from duragent.runtime._tools import Tool

VERSION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$"
_VERSION = re.compile(VERSION_PATTERN)


def check_version(version: object) -> None:
    if not isinstance(version, str) or not _VERSION.match(version):
        raise InvalidOption(
            "an agent version is 1-64 letters, digits, '.', '_', '+' or '-' "
            f"(starting with a letter or digit), not {version!r}"
        )


def wrapped_version(description: Any) -> str:
    """The version of a framework's agent that a wrapper (duragent.pydantic_ai,
    duragent.openai_agents) runs inside one tool, when none is declared: 12 hex
    digits of the SHA-256 of `description` (its instructions, tools' schemas,
    output type and model, as the wrapper reads them). The wrapper's own
    definition is the same for any agent it wraps, so its fingerprint alone would
    never change. Functions and types count by their names, never by a repr that
    holds a memory address."""
    raw = json.dumps(description, sort_keys=True, separators=(",", ":"), default=_stable)
    return hashlib.sha256(raw.encode()).hexdigest()[:12]


def _stable(obj: Any) -> Any:
    schema = getattr(obj, "model_json_schema", None)
    if isinstance(obj, type) and callable(schema):
        return schema()  # a pydantic model: its fields, not only its name
    if isinstance(obj, type) or callable(obj):
        return (
            f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', type(obj).__name__)}"
        )
    return type(obj).__qualname__


def with_handoffs(own: str, graph: list[list[Any]]) -> str:
    """The fingerprint of an agent that hands off: its own (`fingerprint`) and, for
    every agent its handoffs reach (itself included), [name, version or own
    fingerprint, names of its targets, handoff description], sorted: a task
    handed off runs its later rounds on those definitions. `own` when it hands
    off to no one, so such an agent's version is its own fingerprint."""
    if not graph:
        return own
    raw = json.dumps([own, sorted(graph)], separators=(",", ":"))
    return hashlib.sha256(raw.encode()).hexdigest()[:12]


def fingerprint(
    instructions: str, tools: Iterable[Tool], output: dict[str, Any] | None, model: str
) -> str:
    """12 hex digits of the SHA-256 of the instructions, the tools' schemas (name,
    description, parameters), the output schema and the model's name: what decides
    how the agent answers. Timing, limits and retries leave it as it is."""
    what: dict[str, Any] = {
        "instructions": instructions,
        "tools": sorted([t.name, t.description, t.parameters] for t in tools),
        "output": output,
        "model": model,
    }
    raw = json.dumps(what, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(raw.encode()).hexdigest()[:12]
