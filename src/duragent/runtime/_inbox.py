"""Messages into a live task: double texting (docs/steering.md, docs/architecture.md §3).

A sent message is one commit: a record in the log (a `message` checkpoint and a
notice) and its place in the task row's inbox (`config["inbox"]`), made under
the row's version so no concurrent write can drop it. The runner takes it at a
safe point, where no tool call waits for its result: it commits the message as
a user message of the next round, a `delivered` record and the inbox without
it, in one commit fenced by its lease and guarded by the row's version (a
message sent meanwhile makes it look again). A message leaves the inbox only
in the commit that puts it in the model's view, so it is taken exactly once,
and a crash on either side of that commit loses nothing.

What a new message does while a turn runs (the task is pending, running or
waiting) is the session's strategy, named as in LangGraph (`multitask_strategy`):

- `enqueue` (default): taken when the current turn ends (the model answers
  without tool calls); the task goes on with it, the model seeing its answer.
- `reject`: refused (`TaskBusy`, REST 409).
- `interrupt`: a running task stops at the next safe point as a pause does
  (running tools get the grace period), then goes on at once with the message.
- `rollback`: the same, with the round in progress rolled back as by
  `pause(rollback=True)`.

A waiting task stops waiting under `interrupt` and `rollback` (`cut_plan`):
in the commit that sends the message, every open timer, question and approval
of its round is answered "interrupted" (an approval's call never runs), with
`rollback` the round is also rolled back, and the task goes back to the queue
to take the message. A task waiting for a sub-task keeps waiting (the sub-task
runs on): the message is taken when it ends. A paused or blocked task runs no
turn: the message waits in its inbox until the task is resumed. A finished task
takes no messages (continue its conversation with `continue_session` or `fork`).

A message sent with a `request_id` keeps it on its inbox item and on its
`message` record in the log, which stays when the item leaves the inbox: the
same id sent to the task again, before or after the message was taken, sends
nothing (another text under it is a `DuplicateRequest`, runtime/_sending.py).
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from duragent.errors import UsageError
from duragent.runtime._log import RoundState, api_entry, notice, result_entries, rollback
from duragent.store._commits import Commit, TaskPatch
from duragent.types import EntryKind, NewEntry, Task, TaskStatus, UserMessage, new_id

MultitaskStrategy = Literal["enqueue", "reject", "interrupt", "rollback"]
STRATEGIES: tuple[str, ...] = get_args(MultitaskStrategy)
MAX_MESSAGE_CHARS = 100_000

# A turn runs while the task is in one of these: a new message meets the strategy.
BUSY = (TaskStatus.PENDING, TaskStatus.RUNNING, TaskStatus.WAITING)


def check_strategy(value: str) -> MultitaskStrategy:
    if value not in STRATEGIES:
        raise UsageError(
            f"unknown multitask_strategy {value!r}; use one of: {', '.join(STRATEGIES)}"
        )
    return value  # type: ignore[return-value]


def strategy_of(task: Task, default: str = "enqueue") -> MultitaskStrategy:
    """The strategy pinned on the task at submit (its agent's, or the caller's)."""
    return check_strategy(str(task.config.get("multitask_strategy") or default))


def inbox(task: Task) -> list[dict[str, Any]]:
    """The messages sent to the task and not yet in its model's view, oldest first."""
    items = task.config.get("inbox")
    return [dict(m) for m in items if isinstance(m, dict)] if isinstance(items, list) else []


def send_commit(
    task: Task, text: str, strategy: MultitaskStrategy, request_id: str | None = None
) -> tuple[Commit, str]:
    """The commit that puts `text` in the task's inbox (and its id), guarded by the
    task's version and status; under interrupt/rollback a running task also gets
    the control request that stops it at its next safe point. A `request_id` is
    kept on the inbox item and on the log's `message` record, which outlives it."""
    message_id = new_id()
    busy = task.status in BUSY
    at = "turn_end" if strategy == "enqueue" and busy else "next"
    item = {"id": message_id, "text": text, "at": at}
    if request_id is not None:
        item["request_id"] = request_id
    config = {**task.config, "inbox": [*inbox(task), item]}
    changes: dict[str, Any] = {"config": config}
    # A pause or abort asked before stays as asked.
    interrupts = strategy in ("interrupt", "rollback") and task.status is TaskStatus.RUNNING
    if interrupts and task.control is None:
        changes["control"] = {
            "action": "pause",
            "rollback": strategy == "rollback",
            "resume": True,
            "token": message_id,
            "reason": "a new message",
        }
    r = task.iterations + 1
    when = {
        "turn_end": "it is taken when the current turn ends",
        "next": "it is taken at the next safe point"
        if busy
        else "it is taken when the task runs again",
    }[at]
    entries = [
        NewEntry(
            task_id=task.id,
            kind=EntryKind.CHECKPOINT,
            round=r,
            payload={
                "type": "message",
                "id": message_id,
                "text": text,
                "strategy": strategy,
                **({"request_id": request_id} if request_id is not None else {}),
            },
        ),
        notice(task.id, r, f"New message ({strategy}); {when}."),
    ]
    patch = TaskPatch(task.id, changes, expect_status=[task.status], expect_version=task.version)
    return Commit(entries=entries, patches=[patch]), message_id


# What the model sees for a wait a new message cut short.
CUT_TEXT = {
    "timer": "Interrupted by a new message before the timer ended.",
    "input": "Interrupted by a new message instead of an answer.",
    "approval": "Not run: a new message interrupted the wait for its approval.",
}


def cut_plan(
    task: Task, rs: RoundState, roll_back: bool, pending: list[NewEntry]
) -> tuple[list[NewEntry], dict[str, Any]] | None:
    """What ends a waiting task's wait for a new message: each open timer, question
    and approval of round `rs` answered "interrupted", with `roll_back` the round
    rolled back (`log.rollback`: a never-replay call that ran, a sleep or a question
    included, keeps its result; a call that waited for its approval never ran), and
    the task pending again. The entries go after `pending` (committed with them);
    None if it waits for a sub-task (which runs on) or for nothing."""
    waits = rs.open_waits
    if not waits or any(w["wait"] == "subtask" for w in waits.values()):
        return None
    r, tid = rs.round, task.id
    added = [notice(tid, r, "The wait was cut short by a new message.")]
    for cid, w in waits.items():
        added += result_entries(tid, r, cid, CUT_TEXT[w["wait"]], "interrupted")
    changes: dict[str, Any] = {"status": TaskStatus.PENDING, "wake_at": None}
    if roll_back and rs.api_seqs:
        unapproved = {cid for cid, w in waits.items() if w["wait"] == "approval"}
        first = min(rs.api_seqs)
        plan = rollback(
            tid,
            rs,
            first,
            task.last_seq,
            [*pending, *added],
            "a new message",
            unapproved,
            cause="a new message came in",
        )
        added += plan.entries
        if plan.closes_round:
            changes["iterations"] = r
    elif all(cid in waits for cid in rs.missing):
        changes["iterations"] = r  # those were the round's last results
    return added, changes


def sent_before(task: Task, request_id: str) -> dict[str, Any] | None:
    """The message of the task's inbox sent with `request_id`, if it is still there
    (once taken, only the log's `message` record holds the request id)."""
    return next((m for m in inbox(task) if m.get("request_id") == request_id), None)


def due(task: Task, *, turn_end: bool) -> list[dict[str, Any]]:
    """The inbox messages to take at this safe point: all of them at a turn's end,
    else those sent to interrupt (or while the task ran no turn)."""
    return [m for m in inbox(task) if turn_end or m.get("at") != "turn_end"]


def delivery(
    task: Task, items: list[dict[str, Any]], rnd: int
) -> tuple[list[NewEntry], dict[str, Any], list[UserMessage]]:
    """The entries that put `items` in the model's view as user messages of round
    `rnd`, the task's config without them, and the messages themselves."""
    taken = {m["id"] for m in items}
    entries: list[NewEntry] = []
    messages = []
    for m in items:
        message = UserMessage(content=str(m["text"]))
        messages.append(message)
        entries.append(api_entry(task.id, rnd, message))
        entries.append(
            NewEntry(
                task_id=task.id,
                kind=EntryKind.CHECKPOINT,
                round=rnd,
                payload={"type": "delivered", "message_id": m["id"]},
            )
        )
    rest = [m for m in inbox(task) if m["id"] not in taken]
    config = {k: v for k, v in task.config.items() if k != "inbox"}
    if rest:
        config["inbox"] = rest
    return entries, config, messages


__all__ = [
    "BUSY",
    "MAX_MESSAGE_CHARS",
    "STRATEGIES",
    "MultitaskStrategy",
    "check_strategy",
    "delivery",
    "due",
    "inbox",
    "send_commit",
    "sent_before",
    "strategy_of",
]
