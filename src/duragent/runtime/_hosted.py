"""Hosted loops: a task whose agent loop runs inside one tool call, each of its
model requests and tool calls a durable step (duragent.pydantic_ai).

Such a task's own rounds are few (the call, then its answer); its loop's
rounds are in its steps' names, `<what>:<round>[:<more>]` (`model:2`,
`tool:2:<call id>`). A fork of it is taken at one of those rounds: the new
task's log holds the source's user message and the steps of rounds 1..N, and
its run replays them (the call carries over the steps of earlier calls) and
goes on live from round N + 1. The marker is `config["hosted_loop"]` (the
tool's name), written at submit from `Agent.hosted_loop`.
"""

from __future__ import annotations

from typing import Any

from duragent.errors import UsageError
from duragent.runtime._log import notice
from duragent.runtime._steering import Edit, fork_config
from duragent.store._commits import CopyEntries
from duragent.store._protocol import Store
from duragent.types import Entry, EntryKind, NewEntry, Task, new_id

HOSTED_LOOP = "hosted_loop"
STEP_TYPES = ("step", "step_started")


def hosted_tool(task: Task) -> str | None:
    """The tool the task's loop runs in, or None for a native task."""
    tool = task.config.get(HOSTED_LOOP)
    return tool if isinstance(tool, str) else None


def step_round(step: str) -> int | None:
    """The loop round a step is named for (`model:3` -> 3), None if it names none."""
    parts = step.split(":")
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None


async def loop_steps(store: Store, task: Task) -> list[Entry]:
    """The task's step records (finished and started), in log order."""
    entries = await store.entries(task.id, kinds=[EntryKind.CHECKPOINT])
    return [e for e in entries if e.payload.get("type") in STEP_TYPES]


def closed_rounds(task: Task, steps: list[Entry]) -> int:
    """The loop rounds a fork may be taken at: 1..this. A round is closed once a
    step of the next one began (its tools are done by then), or the task ended."""
    top = max((step_round(e.payload["step"]) or 0 for e in steps), default=0)
    return top if task.status.terminal else max(top - 1, 0)


async def new_hosted_fork(
    store: Store, source: Task, at_round: int, edit: Edit | None, request_id: str | None
) -> tuple[Task, list[NewEntry | CopyEntries]]:
    """The pending fork of a hosted-loop task at loop round `at_round`, and its log."""
    tool = hosted_tool(source)
    if edit is not None and not edit.empty:
        raise UsageError(
            f"task {source.id!r} runs its loop inside its {tool!r} call, whose messages a "
            "fork cannot edit: fork it without an edit"
        )
    if at_round < 1:
        raise UsageError(f"at_round must be 1 or more, not {at_round}")
    steps = await loop_steps(store, source)
    closed = closed_rounds(source, steps)
    if at_round > closed:
        raise UsageError(
            f"task {source.id!r} has {closed} closed rounds of its {tool!r} loop; "
            f"round {at_round} cannot be forked" + (f" (fork at 1..{closed})" if closed else " yet")
        )
    messages = await store.entries(source.id, kinds=[EntryKind.API_MESSAGE])
    firsts = [e for e in messages if e.round == 1][:1]  # the prompt (the task's input)
    fork_id = new_id()
    record: dict[str, Any] = {"type": "fork", "task_id": source.id, "round": at_round}
    log: list[NewEntry | CopyEntries] = [
        NewEntry(task_id=fork_id, kind=EntryKind.CHECKPOINT, payload={**record, "edit": None}),
        notice(fork_id, 0, f"Forked from task {source.id} at round {at_round} of its loop."),
    ]
    # Round 0: the steps are carried over to the fork's own call, not part of a round of it.
    log += [
        NewEntry(task_id=fork_id, kind=EntryKind.CHECKPOINT, payload=dict(e.payload))
        for e in steps
        if (step_round(e.payload["step"]) or 0) <= at_round
    ]
    log += [
        NewEntry(task_id=fork_id, kind=EntryKind.API_MESSAGE, round=1, payload=dict(e.payload))
        for e in firsts
    ]
    task = Task(
        id=fork_id,
        agent=source.agent,
        agent_version=source.agent_version,  # its steps were made by that code
        owner=source.owner,
        session_id=source.session_id,
        request_id=request_id,
        input=source.input,
        config=fork_config(source, at_round, edit),
        context=dict(source.context),
    )
    return task, log
