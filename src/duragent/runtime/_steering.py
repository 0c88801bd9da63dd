"""Steering a task after the fact: its history round by round, and forks (docs/steering.md).

History is read from the log: each round's facts come from `read_round`, the
same reader recovery uses. A fork is a new task, never a change to the old one:
its log starts with a record of the fork, then the source's visible API
entries through round N (as they are: every call of a closed round already has
its result, so no tool of a copied round runs again), then its edits as
entries (a void marker, a replacing or appended user message). The store
copies the entries itself (`Store.create_fork`): a fork reads only its
source's entry heads, not their payloads. Its model view
is built by `build_model_view` like every other, so the fork's own log
explains what the model sees.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from duragent._payloads import (
    api_of,
    compaction_of,
    handoff_of,
    is_voided,
    rollback_marker,
    rollback_of,
    voided_ranges,
)
from duragent.errors import UsageError
from duragent.runtime._log import RoundState, notice, read_round
from duragent.store._commits import CopyEntries, EntryHead
from duragent.store._protocol import Store, iter_entries
from duragent.types import (
    API_KINDS,
    Entry,
    EntryKind,
    NewEntry,
    Task,
    TaskStatus,
    UserMessage,
    dump_message,
    new_id,
)

RoundStatus = Literal["complete", "open", "voided"]


class CustomEvent(BaseModel):
    """An event a tool emitted (`ctx.emit`): its name and JSON data."""

    name: str
    data: Any = None


class CallRecord(BaseModel):
    """One tool call of a round and what became of it (no result yet: `outcome` is None)."""

    call_id: str
    name: str
    arguments: str = Field(description="The arguments as the model wrote them (JSON text).")
    edited_arguments: dict[str, Any] | None = Field(
        default=None,
        description="The arguments a person approved the call with, when they edited them.",
    )
    result: str | None = None
    outcome: str | None = Field(
        default=None, description="ok, error, denied or interrupted; None while unanswered."
    )
    events: list[CustomEvent] = Field(
        default_factory=list, description="The custom events the call emitted (ctx.emit)."
    )


class HandoffRecord(BaseModel):
    """A handoff: the model took the transfer tool of call `call_id`; agent `to_agent`
    runs the rounds after this one."""

    call_id: str
    from_agent: str
    to_agent: str


class RoundRecord(BaseModel):
    """The state of a task at one step: what the model was shown and what it did."""

    round: int
    first_seq: int
    last_seq: int
    status: RoundStatus = Field(
        description="complete: closed, every call answered (a fork may start here); "
        "open: in progress or waiting; voided: rolled back, the model no longer sees it."
    )
    voided: bool = Field(
        description="Some of this round's model messages were rolled back "
        "(a redone round is complete or open and still says so)."
    )
    user: list[str] = Field(default_factory=list, description="User messages given this round.")
    assistant: str | None = Field(default=None, description="What the model said (its text).")
    calls: list[CallRecord] = Field(default_factory=list)
    agent: str | None = Field(
        default=None, description="The agent that ran the round (another after a handoff)."
    )
    handoff: HandoffRecord | None = Field(
        default=None, description="The handoff the round took, in force (not rolled back)."
    )


class CompactionRecord(BaseModel):
    """A compaction: from it on, the model sees `head` instead of rounds
    `from_round`..`to_round` (their entries stay in the log, and in `rounds`)."""

    seq: int
    round: int = Field(description="The round whose request it was made for.")
    how: str = Field(description="elided (large tool results shortened), summarised or custom.")
    from_round: int
    to_round: int
    upto: int = Field(description="The last seq it replaces in the model's view.")
    summary: str | None = None
    elided: int | None = Field(default=None, description="Tool results shortened.")
    reason: str | None = Field(default=None, description="threshold or overflow.")


class ForkedFrom(BaseModel):
    task_id: str
    round: int


class History(BaseModel):
    task_id: str
    status: TaskStatus
    iterations: int = Field(description="Closed rounds: a fork may be taken at 1..iterations.")
    forked_from: ForkedFrom | None = None
    rounds: list[RoundRecord]
    compactions: list[CompactionRecord] = Field(
        default_factory=list,
        description="Where the model's view was compacted to fit its context window, in order.",
    )


class Edit(BaseModel):
    """Changes a fork makes to the source's view, applied in this order.

    `drop_last_assistant` voids the last assistant message and the tool results
    answering it; `replace_last_user` voids the last user message and puts the
    new text in its place; `append_user` adds a user message for the next round.
    """

    model_config = ConfigDict(extra="forbid")

    replace_last_user: str | None = Field(default=None, min_length=1)
    append_user: str | None = Field(default=None, min_length=1)
    drop_last_assistant: bool = False

    @property
    def empty(self) -> bool:
        return (
            self.replace_last_user is None
            and self.append_user is None
            and not self.drop_last_assistant
        )


def forked_from(task: Task) -> ForkedFrom | None:
    link = task.config.get("forked_from")
    return ForkedFrom.model_validate(link) if isinstance(link, dict) else None


async def task_history(store: Store, task: Task) -> History:
    entries = [e async for e in iter_entries(store, task.id)]
    markers = [e for e in entries if e.kind is EntryKind.ROLLBACK]
    voided = voided_ranges(rollback_of(m) for m in markers)
    by_round: dict[int, list[Entry]] = defaultdict(list)
    for e in entries:
        by_round[e.round].append(e)
    rounds = []
    agent = task.agent  # the agent in force, handoff after handoff
    for r in sorted(by_round):
        own = by_round[r]
        api = [e for e in own if e.kind in API_KINDS]
        if r == 0 or not (api or any(e.kind is EntryKind.TOOL_INTENT for e in own)):
            continue  # round 0 is status entries and continued-session history
        rs = read_round([*own, *markers], r)
        was_voided = any(is_voided(e.seq, voided) for e in api)
        status: RoundStatus
        if r <= task.iterations:
            status = "complete"
        elif rs.assistant is None and was_voided:
            status = "voided"
        else:
            status = "open"
        calls = []
        if rs.assistant is not None:
            for call in rs.assistant.tool_calls or ():
                res = rs.results.get(call.id)
                calls.append(
                    CallRecord(
                        call_id=call.id,
                        name=call.function.name,
                        arguments=call.function.arguments,
                        edited_arguments=decided.get("arguments")
                        if (decided := rs.decisions.get(call.id))
                        else None,
                        result=None if res is None else res.get("content"),
                        outcome=None if res is None else res.get("outcome", "ok"),
                        events=[
                            CustomEvent(name=ev.get("event", ""), data=ev.get("data"))
                            for ev in rs.events.get(call.id, ())
                        ],
                    )
                )
        users = [
            m.get("content") or ""
            for e in api
            if (m := api_of(e))["role"] == "user" and not is_voided(e.seq, voided)
        ]
        rounds.append(
            RoundRecord(
                round=r,
                first_seq=own[0].seq,
                last_seq=own[-1].seq,
                status=status,
                voided=was_voided,
                user=users,
                assistant=rs.assistant.content if rs.assistant is not None else None,
                calls=calls,
                agent=agent,
                handoff=_handoff_record(own, rs),
            )
        )
        if rounds[-1].handoff is not None:
            agent = rounds[-1].handoff.to_agent
    return History(
        task_id=task.id,
        status=task.status,
        iterations=task.iterations,
        forked_from=forked_from(task),
        rounds=rounds,
        compactions=[compaction_record(e) for e in entries if e.kind is EntryKind.COMPACTION],
    )


def _handoff_record(own: list[Entry], rs: RoundState) -> HandoffRecord | None:
    """The round's handoff in force, if it took one (runtime/_handoffs.py)."""
    seqs = set(rs.handoff_seqs.values())
    for e in own:
        if e.kind is EntryKind.HANDOFF and e.seq in seqs:
            h = handoff_of(e)
            return HandoffRecord(call_id=h["call_id"], from_agent=h["from"], to_agent=h["to"])
    return None


def compaction_record(e: Entry) -> CompactionRecord:
    c = compaction_of(e)
    return CompactionRecord(
        seq=e.seq,
        round=e.round,
        how=c["how"],
        from_round=c["from_round"],
        to_round=c["to_round"],
        upto=c["upto"],
        summary=c.get("summary"),
        elided=c.get("elided"),
        reason=c.get("reason"),
    )


async def check_forkable(store: Store, source: Task, at_round: int) -> None:
    """Refuse a fork at a round that is not closed: some call of it may have no result.

    Copying an unanswered call would leave the fork to re-run (or declare
    interrupted) a tool the source may be running right now; forking at the
    last closed round and appending a message is the safe equivalent.
    """
    if at_round < 1:
        raise UsageError(f"at_round must be 1 or more, not {at_round}")
    if at_round <= source.iterations:
        return
    if at_round == source.iterations + 1:
        rs = read_round(await store.entries(source.id, after_seq=source.round_seq), at_round)
        if rs.missing:
            raise UsageError(
                f"round {at_round} of task {source.id!r} is not complete: calls "
                f"{', '.join(rs.missing)} have no result yet, so it cannot be forked there; "
                f"fork at round {source.iterations} or later once the round closes"
                if source.iterations
                else f"round {at_round} of task {source.id!r} is not complete: calls "
                f"{', '.join(rs.missing)} have no result yet, so it cannot be forked there"
            )
        raise UsageError(
            f"round {at_round} of task {source.id!r} is not complete (the model has not "
            f"finished it); a fork can be taken at rounds 1..{source.iterations}"
            if source.iterations
            else f"task {source.id!r} has no complete round yet to fork from"
        )
    raise UsageError(
        f"task {source.id!r} has {source.iterations} complete rounds; "
        f"round {at_round} does not exist yet"
    )


async def fork_log(
    store: Store, source: Task, fork_id: str, at_round: int, edit: Edit | None
) -> list[NewEntry | CopyEntries]:
    """The fork's log: the record of the fork, the copied view, then the edits.

    The store copies the visible entries itself (`Store.create_fork`), so their
    payloads never pass through Python (the copy still writes their bytes
    again). Only the source's rollback markers are read, and, for an edit
    that voids copied messages, its entry heads (seq, kind, round, role).
    """
    markers = await store.entries(source.id, kinds=(EntryKind.ROLLBACK,))
    voided = voided_ranges(rollback_of(e) for e in markers)
    record = {
        "type": "fork",
        "task_id": source.id,
        "round": at_round,
        "edit": edit.model_dump(exclude_defaults=True) if edit and not edit.empty else None,
    }
    out: list[NewEntry | CopyEntries] = [
        NewEntry(task_id=fork_id, kind=EntryKind.CHECKPOINT, payload=record),
        notice(fork_id, 0, f"Forked from task {source.id} at round {at_round}."),
    ]
    if edit is not None and (edit.drop_last_assistant or edit.replace_last_user is not None):
        out += await _edited_copy(store, source, fork_id, at_round, edit, voided, len(out))
    else:
        out += [
            CopyEntries(source.id, lo, hi, COPIED_KINDS, at_round)
            for lo, hi in _shown_ranges(voided, source.last_seq)
        ]
    if edit is not None and edit.append_user is not None:
        out.append(
            NewEntry(
                task_id=fork_id,
                kind=EntryKind.API_MESSAGE,
                round=at_round + 1,
                payload=dump_message(UserMessage(content=edit.append_user)),
            )
        )
    return out


# A fork's copy: the view, and the handoffs that say which agent runs it.
COPIED_KINDS = (EntryKind.API_MESSAGE, EntryKind.TOOL_RESULT, EntryKind.HANDOFF)


def _shown_ranges(voided: list[tuple[int, int]], last_seq: int) -> list[tuple[int, int]]:
    """Seqs 1..last_seq less the voided ranges, as ranges."""
    out = []
    lo = 1
    for v_lo, v_hi in sorted(voided):
        if v_lo > lo:
            out.append((lo, min(v_lo - 1, last_seq)))
        lo = max(lo, v_hi + 1)
    if lo <= last_seq:
        out.append((lo, last_seq))
    return [(a, b) for a, b in out if a <= b]


async def _edited_copy(
    store: Store,
    source: Task,
    fork_id: str,
    at_round: int,
    edit: Edit,
    voided: list[tuple[int, int]],
    head: int,
) -> list[NewEntry | CopyEntries]:
    """The copy, a replacing user message and the void markers of an edit.

    The void markers name the fork's seqs of copied entries, so every copied
    entry's position is planned here, from the source's entry heads; runs of
    them are copied by the store. `head` entries come before the copy.
    """
    copied: list[EntryHead] = []
    breaks: set[int] = set()  # copied indexes right after a hidden entry: a run ends there
    hidden = False
    for h in await store.entry_heads(source.id, kinds=COPIED_KINDS):
        if h.round > at_round or is_voided(h.seq, voided):
            hidden = True
            continue
        if hidden and copied:
            breaks.add(len(copied))
        copied.append(h)
        hidden = False
    live = list(range(len(copied)))  # indexes of copied entries not voided by an edit
    voids: list[tuple[int, int, str]] = []  # (first, last) copied index, reason
    inserted: dict[int, NewEntry] = {}  # copied index -> the entry that goes right after it
    if edit.drop_last_assistant:
        last = next((i for i in reversed(live) if copied[i].role == "assistant"), None)
        if last is None:
            raise UsageError(f"rounds 1..{at_round} of task {source.id!r} have no model message")
        # Its tool results follow it within its (closed) round: they go with it.
        voids.append((last, len(copied) - 1, "fork: dropped the last assistant message"))
        live = [i for i in live if i < last]
    if edit.replace_last_user is not None:
        last = next((i for i in reversed(live) if copied[i].role == "user"), None)
        if last is None:
            raise UsageError(f"rounds 1..{at_round} of task {source.id!r} have no user message")
        # The replacement goes right after the message it replaces, so the view keeps its order.
        inserted[last] = NewEntry(
            task_id=fork_id,
            kind=EntryKind.API_MESSAGE,
            round=copied[last].round,
            payload=dump_message(UserMessage(content=edit.replace_last_user)),
        )
        voids.append((last, last, "fork: replaced the last user message"))
    out: list[NewEntry | CopyEntries] = []
    seq_of: list[int] = []  # copied index -> its seq in the fork
    seq = head
    run: list[EntryHead] = []

    def flush() -> None:
        if run:
            out.append(
                CopyEntries(source.id, run[0].seq, run[-1].seq, COPIED_KINDS, at_round, len(run))
            )
            run.clear()

    for i, h in enumerate(copied):
        if i in breaks:
            flush()
        seq += 1
        seq_of.append(seq)
        run.append(h)
        if i in inserted:
            flush()
            out.append(inserted[i])
            seq += 1
    flush()
    return out + [
        NewEntry(
            task_id=fork_id,
            kind=EntryKind.ROLLBACK,
            round=at_round,
            payload=rollback_marker("api", seq_of[lo], seq_of[hi], why),
        )
        for lo, hi, why in voids
    ]


_NOT_INHERITED = (
    "forked_from",
    "deadline",
    "inbox",
    "compacted",
    "output_failures",
    "guardrail_corrections",
)


def fork_request(source_id: str, at_round: int, edit: Edit | None) -> str:
    """What a fork asked for, as a digest kept on it: a request_id used again must
    ask for the same fork (else DuplicateRequest), never get another task."""
    asked = {
        "source": source_id,
        "round": at_round,
        "edit": None if edit is None or edit.empty else edit.model_dump(mode="json"),
    }
    text = json.dumps(asked, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def fork_config(source: Task, at_round: int, edit: Edit | None) -> dict[str, Any]:
    """A fork's config: the source's, less what is not its own, with the fork's link."""
    return {
        # A fork is a new task: the source's deadline and inbox are not its own, and
        # its log holds the source's entries, not its compactions (its view is whole).
        **{k: v for k, v in source.config.items() if k not in _NOT_INHERITED},
        "forked_from": {"task_id": source.id, "round": at_round},
        "fork_request": fork_request(source.id, at_round, edit),
    }


async def new_fork(
    store: Store,
    source: Task,
    at_round: int,
    edit: Edit | None,
    request_id: str | None,
) -> tuple[Task, list[NewEntry | CopyEntries]]:
    """The pending fork task and its log (not yet stored: see `Store.create_fork`)."""
    await check_forkable(store, source, at_round)
    fork_id = new_id()
    log = await fork_log(store, source, fork_id, at_round, edit)
    config = fork_config(source, at_round, edit)
    task = Task(
        id=fork_id,
        agent=source.agent,
        agent_version=source.agent_version,  # its rounds were made by that code
        owner=source.owner,
        session_id=source.session_id,
        request_id=request_id,
        input=source.input,
        config=config,
        context=dict(source.context),
        # The copied rounds are closed: the fork's first own round is at_round + 1,
        # and recovery reads its log from after the copy (the store sets round_seq).
        iterations=at_round,
    )
    return task, log


__all__ = [
    "CallRecord",
    "CompactionRecord",
    "Edit",
    "ForkedFrom",
    "History",
    "RoundRecord",
    "check_forkable",
    "fork_config",
    "fork_log",
    "forked_from",
    "new_fork",
    "task_history",
]
