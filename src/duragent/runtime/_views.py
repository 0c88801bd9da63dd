"""Views a person reads: the UI message list and the steps of a task."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from duragent._payloads import (
    api_of,
    checkpoint_of,
    handoff_of,
    is_marker,
    is_voided,
    progress_of,
    result_of,
    rollback_of,
    voided_ranges,
)
from duragent.runtime._builtin import PLAN_KEY
from duragent.runtime._log import read_round
from duragent.store._protocol import Store, iter_entries
from duragent.types import (
    UI_MESSAGE,
    Entry,
    EntryKind,
    Task,
    UIMessage,
    UINotice,
    UIText,
    UIToolCard,
    task_scope,
)

_CARD_STATE = {
    "ok": "ok",
    "interrupted": "interrupted",
    "error": "error",
    "denied": "error",
    "rolled_back": "rolled_back",
}


def _arguments(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {"_raw": text}
    return value if isinstance(value, dict) else {"_value": value}


def ui_view(entries: list[Entry]) -> list[UIMessage]:
    """What a person sees, in commit order.

    Stored UI entries (notices, errors) come as they are; user and assistant
    text and tool cards are derived from the API entries, intents and results.
    Rolled-back rounds stay visible, marked `voided`: UI is never voided. A
    stream still in progress shows as assistant text until its message is committed.
    """
    voided = voided_ranges(rollback_of(e) for e in entries if e.kind is EntryKind.ROLLBACK)

    def void(seq: int) -> bool:
        return is_voided(seq, voided)

    out: list[UIMessage] = []
    cards: dict[str, UIToolCard] = {}
    streaming: dict[int, UIText] = {}
    answered: set[int] = set()
    for e in entries:
        p = e.payload
        if e.kind is EntryKind.UI_MESSAGE:
            if not is_marker(p):
                out.append(UI_MESSAGE.validate_python(p))
        elif e.kind is EntryKind.API_MESSAGE:
            m = api_of(e)
            if m["role"] == "user":
                out.append(UIText(role="user", text=m.get("content") or "", voided=void(e.seq)))
            elif m["role"] == "assistant":
                answered.add(e.round)
                partial = streaming.pop(e.round, None)
                if partial is not None and partial in out:
                    out.remove(partial)
                if said := m.get("content"):
                    out.append(UIText(role="assistant", text=said, voided=void(e.seq)))
                for call in m.get("tool_calls") or ():
                    card = UIToolCard(
                        call_id=call["id"],
                        name=call["function"]["name"],
                        arguments=_arguments(call["function"]["arguments"]),
                        voided=void(e.seq),
                    )
                    cards[card.call_id] = card
                    out.append(card)
        elif e.kind is EntryKind.TOOL_RESULT:
            result = result_of(e)
            done = cards.get(result["tool_call_id"])
            # A voided result of a kept call is answered anew (rolled back): show that one.
            if done is not None and (done.voided or not void(e.seq)):
                done.state = _CARD_STATE.get(result.get("outcome", "ok"), "error")  # type: ignore[assignment]
                done.result = result.get("content", "")[:4000]
        elif e.kind is EntryKind.HANDOFF:
            h = handoff_of(e)
            gone = " (rolled back)" if void(e.seq) else ""
            out.append(UINotice(message=f"Handed off from {h['from']} to {h['to']}.{gone}"))
        elif e.kind is EntryKind.CHECKPOINT:
            c = checkpoint_of(e)
            if c["type"] == "decision":
                decided = cards.get(c["call_id"])
                if decided is not None and c.get("arguments") is not None:
                    decided.original_arguments = decided.arguments
                    decided.arguments = c["arguments"]
            elif c["type"] == "wait":
                parked = cards.get(c["call_id"])
                if parked is not None:
                    parked.state = "waiting"
        elif e.kind is EntryKind.PROGRESS and "call_id" not in p and e.round not in answered:
            text = streaming.get(e.round)
            if text is None:
                text = streaming[e.round] = UIText(role="assistant", text="")
                out.append(text)
            text.text += progress_of(e).get("text", "")
        elif e.kind is EntryKind.ROLLBACK and rollback_of(e).get("scope") == "progress":
            partial = streaming.pop(e.round, None)
            if partial is not None and partial in out:
                out.remove(partial)
    return out


@dataclass
class Step:
    round: int
    thought: str | None
    actions: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Steps:
    """Seed 001's task record: completed steps, pending steps and output."""

    completed: list[Step]
    pending: list[str]
    output: Any
    iterations: int


async def build_steps(store: Store, task: Task) -> Steps:
    entries = [e async for e in iter_entries(store, task.id)]
    markers = [e for e in entries if e.kind is EntryKind.ROLLBACK]
    by_round: dict[int, list[Entry]] = defaultdict(list)
    for e in entries:
        by_round[e.round].append(e)
    completed = []
    for r in range(1, task.iterations + 1):
        rs = read_round([*by_round.get(r, []), *markers], r)
        if rs.assistant is None:
            continue
        step = Step(r, rs.assistant.content)
        for call in rs.assistant.tool_calls or ():
            result = rs.results.get(call.id)
            step.actions.append(
                {
                    "tool": call.function.name,
                    "arguments": _arguments(call.function.arguments),
                    "observation": None if result is None else result["content"],
                    "outcome": None if result is None else result.get("outcome"),
                }
            )
        completed.append(step)
    plan = await store.get_document(task_scope(task.id), PLAN_KEY)
    pending = list(plan.value.get("pending", [])) if plan is not None else []
    return Steps(completed, pending, task.output, task.iterations)


async def partial_output(store: Store, task: Task) -> str | None:
    """The text the model has streamed in the task's current round, as committed in
    progress entries (a tool's progress, and a stream a retry voided, left out)."""
    r = task.iterations + 1
    entries = await store.entries(
        task.id, after_seq=task.round_seq, kinds=(EntryKind.PROGRESS, EntryKind.ROLLBACK)
    )
    voided = voided_ranges((e.payload for e in entries if e.kind is EntryKind.ROLLBACK), "progress")
    text = "".join(
        progress_of(e).get("text", "")
        for e in entries
        if e.kind is EntryKind.PROGRESS
        and e.round == r
        and "call_id" not in e.payload
        and not is_voided(e.seq, voided)
    )
    return text or None
