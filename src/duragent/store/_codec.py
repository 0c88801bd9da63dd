"""How the stores write values down and read them back: entry keys, payloads
without their defaults, entry kinds a later version wrote, compact JSON,
timestamps, and the opaque cursor of a task list."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pydantic_core

from duragent.errors import IncompatibleEntry, InvalidOption
from duragent.types import EntryKind, Task

# The SQL stores key an entry by one integer, its `eid`: its task's number in
# the high bits, its seq in the low SEQ_BITS (so a task holds at most MAX_SEQ).
SEQ_BITS = 32
MAX_SEQ = (1 << SEQ_BITS) - 1


def entry_key(task_num: int, seq: int) -> int:
    """An entry's `eid`: its task's number and its seq in one integer."""
    return (task_num << SEQ_BITS) | seq


def entry_range(task_id: str, first: int = 0, last: int = MAX_SEQ) -> tuple[str, int, str, int]:
    """The parameters of a store's ENTRY_RANGE: the entries of `task_id` with
    first <= seq <= last (a task's number is looked up by its id in the query)."""
    return (task_id, first, task_id, last)


# --- payloads on disk ----------------------------------------------------------
#
# Two fields are left out of the stored payload when they hold their default: an
# intent's `replay` ("never") and a result's `outcome` ("ok"), two of a round's
# three rows at every round. Reading an entry gives them back, so above the SQL
# stores a payload is exactly as it was written, and a row written before, which
# has them, reads the same. Only `Store.entries` reads these kinds' payloads;
# the model view drops a result's `outcome` anyway.
STORED_DEFAULTS: dict[EntryKind, tuple[str, str]] = {
    EntryKind.TOOL_INTENT: ("replay", "never"),
    EntryKind.TOOL_RESULT: ("outcome", "ok"),
}


class UnknownKind(str):
    """An entry kind a later version wrote, kept as it is so a file store still
    loads (and rewrites) it; reading that task's entries raises IncompatibleEntry."""

    __slots__ = ()

    @property
    def value(self) -> str:
        return str(self)


def kind_as_stored(raw: str) -> EntryKind | UnknownKind:
    """A stored kind: known, or kept as written (see UnknownKind)."""
    try:
        return EntryKind(raw)
    except ValueError:
        return UnknownKind(raw)


def entry_kind(task_id: str, seq: int, raw: str) -> EntryKind:
    """The kind of entry `seq` of a task as read back, or IncompatibleEntry naming it."""
    try:
        return EntryKind(raw)
    except ValueError:
        raise IncompatibleEntry(task_id, seq, str(raw)) from None


def packed(kind: EntryKind, payload: dict[str, Any]) -> dict[str, Any]:
    """The payload as stored: without the field its kind leaves out at its default."""
    default = STORED_DEFAULTS.get(kind)
    if default is None or payload.get(default[0], default) != default[1]:
        return payload
    key = default[0]
    return {k: v for k, v in payload.items() if k != key}


def unpacked(kind: EntryKind, payload: dict[str, Any]) -> dict[str, Any]:
    """A stored payload (a dict of its own, just parsed) as it was written."""
    default = STORED_DEFAULTS.get(kind)
    if default is not None:
        payload.setdefault(*default)
    return payload


def dumps(value: Any) -> str:
    """Compact JSON text: the one encoder the SQL stores write with.

    pydantic's encoder, in one call of compiled code: `json.dumps` builds an
    encoder object per call and costs about five times as much on a message.
    For JSON values its text is what `json.dumps(value, separators=(",", ":"),
    ensure_ascii=False)` writes but for the spelling of some floats (`1e-7`
    for `1e-07`); NaN and infinities are written as Python writes them. What
    reaches a store was made JSON before (API models, `storable` values); of
    the rest, pydantic writes sets, bytes and datetimes as arrays and text
    where `json.dumps` refused them, and refuses other objects as it did.
    """
    return pydantic_core.to_json(value, inf_nan_mode="constants").decode()


def to_ts(dt: datetime | None) -> float | None:
    return None if dt is None else dt.timestamp()


def from_ts(ts: float | None) -> datetime | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC)


def ts_to_dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


def encode_cursor(task: Task) -> str:
    return f"{task.created_at.timestamp():.6f}|{task.id}"


def decode_cursor(cursor: str) -> tuple[float, str]:
    try:
        ts, task_id = cursor.split("|", 1)
        return float(ts), task_id
    except ValueError as exc:
        raise InvalidOption(f"invalid cursor {cursor!r}") from exc
