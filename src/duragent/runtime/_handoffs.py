"""Handoffs: an agent hands the task's conversation on to another agent.

`Agent(handoffs=[other, ...])` offers the model one transfer tool per target,
`transfer_to_<name>` (the name lower-cased, other characters than letters,
digits and `_` as `_`, cut to 64 characters with a hash of the name after
them when longer), described by the target's `handoff_description`, as the
OpenAI Agents SDK names and describes them. When the model takes one, the call's
result is `{"assistant": "<target>"}` and, in the same commit, right after it,
a `handoff` entry (from, to) is appended. From the next round on the target runs
the task on the same conversation: its instructions, tools, handoffs, model and
model settings. The task's own options stay its agent's: limits, retry, output
type and guardrails, context policy, deadline, webhook.

A handoff in a turn with other calls is that turn's last action, as in the
Agents SDK's Runner: the turn's other calls run (and may wait) as usual, and the
target takes over when the round closes. Of several handoffs in one turn the
first is taken; each other one is answered "Multiple handoffs detected, ignoring
this one." (the SDK's words).

Which agent runs round R is read from the log, never kept beside it: the target
of the last handoff entry in force (not voided by a rollback) of a round before
R, else the task's own agent. So a rollback, a fork or a retry from before a
handoff runs the agent of that point. The targets a task may reach, with their
model requests and tool reach, are pinned on it (runtime/_pins.py).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from typing import Any, Protocol

from duragent._payloads import HandoffPayload, handoff_of, is_voided, rollback_of, voided_ranges
from duragent.llm._base import ToolSpec
from duragent.store._protocol import Store
from duragent.types import Entry, EntryKind, NewEntry, Task


class Target(Protocol):
    """What a transfer tool says of the agent it hands to (an Agent)."""

    @property
    def name(self) -> str: ...

    @property
    def handoff_description(self) -> str: ...


_MAX_NAME = 64  # ^[a-zA-Z0-9_-]{1,64}$, OpenAI's and Anthropic's tool name rule
MULTIPLE = "Multiple handoffs detected, ignoring this one."
_NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


def transfer_name(agent: str) -> str:
    """The name of the tool that hands a task to agent `agent`. Providers take tool
    names of at most 64 characters: a longer one is cut and ends with a hash of
    the agent's name, so two long names sharing a beginning stay two tools."""
    name = re.sub(r"\s", "_", f"transfer_to_{agent}")
    name = re.sub(r"[^a-zA-Z0-9_]", "_", name).lower()
    if len(name) <= _MAX_NAME:
        return name
    return f"{name[: _MAX_NAME - 9]}_{hashlib.sha256(agent.encode()).hexdigest()[:8]}"


def transfer_spec(agent: Target) -> ToolSpec:
    """The transfer tool to `agent` as the model sees it."""
    description = f"Handoff to the {agent.name} agent to handle the request. "
    return ToolSpec(
        transfer_name(agent.name), (description + agent.handoff_description).strip(), _NO_ARGUMENTS
    )


def transfer_result(target: str) -> str:
    """The result of a handoff call taken: the target's name, as the Agents SDK says it."""
    return json.dumps({"assistant": target})


def handoff_entry(task_id: str, rnd: int, call_id: str, source: str, target: str) -> NewEntry:
    payload: HandoffPayload = {"call_id": call_id, "from": source, "to": target}
    return NewEntry(task_id=task_id, kind=EntryKind.HANDOFF, round=rnd, payload=dict(payload))


def in_force(entries: Sequence[Entry], rnd: int) -> tuple[str | None, str | None]:
    """From a task's handoff entries and rollback markers: (the agent that runs round
    `rnd`, a handoff of round `rnd` itself, taking effect when it closes); None for
    none (the task's own agent; no handoff yet)."""
    voided = voided_ranges(rollback_of(e) for e in entries if e.kind is EntryKind.ROLLBACK)
    current = pending = None
    for e in entries:
        if e.kind is not EntryKind.HANDOFF or is_voided(e.seq, voided):
            continue
        if e.round < rnd:
            current = handoff_of(e)["to"]
        elif e.round == rnd:
            pending = handoff_of(e)["to"]
    return current, pending


async def read_in_force(
    store: Store, task: Task, reaches_others: bool
) -> tuple[str | None, str | None]:
    """`in_force` for the task's open round, read from its log. Not read (None, None)
    for a task that never could hand off: its agent reaches no other, and it has no
    handoffs pinned (a task re-pinned from an agent that had some keeps `{}`)."""
    if not reaches_others and "handoffs" not in task.config:
        return None, None
    kinds = (EntryKind.HANDOFF, EntryKind.ROLLBACK)
    return in_force(await store.entries(task.id, kinds=kinds), task.iterations + 1)
