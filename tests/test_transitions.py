"""The task lifecycle: the transition table, its reason rules, and every status
change going through `check_transition` (issue 38).

The table is asserted against one written out here, pair by pair, so a dropped
or added entry of `TRANSITIONS` fails a test; the changes the lifecycle allows
(or refuses) are then made through the real Runtime and stores.
"""

from __future__ import annotations

import itertools

import pytest

from duragent import Runtime
from duragent.errors import InvalidTransition
from duragent.store import Commit, Store, TaskPatch
from duragent.types import (
    TERMINAL,
    TRANSITIONS,
    BlockReason,
    EntryKind,
    Task,
    TaskStatus,
    WaitReason,
    check_transition,
)

S = TaskStatus
P, R, PA, W, C, F, A, B = (
    S.PENDING,
    S.RUNNING,
    S.PAUSED,
    S.WAITING,
    S.COMPLETED,
    S.FAILED,
    S.ABORTED,
    S.BLOCKED,
)

# What may follow what, written out (old -> every new it may go to).
EXPECTED: dict[TaskStatus, set[TaskStatus]] = {
    P: {R, PA, A, B, F},
    R: {R, P, PA, W, C, F, A, B},  # R -> R: a takeover; R -> P: a release
    PA: {P, A},
    W: {W, P, R, PA, A, F},
    B: {P, A},
    C: set(),
    F: {P},  # a retry
    A: set(),
}

# A reason each status accepts (None: it takes none).
A_REASON: dict[TaskStatus, str | None] = {W: "input", B: "restart_limit"}


def test_the_table_is_the_one_written_out() -> None:
    assert set(TRANSITIONS) == set(S)
    assert {old: set(new) for old, new in TRANSITIONS.items()} == EXPECTED


def test_terminal_statuses() -> None:
    assert {C, F, A} == TERMINAL
    assert [s for s in S if s.terminal] == [C, F, A]


@pytest.mark.parametrize(("old", "new"), list(itertools.product(S, S)), ids=str)
def test_every_pair_allowed_or_refused_per_the_table(old: TaskStatus, new: TaskStatus) -> None:
    reason = A_REASON.get(new)
    if new in EXPECTED[old]:
        check_transition(old, new, reason)
        return
    with pytest.raises(InvalidTransition) as err:
        check_transition(old, new, reason)
    assert (err.value.old, err.value.new) == (old.value, new.value)
    assert f"from {old.value!r} to {new.value!r}" in str(err.value)


# --- the reason rules: waiting needs a WaitReason, blocked a BlockReason,
# failed may say why (a deadline), every other status takes none.


@pytest.mark.parametrize("reason", list(WaitReason))
def test_waiting_takes_each_wait_reason(reason: WaitReason) -> None:
    check_transition(R, W, reason.value)
    check_transition(W, W, reason)


@pytest.mark.parametrize("reason", list(BlockReason))
def test_blocked_takes_each_block_reason(reason: BlockReason) -> None:
    check_transition(R, B, reason.value)
    check_transition(P, B, reason)


@pytest.mark.parametrize(
    ("new", "reason", "kinds"),
    [
        (W, None, "subtask, timer, input"),
        (W, "restart_limit", "subtask, timer, input"),  # a block's reason
        (W, "nap", "subtask, timer, input"),
        (B, None, "restart_limit, missing_definition, incompatible_store, pinned"),
        (B, "timer", "restart_limit, missing_definition, incompatible_store, pinned"),
        (B, "", "restart_limit, missing_definition, incompatible_store, pinned"),
    ],
)
def test_waiting_and_blocked_need_their_own_kind_of_reason(
    new: TaskStatus, reason: str | None, kinds: str
) -> None:
    with pytest.raises(InvalidTransition) as err:
        check_transition(R, new, reason)
    assert (err.value.old, err.value.new) == ("running", new.value)
    assert str(err.value).endswith(f"status {new.value!r} needs a reason, one of: {kinds}")


@pytest.mark.parametrize(("old", "new"), [(R, P), (R, R), (R, PA), (R, C), (R, A), (B, P)])
def test_other_statuses_take_no_reason(old: TaskStatus, new: TaskStatus) -> None:
    check_transition(old, new)
    check_transition(old, new, None)
    for reason in ("input", "restart_limit", "because"):
        with pytest.raises(InvalidTransition, match=f"status {new.value!r} takes no reason"):
            check_transition(old, new, reason)


@pytest.mark.parametrize("old", [P, R, W])
def test_failed_may_say_why(old: TaskStatus) -> None:
    check_transition(old, F)
    check_transition(old, F, "deadline")


def test_a_refused_pair_is_refused_whatever_the_reason() -> None:
    with pytest.raises(InvalidTransition) as err:
        check_transition(PA, W, "input")
    assert str(err.value) == "a task cannot go from 'paused' to 'waiting'"
    with pytest.raises(InvalidTransition) as err:
        check_transition(C, B, "pinned")
    assert str(err.value) == "a task cannot go from 'completed' to 'blocked'"


# --- through the real Runtime and stores (every backend) ---------------------


async def status_changes(store: Store, task_id: str) -> list[tuple[str, str]]:
    return [
        (e.payload["from"], e.payload["to"])
        for e in await store.entries(task_id, kinds=[EntryKind.STATUS])
    ]


async def task_in(store: Store, status: TaskStatus) -> Task:
    """A task nobody runs, brought to `status` the way a worker or the Runtime does."""
    task, _ = await store.create_task(Task(agent="a"))
    if status is P:
        return task
    if status in (PA, B):
        change: dict[str, object] = {"status": status, "status_reason": A_REASON.get(status)}
        res = await store.commit(Commit(patches=[TaskPatch(task.id, change)]))
        return res.tasks[task.id]
    claimed = await store.claim_task("w1", task_id=task.id)
    assert claimed is not None
    change = {"status": status, "status_reason": A_REASON.get(status)}
    if status is C:
        change["output"] = "done"
    res = await store.commit(
        Commit(patches=[TaskPatch(task.id, change)], fence={task.id: claimed.lease.epoch})
    )
    return res.tasks[task.id]


@pytest.mark.parametrize("status", [PA, B, W], ids=str)
async def test_runtime_aborts_a_task_that_is_not_running(store: Store, status: TaskStatus) -> None:
    task = await task_in(store, status)
    assert task.status is status
    async with Runtime(store, run_worker=False) as rt:  # no resume first
        done = await rt.abort(task.id, "no longer needed")
    row = await store.get_task(task.id)
    assert done.status is row.status is A
    assert row.error == "no longer needed" and row.completed_at is not None
    assert row.status_reason is None
    assert (await status_changes(store, task.id))[-1] == (status.value, "aborted")


@pytest.mark.parametrize("status", [P, W], ids=str)
async def test_a_pending_or_waiting_task_fails(store: Store, status: TaskStatus) -> None:
    task = await task_in(store, status)
    change = {"status": F, "status_reason": "deadline", "error": "deadline exceeded"}
    res = await store.commit(Commit(patches=[TaskPatch(task.id, change)]))
    row = await store.get_task(task.id)
    assert res.tasks[task.id].status is row.status is F
    assert (row.status_reason, row.error) == ("deadline", "deadline exceeded")
    assert row.completed_at is not None and row.wake_at is None
    assert (await status_changes(store, task.id))[-1] == (status.value, "failed")


@pytest.mark.parametrize(
    ("status", "new"),
    [(C, R), (C, A), (A, P), (PA, W), (PA, R), (B, R), (P, W), (P, C), (W, C), (F, R)],
    ids=str,
)
async def test_a_store_refuses_what_the_table_refuses(
    store: Store, status: TaskStatus, new: TaskStatus
) -> None:
    task = await task_in(store, status)
    change = {"status": new, "status_reason": A_REASON.get(new)}
    with pytest.raises(InvalidTransition) as err:
        await store.commit(Commit(patches=[TaskPatch(task.id, change)]))
    assert (err.value.old, err.value.new) == (status.value, new.value)
    assert f"from {status.value!r} to {new.value!r}" in str(err.value)
    row = await store.get_task(task.id)
    assert (row.status, row.version) == (status, task.version)  # nothing written


async def test_a_store_refuses_a_reason_the_status_does_not_take(store: Store) -> None:
    task = await task_in(store, P)
    for change in (
        {"status": B},
        {"status": B, "status_reason": "input"},
        {"status": PA, "status_reason": "restart_limit"},
    ):
        with pytest.raises(InvalidTransition, match="from 'pending' to "):
            await store.commit(Commit(patches=[TaskPatch(task.id, change)]))
    assert (await store.get_task(task.id)).version == task.version


@pytest.mark.parametrize(("status", "action"), [(C, "abort"), (A, "pause"), (B, "pause")], ids=str)
async def test_runtime_refuses_an_illegal_stop(
    store: Store, status: TaskStatus, action: str
) -> None:
    task = await task_in(store, status)
    target = "aborted" if action == "abort" else "paused"
    async with Runtime(store, run_worker=False) as rt:
        with pytest.raises(InvalidTransition) as err:
            await (rt.abort(task.id) if action == "abort" else rt.pause(task.id))
    assert (err.value.old, err.value.new) == (status.value, target)
    assert f"from {status.value!r} to {target!r}" in str(err.value)
    assert (await store.get_task(task.id)).status is status
