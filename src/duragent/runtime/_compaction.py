"""Compaction: a task's model view kept inside the context window by committed entries.

Before each model call the runner estimates the request's size (`Budget`: the
provider's last reported prompt tokens plus what was added since, at the
task's own characters-per-token) and, past the policy's threshold or when the
provider answers that a request was too long, compacts (`Compactor.fit`):

1. elide: older tool results longer than `elide_over` shorten to a marker;
2. if that is not enough, summarise the oldest rounds with a model call.

Either way one `compaction` entry is committed ("the view replaces entries up
to `upto` with `head`", store/_views.py), with a UI notice and the row's
`config["compacted"]` (where a resume starts reading the view). Nothing is
deleted. The summary is used only once committed: the runner reads its view
back from the store. A crash before that commit leaves the log as it was, and
the next owner decides again from the log (and calls the summariser again; it
has no side effects).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import pydantic

from duragent._payloads import ApiPayload, CompactionPayload, is_voided, stored, voided_ranges
from duragent.errors import CompactionFailed, Conflict, ContextOverflow, ModelError
from duragent.llm._base import ModelRequest, ResponseAssembler
from duragent.llm._messages import WorkingView
from duragent.llm._windows import WINDOWS, context_window
from duragent.runtime._agent import Agent
from duragent.runtime._commits import Commits
from duragent.runtime._context_policy import ContextPolicy
from duragent.runtime._control import Controls, Interrupted
from duragent.runtime._log import notice
from duragent.store._views import compaction_voided, view_start
from duragent.types import (
    API_MESSAGES,
    EntryKind,
    NewEntry,
    SystemMessage,
    Usage,
    UserMessage,
    dump_message,
)

log = logging.getLogger(__name__)

# Marks a summary in the view, and a tool result shortened by elision.
SUMMARY_TAG = "[Summary of rounds {a}-{b}, compacted to fit the context window]"
ELIDED = "[elided from the model's view to fit the context window: {n} characters; kept in the log]"

Trace = Callable[..., Awaitable[None]]

# The settings that cap a request's answer, and the share of the window kept for
# the answer when none is set.
_MAX_OUTPUT = ("max_tokens", "max_completion_tokens", "max_output_tokens")
ANSWER_SHARE = 0.05


def message_chars(m: Mapping[str, Any]) -> int:
    """About what a wire-form message costs in characters (content, calls, framing)."""
    n = 12 + len(m.get("content") or "")
    for c in m.get("tool_calls") or ():
        f = c.get("function") or {}
        n += 24 + len(f.get("name") or "") + len(f.get("arguments") or "")
    return n


class Budget:
    """A task's request size in tokens: the provider's count for the last request
    plus an estimate, at this task's characters per token, of what came since."""

    def __init__(self, policy: ContextPolicy, fixed: int) -> None:
        self.fixed = fixed  # the instructions, the tools' and output schemas, in characters
        self.ratio = policy.chars_per_token
        self.sent_chars: int | None = None
        self.sent_tokens: int | None = None
        self._view: WorkingView | None = None
        self._counted = 0
        self._chars = 0

    def chars(self, view: WorkingView) -> int:
        """The characters of a request of `view`, counted from where the last count stopped."""
        if view is not self._view:
            self._view, self._counted, self._chars = view, 0, 0
        n = len(view)
        if n > self._counted:
            self._chars += sum(message_chars(m) for m in view.data(n)[self._counted :])
            self._counted = n
        return self._chars + self.fixed

    def tokens(self, chars: int) -> int:
        if self.sent_tokens is None or self.sent_chars is None:
            return int(chars / self.ratio)
        return max(0, self.sent_tokens + int((chars - self.sent_chars) / self.ratio))

    def sent(self, chars: int, tokens: int) -> None:
        """The provider counted `tokens` for a request of `chars`: calibrate."""
        if tokens > 0:
            self.sent_chars, self.sent_tokens = chars, tokens
            self.ratio = max(0.5, chars / tokens)


@dataclass(slots=True)
class _Item:
    seq: int
    round: int
    message: dict[str, Any]


class Compactor:
    """One runner's compaction: its budget and the commits that shrink its view."""

    def __init__(
        self,
        agent: Agent,
        commits: Commits,
        controls: Controls,
        trace: Trace,
        moved: Callable[[int], Awaitable[bool]] | None = None,
    ) -> None:
        self.agent = agent
        self.moved = moved  # after a Conflict: whether the row moved on (it is then taken)
        self.policy: ContextPolicy = agent.context
        self.commits = commits
        self.controls = controls
        self.trace = trace
        tools = [{"n": t.name, "d": t.description, "p": t.parameters} for t in _specs(agent)]
        # The output schema goes with every request too (a tool or a response format).
        output = (commits.task.config.get("request") or {}).get("output", agent.output_pin)
        fixed = len(agent.instructions) + len(json.dumps(tools)) + len(json.dumps(output or ""))
        self.budget = Budget(self.policy, fixed)
        self.learned: int | None = None  # a window a provider's overflow answer told
        self._known: tuple[str | None, int | None] = (None, None)  # model name, its window
        self._overflow_round, self._overflows = 0, 0  # refusals of one round in a row

    # --- the budget ---

    def window(self) -> int | None:
        p = self.policy
        if p.window is not None:
            return p.window
        if self.learned is not None:
            return self.learned
        name = self._model_name()
        if self._known[0] != name:
            table = {**WINDOWS, **p.windows} if p.windows else WINDOWS
            self._known = (name, context_window(name, table))
        return self._known[1]

    def _reserve(self, window: int) -> int:
        """Tokens of the window kept for the answer: the request's max output tokens
        (the task's pinned settings, the model's own) when set, else a share of it."""
        pin = self.commits.task.config.get("request") or {}
        model = self.agent.chat_model
        settings = {
            **(getattr(model, "settings", None) or {}),
            **(pin.get("settings", self.agent.model_settings) or {}),
        }
        n = next(
            (settings[k] for k in _MAX_OUTPUT if k in settings),
            getattr(model, "max_tokens", None),
        )
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            return min(n, window // 2)
        return int(window * ANSWER_SHARE)

    def sent(self, view: WorkingView, prompt_tokens: int) -> None:
        """A request of `view` was answered; the provider counted `prompt_tokens`."""
        if self.policy.enabled and self.window() is not None:
            self.budget.sent(self.budget.chars(view), prompt_tokens)

    # --- compaction ---

    async def fit(
        self, view: WorkingView, r: int, overflow: ContextOverflow | None = None
    ) -> WorkingView | None:
        """Before round `r`'s request: the view compacted (committed, read back from
        the store) when the request would not fit; None when it fits, or when a
        control request stopped the compaction (the round then stops).

        After an `overflow` that compaction cannot cure: ContextOverflow saying why.
        """
        p = self.policy
        if overflow is not None:
            self._overflowed(overflow, r)
        if not p.enabled:
            return None
        if overflow is None and self.window() is None:
            return None  # no window known (yet): the provider's answer will tell
        chars = self.budget.chars(view)
        if overflow is not None:
            self._learn(chars, overflow)
        window = self.window()
        if window is None:
            return None
        tokens = self.budget.tokens(chars)
        room = window - self._reserve(window)  # the prompt's share: the answer needs the rest
        if overflow is not None:
            tokens = max(tokens, room + 1)
        elif tokens <= p.threshold * room:
            return None
        await self.commits.caught_up()  # the last round's closing result is in the log
        prev, items = await self._tail()
        plan = self._plan(prev, items, r, tokens, room, overflow is not None)
        if plan is None:
            if overflow is None:
                return None  # nothing to take away yet: let the provider judge
            raise ContextOverflow(
                self._cannot(window, tokens), tokens=overflow.tokens, limit=window
            )
        await self.trace("compaction_start", how=plan.how, to_round=plan.to_round)
        usage = Usage()
        if plan.how != "elided":
            try:
                async with self.controls.interruptible():
                    summary, usage = await self._summarise(plan.old, plan, window)
            except Interrupted:
                return None
            except ModelError as exc:
                if overflow is not None:
                    raise
                # Not too long yet: the request goes as it is, and the next round tries again.
                log.warning("task %s: compaction skipped: %s", self.commits.task.id, exc)
                return None
            plan.finish(summary)
            await self.trace("compaction_summarised", to_round=plan.to_round)
        after = max(0, tokens - int((plan.old_chars - plan.head_chars()) / self.budget.ratio))
        await self._commit(plan, r, "overflow" if overflow else "threshold", tokens, after, usage)
        await self.trace("compacted", how=plan.how, to_round=plan.to_round)
        return WorkingView(await self.commits.store.model_view_data(self.commits.task.id))

    def _overflowed(self, overflow: ContextOverflow, r: int) -> None:
        """Raise, saying what to change, when compacting is no cure for an overflow:
        compaction is off, or the provider refused round `r` again and again."""
        if not self.policy.enabled:
            raise ContextOverflow(
                f"{overflow}; compaction is off (Agent(context=ContextPolicy(enabled=False))): "
                "turn it on, or use a model with a larger window",
                tokens=overflow.tokens,
                limit=overflow.limit,
            ) from overflow
        self._overflows = self._overflows + 1 if self._overflow_round == r else 1
        self._overflow_round = r
        if self._overflows > 3:
            raise ContextOverflow(
                f"{overflow}; the view was compacted {self._overflows - 1} times for round {r} "
                "and the provider still refuses it as too long: set "
                "Agent(context=ContextPolicy(window=...)) to the model's real window, or lower "
                "its threshold and target",
                tokens=overflow.tokens,
                limit=overflow.limit,
            ) from overflow

    def _learn(self, chars: int, overflow: ContextOverflow) -> None:
        """What an overflow answer teaches: the request's true size, the window."""
        if overflow.tokens:
            self.budget.sent(chars, overflow.tokens)
        if self.policy.window is None:  # the provider knows its window better than a table
            guess = overflow.limit or int(self.budget.tokens(chars) * 0.9)
            self.learned = min(self.learned or guess, guess)

    async def _tail(self) -> tuple[CompactionPayload | None, list[_Item]]:
        """The last compaction and the visible API entries after it (a flat read)."""
        task = self.commits.task
        after = max(0, view_start(task.config) - 1)
        kinds = (
            EntryKind.API_MESSAGE,
            EntryKind.TOOL_RESULT,
            EntryKind.ROLLBACK,
            EntryKind.COMPACTION,
        )
        entries = await self.commits.store.entries(task.id, after_seq=after, kinds=kinds)
        markers = [(e.seq, e.payload) for e in entries if e.kind is EntryKind.ROLLBACK]
        voided = voided_ranges(m for _s, m in markers)
        prev = None
        for e in reversed(entries):
            kind = e.kind
            if kind is EntryKind.COMPACTION and not compaction_voided(
                e.seq, e.payload["upto"], markers
            ):
                prev = cast(CompactionPayload, e.payload)
                break
        upto = prev["upto"] if prev is not None else 0
        items = [
            _Item(e.seq, e.round, {k: v for k, v in e.payload.items() if k != "outcome"})
            for e in entries
            if e.kind in (EntryKind.API_MESSAGE, EntryKind.TOOL_RESULT)
            and e.seq > upto
            and not is_voided(e.seq, voided)
        ]
        return prev, items

    def _plan(
        self,
        prev: CompactionPayload | None,
        items: list[_Item],
        r: int,
        tokens: int,
        window: int,
        forced: bool,
    ) -> _Plan | None:
        """What to replace: elision if it reaches the target, else a summary of as
        few of the oldest rounds as reaches it; None if nothing would help enough."""
        p, ratio = self.policy, self.budget.ratio
        closed = sorted({it.round for it in items if it.round < r})
        goal = p.target * window
        limit = window if forced else p.threshold * window
        first_round = prev["from_round"] if prev is not None else (closed[0] if closed else r)
        head = list(prev["head"]) if prev is not None else []
        kept_n = prev.get("kept", 0) if prev is not None else 0
        best: _Plan | None = None
        for k in range(min(p.keep_rounds, len(closed) - 1), -1, -1):
            cut_round = closed[-k - 1]
            cut = [it for it in items if it.round <= cut_round]
            if not cut:
                continue
            plan = _Plan.of(p, head, kept_n, cut, prev is None, first_round, cut_round)
            first_try = k == min(p.keep_rounds, len(closed) - 1)
            if first_try and plan.elided and tokens - plan.elision_saves() / ratio <= goal:
                plan.elide()
                return plan
            after = tokens - (plan.old_chars - plan.summary_room()) / ratio
            best = plan
            if after <= goal:
                return plan
        if best is None:
            return None
        after = tokens - (best.old_chars - best.summary_room()) / ratio
        return best if after < limit else None

    def _cannot(self, window: int, tokens: int) -> str:
        p = self.policy
        text = (
            f"the task's view cannot be made to fit the model's context window of {window} "
            f"tokens (about {tokens} tokens asked): the instructions, the tools and the newest "
            "round alone exceed it, and nothing older is left to compact. Use a model with a "
            "larger window (or set Agent(context=ContextPolicy(window=...)) if it is larger "
            "than assumed), shorten the instructions, or make the tools return less"
        )
        summary = int((p.summary_chars + 120) / self.budget.ratio)
        if summary >= p.target * window:  # the room kept for a summary may be the cause
            text += (
                f"; or lower ContextPolicy.summary_chars: {p.summary_chars} characters (about "
                f"{summary} tokens) are kept for a summary, more than the target share of the "
                f"window ({int(p.target * window)} tokens)"
            )
        return text

    async def _summarise(
        self, old: list[dict[str, Any]], plan: _Plan, window: int
    ) -> tuple[str, Usage]:
        p = self.policy
        if p.compact is not None:
            out = await _call_compact(p.compact, old)
            if isinstance(out, list):
                plan.custom = out
                return "", Usage()
            return out, Usage()
        model = p.summarizer or self.agent.chat_model
        name = model.name if p.summarizer is not None else self._model_name()
        cap = int(window * p.target * self.budget.ratio)
        request = ModelRequest(
            model=name,
            messages=[
                SystemMessage(content=p.summary_prompt),
                UserMessage(content=transcript(old, p.elide_over, cap)),
            ],
        )
        retry = self.agent.model_retry
        attempt = 0
        while True:
            assembler = ResponseAssembler()
            try:
                async for event in model.stream(request):
                    assembler.add(event)
                break
            except ContextOverflow as exc:  # the summariser's own window is smaller
                attempt += 1
                if attempt > 3:
                    raise ModelError(f"the summariser failed: {exc}") from exc
                cap //= 2
                request.messages = [
                    request.messages[0],
                    UserMessage(content=transcript(old, p.elide_over // 2, cap)),
                ]
            except ModelError as exc:
                attempt += 1
                if not exc.retryable or attempt > retry.max_retries:
                    raise ModelError(f"the summariser failed: {exc}") from exc
                await asyncio.sleep(exc.retry_after or min(retry.max_delay, retry.base_delay))
        text = "".join(assembler.text).strip()
        return text[: p.summary_chars], assembler.usage

    async def _commit(
        self, plan: _Plan, r: int, reason: str, before: int, after: int, usage: Usage
    ) -> None:
        task = self.commits.task
        payload = CompactionPayload(
            upto=plan.upto,
            head=cast(list[ApiPayload], plan.head()),
            how=plan.how,
            from_round=plan.from_round,
            to_round=plan.to_round,
            kept=len(plan.kept),
            reason=reason,
            tokens_before=before,
            tokens_after=after,
        )
        if plan.how == "elided":
            payload["elided"] = plan.elided
        else:
            payload["summary"] = plan.summary
        text = compaction_text(payload)
        entries = [
            NewEntry(task_id=task.id, kind=EntryKind.COMPACTION, round=r, payload=stored(payload)),
            notice(task.id, r, text),
        ]
        while True:  # config holds the inbox: a message sent meanwhile must not be lost
            task = self.commits.task
            version = task.version
            patch: dict[str, Any] = {"config": {**task.config, "compacted": {"upto": plan.upto}}}
            if usage.input_tokens or usage.output_tokens:
                patch["usage"] = task.usage + usage
            try:
                await self.commits.commit(entries, patch, expect_version=version)
            except Conflict:
                if self.moved is None or not await self.moved(version):
                    raise
                continue
            return

    def _model_name(self) -> str:
        pin = self.commits.task.config.get("request") or {}
        return str(pin.get("model", self.agent.model_name))


async def _call_compact(
    compact: Callable[..., Any], old: list[dict[str, Any]]
) -> str | list[dict[str, Any]]:
    """The user's `compact` function's summary (text) or messages (checked as API
    messages). What it raises but a ModelError, or a result that is neither, fails
    the task saying so, before anything is committed."""
    what = f"ContextPolicy(compact={getattr(compact, '__name__', 'function')})"
    try:
        out = compact([dict(m) for m in old])
        if inspect.isawaitable(out):
            out = await out
    except ModelError:
        raise
    except Exception as exc:
        text = " ".join(str(exc).split())
        raise CompactionFailed(f"{what} raised {type(exc).__name__}: {text}") from exc
    if isinstance(out, str):
        return out
    if isinstance(out, list):
        try:
            messages = API_MESSAGES.validate_python(out)
        except pydantic.ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(x) for x in first["loc"])
            raise CompactionFailed(
                f"{what} returned a list that is not API messages (at {where}: {first['msg']})"
            ) from None
        return [dump_message(m) for m in messages]
    raise CompactionFailed(
        f"{what} returned {type(out).__name__}: it must return a summary (str) or a "
        "list of API messages (dicts with a role)"
    )


def compaction_text(c: CompactionPayload) -> str:
    """One line saying what a compaction did ("Rounds 1-40 summarised ...")."""
    rounds = f"Rounds {c['from_round']}-{c['to_round']}"
    if c["how"] == "elided":
        return (
            f"{rounds}: {c.get('elided', 0)} large tool results elided from the model's view "
            "to fit the context window (kept in the log)"
        )
    return f"{rounds} summarised to fit the context window (kept in the log)"


class _Plan:
    """One compaction being prepared: what stays verbatim, what is replaced."""

    def __init__(
        self,
        policy: ContextPolicy,
        kept: list[dict[str, Any]],
        old: list[dict[str, Any]],
        upto: int,
        from_round: int,
        to_round: int,
    ) -> None:
        self.policy = policy
        self.kept = kept
        self.old = old
        self.upto = upto
        self.from_round = from_round
        self.to_round = to_round
        self.old_chars = sum(message_chars(m) for m in old)
        self.elided = sum(1 for m in old if _elidable(m, policy.elide_over))
        self.how = "summarised"
        self.summary = ""
        self.custom: list[dict[str, Any]] | None = None
        self._head: list[dict[str, Any]] = []

    @classmethod
    def of(
        cls,
        policy: ContextPolicy,
        head: Sequence[Mapping[str, Any]],
        kept_n: int,
        cut: list[_Item],
        first: bool,
        from_round: int,
        to_round: int,
    ) -> _Plan:
        kept = [dict(m) for m in head[:kept_n]]
        old = [dict(m) for m in head[kept_n:]]
        for i, it in enumerate(cut):
            m = it.message
            keep_first = first and i == 0 and policy.keep_first_user and m.get("role") == "user"
            if keep_first:
                kept.append(m)
            elif policy.pinned is not None and policy.pinned(m):
                kept.append(_standalone(m))
            else:
                old.append(m)
        return cls(policy, kept, old, cut[-1].seq, from_round, to_round)

    def elision_saves(self) -> int:
        over = self.policy.elide_over
        return sum(len(m["content"]) - len(_marker(m)) for m in self.old if _elidable(m, over))

    def summary_room(self) -> int:
        return self.policy.summary_chars + 120

    def elide(self) -> None:
        over = self.policy.elide_over
        self.how = "elided"
        self._head = [{**m, "content": _marker(m)} if _elidable(m, over) else m for m in self.old]

    def finish(self, summary: str) -> None:
        if self.custom is not None:
            self.how, self._head = "custom", self.custom
            return
        self.summary = summary
        tag = SUMMARY_TAG.format(a=self.from_round, b=self.to_round)
        self._head = [{"role": "user", "content": f"{tag}\n{summary}"}]

    def head(self) -> list[dict[str, Any]]:
        return [*self.kept, *self._head]

    def head_chars(self) -> int:
        return sum(message_chars(m) for m in self._head)


def _standalone(m: dict[str, Any]) -> dict[str, Any]:
    """A pinned message as one that stands without its round (whose other messages
    are summarised): a tool result without its call, or a call without its result,
    is refused by the providers, so they are kept as text."""
    if m.get("role") == "tool":
        return {"role": "user", "content": f"[Pinned tool result]\n{m.get('content') or ''}"}
    if m.get("role") == "assistant" and m.get("tool_calls"):
        calls = "; ".join(
            f"{c['function']['name']}({c['function'].get('arguments', '')})"
            for c in m["tool_calls"]
        )
        return {
            "role": "assistant",
            "content": f"{m.get('content') or ''}\n[Called: {calls}]".strip(),
        }
    return m


def _elidable(m: Mapping[str, Any], over: int) -> bool:
    content = m.get("content")
    return m.get("role") == "tool" and isinstance(content, str) and len(content) > over


def _marker(m: Mapping[str, Any]) -> str:
    return ELIDED.format(n=len(m.get("content") or ""))


def transcript(messages: Sequence[Mapping[str, Any]], clip: int, cap: int) -> str:
    """The messages to summarise as plain text, each tool result clipped to `clip`
    characters and the whole to `cap` (its middle dropped: the start holds the
    earlier summary and the task, the end what happened last)."""
    lines: list[str] = []
    for m in messages:
        role = m.get("role")
        content = str(m.get("content") or "")
        if role == "tool":
            if len(content) > clip:
                content = content[:clip] + f" [... {len(content) - clip} more characters]"
            lines.append(f"TOOL RESULT ({m.get('tool_call_id', '')}): {content}")
            continue
        if content:
            lines.append(f"{str(role).upper()}: {content}")
        for c in m.get("tool_calls") or ():
            f = c.get("function") or {}
            lines.append(f"ASSISTANT CALLED {f.get('name')}({f.get('arguments', '')})")
    text = "\n".join(lines)
    if len(text) > cap > 0:
        head = cap // 4
        text = text[:head] + "\n[... earlier part left out ...]\n" + text[-(cap - head) :]
    return text


def _specs(agent: Agent) -> list[Any]:
    return [t.spec() for t in agent.tool_map.values()]
