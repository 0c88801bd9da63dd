"""The model's view of a task, decided in one place, and the UI's view."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import pydantic_core

from duragent._heap import collector_paused
from duragent._payloads import is_marker, is_voided, voided_ranges
from duragent.errors import StoreCorrupt
from duragent.llm._messages import in_call_order
from duragent.types import API_KINDS, API_MESSAGES, UI_MESSAGE, ApiMessage, EntryKind, UIMessage

# The kinds a model's view is built from: API messages, rollback markers and
# compactions. The markers (not messages) are the last two.
VIEW_KINDS = tuple(k.value for k in (*API_KINDS, EntryKind.ROLLBACK, EntryKind.COMPACTION))
MARKER_KINDS = (EntryKind.ROLLBACK.value, EntryKind.COMPACTION.value)


def build_model_view(rows: Iterable[tuple[int, str, str]]) -> list[ApiMessage]:
    """API messages in seq order, skipping every range voided by a rollback marker;
    a round's tool results in the order of its calls (`in_call_order`). The last
    compaction's head stands for every entry up to its `upto`.

    `rows` are (seq, kind, payload JSON text) for API kinds and rollback markers.
    Payload texts are joined and validated in one call: a 10,000-message history
    parses in milliseconds.
    """
    return parse_messages(view_text(rows))


def view_text(rows: Iterable[tuple[int, str, str]]) -> str:
    """The payloads the model sees as one JSON array text (see build_model_view)."""
    rows = list(rows)
    markers = [(s, json.loads(p)) for s, k, p in rows if k == EntryKind.ROLLBACK]
    voided = voided_ranges(m for _s, m in markers)
    marker = None
    for s, k, p in reversed(rows):
        if k == EntryKind.COMPACTION:
            marker = json.loads(p)
            if not compaction_voided(s, marker["upto"], markers):
                break
            marker = None
    parts, upto = [], 0
    if marker is not None:
        upto = marker["upto"]
        parts = [json.dumps(m, ensure_ascii=False, separators=(",", ":")) for m in marker["head"]]
    for seq, kind, payload in rows:
        if kind in MARKER_KINDS or seq <= upto:
            continue
        if voided and is_voided(seq, voided):
            continue
        # A tool_result payload is the tool message plus an `outcome` field the
        # message model ignores, so every payload text parses as a message.
        parts.append(payload)
    return "[" + ",".join(parts) + "]"


def compaction_voided(
    seq: int, upto: int, markers: Iterable[tuple[int, Mapping[str, Any]]]
) -> bool:
    """Whether the compaction at `seq`, standing for entries up to `upto`, is void:
    a later API rollback voids a range reaching into what it stands for (a
    replaced message list). An open round's rollback starts after `upto` (a
    compaction stands for closed rounds only) and leaves it as it was. `markers`
    are (seq, payload) of rollback entries; an earlier compaction then stands.
    """
    return any(
        s > seq and is_marker(m) and m.get("scope", "api") == "api" and m["from_seq"] <= upto
        for s, m in markers
    )


def view_start(config: object) -> int:
    """The first seq a model view must read, from a task's `config` (its last
    compaction's `upto` + 1; 0 without one): resume reads only the visible part.

    A lower bound only: entries read from there may hold a later compaction, and
    `view_text` takes the last one.
    """
    if isinstance(config, dict):
        mark = config.get("compacted")
        if isinstance(mark, dict) and type(mark.get("upto")) is int:
            return int(mark["upto"]) + 1
    return 0


def parse_messages(text: str) -> list[ApiMessage]:
    """A JSON array of API messages as typed messages, in one validation call.

    A long history builds thousands of small objects, none of them garbage
    (see `duragent._heap`).
    """
    with collector_paused():
        return in_call_order(API_MESSAGES.validate_json(text))


def view_data(text: str) -> list[dict[str, Any]]:
    """The model's view as plain data: a JSON array of API messages decoded in one
    call, in their wire form (as `dump_message` stored them, minus a tool
    result's `outcome`), not validated.

    The runtime resumes a long task from this and builds typed messages only
    when a model call asks for them (`duragent.llm._messages`). Text that is not
    a JSON array of objects is a damaged store: `StoreCorrupt`.
    """
    with collector_paused():
        try:
            # Keys only: every message repeats a few keys, while their texts are
            # mostly unique (caching those too costs more than it saves).
            data = pydantic_core.from_json(text, cache_strings="keys")
        except ValueError:
            try:  # what only Python's decoder takes (an escaped lone surrogate)
                data = json.loads(text)
            except ValueError as exc:
                raise StoreCorrupt(f"the model's view of a task is not valid JSON: {exc}") from exc
    if type(data) is not list:
        raise StoreCorrupt("the model's view of a task is not a list of message objects")
    for m in data:
        if type(m) is not dict:
            raise StoreCorrupt("the model's view of a task is not a list of message objects")
        if "outcome" in m:
            del m["outcome"]
    return in_call_order(data)


def build_ui_view(rows: Iterable[tuple[int, str]]) -> list[UIMessage]:
    """UI messages in seq order; only a `scope: "ui"` rollback (a deleted message) hides them."""
    data = [(seq, payload, json.loads(payload)) for seq, payload in rows]
    hidden = voided_ranges((d for _s, _p, d in data), "ui")
    return [
        UI_MESSAGE.validate_json(p)
        for s, p, d in data
        if not is_marker(d) and not is_voided(s, hidden)
    ]
