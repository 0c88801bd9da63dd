"""Answering a parked task: a person's input, an approval, a finished sub-task.

Whoever answers commits the call's result (or the approval decision) and the
task's next status in one commit, guarded by the task's version so two
answers can never both land.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from duragent._payloads import WaitCheckpoint
from duragent.errors import Conflict, UsageError
from duragent.llm._base import parse_arguments
from duragent.runtime._agent import Agent
from duragent.runtime._approvals import Decision, decision_payload, wake_times
from duragent.runtime._deadlines import wake_time
from duragent.runtime._log import (
    RoundState,
    decision_entry,
    read_round,
    result_entries,
    wait_reason,
)
from duragent.store._commits import TaskPatch
from duragent.store._protocol import Store
from duragent.types import NewEntry, Task, TaskStatus


async def open_round(store: Store, task: Task) -> RoundState:
    """The task's round in progress (the one after its last closed one), as its log has it."""
    return read_round(await store.entries(task.id, after_seq=task.round_seq), task.iterations + 1)


async def open_waits(store: Store, task: Task) -> dict[str, WaitCheckpoint]:
    return (await open_round(store, task)).open_waits


@dataclass
class Answer:
    """What answers one open wait: a result for the model, an approval decision, or both."""

    content: str | None = None
    outcome: str = "ok"
    decision: dict[str, Any] | None = None  # approved, reason, and edited arguments if any


async def resolution(
    store: Store,
    task: Task,
    call_id: str,
    *,
    content: str | None = None,
    outcome: str = "ok",
    decision: tuple[bool, str | None] | None = None,
) -> tuple[list[NewEntry], TaskPatch]:
    """The entries and task patch that answer one open wait of `task`."""
    d = None if decision is None else {"approved": decision[0], "reason": decision[1]}
    return await resolve(store, task, {call_id: Answer(content, outcome, d)})


async def resolve(
    store: Store, task: Task, answers: Mapping[str, Answer]
) -> tuple[list[NewEntry], TaskPatch]:
    """The entries and task patch that answer several open waits of `task`, in one commit."""
    if task.status not in (TaskStatus.WAITING, TaskStatus.PAUSED):
        raise Conflict(f"task {task.id!r} is {task.status.value}, not waiting for an answer")
    rs = await open_round(store, task)
    r = rs.round
    entries: list[NewEntry] = []
    for call_id, answer in answers.items():
        if call_id not in rs.open_waits:
            raise UsageError(f"task {task.id!r} has no open wait for call {call_id!r}")
        if answer.decision is not None:
            entries.append(decision_entry(task.id, r, call_id, **answer.decision))
        if answer.content is not None:
            entries += result_entries(task.id, r, call_id, answer.content, answer.outcome)
    guard = {"expect_status": [task.status], "expect_version": task.version}
    if task.status is TaskStatus.PAUSED:
        # Record the answer; the task stays paused and sees it when resumed.
        return entries, TaskPatch(task.id, {}, **guard)  # type: ignore[arg-type]
    left = {c: w for c, w in rs.open_waits.items() if c not in answers}
    if left:
        changes: dict[str, Any] = {
            "status": TaskStatus.WAITING,
            "status_reason": wait_reason(left),
            "wake_at": wake_time(task, wake_times(left.values())),  # a deadline wakes it too
        }
    else:
        answered = {c for c, a in answers.items() if a.content is not None}
        missing = [c for c in rs.missing if c not in answered]
        changes = {"status": TaskStatus.PENDING, "wake_at": None}
        if not missing:
            changes["iterations"] = r  # that was the round's last result
    return entries, TaskPatch(task.id, changes, **guard)  # type: ignore[arg-type]


async def person_answers(
    store: Store,
    task: Task,
    agent: Agent | None,
    *,
    approve: bool | None = None,
    reason: str | None = None,
    answer: str | None = None,
    call_id: str | None = None,
    arguments: dict[str, Any] | None = None,
    decisions: Mapping[str, Decision] | None = None,
) -> dict[str, Answer]:
    """What a person's respond() means for the task's open questions and approvals.

    Checked before anything is written: an unknown call, an approval answered
    without a decision, edited arguments the tool's schema refuses, an expired
    approval each raise, and nothing is committed.
    """
    rs = await open_round(store, task)
    waits = {c: w for c, w in rs.open_waits.items() if w["wait"] in ("input", "approval")}
    if decisions is not None:
        if any(v is not None for v in (approve, reason, answer, call_id, arguments)):
            raise UsageError("pass decisions= alone, or one answer with approve=/answer=")
        if not decisions:
            raise UsageError("decisions= is empty: give a Decision per call id")
        asked = dict(decisions)
    else:
        if call_id is None:
            if len(waits) != 1:
                raise UsageError(
                    f"task {task.id!r} waits for {len(waits)} answers; pass call_id= one of "
                    f"{sorted(waits)} (or decisions= for several approvals)"
                    if waits
                    else f"task {task.id!r} is not waiting for input"
                )
            (call_id,) = waits
        wait = waits.get(call_id)
        if wait is None or wait["wait"] != "approval":
            if wait is None:
                raise UsageError(
                    f"task {task.id!r} has no question or approval open for call {call_id!r}"
                )
            if answer is None:
                raise UsageError("this call waits for an answer: pass answer='...'")
            return {call_id: Answer(content=answer)}
        if approve is None:
            raise UsageError("this call waits for an approval: pass approve=True or False")
        try:
            asked = {call_id: Decision(approve=approve, reason=reason, arguments=arguments)}
        except ValidationError as exc:
            raise UsageError(exc.errors()[0]["msg"]) from None
    out: dict[str, Answer] = {}
    for cid, decision in asked.items():
        wait = waits.get(cid)
        if wait is None or wait["wait"] != "approval":
            open_ = sorted(c for c, w in waits.items() if w["wait"] == "approval")
            raise UsageError(
                f"task {task.id!r} has no approval open for call {cid!r}; open: {open_ or 'none'}"
            )
        if wait.get("rerun"):  # asked by the tool itself: it reads the decision when run again
            if decision.arguments is not None:
                raise UsageError(
                    f"call {cid!r} asks to approve a step inside it ({wait.get('tool')}): "
                    "approve or deny it, without edited arguments"
                )
            out[cid] = Answer(decision={"approved": decision.approve, "reason": decision.reason})
            continue
        name = rs.intents[cid]["name"]
        model_args = _model_arguments(rs, cid)
        tool = agent.tool_map.get(name) if agent is not None else None
        d = decision_payload(cid, wait, decision, tool=tool, tool_name=name, arguments=model_args)
        if decision.approve:
            out[cid] = Answer(decision=d)
        else:
            text = f"The user denied this call: {decision.reason or 'no reason given'}"
            out[cid] = Answer(text, "denied", d)
    return out


def _model_arguments(rs: RoundState, call_id: str) -> dict[str, Any]:
    for call in (rs.assistant.tool_calls or []) if rs.assistant else []:
        if call.id == call_id:
            try:
                return parse_arguments(call.function.arguments)
            except ValueError:
                return {}
    return {}


async def child_resolution(
    store: Store, child: Task, content: str, outcome: str
) -> tuple[list[NewEntry], list[TaskPatch]]:
    """What a finishing sub-task commits to its parent (nothing if the parent moved on)."""
    if child.parent_id is None:
        return [], []
    parent = await store.get_task(child.parent_id)
    if parent.status.terminal:
        return [], []
    for call_id, wait in (await open_waits(store, parent)).items():
        if wait["wait"] == "subtask" and wait.get("child_id") == child.id:
            entries, patch = await resolution(
                store, parent, call_id, content=content, outcome=outcome
            )
            return entries, [patch]
    return [], []
