"""The task lifecycle: the transition table, its reason rules, and every status
change going through `check_transition` (issue 38).

The table is asserted against one written out here, pair by pair, so a dropped
or added entry of `TRANSITIONS` fails a test; the changes the lifecycle allows
(or refuses) are then made through the real Runtime and stores.
"""

from __future__ import annotations

import itertools
import sqlite3
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from pydantic import BaseModel, PrivateAttr

from conftest import opened_store, require_postgres
from duragent import Runtime
from duragent._model_internals import given_in_full, updated
from duragent.errors import InvalidOption, InvalidTransition, StaleLease, TaskNotFound
from duragent.store import Commit, DocumentWrite, Store, TaskPatch
from duragent.store._postgres import PostgresStore
from duragent.store._queues import QUEUES_SCOPE, Queue, define_queue
from duragent.store._rules import claim
from duragent.store._sqlite import SQLiteStore
from duragent.store._tx import HeldRows, Notes, hold_row, may_become_claimable
from duragent.types import (
    API_KINDS,
    PATCHABLE,
    TERMINAL,
    TRANSITIONS,
    AssistantMessage,
    BlockReason,
    Document,
    Entry,
    EntryKind,
    NewEntry,
    Task,
    TaskStatus,
    UIText,
    UIToolCard,
    Usage,
    WaitReason,
    check_transition,
    dump_message,
    session_scope,
    stored_entry,
    task_scope,
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
        (B, None, "restart_limit, missing_definition, incompatible_store, pinned, lost_commits"),
        (B, "timer", "restart_limit, missing_definition, incompatible_store, pinned, lost_commits"),
        (B, "", "restart_limit, missing_definition, incompatible_store, pinned, lost_commits"),
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


# --- claims, takeovers and releases go through check_transition --------------


@pytest.mark.parametrize("status", list(S), ids=str)
def test_a_claim_is_a_transition_to_running(status: TaskStatus) -> None:
    task = Task(agent="a", status=status, status_reason=A_REASON.get(status))
    now = datetime.now(UTC)
    if R not in EXPECTED[status]:
        with pytest.raises(InvalidTransition) as err:
            claim(task, "w1", 30.0, now)
        assert (err.value.old, err.value.new) == (status.value, "running")
        return
    claimed, entry = claim(task, "w1", 30.0, now)
    assert claimed.status is R and claimed.lease.owner == "w1"
    assert entry.payload["from"] == status.value and entry.payload["to"] == "running"
    assert entry.payload["takeover"] is (status is R)
    assert claimed.restarts == (1 if status is R else 0)


# --- what a write means to waiters in other processes (store/_tx.py Notes) ----


@pytest.mark.parametrize(
    ("status", "wake", "claimable"),
    [
        (P, False, True),
        (P, True, True),  # a delayed start
        (R, False, True),  # once its lease ends
        (W, True, True),  # a timer
        (W, False, False),  # an answer or a sub-task: only a write wakes it
        (PA, False, False),
        (B, False, False),
        (C, False, False),
        (F, False, False),
        (A, False, False),
    ],
)
def test_which_rows_may_become_claimable(status: TaskStatus, wake: bool, claimable: bool) -> None:
    at = datetime.now(UTC) if wake else None
    assert may_become_claimable(Task(agent="a", status=status, wake_at=at)) is claimable


def _moved(task: Task, **change: Any) -> Task:
    return task.model_copy(update=change)


def test_notes_say_work_when_a_row_moved_to_where_it_may_be_claimed() -> None:
    pending = Task(agent="a")
    notes = Notes()
    assert (notes.work, notes.controlled) == (False, [])
    notes.read(pending)
    notes.wrote(_moved(pending, context={"k": 1}))  # its schedule did not move
    assert (notes.work, notes.controlled) == (False, [])
    notes.wrote(_moved(pending, status=PA))  # moved, but nobody may claim it
    assert notes.work is False
    notes.wrote(_moved(pending, status=P))  # resumed
    assert notes.work is True

    running = Task(agent="a", status=R, lease={"owner": "w1", "epoch": 1})
    notes = Notes()
    notes.read(running)
    notes.wrote(_moved(running, status=P, lease=running.lease.model_copy(update={"owner": None})))
    assert notes.work is True  # released

    notes = Notes()
    notes.read(pending)
    notes.wrote(_moved(pending, status=R, lease=running.lease))  # claimed
    assert notes.work is True

    notes = Notes()
    notes.wrote(pending, created=True)
    assert notes.work is True
    notes = Notes()
    notes.wrote(Task(agent="a", status=W, status_reason="input"))  # unread: moved
    assert notes.work is False


def test_notes_list_the_tasks_a_control_request_was_set_on() -> None:
    running = Task(agent="a", status=R)
    asked = _moved(running, control={"action": "pause"})
    notes = Notes()
    notes.read(running)
    notes.wrote(running)
    assert notes.controlled == []
    notes.wrote(asked)
    notes.wrote(asked)  # the same request again: said once
    assert notes.controlled == [running.id]
    notes.wrote(_moved(asked, control={"action": "abort"}))
    assert notes.controlled == [running.id, running.id]
    notes.wrote(running)  # cleared
    assert notes.controlled == [running.id, running.id]
    unread = Notes()
    unread.wrote(asked)
    assert unread.controlled == [running.id]


def test_a_held_row_remembers_what_the_row_held_first() -> None:
    first, second, third = Task(agent="a"), Task(agent="a"), Task(agent="a")
    second.id = third.id = first.id
    rows: HeldRows = {}
    hold_row(rows, None, first)
    assert rows == {first.id: (None, first)}
    hold_row(rows, first, second)
    assert rows[first.id] == (None, second)
    rows = {}
    hold_row(rows, first, second)
    hold_row(rows, second, third)
    assert rows[first.id] == (first, third)


# --- the rest of the data model (types.py): defaults, copies, scopes ---------
# What the stores and the runner rely on of these types, each asserted once.


def test_a_new_task_starts_from_zero() -> None:
    task = Task(agent="writer")
    assert task.status is P and task.status_reason is None
    assert task.root_id == task.id and task.queue == "writer"
    assert task.id.startswith("t_") and len(task.id) == 34
    assert (task.priority, task.iterations, task.restarts, task.last_seq) == (0, 0, 0, 0)
    assert (task.round_seq, task.version, task.lease.epoch) == (0, 0, 0)
    assert task.usage == Usage() and (Usage().input_tokens, Usage().output_tokens) == (0, 0)
    assert task.lease.owner is None and task.lease.expires_at is None
    assert task.created_at.tzinfo is not None
    given = Task(agent="writer", root_id="t_root", queue="emails")
    assert (given.root_id, given.queue) == ("t_root", "emails")  # kept as given


def test_a_task_field_assigned_is_taken_as_given() -> None:
    """No validation on assignment (the runner sets its own copy's fields in
    place, with values already of their type): a patch's values are validated
    by the store (apply_patch), not here."""
    task = Task(agent="a")
    setattr(task, "iterations", "3")  # noqa: B010
    assert task.__dict__["iterations"] == "3"


def test_usage_adds_up() -> None:
    total = Usage(input_tokens=3, output_tokens=5) + Usage(input_tokens=10, output_tokens=20)
    assert total == Usage(input_tokens=13, output_tokens=25)


@pytest.mark.parametrize(
    ("config", "deadline"),
    [
        ({}, None),
        ({"deadline": "2030-01-01T00:00:00+00:00"}, None),  # not a record
        ({"deadline": {"by": "submit"}}, None),
        ({"deadline": {"at": ""}}, None),
        (
            {"deadline": {"at": "2030-01-01T00:00:00+00:00"}},
            datetime(2030, 1, 1, tzinfo=UTC),
        ),
    ],
)
def test_a_task_deadline_is_read_from_its_record(
    config: dict[str, Any], deadline: datetime | None
) -> None:
    assert Task(agent="a", config=config).deadline == deadline


def test_the_fields_a_patch_may_change() -> None:
    assert {
        "input",
        "status",
        "status_reason",
        "config",
        "context",
        "output",
        "error",
        "iterations",
        "usage",
        "restarts",
        "updated_at",
        "paused_at",
        "completed_at",
        "wake_at",
        "control",
        "round_seq",
        "agent_version",  # a migration's
    } == PATCHABLE
    assert {EntryKind.API_MESSAGE, EntryKind.TOOL_RESULT} == API_KINDS


def test_entry_and_document_defaults() -> None:
    new = NewEntry(task_id="t", kind="status", payload={})  # type: ignore[arg-type]
    assert new.kind is EntryKind.STATUS and new.round == 0
    assert not hasattr(new, "__dict__")  # slots: built several times a round
    with pytest.raises(TypeError):
        NewEntry("t", EntryKind.STATUS, {})  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="an entry's payload must be a dict, not list"):
        NewEntry(task_id="t", kind=EntryKind.STATUS, payload=[1])  # type: ignore[arg-type]
    assert Entry(task_id="t", seq=1, kind=EntryKind.STATUS, payload={}).round == 0
    assert Document(scope="s", key="k", value=1).version == 1
    assert UIText(text="x").voided is False
    assert UIToolCard(call_id="c", name="n").voided is False


def test_a_message_is_dumped_without_its_empty_fields() -> None:
    assert dump_message(AssistantMessage(content="hi")) == {"role": "assistant", "content": "hi"}


def test_scopes() -> None:
    assert task_scope("t_1") == "task:t_1"
    assert session_scope("alice", "s1") == "session:alice:s1"
    assert session_scope("a:b/c", "s1") == "session:a%3Ab%2Fc:s1"
    assert session_scope(None, "s1") == session_scope("", "s1") == "session::s1"


def test_a_stored_entry_and_a_row_read_back_have_every_field_given() -> None:
    at = datetime.now(UTC)
    entry = stored_entry("t", 3, EntryKind.STATUS, 2, {"a": 1}, at)
    assert entry == Entry(
        task_id="t", seq=3, kind=EntryKind.STATUS, round=2, payload={"a": 1}, created_at=at
    )
    assert entry.model_fields_set == set(Entry.model_fields)
    assert entry.model_dump(exclude_unset=True) == entry.model_dump()
    task = Task(agent="a")
    assert "status" not in task.model_fields_set
    assert given_in_full(task) is task
    assert task.model_fields_set == set(Task.model_fields)


def test_an_updated_copy_is_the_model_copy() -> None:
    full = given_in_full(Task(agent="a"))
    copy = updated(full, {"status": R, "iterations": 2})
    assert (copy.status, copy.iterations, full.status, full.iterations) == (R, 2, P, 0)
    assert copy == full.model_copy(update={"status": R, "iterations": 2})
    # A full fields set is shared, not copied (nothing can be added to it).
    assert copy.__pydantic_fields_set__ is full.__pydantic_fields_set__
    # A partial one gains the fields updated, as model_copy's does.
    fresh = Task(agent="a")
    assert "status" not in fresh.model_fields_set
    partial = updated(fresh, {"status": R})
    assert partial.model_fields_set == fresh.model_fields_set | {"status"}
    assert partial.model_dump(exclude_unset=True)["status"] is R


class _Extra(BaseModel, extra="allow"):
    a: int = 0


class _Private(BaseModel):
    a: int = 0
    _note: str = PrivateAttr(default="kept")


def test_an_updated_copy_keeps_extras_and_private_attributes() -> None:
    extra = updated(_Extra.model_validate({"a": 1, "x": 2}), {"a": 3})
    assert (extra.a, extra.model_extra) == (3, {"x": 2})
    private = _Private(a=1)
    private._note = "mine"
    copy = updated(private, {"a": 3})
    assert (copy.a, copy._note) == (3, "mine")


# --- through the real Runtime and stores (every backend): after the pure
# tests above, so a mutant they kill is told in a second --------------------


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


def _behind_the_store(store: Store, sqlite_sql: str, pg_sql: str, *params: Any) -> list[Any]:
    """One statement on the store's file or schema, behind its back (PostgreSQL's
    names the schema `{0}`); its rows."""
    if isinstance(store, SQLiteStore):
        with closing(sqlite3.connect(store.path)) as db, db:
            return db.execute(sqlite_sql, params).fetchall()
    assert isinstance(store, PostgresStore) and store.schema is not None
    with psycopg.connect(require_postgres(), autocommit=True) as pg:
        cur = pg.execute(sql.SQL(pg_sql).format(sql.Identifier(store.schema)), params)
        return cur.fetchall() if cur.description else []


SQL_STORES = ["sqlite", "sqlite-full", "postgres"]


@pytest.mark.parametrize("kind", SQL_STORES)
@pytest.mark.parametrize("status", [PA, B, C, F, A], ids=str)
async def test_a_row_indexed_as_pending_that_may_not_run_is_not_claimed(
    kind: str, status: TaskStatus, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The claim query reads the status column; the row (its data) is what is
    claimed. A row whose column says pending while the row says it may not go
    to running (a row written behind the store's back) is passed over and left
    as it is: the claim takes the next task instead."""
    async with opened_store(kind, tmp_path) as store:
        stuck = await task_in(store, status)
        good, _ = await store.create_task(Task(agent="a"))
        _behind_the_store(
            store,
            "UPDATE tasks SET status='pending', wake_at=NULL WHERE id=?",
            "UPDATE {0}.tasks SET status = 'pending', wake_at = NULL WHERE id = %s",
            stuck.id,
        )
        # Claimed one at a time: the first page holds only the stuck row.
        claimed = await store.claim_task("w2")
        assert claimed is not None and claimed.id == good.id
        assert await store.claim_tasks("w2", 2) == []
        said = [r.getMessage() for r in caplog.records if r.name == "duragent.store"]
        assert (
            f"task {stuck.id} not claimed: a task cannot go from {status.value!r} to " in (said[0])
        )
        row = await store.get_task(stuck.id)
        assert (row.status, row.version, row.lease) == (status, stuck.version, stuck.lease)
        assert len(await store.entries(stuck.id)) == stuck.last_seq


async def test_a_release_is_a_transition_to_pending(store: Store) -> None:
    task, _ = await store.create_task(Task(agent="a"))
    claimed = await store.claim_task("w1", task_id=task.id)
    assert claimed is not None
    await store.release_lease(task.id, claimed.lease.epoch)
    row = await store.get_task(task.id)
    assert row.status is P and row.lease.owner is None
    assert row.lease.epoch == claimed.lease.epoch  # never reset: a stale writer stays fenced
    assert row.version == claimed.version + 1
    assert await status_changes(store, task.id) == [("pending", "running"), ("running", "pending")]
    # A released task that is not running (it parked first) keeps its status.
    again = await store.claim_task("w1", task_id=task.id)
    assert again is not None
    res = await store.commit(
        Commit(
            patches=[TaskPatch(task.id, {"status": W, "status_reason": "input"})],
            fence={task.id: again.lease.epoch},
        )
    )
    await store.release_lease(task.id, again.lease.epoch)
    row = await store.get_task(task.id)
    assert (row.status, row.status_reason, row.lease.owner) == (W, "input", None)
    assert row.version == res.tasks[task.id].version
    assert (await status_changes(store, task.id))[-1] == ("running", "waiting")


# --- gaps of the claim and create paths (store/_tx.py) ------------------------


async def test_a_claim_that_reads_a_larger_page_never_returns_a_task_twice(store: Store) -> None:
    """A queue limit refuses most of the first page (one task per owner), so the
    claim reads a larger page, which holds the tasks it already took: each is
    taken once, and the slot left goes to the next task the limit admits."""
    await define_queue(store, Queue("q", per_owner=1))
    first, _ = await store.create_task(Task(agent="a", queue="free", priority=10))
    alice = [
        (await store.create_task(Task(agent="a", queue="q", owner="alice", priority=5)))[0]
        for _ in range(12)
    ]
    bob, _ = await store.create_task(Task(agent="a", queue="q", owner="bob"))
    claimed = await store.claim_tasks("w1", 3)
    ids = [t.id for t in claimed]
    assert len(ids) == len(set(ids)) == 3
    assert ids[0] == first.id and ids[2] == bob.id and ids[1] in {t.id for t in alice}
    for t in claimed:
        row = await store.get_task(t.id)
        assert (row.status, row.lease.owner, row.lease.epoch) == (R, "w1", 1)
        assert await status_changes(store, t.id) == [("pending", "running")]


@pytest.mark.parametrize(
    "when", [datetime(2001, 1, 1, tzinfo=UTC), datetime(2100, 1, 1, tzinfo=UTC)], ids=str
)
async def test_the_store_sets_created_at_not_the_caller(store: Store, when: datetime) -> None:
    """A caller's created_at (in the past: jumping the queue; in the future:
    going behind it), updated_at and last_seq are replaced by the store's own."""
    before = datetime.now(UTC) - timedelta(seconds=1)
    made, forked = (Task(agent="a", created_at=when, updated_at=when, last_seq=7) for _ in "ab")
    made, _ = await store.create_task(
        made, [NewEntry(task_id=made.id, kind=EntryKind.CHECKPOINT, payload={"n": 1})]
    )
    forked, _ = await store.create_fork(
        forked, [NewEntry(task_id=forked.id, kind=EntryKind.CHECKPOINT, payload={"n": 1})]
    )
    child = Task(agent="a", parent_id=made.id, created_at=when, updated_at=when, last_seq=7)
    res = await store.commit(Commit(new_tasks=[child]))
    after = datetime.now(UTC) + timedelta(seconds=1)
    for task, entries in ((made, 1), (forked, 1), (res.tasks[child.id], 0)):
        for row in (task, await store.get_task(task.id)):
            assert before <= row.created_at <= after
            assert before <= row.updated_at <= after
            assert row.last_seq == entries
        assert [e.seq for e in await store.entries(task.id)] == list(range(1, entries + 1))
    # The claim order is the store's: oldest first, whatever the caller said.
    assert [t.id for t in await store.claim_tasks("w1", 3)] == [made.id, forked.id, child.id]


@pytest.mark.parametrize("kind", SQL_STORES)
async def test_the_lease_columns_follow_the_row(kind: str, tmp_path: Path) -> None:
    """The SQL stores keep the lease in columns (the claim query and fencing read
    them) and in the row's data: after a claim, a takeover and a release the
    columns hold the row's lease."""

    def columns(task_id: str) -> tuple[Any, ...]:
        (row,) = _behind_the_store(
            store,
            "SELECT lease_epoch, lease_owner FROM tasks WHERE id=?",
            "SELECT lease_epoch, lease_owner FROM {0}.tasks WHERE id = %s",
            task_id,
        )
        return tuple(row)

    async with opened_store(kind, tmp_path) as store:
        task, _ = await store.create_task(Task(agent="a"))
        assert columns(task.id) == (0, None)
        lapsed = await store.claim_task("w1", ttl=0)  # its lease ends at once
        assert lapsed is not None and lapsed.lease.epoch == 1
        assert columns(task.id) == (1, "w1")
        taken = await store.claim_task("w2", ttl=60)  # a takeover
        assert taken is not None and taken.id == task.id
        assert columns(task.id) == (2, "w2")
        await store.release_lease(task.id, 2)
        row = await store.get_task(task.id)
        assert columns(task.id) == (row.lease.epoch, row.lease.owner) == (2, None)
        again = await store.claim_task("w3", ttl=60)
        assert again is not None
        assert columns(task.id) == (again.lease.epoch, "w3") == (3, "w3")
        with pytest.raises(StaleLease):  # the fence reads the column
            await store.release_lease(task.id, 2)


# --- the claim's pages, limits and defaults (store/_tx.py apply_claim) --------


async def test_a_claim_takes_no_more_than_asked_though_the_limit_refused_some(
    store: Store,
) -> None:
    """A limit refuses one candidate before the n-th is taken: the claim stops
    at n (it reads no larger page for the refused one)."""
    await define_queue(store, Queue("q", per_owner=1))
    made = [
        (await store.create_task(Task(agent="a", queue="q", owner=o, priority=p)))[0]
        for o, p in (("alice", 10), ("alice", 9), ("bob", 8), ("carol", 7))
    ]
    claimed = await store.claim_tasks("w1", 2)
    assert [t.id for t in claimed] == [made[0].id, made[2].id]
    assert [(await store.get_task(t.id)).status for t in made] == [R, P, R, P]


@pytest.mark.slow
async def test_a_claim_reads_four_pages_at_most() -> None:
    """Refused candidates make the page larger (n + 8, then eight times, three
    times over), never without end: past the fourth page the claim takes what
    it found. Here the only admissible task left sits past the fourth page."""
    async with opened_store("memory", Path("unused")) as store:
        await define_queue(store, Queue("q", per_owner=1))
        alice = [Task(agent="a", queue="q", owner="alice", priority=1) for _ in range(5199)]
        await store.commit(Commit(new_tasks=alice))
        bob, _ = await store.create_task(Task(agent="a", queue="q", owner="bob"))
        # Pages of 10, 80, 640 and 5,120 candidates: bob is the 5,200th.
        claimed = await store.claim_tasks("w1", 2)
        assert len(claimed) == 1 and claimed[0].owner == "alice"
        assert (await store.get_task(bob.id)).status is P


async def test_a_claim_counts_what_already_runs_in_a_limited_queue(store: Store) -> None:
    await define_queue(store, Queue("one", concurrency=1))
    first, _ = await store.create_task(Task(agent="a", queue="one"))
    second, _ = await store.create_task(Task(agent="a", queue="one"))
    taken = await store.claim_task("w1")
    assert taken is not None and taken.id == first.id
    assert await store.claim_task("w2") is None  # one runs: the queue is full
    assert (await store.get_task(second.id)).status is P


async def test_a_claim_writes_back_the_rate_bucket_it_drew_from(store: Store) -> None:
    await define_queue(store, Queue("rated", rate=(5, 3600)))
    before = await store.get_document(QUEUES_SCOPE, "rated")
    assert before is not None
    for _ in range(2):
        await store.create_task(Task(agent="a", queue="rated"))
    assert len(await store.claim_tasks("w1", 2)) == 2
    after = await store.get_document(QUEUES_SCOPE, "rated")
    assert after is not None and after.version == before.version + 1
    assert 2.9 < after.value["tokens"] < 3.1  # five, less the two starts


async def test_claim_defaults_take_one_task(store: Store) -> None:
    made = [(await store.create_task(Task(agent="a")))[0] for _ in range(3)]
    one = await store.claim_task("w1")
    assert one is not None and one.id == made[0].id
    assert [t.id for t in await store.claim_tasks("w1")] == [made[1].id]
    assert (await store.get_task(made[2].id)).status is P
    assert await store.claim_tasks("w1", 0) == []
    assert (await store.get_task(made[2].id)).status is P
    empty = await store.renew_leases("w1", {}, 30.0)
    assert (empty.kept, empty.lost) == ({}, set())


@pytest.mark.parametrize("kind", SQL_STORES)
async def test_the_status_columns_follow_the_row(kind: str, tmp_path: Path) -> None:
    """The status, its reason and the wake-up time are columns too (an update
    writes only the ones that changed): each change reaches its column."""

    def columns(task_id: str) -> tuple[Any, ...]:
        (row,) = _behind_the_store(
            store,
            "SELECT status, status_reason, wake_at IS NOT NULL FROM tasks WHERE id=?",
            "SELECT status, status_reason, wake_at IS NOT NULL FROM {0}.tasks WHERE id = %s",
            task_id,
        )
        return tuple(row)

    async with opened_store(kind, tmp_path) as store:
        task, _ = await store.create_task(Task(agent="a"))
        assert columns(task.id) == ("pending", None, False)
        claimed = await store.claim_task("w1", task_id=task.id)
        assert claimed is not None
        assert columns(task.id) == ("running", None, False)
        later = datetime.now(UTC) + timedelta(hours=1)
        fence = {task.id: claimed.lease.epoch}
        for change, expected in (
            ({"status": W, "status_reason": "timer", "wake_at": later}, ("waiting", "timer", True)),
            ({"status": W, "status_reason": "input", "wake_at": None}, ("waiting", "input", False)),
            ({"status": F, "status_reason": "deadline"}, ("failed", "deadline", False)),
            ({"status": P}, ("pending", None, False)),
        ):
            await store.commit(Commit(patches=[TaskPatch(task.id, change)], fence=fence))
            assert columns(task.id) == expected
            row = await store.get_task(task.id)
            assert (row.status.value, row.status_reason) == expected[:2]


async def test_a_new_task_starts_pending_whichever_way_it_is_made(store: Store) -> None:
    parent, _ = await store.create_task(Task(agent="a"))
    for status in (R, W, C):
        made = Task(agent="a", status=status, status_reason=A_REASON.get(status))
        child = Task(agent="a", parent_id=parent.id, status=status)
        refused = f"must start pending, not {status.value}"
        with pytest.raises(InvalidOption, match=refused):
            await store.create_task(made)
        with pytest.raises(InvalidOption, match=refused):
            await store.create_fork(made, [])
        with pytest.raises(InvalidOption, match=refused):
            await store.commit(Commit(new_tasks=[child]))
        for task_id in (made.id, child.id):
            with pytest.raises(TaskNotFound):
                await store.get_task(task_id)


async def test_a_renewed_lease_is_kept_and_handed_back(store: Store) -> None:
    task, _ = await store.create_task(Task(agent="a"))
    claimed = await store.claim_task("w1", ttl=5)
    assert claimed is not None and claimed.lease.expires_at is not None
    renewed = await store.renew_lease(task.id, "w1", claimed.lease.epoch, 3600)
    row = await store.get_task(task.id)
    assert renewed.lease == row.lease and row.lease.epoch == claimed.lease.epoch
    assert row.lease.expires_at is not None
    assert row.lease.expires_at - claimed.lease.expires_at > timedelta(minutes=59)
    both = await store.renew_leases("w1", {task.id: claimed.lease.epoch, "t_gone": 1}, 7200)
    assert set(both.kept) == {task.id} and both.lost == {"t_gone"}


async def test_a_commit_hands_back_the_documents_it_wrote(store: Store) -> None:
    res = await store.commit(Commit(documents=[DocumentWrite("s", "k", {"v": 1})]))
    assert [(d.key, d.value, d.version) for d in res.documents] == [("k", {"v": 1}, 1)]
    res = await store.commit(Commit(documents=[DocumentWrite("s", "k", 2, expect_version=1)]))
    assert [(d.value, d.version) for d in res.documents] == [(2, 2)]
    gone = await store.commit(Commit(documents=[DocumentWrite("s", "k", delete=True)]))
    assert gone.documents == [] and await store.get_document("s", "k") is None
