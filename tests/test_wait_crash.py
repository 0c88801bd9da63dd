"""A worker SIGKILLed on its way to a durable wait: the next one re-establishes the wait.

Issue 37 item 13b. Each kind of built-in wait (a `ctx.sleep` timer, the
`ask_user` question, an approval, a `ctx.spawn` sub-task) is asked for by a
real worker process (tests/wait_child.py) that is killed at each step between
the commit of the call's intent and the commit of its wait. A new runtime
takes the task over: it waits again with the same deadline / question /
approval / sub-task (never a second one), and never answers the call
"interrupted"; it then completes when the wait is answered.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from conftest import drop_schema, pg_schema_url
from duragent import (
    Agent,
    BuiltinTools,
    Runtime,
    ScriptedModel,
    TaskStatus,
    Timing,
    ToolCall,
    ToolContext,
    tool,
)
from duragent.errors import StoreUnavailable
from duragent.store._commits import Commit, CommitResult
from duragent.store._sqlite import SQLiteStore
from duragent.types import EntryKind, Task
from support.crashlib import kill_at, spawn
from wait_child import MONTH, QUESTION, waiter

KINDS = ["timer", "input", "approval", "subtask"]
# The runner's steps from the intent's commit to the wait's: "intents" (the
# call's intent is committed), "tool_start" (its tool is about to run; an
# approval is asked before any tool runs), "suspended" (the tool handed back
# its wait), "park" (the wait's commit is about to go).
POINTS = ["intents", "tool_start", "suspended", "park"]
CASES = [(k, p) for k in KINDS for p in POINTS if (k, p) != ("approval", "tool_start")]


@pytest.fixture(params=["sqlite", "postgres", "postgres-psycopg"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/w.db"
        return
    schema = f"test_{uuid.uuid4().hex[:12]}"
    yield pg_schema_url(request.param, schema)
    drop_schema(schema)


async def submit(url: str, kind: str) -> str:
    async with Runtime(url, agents=waiter(kind), run_worker=False) as rt:
        return (await rt.submit("waiter", "plan my trip")).task_id


def waits_of(entries: list[Any]) -> list[dict[str, Any]]:
    return [
        e.payload for e in entries if e.kind is EntryKind.CHECKPOINT and e.payload["type"] == "wait"
    ]


def results_of(entries: list[Any]) -> list[dict[str, Any]]:
    return [e.payload for e in entries if e.kind is EntryKind.TOOL_RESULT]


async def until_waiting(rt: Runtime, task_id: str) -> Task:
    """The task once it waits (or ended: then the test fails at once, saying so)."""
    task = await rt.wait(
        task_id, timeout=60, until=lambda t: t.status is TaskStatus.WAITING or t.status.terminal
    )
    assert task.status is TaskStatus.WAITING, (task.status, task.output)
    return task


async def answer(rt: Runtime, kind: str, task_id: str) -> str:
    """Answer the re-established wait; the parent's output that must follow."""
    if kind == "input":
        await rt.respond(task_id, answer="Lisbon")
        return "done: Lisbon"
    if kind == "approval":
        await rt.respond(task_id, approve=True)
        return "done: paid 500"
    assert kind == "subtask"  # the helper runs and its answer wakes the parent
    return "done: 42"


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "point"), CASES)
async def test_a_wait_survives_a_sigkill_before_its_commit(
    url: str, kind: str, point: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DURAGENT_TEST_SLEEP", raising=False)
    tid = await submit(url, kind)
    kill_at(spawn("wait_child.py", url, tid, kind, point), f"AT {point}")
    async with Runtime(url, agents=waiter(kind), poll_interval=0.05, lease_ttl=1.0) as rt:
        before = await rt.store.entries(tid)
        (intent,) = [e for e in before if e.kind is EntryKind.TOOL_INTENT]
        assert waits_of(before) == []  # killed before the wait was committed
        called_at = intent.created_at
        task = await until_waiting(rt, tid)
        entries = await rt.store.entries(tid)
        (wait,) = waits_of(entries)  # one wait, re-established
        assert results_of(entries) == []  # never answered "interrupted"
        assert task.restarts >= 1
        if kind == "timer":
            deadline = called_at + timedelta(seconds=MONTH)  # the original deadline
            assert (wait["wait"], wait["wake_at"]) == ("timer", deadline.isoformat())
            assert task.wake_at == deadline and task.status_reason == "timer"
            return  # a month away; test_a_timer_... below sees one come due
        if kind == "input":
            assert (wait["wait"], wait["question"]) == ("input", QUESTION)
            assert task.status_reason == "input"
        if kind == "approval":
            assert wait["wait"] == "approval" and wait["tool"] == "pay"
            expires = called_at + timedelta(seconds=MONTH)  # its time limit as first asked
            assert wait["expires_at"] == expires.isoformat()
        if kind == "subtask":
            children = (await rt.tree(tid)).children
            assert [c.task.id for c in children] == [wait["child_id"]]  # one, never two
        output = await answer(rt, kind, tid)
        done = await rt.wait(tid, timeout=60)
    assert done.status is TaskStatus.COMPLETED and done.output == output


@pytest.mark.slow
async def test_a_timer_re_established_after_a_sigkill_ends_at_its_original_time(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DURAGENT_TEST_SLEEP", "3")
    tid = await submit(url, "timer")
    kill_at(spawn("wait_child.py", url, tid, "timer", "park"), "AT park")
    async with Runtime(url, agents=waiter("timer"), poll_interval=0.05, lease_ttl=1.0) as rt:
        (intent,) = [e for e in await rt.store.entries(tid) if e.kind is EntryKind.TOOL_INTENT]
        due = intent.created_at + timedelta(seconds=3)
        done = await rt.wait(tid, timeout=60)
    assert done.status is TaskStatus.COMPLETED
    assert done.output == f"done: Slept until {due.isoformat()}."
    assert done.updated_at >= due


class FlakyStore(SQLiteStore):
    """A real SQLite store whose first commit of a wait fails as a dropped connection
    does (`StoreUnavailable`, nothing written): the transient error of the soak."""

    faults = 1

    async def commit(self, commit: Commit) -> CommitResult:
        if self.faults and any(
            e.kind is EntryKind.CHECKPOINT and e.payload["type"] == "wait" for e in commit.entries
        ):
            self.faults -= 1
            raise StoreUnavailable("the connection to the store was lost (test fault)")
        return await super().commit(commit)


@pytest.mark.parametrize(
    ("kind", "replay"),
    [("input", "never"), ("timer", "never"), ("subtask", "never"), ("timer", "safe")],
)
async def test_a_transient_store_error_at_the_wait_keeps_the_wait(
    tmp_path: Path, kind: str, replay: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In one process: the wait's commit fails with a transient error; the runner
    commits it again before handing the task back (a never-replay tool is not run
    again), and the task waits as asked; it never becomes an answer nobody gave."""
    monkeypatch.delenv("DURAGENT_TEST_SLEEP", raising=False)
    store = FlakyStore(str(tmp_path / "f.db"))
    agents = waiter(kind, replay)
    try:
        async with Runtime(store, agents=agents, poll_interval=0.05, lease_ttl=1.0) as rt:
            tid = (await rt.submit("waiter", "plan my trip")).task_id
            task = await until_waiting(rt, tid)
            entries = await rt.store.entries(tid)
            assert store.faults == 0  # the fault happened
            (intent,) = [e for e in entries if e.kind is EntryKind.TOOL_INTENT]
            (wait,) = waits_of(entries)
            assert results_of(entries) == []
            if kind == "input":
                assert wait["question"] == QUESTION
                await rt.respond(tid, answer="Lisbon")
                done = await rt.wait(tid, timeout=60)
                assert (done.status, done.output) == (TaskStatus.COMPLETED, "done: Lisbon")
            elif kind == "subtask":
                children = (await rt.tree(tid)).children
                assert [c.task.id for c in children] == [wait["child_id"]]  # one, never two
                done = await rt.wait(tid, timeout=60)
                assert (done.status, done.output) == (TaskStatus.COMPLETED, "done: 42")
            else:
                deadline = intent.created_at + timedelta(seconds=MONTH)
                assert wait["wake_at"] == deadline.isoformat() and task.wake_at == deadline
    finally:
        await store.close()


async def test_a_worker_stopping_parks_a_wait_a_call_asked_for_in_its_grace(
    tmp_path: Path,
) -> None:
    """A round of two calls: `nap` (never-replay) asks for a timer while `slow` runs;
    the worker stops (hands its tasks back) and cuts `slow` short. The task is
    parked on the timer, not handed back without it (the next owner would answer
    the never-replay `nap` "interrupted")."""
    entered = asyncio.Event()

    @tool
    async def slow() -> str:
        """Take a while."""
        entered.set()
        await asyncio.Event().wait()
        return "never"

    @tool
    async def nap(ctx: ToolContext) -> Any:
        """Wait durably."""
        return ctx.sleep(MONTH)

    napped = asyncio.Event()

    async def trace(point: str, **info: Any) -> None:
        if point == "suspended":
            napped.set()

    model = ScriptedModel([[ToolCall("slow"), ToolCall("nap")], "done"])
    agent = Agent(
        name="two",
        model=model,
        tools=[slow, nap],
        builtin_tools=BuiltinTools(plan=False),
        timing=Timing(tool_grace=0.0),
    )
    url = f"sqlite:///{tmp_path}/s.db"
    async with Runtime(url, agents=[agent], trace=trace) as rt:
        tid = (await rt.submit("two", "go")).task_id
        await entered.wait()
        await napped.wait()
        assert rt.worker is not None
        await rt.worker.stop(graceful=True)  # the worker hands its tasks back
        task = await rt.get(tid)
        entries = await rt.store.entries(tid)
    assert task.status is TaskStatus.WAITING and task.status_reason == "timer"
    (wait,) = waits_of(entries)
    results = {r["tool_call_id"]: r["outcome"] for r in results_of(entries)}
    assert wait["wait"] == "timer" and wait["call_id"] not in results
    assert list(results.values()) == ["interrupted"]  # slow, cut short by the stop
