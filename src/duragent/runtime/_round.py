"""The round: the model's answer, then its tool calls. Every step is a commit.

A round: model view -> stream the model (progress committed at most every
`progress_interval`) -> commit the assistant message with its tool intents ->
run the tools concurrently, committing each result (runtime/_round_calls.py) ->
next round. The commit that brings the last result of a round also closes it
(iterations + 1). An answer without tool calls ends the turn, unless messages
wait in the inbox.
"""

from __future__ import annotations

import asyncio
import random
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from duragent._payloads import IntentPayload, stored
from duragent.errors import Conflict, ContextOverflow, ModelError
from duragent.llm._base import ModelRequest, Response, ResponseAssembler, TextDelta
from duragent.llm._messages import WorkingView
from duragent.runtime._agent import Agent, reachable
from duragent.runtime._checks import Checks
from duragent.runtime._commits import Commits
from duragent.runtime._compaction import Compactor
from duragent.runtime._control import Control, Controls, Interrupted
from duragent.runtime._ending import Ending
from duragent.runtime._handoffs import transfer_spec
from duragent.runtime._held import Held
from duragent.runtime._inbox import delivery, due
from duragent.runtime._log import api_entry, notice
from duragent.runtime._open_round import OpenRound
from duragent.runtime._output import spec_of
from duragent.runtime._pins import request_pin
from duragent.runtime._round_calls import RoundCalls
from duragent.runtime._state import DebouncedState
from duragent.runtime._waits import open_round
from duragent.store._protocol import Store
from duragent.types import (
    ApiMessage,
    EntryKind,
    NewEntry,
    SystemMessage,
    Task,
    TaskStatus,
    Usage,
    UserMessage,
    utcnow,
)
from duragent.webhooks import custom_event

# Called at named points of a round ("progress", "intents", "tool_start",
# "result", "final", "step"), after what precedes them is committed, and around
# a run ("task_start", "task_end"), a round ("round_start") and a model call
# ("model_start", "model_end"). One exception: the result that closes a round
# may still be syncing (Commits.commit_behind); its "result" point carries
# `landed`, an awaitable done once it is durable. For tests, demos, tracing
# (duragent.otel) and metrics (duragent.metrics); a hook that never returns
# holds the task there.
TraceHook = Callable[..., Awaitable[None]]


class Rounds:
    """A runner's rounds: messages taken at a safe point, the model, the tools.
    Owns the model's view of the task (`view`), the round open (`round`), the
    trace hook; it is what a tool call sees of its runner (CallHost,
    runtime/_calls.py)."""

    def __init__(
        self,
        agent: Agent,
        agents: Mapping[str, Agent],
        commits: Commits,
        controls: Controls,
        ending: Ending,
        trace: TraceHook | None,
    ) -> None:
        # The task's own agent, and the agent in force: the one running its rounds,
        # another after a handoff (runtime/_handoffs.py).
        self.root = self.agent = agent
        self.agents = agents
        self.handoff_agents = {a.name: a for a in reachable(agent)}
        # A handoff taken in round n: its target runs from round n + 1 on.
        self.handed: tuple[int, Agent] | None = None
        self.commits = commits
        self.controls = controls
        self.ending = ending
        self.trace = trace
        self.store: Store = commits.store
        self.commit = commits.commit
        self.view = WorkingView()  # plain data; typed messages built when a model call reads them
        self.round: OpenRound | None = None
        self._tool_progress_at: dict[str, float] = {}
        self.checks = Checks(self)  # guardrails and the output schema
        me = weakref.ref(self)  # the compactor is ours: no cycle back to us (tests/test_heap.py)

        async def traced(point: str, **info: Any) -> None:
            rounds = me()
            if rounds is not None:
                await rounds.trace_point(point, **info)

        async def moved(version: int) -> bool:
            rounds = me()
            return rounds is not None and await rounds._moved(version)

        self.compactor = Compactor(agent, commits, controls, traced, moved)
        self.held = Held()  # closed when the runner's run ends (TaskRunner.run)
        self.worker_held: Held | None = None

    # --- what a tool call sees (CallHost) ---

    @property
    def task(self) -> Task:
        """The task's row as its commits last took it."""
        return self.commits.task

    @property
    def state(self) -> DebouncedState:
        return self.commits.state

    async def trace_point(self, point: str, **info: Any) -> None:
        if self.trace is not None:
            task = self.commits.task
            await self.trace(point, task_id=task.id, round=task.iterations + 1, **info)

    async def tool_progress(self, call_id: str, text: str) -> None:
        now = time.monotonic()
        if now - self._tool_progress_at.get(call_id, 0.0) < self.agent.timing.progress_interval:
            return
        self._tool_progress_at[call_id] = now
        task = self.commits.task
        payload = {"call_id": call_id, "text": text}
        entry = NewEntry(
            task_id=task.id, kind=EntryKind.PROGRESS, round=task.iterations + 1, payload=payload
        )
        await self.commit([entry])

    async def tool_event(self, call_id: str, name: str, data: Any, n: int) -> None:
        """Commit the `n`-th custom event of call `call_id` (and its webhook event)."""
        task = self.commits.task
        payload = {"call_id": call_id, "event": name, "data": data, "n": n}
        entry = NewEntry(
            task_id=task.id, kind=EntryKind.PROGRESS, round=task.iterations + 1, payload=payload
        )
        await self.commit([entry], documents=custom_event(task, call_id, name, data))
        await self.trace_point("tool_event", call_id=call_id, event=name, n=n)

    def called_at(self, call_id: str) -> datetime:
        """When call `call_id` of the open round was made (its intent committed)."""
        made = self.round.called_at.get(call_id) if self.round is not None else None
        return made or utcnow()

    # --- messages at a safe point ---

    async def take_messages(
        self,
        r: int,
        *,
        turn_end: bool = False,
        before: Sequence[NewEntry] = (),
        patch: Mapping[str, Any] | None = None,
    ) -> list[UserMessage]:
        """Commit the inbox messages due at this safe point as user messages of round
        r (after `before`, with `patch`); [] when none is due, and nothing committed.

        Guarded by the row's version: a message sent since this runner last saw the
        row makes it read the row and decide again, so none is missed or taken twice.
        """
        while True:
            items = due(self.commits.task, turn_end=turn_end)
            if not items:
                return []
            entries, config, messages = delivery(self.commits.task, items, r)
            version = self.commits.task.version
            try:
                await self.commit(
                    [*before, *entries],
                    {**(patch or {}), "config": config},
                    expect_version=version,
                )
            except Conflict:
                if not await self._moved(version):
                    raise
                continue
            return messages

    async def _moved(self, version: int) -> bool:
        """After a Conflict: whether this task's row moved past `version` (a message
        came in); if so the runner takes the row as it is now (same lease: if another
        worker took the task, the next commit is refused by fencing)."""
        row = await self.store.get_task(self.commits.task.id)
        if row.version == version:
            return False  # the conflict was someone else's (a parent's row)
        self.commits.task = row
        if row.control:
            self.controls.request(Control.from_row(row.control))
        return True

    def hand_off(self, r: int, target: str) -> None:
        """A handoff taken in round `r`: `target` runs the rounds after it."""
        self.handed = (r, self.handoff_agents[target])

    def in_force(self, current: str | None, pending: str | None) -> None:
        """The agents the log says (runtime/_handoffs.py `in_force`): the one running the
        open round (None: the task's own) and the target of a handoff taken in it."""
        self.agent = self.handoff_agents[current] if current else self.root
        r = self.commits.task.iterations + 1
        self.handed = (r, self.handoff_agents[pending]) if pending else None

    async def play(self) -> None:
        """One round: the model's answer, then its tool calls (or the turn's end)."""
        r = self.commits.task.iterations + 1
        if self.handed is not None and self.handed[0] < r:  # the round of a handoff closed
            self.agent, self.handed = self.handed[1], None
        self.round = rnd = OpenRound(r)
        await self.trace_point("round_start")
        if r == 1 and self.agent.input_checks and not await self.checks.check_input():
            return  # a guardrail failed the task
        compacted = await self.compactor.fit(self.view, r)  # committed before it is used
        if compacted is not None:
            self.view = compacted
        response = await self._ask_model(rnd)
        if response is None:  # stopped by a control request while streaming
            await self.ending.stop(self.controls.current or Control("pause"), rnd=rnd)
            return
        message = response.message()
        usage = self.commits.task.usage + response.usage
        tid = self.commits.task.id
        if not response.tool_calls:
            if self.checks.on_output:
                await self.checks.end_turn(rnd, message, response.text, usage)
            else:
                await self._end_turn(r, message, response.text, usage)
            await self.trace_point("final")
            return
        intents = [
            NewEntry(
                task_id=tid,
                kind=EntryKind.TOOL_INTENT,
                round=r,
                payload=stored(
                    IntentPayload(
                        call_id=c.id, name=c.function.name, replay=self._replay(c.function.name)
                    )
                ),
            )
            for c in response.tool_calls
        ]
        res = await self.commit(
            [api_entry(tid, r, message), *intents],
            {"usage": usage, "round_seq": self.commits.task.last_seq},
        )
        rnd.api_seqs.append(res.entries[0].seq)
        made = zip(response.tool_calls, res.entries[1:], strict=True)
        rnd.called_at = {c.id: e.created_at for c, e in made}
        self.view.append(message)
        await self.trace_point("intents", calls=[c.id for c in response.tool_calls])
        await RoundCalls(self, rnd, response.tool_calls, None).run()

    async def _end_turn(
        self, r: int, message: ApiMessage, output: Any, usage: Usage, *, committed: bool = False
    ) -> None:
        """An answer without tool calls ends the turn: the task completes (with
        `output`: the text, or a structured answer's JSON), unless messages wait in
        its inbox; then it goes on with them, seeing the answer. `committed`: the
        answer is in the log (and the view) already, as its guardrails checked it."""
        final = [] if committed else [api_entry(self.commits.task.id, r, message)]
        while True:
            version = self.commits.task.version  # what the inbox was read at
            users = await self.take_messages(
                r + 1, turn_end=True, before=final, patch={"usage": usage, "iterations": r}
            )
            if users:
                self.view.extend([*([] if committed else [message]), *users])
                return
            try:
                await self.ending.finish(
                    TaskStatus.COMPLETED,
                    entries=final,
                    extra={"output": output, "usage": usage, "iterations": r},
                    expect_version=version,
                )
                return
            except Conflict:
                if not await self._moved(version):
                    raise

    def _replay(self, name: str) -> str:
        if name in self.agent.transfers:
            return "safe"  # a handoff's result is decided from the log alone
        tool = self.agent.tool_map.get(name)
        return tool.replay if tool is not None else "never"

    # --- the model ---

    def _request(self) -> ModelRequest:
        agent, task = self.agent, self.commits.task
        pin = request_pin(task, agent)
        # The final answer's shape is the task's, whoever gives it.
        output = (task.config.get("request") or {}).get("output", self.root.output_pin)
        head = [SystemMessage(content=agent.instructions)] if agent.instructions else []
        tools = [t.spec() for t in agent.tool_map.values()]
        return ModelRequest(
            model=pin.get("model", agent.model_name),
            messages=self.view.messages(head),
            tools=tools + [transfer_spec(a) for a in agent.transfers.values()],
            settings=pin.get("settings", agent.model_settings),
            output=spec_of(output),
        )

    async def _ask_model(self, rnd: OpenRound) -> Response | None:
        """Stream the model with retries; None if a control request stopped it."""
        r, attempt = rnd.number, 0
        while True:
            try:
                async with self.controls.interruptible():
                    return await self._stream_once(rnd)
            except Interrupted:
                return None
            except ContextOverflow as exc:
                # Compacted and asked again; a compaction that cannot cure it raises.
                compacted = await self.compactor.fit(self.view, r, exc)
                if compacted is None:
                    return None  # stopped by a control request
                self.view = compacted
                continue
            except ModelError as exc:
                if not exc.retryable:
                    raise
                attempt += 1
                if attempt > self.agent.model_retry.max_retries:
                    raise ModelError(f"the model failed {attempt} times in a row: {exc}") from exc
                delay = exc.retry_after
                if delay is None:
                    policy = self.agent.model_retry
                    base = policy.base_delay * 2 ** (attempt - 1)
                    delay = min(policy.max_delay, base) * (0.5 + random.random() / 2)
                entries = [
                    notice(
                        self.commits.task.id,
                        r,
                        f"Model error ({exc}); retry {attempt} of "
                        f"{self.agent.model_retry.max_retries} in {delay:.1f} s.",
                    )
                ]
                if rnd.progress:
                    entries.insert(0, rnd.void_progress(self.commits.task.id, r, "retry"))
                # Tokens a failed attempt used are billed all the same: count them.
                spent = _usage_of(rnd.attempt)
                patch = {"usage": self.commits.task.usage + spent} if spent else None
                await self.commit(entries, patch)
                try:
                    async with self.controls.interruptible():
                        await asyncio.sleep(delay)
                except Interrupted:
                    return None

    async def _stream_once(self, rnd: OpenRound) -> Response:
        r = rnd.number
        assembler = ResponseAssembler()
        rnd.attempt = assembler
        pending: list[str] = []
        last = time.monotonic()
        interval = self.agent.timing.progress_interval
        request = self._request()
        await self.trace_point("model_start", model=request.model)
        async for event in self.agent.chat_model.stream(request):
            assembler.add(event)
            if isinstance(event, TextDelta):
                pending.append(event.text)
                now = time.monotonic()
                if now - last >= interval:
                    await self._commit_progress(rnd, "".join(pending))
                    pending, last = [], now
        response = assembler.response(call_id_prefix=f"call_{r}")
        self.compactor.sent(self.view, response.usage.input_tokens)
        await self.trace_point("model_end", usage=response.usage, finish=response.finish)
        return response

    async def _commit_progress(self, rnd: OpenRound, text: str) -> None:
        entry = NewEntry(
            task_id=self.commits.task.id,
            kind=EntryKind.PROGRESS,
            round=rnd.number,
            payload={"text": text},
        )
        patch = None if rnd.progress else {"round_seq": self.commits.task.last_seq}
        res = await self.commit([entry], patch)
        rnd.progress.append(res.entries[0].seq)
        await self.trace_point("progress", seq=res.entries[0].seq)

    async def repark(self) -> bool:
        """After a store error cut the commit of this round's waits: commit it now,
        unless it landed after all (its waits are in the log); True when the task is
        parked. Read from the store first: a commit whose answer was lost may have
        landed, and is never applied twice."""
        rnd = self.round
        parking = rnd.parking if rnd is not None else None
        if rnd is None or parking is None:
            return False
        row = await self.store.get_task(self.commits.task.id)
        rs = await open_round(self.store, row)
        if rs.round != parking.round or any(c in rs.results for c in parking.calls):
            rnd.parking = None  # the log went on without it: recovery decides
            return False
        if not any(c in rs.waits for c in parking.calls):
            self.commits.task = row
            p = parking
            await self.commit(p.entries, p.patch, new_tasks=p.new_tasks, documents=p.documents)
        rnd.parking = None
        return True


def _usage_of(attempt: ResponseAssembler | None) -> Usage | None:
    """Usage a (failed) model attempt reported, if any."""
    usage = attempt.usage if attempt is not None else None
    return usage if usage and (usage.input_tokens or usage.output_tokens) else None
