"""Recovery: a claimed task's interrupted round brought to where the loop goes on.

What the log of the open round says decides it (docs/architecture.md §4, the
recovery table): a partial stream is voided and the model asked again; calls
with an intent and no result are decided one by one (runtime/_calls.py); a tool
the agent no longer defines blocks the task.
"""

from __future__ import annotations

from collections.abc import Sequence

from duragent._payloads import rollback_marker, status_of
from duragent.errors import LostCommits
from duragent.llm._messages import WorkingView
from duragent.runtime._ending import Ending
from duragent.runtime._handoffs import read_in_force
from duragent.runtime._log import RoundState, notice, read_round
from duragent.runtime._open_round import OpenRound
from duragent.runtime._pins import conflict
from duragent.runtime._round import Rounds
from duragent.runtime._round_calls import RoundCalls
from duragent.types import BlockReason, Entry, EntryKind, NewEntry, TaskStatus


class Recovery:
    """A runner's start on a claimed task, and its re-reading of the log after an
    interrupt: the model's view and the open round of `rounds`, as the log has them."""

    def __init__(self, rounds: Rounds, ending: Ending) -> None:
        self.rounds = rounds
        self.ending = ending
        self.commits = rounds.commits
        self.store = rounds.store
        self.agent = rounds.agent

    async def start(self) -> None:
        t = self.commits.task
        if t.last_seq < self.commits.acked:  # this worker had been told of more
            raise LostCommits(t.id, t.last_seq, self.commits.acked)
        # The open round and the model's view in one call: one round trip to the
        # store before the first round where it is remote (the view goes unused
        # when the task is blocked below). The two reads are not one snapshot: a
        # message or a control request from another process may land between
        # them (runtime/_inbox.py), as it could with the reads in turn; neither
        # is part of the model's view, and the runner takes them in afterwards.
        entries, view = await self.store.start_reads(t.id, t.round_seq)
        self._report_claim(entries)
        if t.restarts > self.agent.limits.max_restarts:
            await self.ending.block(
                BlockReason.RESTART_LIMIT,
                f"the task was taken over {t.restarts} times after its worker died or lost its "
                f"lease (max_restarts={self.agent.limits.max_restarts}); "
                "fix the cause, then resume it",
            )
            return
        problem = conflict(t, self.agent)
        if problem is not None:
            await self.ending.block(BlockReason.PINNED, f"task {t.id}: {problem}")
            return
        if not await self._agents_in_force():
            return
        self.rounds.view = WorkingView(view)
        await self._recover(read_round(entries, t.iterations + 1))

    async def _agents_in_force(self) -> bool:
        """Take the agents the log says run the task (its handoffs); False (and the
        task blocked) when one of them is not among those the task's agent reaches."""
        others = len(self.rounds.handoff_agents) > 1
        current, pending = await read_in_force(self.store, self.commits.task, others)
        missing = [n for n in (current, pending) if n and n not in self.rounds.handoff_agents]
        if missing:
            await self.ending.block(
                BlockReason.MISSING_DEFINITION,
                f"the task was handed off to agent {missing[0]!r}, which agent "
                f"{self.agent.name!r} no longer reaches by its handoffs; restore the "
                "handoff, then resume the task",
            )
            return False
        self.rounds.in_force(current, pending)
        return True

    def _report_claim(self, entries: Sequence[Entry]) -> None:
        """The claim that started this runner changed the status in the store, not
        through a commit of ours: report it (pending -> running, say) all the same."""
        commits = self.commits
        if commits.on_status is None or commits.detached:
            return
        for e in reversed(entries):
            if e.kind is EntryKind.STATUS and status_of(e).get("epoch") == commits.epoch:
                old = TaskStatus(status_of(e)["from"])
                if old is not TaskStatus.RUNNING:  # a takeover is no change of status
                    commits.on_status(commits.task, old, TaskStatus.RUNNING)
                return

    async def _recover(self, rs: RoundState) -> None:
        """Bring an interrupted round to a state the loop can continue from
        (docs/architecture.md §4)."""
        tid, r = self.commits.task.id, rs.round
        if rs.assistant is None:
            if rs.progress_seqs:  # a partial stream: void it and ask again
                marker = rollback_marker(
                    "progress", rs.progress_seqs[0], rs.progress_seqs[-1], "interrupted stream"
                )
                await self.commits.commit(
                    [
                        NewEntry(task_id=tid, kind=EntryKind.ROLLBACK, round=r, payload=marker),
                        notice(tid, r, "The model's answer was interrupted; asking again."),
                    ]
                )
            return
        if not rs.assistant.tool_calls and await self.rounds.checks.resume(rs):
            return  # a final answer whose guardrails had not all answered
        # The progress this runner streamed in the round, if it had it open, stays its own.
        held = self.rounds.round
        self.rounds.round = rnd = OpenRound.from_log(rs, held.progress if held else None)
        agent = self.rounds.agent  # the one that made the calls (after a handoff: its target)
        for cid in rs.missing:
            name = rs.intents[cid]["name"]
            known = name in agent.tool_map or name in agent.transfers
            if not known and cid not in rs.waits:
                await self.ending.block(
                    BlockReason.MISSING_DEFINITION,
                    f"tool {name!r} (call {cid}) has no result and agent {agent.name!r} no "
                    "longer defines it; restore the tool, then resume the task",
                )
                return
        calls = [c for c in rs.assistant.tool_calls or () if c.id in rs.intents]
        await RoundCalls(self.rounds, rnd, calls, rs).run()

    async def reread_round(self) -> None:
        """After an interrupt: the model's view and the open round as the log has them."""
        t = self.commits.task
        if not await self._agents_in_force():  # a rollback may have voided a handoff
            return
        entries, view = await self.store.start_reads(t.id, t.round_seq)
        self.rounds.view = WorkingView(view)
        await self._recover(read_round(entries, t.iterations + 1))
