"""The round a runner has open, as it holds it in memory.

The log's own account of a round is `RoundState` (runtime/_log.py, read with
`waits.open_round`); this is what the runner adds to it while it works: the
seqs it committed, its model call, the commit of its waits until it lands.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from duragent._payloads import rollback_marker
from duragent.llm._base import ResponseAssembler
from duragent.runtime._log import RoundState
from duragent.store._commits import DocumentWrite
from duragent.types import EntryKind, NewEntry, Task


@dataclass
class Parking:
    """The commit that parks a task on the waits of round `round` (calls `calls`)."""

    round: int
    calls: list[str]
    entries: list[NewEntry]
    patch: dict[str, Any]
    new_tasks: list[Task]
    documents: list[DocumentWrite]


@dataclass
class OpenRound:
    """Round `number` as its runner holds it: made when the round opens (or is
    read back from the log), replaced when the next one does."""

    number: int
    api_seqs: list[int] = field(default_factory=list)  # its entries the model sees
    progress: list[int] = field(default_factory=list)  # its streamed progress entries
    # When each call was made (its intent's commit time): what a call's waits
    # count from, so a re-run after a crash asks the same.
    called_at: dict[str, datetime] = field(default_factory=dict)
    attempt: ResponseAssembler | None = None  # the model call in progress
    # The commit of its waits, while it has not landed (see CallBatch.park).
    parking: Parking | None = None

    @classmethod
    def from_log(cls, rs: RoundState, progress: list[int] | None = None) -> OpenRound:
        """The round as the log has it; `progress`, the progress this runner streamed."""
        api_seqs = list(rs.api_seqs)
        return cls(rs.round, api_seqs, progress or [], called_at=dict(rs.called_at))

    def void_progress(self, task_id: str, r: int, reason: str) -> NewEntry:
        """A rollback marker (in round r) hiding the progress streamed so far."""
        marker = rollback_marker("progress", self.progress[0], self.progress[-1], reason)
        self.progress = []
        return NewEntry(task_id=task_id, kind=EntryKind.ROLLBACK, round=r, payload=marker)
