"""What the log says about a round, and the entries the runtime writes.

Payload shapes live here so the engine, recovery and wait resolution read and
write them the same way.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from duragent._payloads import (
    Checkpoint,
    DecisionCheckpoint,
    IntentPayload,
    ProgressPayload,
    ResultPayload,
    StartedCheckpoint,
    StepCheckpoint,
    StepStartedCheckpoint,
    WaitCheckpoint,
    WaitKind,
    api_of,
    checkpoint_of,
    handoff_of,
    intent_of,
    is_voided,
    progress_of,
    result_of,
    rollback_marker,
    stored,
    voided_ranges,
)
from duragent.types import (
    API_MESSAGE,
    AssistantMessage,
    Entry,
    EntryKind,
    NewEntry,
    ToolCallData,
    ToolMessage,
    UIError,
    UINotice,
    UIText,
    UIToolCard,
    dump_message,
)


def rolled_back(cause: str) -> str:
    """The result a call's discarded result is replaced with; `cause` says why the
    round was rolled back ("the task was paused", "a new message came in")."""
    return (
        f"Rolled back: {cause} and this round was rolled back, so this call's result "
        "was discarded. Call it again if it is still needed."
    )


ROLLED_BACK = rolled_back("the task was paused")

INTERRUPTED = (
    "Tool call interrupted: the process running it stopped before its result was saved. "
    "It may or may not have taken effect; it was not re-run because it is not marked "
    "replay-safe."
)


@dataclass
class RoundState:
    """The committed, non-voided facts of one round."""

    round: int
    assistant: AssistantMessage | None = None
    api_seqs: list[int] = field(default_factory=list)
    intents: dict[str, IntentPayload] = field(default_factory=dict)
    # When each intent was committed: the time a call's waits count from.
    called_at: dict[str, datetime] = field(default_factory=dict)
    results: dict[str, ResultPayload] = field(default_factory=dict)
    result_seqs: dict[str, int] = field(default_factory=dict)
    waits: dict[str, WaitCheckpoint] = field(default_factory=dict)
    decisions: dict[str, DecisionCheckpoint] = field(default_factory=dict)
    progress_seqs: list[int] = field(default_factory=list)
    tool_partial: dict[str, list[str]] = field(default_factory=dict)
    # Custom events tools emitted (ctx.emit), by call id, in order.
    events: dict[str, list[ProgressPayload]] = field(default_factory=dict)
    started: set[str] = field(default_factory=set)
    # Durable steps inside tools (ctx.step): call id -> step name -> record.
    steps: dict[str, dict[str, StepCheckpoint]] = field(default_factory=dict)
    steps_started: dict[str, set[str]] = field(default_factory=dict)
    # The round's handoff entry, by its call id: its seq (right after the call's result).
    handoff_seqs: dict[str, int] = field(default_factory=dict)

    @property
    def missing(self) -> list[str]:
        """Call ids with an intent and no result, in call order."""
        return [cid for cid in self.intents if cid not in self.results]

    @property
    def open_waits(self) -> dict[str, WaitCheckpoint]:
        """Waits nobody has answered yet (an approved call is no longer waiting)."""
        return {
            cid: w
            for cid, w in self.waits.items()
            if cid not in self.results and cid not in self.decisions
        }


def read_round(entries: Iterable[Entry], rnd: int) -> RoundState:
    entries = list(entries)
    markers = [e.payload for e in entries if e.kind is EntryKind.ROLLBACK]
    api_voided = voided_ranges(markers, "api")
    progress_voided = voided_ranges(markers, "progress")

    st = RoundState(rnd)
    for e in entries:
        if e.round != rnd:
            continue
        if e.kind is EntryKind.PROGRESS:
            pr = progress_of(e)
            if "event" in pr:
                st.events.setdefault(pr.get("call_id", ""), []).append(pr)
            elif "call_id" in pr:
                st.tool_partial.setdefault(pr["call_id"], []).append(pr.get("text", ""))
            elif not is_voided(e.seq, progress_voided):
                st.progress_seqs.append(e.seq)
            continue
        if is_voided(e.seq, api_voided):
            continue
        if e.kind is EntryKind.API_MESSAGE and api_of(e)["role"] == "assistant":
            msg = API_MESSAGE.validate_python(e.payload)
            assert isinstance(msg, AssistantMessage)
            st.assistant = msg
            st.api_seqs.append(e.seq)
        elif e.kind is EntryKind.TOOL_INTENT:
            intent = intent_of(e)
            st.intents[intent["call_id"]] = intent
            st.called_at[intent["call_id"]] = e.created_at
        elif e.kind is EntryKind.TOOL_RESULT:
            result = result_of(e)
            st.results[result["tool_call_id"]] = result
            st.result_seqs[result["tool_call_id"]] = e.seq
            st.api_seqs.append(e.seq)
        elif e.kind is EntryKind.CHECKPOINT:
            _read_checkpoint(st, checkpoint_of(e))
        elif e.kind is EntryKind.HANDOFF:
            st.handoff_seqs[handoff_of(e)["call_id"]] = e.seq
    return st


def _read_checkpoint(st: RoundState, c: Checkpoint) -> None:
    if c["type"] == "wait":
        st.waits[c["call_id"]] = c
        # A call that waits again (a tool asking for its next approval) has no
        # answer to this wait yet: an earlier decision answered an earlier wait.
        st.decisions.pop(c["call_id"], None)
    elif c["type"] == "decision":
        st.decisions[c["call_id"]] = c
    elif c["type"] == "started":
        st.started.add(c["call_id"])
    elif c["type"] == "step":
        st.steps.setdefault(c["call_id"], {})[c["step"]] = c
    elif c["type"] == "step_started":
        st.steps_started.setdefault(c["call_id"], set()).add(c["step"])


# --- entry builders ----------------------------------------------------------


def api_entry(task_id: str, rnd: int, message: Any) -> NewEntry:
    return NewEntry(
        task_id=task_id, kind=EntryKind.API_MESSAGE, round=rnd, payload=dump_message(message)
    )


def ui_entry(task_id: str, rnd: int, message: UIText | UIToolCard | UIError | UINotice) -> NewEntry:
    return NewEntry(
        task_id=task_id, kind=EntryKind.UI_MESSAGE, round=rnd, payload=dump_message(message)
    )


def notice(task_id: str, rnd: int, text: str) -> NewEntry:
    return ui_entry(task_id, rnd, UINotice(message=text))


def result_entries(
    task_id: str, rnd: int, call_id: str, content: str, outcome: str
) -> list[NewEntry]:
    """A tool result: the tool message the model sees plus its outcome.

    No UI card is stored beside it: the UI view derives tool cards from intents
    and results (runtime/_views.py), so a round costs one row per fact.
    """
    message = dump_message(ToolMessage(tool_call_id=call_id, content=content))
    return [
        NewEntry(
            task_id=task_id,
            kind=EntryKind.TOOL_RESULT,
            round=rnd,
            payload={**message, "outcome": outcome},
        )
    ]


def wait_entry(task_id: str, rnd: int, call_id: str, wait: WaitKind, **details: Any) -> NewEntry:
    payload = {"type": "wait", "call_id": call_id, "wait": wait, **details}
    return NewEntry(task_id=task_id, kind=EntryKind.CHECKPOINT, round=rnd, payload=payload)


def started_entry(task_id: str, rnd: int, call_id: str) -> NewEntry:
    payload: StartedCheckpoint = {"type": "started", "call_id": call_id}
    return NewEntry(task_id=task_id, kind=EntryKind.CHECKPOINT, round=rnd, payload=stored(payload))


def step_entry(task_id: str, rnd: int, call_id: str, step: str, **record: Any) -> NewEntry:
    """A step of a tool call finished: its result (`value`) or its failure (`error`)."""
    payload = {"type": "step", "call_id": call_id, "step": step, **record}
    return NewEntry(task_id=task_id, kind=EntryKind.CHECKPOINT, round=rnd, payload=payload)


def step_started_entry(task_id: str, rnd: int, call_id: str, step: str) -> NewEntry:
    payload: StepStartedCheckpoint = {"type": "step_started", "call_id": call_id, "step": step}
    return NewEntry(task_id=task_id, kind=EntryKind.CHECKPOINT, round=rnd, payload=stored(payload))


def decision_entry(
    task_id: str,
    rnd: int,
    call_id: str,
    approved: bool,
    reason: str | None,
    arguments: dict[str, Any] | None = None,
) -> NewEntry:
    """A person's decision on an approval; `arguments` when they edited the call's."""
    payload: DecisionCheckpoint = {
        "type": "decision",
        "call_id": call_id,
        "approved": approved,
        "reason": reason,
    }
    if arguments is not None:
        payload["arguments"] = arguments
    return NewEntry(task_id=task_id, kind=EntryKind.CHECKPOINT, round=rnd, payload=stored(payload))


def wait_reason(waits: Mapping[str, WaitCheckpoint]) -> str:
    """The status reason for a set of open waits: input first (a person must act)."""
    kinds = {w["wait"] for w in waits.values()}
    for kind, reason in (("input", "input"), ("approval", "input"), ("subtask", "subtask")):
        if kind in kinds:
            return reason
    return "timer"


# --- rollback ------------------------------------------------------------------


@dataclass
class RollbackPlan:
    entries: list[NewEntry]  # rollback markers and "rolled back" results, to append
    kept: list[ToolCallData]  # calls that stay in the model's view
    closes_round: bool  # every call of the round is answered after it


def rollback(
    task_id: str,
    rs: RoundState,
    first_seq: int,
    last_seq: int,
    pending: list[NewEntry],
    reason: str,
    not_run: Collection[str] = (),
    cause: str = "the task was paused",
) -> RollbackPlan:
    """What takes round `rs.round` out of the model's view; UI entries are never voided.

    A call the model must not repeat stays in the model's view: a never-replay
    call that has its result (it ran, or ran and was cut short), or one whose
    sub-task is still running. If there is any, the assistant message and those
    results are kept, every other call's result is voided and answered anew
    with ROLLED_BACK (so each call keeps exactly one result in the view), and
    the round closes once all are answered. If there is none, the round's API
    entries from `first_seq` on are voided and the model is asked the round again.
    `pending` are entries about to be committed after `last_seq`, in order.
    Calls in `not_run` (an approval never given) were never run: never kept.
    `cause` is why, as the model reads it in each "rolled back" result.
    """
    r, tid = rs.round, task_id
    result_seqs, handoff_seqs = dict(rs.result_seqs), dict(rs.handoff_seqs)
    for i, e in enumerate(pending):
        if e.kind is EntryKind.TOOL_RESULT and e.round == r:
            result_seqs[result_of(e)["tool_call_id"]] = last_seq + 1 + i
        elif e.kind is EntryKind.HANDOFF and e.round == r:
            handoff_seqs[handoff_of(e)["call_id"]] = last_seq + 1 + i
    calls = (
        [c for c in (rs.assistant.tool_calls or []) if c.id in rs.intents]
        if (rs.assistant is not None)
        else []
    )
    children = {c for c, w in rs.open_waits.items() if w["wait"] == "subtask"}
    kept = [
        c
        for c in calls
        if rs.intents[c.id].get("replay") != "safe"
        and (c.id in result_seqs or c.id in children)
        and c.id not in not_run
    ]
    if not kept:
        return RollbackPlan([_void(tid, r, first_seq, last_seq + len(pending), reason)], [], False)
    out: list[NewEntry] = []
    kept_ids = {c.id for c in kept}
    for c in calls:
        if c.id in kept_ids:
            continue
        seq = result_seqs.get(c.id)
        if seq is not None:
            # A handoff's entry (right after its result) goes with the result.
            out.append(_void(tid, r, seq, handoff_seqs.get(c.id, seq), reason))
        out += result_entries(tid, r, c.id, rolled_back(cause), "rolled_back")
    return RollbackPlan(out, kept, all(c.id in result_seqs for c in kept))


def _void(task_id: str, rnd: int, from_seq: int, to_seq: int, reason: str) -> NewEntry:
    payload = rollback_marker("api", from_seq, to_seq, reason)
    return NewEntry(task_id=task_id, kind=EntryKind.ROLLBACK, round=rnd, payload=payload)
