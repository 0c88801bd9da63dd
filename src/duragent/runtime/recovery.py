"""Recovery: a claimed task's interrupted round brought to where the loop goes on.

What the log of the open round says decides it (docs/architecture.md §4, the
recovery table): a partial stream is voided and the model asked again; calls
with an intent and no result are decided one by one (runtime/calls.py); a tool
the agent no longer defines blocks the task.
"""

from __future__ import annotations

from collections.abc import Sequence

from duragent.llm.messages import WorkingView
from duragent.payloads import rollback_marker, status_of
from duragent.runtime.log import RoundState, notice, read_round
from duragent.runtime.pins import conflict
from duragent.runtime.round import RoundRunner
from duragent.runtime.waits import open_round
from duragent.types import BlockReason, Entry, EntryKind, NewEntry, TaskStatus


class RecoveringRunner(RoundRunner):
    """A runner's start on a claimed task, and its re-reading of the log."""

    async def _start(self) -> None:
        t = self.task
        entries = await self.store.entries(t.id, after_seq=t.round_seq)
        self._report_claim(entries)
        most = self.agent.limits.max_restarts
        if t.restarts > most:
            await self._block(
                BlockReason.RESTART_LIMIT,
                f"the task was taken over {t.restarts} times after its worker died or lost its "
                f"lease (max_restarts={most}); fix the cause, then resume it",
            )
            return
        problem = conflict(t, self.agent)
        if problem is not None:
            await self._block(BlockReason.PINNED, f"task {t.id}: {problem}")
            return
        self.view = WorkingView(await self.store.model_view_data(t.id))
        await self._recover(read_round(entries, t.iterations + 1))

    def _report_claim(self, entries: Sequence[Entry]) -> None:
        """The claim that started this runner changed the status in the store, not
        through a commit of ours: report it (pending -> running, say) all the same."""
        if self.on_status is None or self.detached:
            return
        for e in reversed(entries):
            if e.kind is EntryKind.STATUS and status_of(e).get("epoch") == self.epoch:
                old = TaskStatus(status_of(e)["from"])
                if old is not TaskStatus.RUNNING:  # a takeover is no change of status
                    self.on_status(self.task, old, TaskStatus.RUNNING)
                return

    async def _recover(self, rs: RoundState) -> None:
        """Bring an interrupted round to a state the loop can continue from
        (docs/architecture.md §4)."""
        tid, r = self.task.id, rs.round
        if rs.assistant is None:
            if rs.progress_seqs:  # a partial stream: void it and ask again
                marker = rollback_marker(
                    "progress", rs.progress_seqs[0], rs.progress_seqs[-1], "interrupted stream"
                )
                await self.commit(
                    [
                        NewEntry(task_id=tid, kind=EntryKind.ROLLBACK, round=r, payload=marker),
                        notice(tid, r, "The model's answer was interrupted; asking again."),
                    ]
                )
            return
        self._round_no, self._round_api_seqs = r, list(rs.api_seqs)
        self._called_at = dict(rs.called_at)
        for cid in rs.missing:
            name = rs.intents[cid]["name"]
            if name not in self.agent.tool_map and cid not in rs.waits:
                await self._block(
                    BlockReason.MISSING_DEFINITION,
                    f"tool {name!r} (call {cid}) has no result and agent {self.agent.name!r} no "
                    "longer defines it; restore the tool, then resume the task",
                )
                return
        calls = [c for c in rs.assistant.tool_calls or () if c.id in rs.intents]
        await self._run_calls(r, calls, rs)

    async def _reread_round(self) -> None:
        """After an interrupt: the model's view and the open round as the log has them."""
        t = self.task
        self.view = WorkingView(await self.store.model_view_data(t.id))
        await self._recover(await open_round(self.store, t))
