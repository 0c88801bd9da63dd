"""Entry payloads: the void rule of rollback markers.

A rollback marker hides a range of seqs in one scope and never deletes them:
`api` takes entries out of the model's view (a rolled-back round, an edited
fork), `progress` drops a stream's partial text, `ui` hides a deleted UI
message. Every reader that asks "is this entry hidden?" asks here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

VoidScope = Literal["api", "progress", "ui"]


def rollback_marker(scope: VoidScope, from_seq: int, to_seq: int, reason: str) -> dict[str, Any]:
    """The payload of a marker hiding seqs `from_seq`..`to_seq` in `scope`."""
    return {"scope": scope, "from_seq": from_seq, "to_seq": to_seq, "reason": reason}


def voided_ranges(
    markers: Iterable[Mapping[str, Any]], scope: VoidScope = "api"
) -> list[tuple[int, int]]:
    """The seq ranges the markers of `scope` hide (a marker without a scope is `api`).

    Payloads that are not markers (no `from_seq`) are skipped, so a reader can
    pass every UI payload and get the deletions among them.
    """
    return [
        (m["from_seq"], m["to_seq"])
        for m in markers
        if "from_seq" in m and m.get("scope", "api") == scope
    ]


def is_voided(seq: int, ranges: Sequence[tuple[int, int]]) -> bool:
    return any(lo <= seq <= hi for lo, hi in ranges)
