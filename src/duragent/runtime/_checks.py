"""`Checks`: a task's input and final answer checked (the output schema, the
guardrails), every verdict committed before anything acts on it.

Input guardrails run before the first model call, on the task's input (its first
user message's seq names what they checked). A final answer is first checked
against the output schema, which needs no commit (it is a function of the text):
one that does not validate is committed with the errors sent back as a user
message, and the round closes (`config["output_failures"]` counts the attempts,
so a restart goes on counting; `config["guardrail_corrections"]` counts an
output guardrail's corrections, under the same limit). A valid answer with output guardrails is
committed first, its round left open, then each verdict; a restart finds the
answer in the open round (runtime/_recovery.py) and reuses the verdicts in the
log, so no guardrail runs twice on one committed answer.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from duragent._payloads import GuardrailCheckpoint, Stage
from duragent.errors import Conflict
from duragent.llm._messages import WorkingView
from duragent.runtime._agent import Agent
from duragent.runtime._commits import Commits
from duragent.runtime._ending import Ending
from duragent.runtime._guardrails import (
    GuardrailResult,
    as_result,
    committed_verdicts,
    run_guardrail,
    tripped_text,
    verdict_entry,
)
from duragent.runtime._log import RoundState, api_entry, notice
from duragent.runtime._open_round import OpenRound
from duragent.runtime._output import OutputInvalid, correction_text, parse_output
from duragent.runtime._submit import input_text
from duragent.store._protocol import Store
from duragent.types import ApiMessage, EntryKind, NewEntry, TaskStatus, Usage, UserMessage


class AnswerHost(Protocol):
    """What the checks use of their runner's rounds (runtime/_round.py `Rounds`)."""

    agent: Agent
    commits: Commits
    ending: Ending
    store: Store
    view: WorkingView

    async def _moved(self, version: int) -> bool: ...

    async def _end_turn(
        self, r: int, message: ApiMessage, output: Any, usage: Usage, *, committed: bool = False
    ) -> None: ...


class Checks:
    """One runner's checks of its task's input and final answers."""

    def __init__(self, host: AnswerHost) -> None:
        # Held weakly: the host (the runner's rounds) holds these checks, and a
        # cycle would keep a finished runner until the collector's next full pass.
        self.host = weakref.proxy(host)
        self.agent = host.agent
        self.input_checked = False

    @property
    def on_output(self) -> bool:
        """Whether a final answer is checked at all (else it completes the task as is)."""
        return self.agent.output_type is not None or bool(self.agent.output_checks)

    # --- the input ---

    async def check_input(self) -> bool:
        """Run the input guardrails (once per task: verdicts in the log are reused);
        False when one failed the task."""
        if self.input_checked:
            return True
        task, store = self.host.commits.task, self.host.store
        heads = await store.entry_heads(task.id, kinds=[EntryKind.API_MESSAGE])
        seq = next((h.seq for h in heads if h.round == 1 and h.role == "user"), 0)
        logged = await store.entries(task.id, after_seq=seq - 1)
        verdicts = committed_verdicts(logged, "input", seq)
        # The input as submitted; the first message as the model reads it, should they differ.
        said = logged[0].payload.get("content") if logged and logged[0].seq == seq else None
        value = task.input if said is None or said == input_text(task.input) else said
        for name, fn in self.agent.input_checks.items():
            verdict = verdicts.get(name)
            result = as_result(verdict) if verdict else await run_guardrail(name, fn, value)
            entries = [] if verdict else [verdict_entry(task.id, 1, "input", name, seq, result)]
            if not result.tripwire:
                if entries:
                    await self.host.commits.commit(entries)
                continue
            if result.action == "fail":
                await self._fail("input", name, result, entries, {})
                return False
            if entries:  # the verdict and its correction are one commit
                correction = UserMessage(content=result.message)
                note = notice(task.id, 1, f"Input guardrail {name}: {result.message}")
                await self.host.commits.commit([*entries, note, api_entry(task.id, 1, correction)])
                self.host.view.append(correction)
            break
        self.input_checked = True
        return True

    # --- the final answer ---

    async def end_turn(self, rnd: OpenRound, message: ApiMessage, text: str, usage: Usage) -> None:
        """A final answer: checked against the output schema, then the guardrails."""
        r = rnd.number
        value: Any = text
        typed: Any = text
        if self.agent.output_type is not None:
            try:
                value, typed = parse_output(self.agent.output_type, text)
            except OutputInvalid as exc:
                await self._ask_again(r, message, usage, exc.errors, committed=False)
                return
        if not self.agent.output_checks:
            await self.host._end_turn(r, message, value, usage)
            return
        # The answer is committed first (the round stays open): the verdicts name it.
        commits = self.host.commits
        tid = commits.task.id
        res = await commits.commit(
            [api_entry(tid, r, message)], {"usage": usage, "round_seq": commits.task.last_seq}
        )
        seq = res.entries[0].seq
        rnd.api_seqs.append(seq)
        self.host.view.append(message)
        await self._check_output(r, message, seq, value, typed, {})

    async def resume(self, rs: RoundState) -> bool:
        """A final answer committed with its checks unfinished (found by recovery):
        finish them, reusing the verdicts in the log. False if `rs` is no such round."""
        message = rs.assistant
        if message is None or message.tool_calls or not rs.api_seqs or not self.on_output:
            return False
        task = self.host.commits.task
        text, seq = message.content or "", rs.api_seqs[0]
        value: Any = text
        typed: Any = text
        if self.agent.output_type is not None:
            try:
                value, typed = parse_output(self.agent.output_type, text)
            except OutputInvalid as exc:
                await self._ask_again(rs.round, message, task.usage, exc.errors, committed=True)
                return True
        logged = await self.host.store.entries(task.id, after_seq=seq, kinds=[EntryKind.CHECKPOINT])
        verdicts = committed_verdicts(logged, "output", seq)
        await self._check_output(rs.round, message, seq, value, typed, verdicts)
        return True

    async def _check_output(
        self,
        r: int,
        message: ApiMessage,
        seq: int,
        value: Any,
        typed: Any,
        verdicts: Mapping[str, GuardrailCheckpoint],
    ) -> None:
        """The output guardrails on the committed answer `seq`, in order; then the
        turn ends (the task completes), fails, or the model is corrected."""
        commits = self.host.commits
        tid = commits.task.id
        for name, fn in self.agent.output_checks.items():
            verdict = verdicts.get(name)
            result = as_result(verdict) if verdict else await run_guardrail(name, fn, typed)
            entries = [] if verdict else [verdict_entry(tid, r, "output", name, seq, result)]
            if not result.tripwire:
                if entries:
                    await commits.commit(entries)
                continue
            if result.action == "fail":
                await self._fail("output", name, result, entries, {"iterations": r})
                return
            await self._correct(r, name, result, entries)
            return
        await self.host._end_turn(r, message, value, commits.task.usage, committed=True)

    async def _correct(
        self, r: int, name: str, result: GuardrailResult, entries: list[NewEntry]
    ) -> None:
        """An output guardrail's correction goes back to the model, at most
        `output_retries` times a task (`config["guardrail_corrections"]` counts
        them, so a restart goes on counting); one more fails the task."""
        limit = self.agent.output_retries
        await self._counted_retry(
            r,
            "guardrail_corrections",
            "guardrail",
            entries,
            UserMessage(content=result.message),
            lambda n: (
                f"output guardrail {name} asked for a correction {n} times "
                f"(Agent.output_retries={limit}): {' '.join(result.message.split())}"
            ),
            lambda n: f"Output guardrail {name}: {result.message} (correction {n} of {limit})",
        )

    async def _ask_again(
        self, r: int, message: ApiMessage, usage: Usage, errors: str, *, committed: bool
    ) -> None:
        """An answer that does not meet the schema goes back to the model with the
        errors (the round closes), or fails the task once the retries are spent."""
        tid = self.host.commits.task.id
        limit = self.agent.output_retries
        await self._counted_retry(
            r,
            "output_failures",
            "output_invalid",
            [] if committed else [api_entry(tid, r, message)],
            UserMessage(content=correction_text(errors)),
            lambda n: (
                f"the answer did not match the output schema after {n} "
                f"attempts: {' '.join(errors.split())}"
            ),
            lambda n: (
                f"The answer did not match the output schema (attempt {n} of "
                f"{limit + 1}); asking again."
            ),
            usage=usage,
            viewed=[] if committed else [message],
        )

    async def _counted_retry(
        self,
        r: int,
        key: str,
        reason: str,
        entries: list[NewEntry],
        correction: UserMessage,
        error: Callable[[int], str],
        note: Callable[[int], str],
        *,
        usage: Usage | None = None,
        viewed: Sequence[ApiMessage] = (),
    ) -> None:
        """Send the model `correction` (round `r` closes, with `entries` and a
        notice), counted in `config[key]`; past `output_retries` the task fails
        instead (`reason`, `error(n)`). The count's commit expects the row's
        version: a message sent meanwhile changes config, and the row is taken
        again. `viewed`: what the view gains before the correction."""
        host = self.host
        tid = host.commits.task.id
        limit = self.agent.output_retries
        done = {} if usage is None else {"usage": usage}
        while True:
            task = host.commits.task
            version = task.version  # config is the runtime's; a message sent may change it
            n = int(task.config.get(key, 0)) + 1
            config = {k: v for k, v in task.config.items() if k != key}
            try:
                if n > limit:
                    extra = {**done, "iterations": r, "config": config, "status_reason": reason}
                    await host.ending.finish(
                        TaskStatus.FAILED,
                        entries=entries,
                        error=error(n),
                        extra=extra,
                        expect_version=version,
                    )
                    return
                said = [*entries, notice(tid, r, note(n)), api_entry(tid, r + 1, correction)]
                patch = {**done, "iterations": r, "config": {**config, key: n}}
                await host.commits.commit(said, patch, expect_version=version)
            except Conflict:
                if not await host._moved(version):
                    raise
                continue
            host.view.extend([*viewed, correction])
            return

    async def _fail(
        self,
        stage: Stage,
        name: str,
        result: GuardrailResult,
        entries: list[NewEntry],
        extra: dict[str, Any],
    ) -> None:
        """A tripped guardrail fails the task; its verdict lands in the same commit."""
        error = tripped_text(stage, name, result)
        await self.host.ending.finish(
            TaskStatus.FAILED,
            entries=entries,
            error=error,
            extra={**extra, "status_reason": "guardrail"},
        )
