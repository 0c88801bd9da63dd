"""Deadlines (issue 13 item 4), on every store.

A task with a deadline stops at its next safe point once it passes, `failed`
with status reason `deadline`; a task parked in the store (input, timer,
sub-task) is woken by a worker at its deadline (`wake_at`, the earlier of its
timer and its deadline); `retry` drops a passed deadline or sets a new one.
"""

from __future__ import annotations

import asyncio
import signal
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from conftest import drop_schema, require_postgres
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
from duragent.errors import UsageError
from duragent.runtime._presence import served_agents
from duragent.store._protocol import Store
from duragent.types import AssistantMessage, Task, ToolMessage, UserMessage, utcnow


@tool
async def ask(question: str, ctx: ToolContext) -> Any:
    """Ask the user."""
    return ctx.wait_for_input(question)


@tool
async def snooze(seconds: float, ctx: ToolContext) -> Any:
    """Sleep durably."""
    return ctx.sleep(seconds)


@tool
async def delegate(job: str, ctx: ToolContext) -> Any:
    """Hand a job to the `helper` agent."""
    return ctx.spawn("helper", job)


def calls_then_answers(call: ToolCall) -> ScriptedModel:
    def script(messages: list[Any]) -> Any:
        if not any(isinstance(m, AssistantMessage) for m in messages):
            return [call]
        last = [m.content for m in messages if isinstance(m, ToolMessage)][-1]
        return f"done after: {last}"

    return ScriptedModel(script)


def agents() -> list[Agent]:
    return [
        Agent(
            name="asker",
            model=calls_then_answers(ToolCall("ask", {"question": "Which city?"})),
            tools=[ask],
            builtin_tools=BuiltinTools(plan=False),
        ),
        Agent(
            name="sleeper",
            model=calls_then_answers(ToolCall("snooze", {"seconds": 3600})),
            tools=[snooze],
            builtin_tools=BuiltinTools(plan=False),
        ),
        Agent(
            name="parent",
            model=calls_then_answers(ToolCall("delegate", {"job": "ask"})),
            tools=[delegate],
            builtin_tools=BuiltinTools(plan=False),
        ),
        Agent(
            name="helper",
            model=calls_then_answers(ToolCall("ask", {"question": "Sure?"})),
            tools=[ask],
            builtin_tools=BuiltinTools(plan=False),
        ),
    ]


class Moves:
    """Every status change the runtime commits, with the row it committed."""

    def __init__(self) -> None:
        self.rows: list[Task] = []
        self.parked = asyncio.Event()

    def __call__(self, task: Task, old: TaskStatus, new: TaskStatus) -> None:
        self.rows.append(task)
        if new is TaskStatus.WAITING:
            self.parked.set()

    def waiting(self, task_id: str) -> Task:
        return next(t for t in self.rows if t.id == task_id and t.status is TaskStatus.WAITING)


def one_result_per_call(view: list[Any]) -> list[str]:
    calls = [c.id for m in view if isinstance(m, AssistantMessage) for c in m.tool_calls or ()]
    results = Counter(m.tool_call_id for m in view if isinstance(m, ToolMessage))
    assert set(results) == set(calls) and all(n == 1 for n in results.values()), (calls, results)
    return [m.content for m in view if isinstance(m, ToolMessage)]


async def ended(rt: Runtime, task_id: str) -> Task:
    return await rt.wait(task_id, timeout=30, until=lambda t: t.status.terminal)


@pytest.mark.slow
async def test_a_task_waiting_for_input_fails_at_its_deadline(store: Store) -> None:
    moves = Moves()
    async with Runtime(store, agents=agents(), on_status_change=moves, poll_interval=0.1) as rt:
        sub = await rt.submit("asker", "plan a trip", deadline=0.5)
        submitted = await rt.get(sub.task_id)
        assert submitted.deadline is not None
        assert submitted.config["deadline"]["by"] == "submit"
        task = await ended(rt, sub.task_id)
        view = await rt.messages(task.id)
    parked = moves.waiting(sub.task_id)
    # Parked for input, with the deadline as its wake-up: a worker claims it then.
    assert parked.status_reason == "input" and parked.wake_at == submitted.deadline
    assert task.status is TaskStatus.FAILED and task.status_reason == "deadline"
    assert task.error == f"deadline exceeded: {submitted.deadline.isoformat()} (0.5 s after submit)"
    assert task.completed_at is not None and task.completed_at >= submitted.deadline
    # The open question is answered for the model: every call has exactly one result.
    assert one_result_per_call(view) == [
        "Tool call cancelled: the task's deadline passed while it waited."
    ]


@pytest.mark.slow
async def test_a_timer_past_the_deadline_is_cut_short_at_the_deadline(store: Store) -> None:
    moves = Moves()
    async with Runtime(store, agents=agents(), on_status_change=moves, poll_interval=0.1) as rt:
        sub = await rt.submit("sleeper", "nap", deadline=timedelta(seconds=0.5))
        task = await ended(rt, sub.task_id)
    parked = moves.waiting(sub.task_id)
    assert parked.status_reason == "timer" and parked.wake_at == task.deadline  # the earlier
    assert task.status is TaskStatus.FAILED and task.status_reason == "deadline"


@pytest.mark.slow
async def test_a_timer_before_the_deadline_wakes_first(store: Store) -> None:
    moves = Moves()
    agent = Agent(
        name="napper",
        model=calls_then_answers(ToolCall("snooze", {"seconds": 0.2})),
        tools=[snooze],
        builtin_tools=BuiltinTools(plan=False),
    )
    async with Runtime(store, agents=[agent], on_status_change=moves, poll_interval=0.1) as rt:
        sub = await rt.submit("napper", "nap", deadline=3600)
        task = await ended(rt, sub.task_id)
    parked = moves.waiting(sub.task_id)
    assert task.deadline is not None and parked.wake_at is not None
    assert parked.wake_at < task.deadline
    assert task.status is TaskStatus.COMPLETED and task.output.startswith("done after: Slept")


@pytest.mark.slow
async def test_a_sub_task_inherits_its_parents_deadline(store: Store) -> None:
    async with Runtime(store, agents=agents(), poll_interval=0.1) as rt:
        sub = await rt.submit("parent", "delegate", deadline=0.5)
        parent = await ended(rt, sub.task_id)
        (child_node,) = (await rt.tree(sub.task_id)).children
        child = await ended(rt, child_node.task.id)
        view = await rt.messages(parent.id)
    assert child.deadline == parent.deadline and child.config["deadline"]["by"] == "parent"
    assert parent.status is TaskStatus.FAILED and parent.status_reason == "deadline"
    assert child.status is TaskStatus.FAILED and child.status_reason == "deadline"
    assert "the parent task's deadline" in (child.error or "")
    (result,) = one_result_per_call(view)
    # Whichever ended first, the parent's call has one result, about the deadline.
    assert "deadline" in result


@pytest.mark.slow
async def test_a_long_tool_gets_the_grace_then_is_cancelled(store: Store) -> None:
    started = asyncio.Event()

    @tool
    async def forever(ctx: ToolContext) -> str:
        """Never returns."""
        started.set()
        await asyncio.Event().wait()
        return "unreachable"

    agent = Agent(
        name="stuck",
        model=calls_then_answers(ToolCall("forever", {})),
        tools=[forever],
        builtin_tools=BuiltinTools(plan=False),
        timing=Timing(tool_grace=0.2),
    )
    async with Runtime(store, agents=[agent]) as rt:
        # The deadline must pass while the tool runs: 2 s leaves the tool time to
        # start on a loaded machine (0.3 s did not, beside a CPU hog). Deadlines are
        # wall-clock; there is no clock to inject here.
        sub = await rt.submit("stuck", "go", deadline=2.0)
        task = await ended(rt, sub.task_id)
        view = await rt.messages(task.id)
    assert started.is_set()
    assert task.status is TaskStatus.FAILED and task.status_reason == "deadline"
    assert one_result_per_call(view) == [
        "Tool call cancelled: the task's deadline passed while it ran. "
        "It may or may not have taken effect."
    ]


@pytest.mark.slow
async def test_a_tool_finishing_within_the_grace_keeps_its_result(store: Store) -> None:
    release = asyncio.Event()
    answers: list[str] = []

    @tool
    async def slow(ctx: ToolContext) -> str:
        """Returns once released."""
        await release.wait()
        return "slow result"

    def script(messages: list[Any]) -> Any:
        if not any(isinstance(m, AssistantMessage) for m in messages):
            return [ToolCall("slow", {})]
        answers.append("asked again")
        return "done"

    agent = Agent(
        name="slowpoke",
        model=ScriptedModel(script),
        tools=[slow],
        builtin_tools=BuiltinTools(plan=False),
        timing=Timing(tool_grace=60),
    )
    async with Runtime(store, agents=[agent]) as rt:
        sub = await rt.submit("slowpoke", "go", deadline=0.3)
        # Released only once the runner heard the deadline: the tool ends in the grace.
        assert rt.worker is not None
        while (runner := rt.worker.runner(sub.task_id)) is None or (runner.control is None):
            await asyncio.sleep(0.01)
        release.set()
        task = await ended(rt, sub.task_id)
        view = await rt.messages(task.id)
    assert task.status is TaskStatus.FAILED and task.status_reason == "deadline"
    assert one_result_per_call(view) == ["slow result"]
    assert answers == []  # stopped at the safe point after the result: no next model call


@pytest.mark.slow
async def test_a_streaming_model_is_stopped_at_the_deadline(store: Store) -> None:
    agent = Agent(
        name="talker",
        model=ScriptedModel(["tick " * 2000], chunk_delay=0.02, chunk_size=5),
        builtin_tools=BuiltinTools(plan=False),
        timing=Timing(progress_interval=0.05),
    )
    async with Runtime(store, agents=[agent]) as rt:
        sub = await rt.submit("talker", "talk", deadline=0.3)
        task = await ended(rt, sub.task_id)
        view = await rt.messages(task.id)
    assert task.status is TaskStatus.FAILED and task.status_reason == "deadline"
    assert task.output is None and [type(m) for m in view] == [UserMessage]


@pytest.mark.slow
async def test_a_start_after_the_deadline_fails_at_the_deadline_without_running(
    store: Store,
) -> None:
    ran: list[str] = []

    def script(messages: list[Any]) -> Any:
        ran.append("model")
        return "never"

    agent = Agent(name="late", model=ScriptedModel(script), builtin_tools=BuiltinTools(plan=False))
    async with Runtime(store, agents=[agent], poll_interval=0.1) as rt:
        sub = await rt.submit("late", "go", start_at=timedelta(hours=1), deadline=0.3)
        submitted = await rt.get(sub.task_id)
        assert submitted.wake_at == submitted.deadline
        task = await ended(rt, sub.task_id)
    assert task.status is TaskStatus.FAILED and task.status_reason == "deadline"
    assert ran == []


@pytest.mark.slow
async def test_retry_drops_a_passed_deadline_or_sets_a_new_one(store: Store) -> None:
    async with Runtime(store, agents=agents(), poll_interval=0.1) as rt:
        sub = await rt.submit("asker", "plan a trip", deadline=0.3)
        first = await ended(rt, sub.task_id)
        assert first.status_reason == "deadline"
        # A new deadline: the task runs again (the model sees the cancelled call) and
        # fails at the new one if it waits again. Here it answers at once.
        again = await rt.retry(sub.task_id, deadline=timedelta(minutes=5))
        assert again.status is TaskStatus.PENDING and again.status_reason is None
        assert again.config["deadline"]["by"] == "retry"
        assert again.deadline is not None and again.deadline > utcnow()
        done = await ended(rt, sub.task_id)
        assert done.status is TaskStatus.COMPLETED and done.deadline == again.deadline

        other = await rt.submit("sleeper", "nap", deadline=0.3)
        failed = await ended(rt, other.task_id)
        assert failed.status_reason == "deadline"
        # No deadline given: the passed one is dropped, the task continues without one.
        dropped = await rt.retry(other.task_id)
        assert dropped.deadline is None and "deadline" not in dropped.config
        done = await ended(rt, other.task_id)
    assert done.status is TaskStatus.COMPLETED
    assert done.output.startswith("done after: Tool call cancelled: the task's deadline")


@pytest.mark.slow
async def test_a_new_deadline_on_retry_is_enforced_and_named(store: Store) -> None:
    def always_asks(messages: list[Any]) -> Any:
        n = sum(isinstance(m, AssistantMessage) for m in messages)
        return [ToolCall("ask", {"question": f"question {n}"})]

    agent = Agent(
        name="curious",
        model=ScriptedModel(always_asks),
        tools=[ask],
        builtin_tools=BuiltinTools(plan=False),
    )
    async with Runtime(store, agents=[agent], poll_interval=0.1) as rt:
        sub = await rt.submit("curious", "go", deadline=0.3)
        assert (await ended(rt, sub.task_id)).status_reason == "deadline"
        again = await rt.retry(sub.task_id, deadline=0.4)
        task = await ended(rt, sub.task_id)
        view = await rt.messages(task.id)
    assert task.status is TaskStatus.FAILED and task.status_reason == "deadline"
    assert again.deadline is not None
    assert task.error == f"deadline exceeded: {again.deadline.isoformat()} (0.4 s after retry)"
    # Each question asked got exactly one result, the cancellation. (How many were
    # asked depends on the machine: a deadline of 0.3 s can pass while the model
    # is still being asked, before a question is recorded; that run ends by the
    # same deadline, with no call left open.)
    results = one_result_per_call(view)
    assert len(results) <= 2
    assert set(results) <= {"Tool call cancelled: the task's deadline passed while it waited."}


async def test_pausing_a_waiting_task_clears_its_wake_up(store: Store) -> None:
    moves = Moves()
    async with Runtime(store, agents=agents(), on_status_change=moves, poll_interval=0.1) as rt:
        sub = await rt.submit("asker", "plan a trip", deadline=3600)
        await asyncio.wait_for(moves.parked.wait(), 30)
        paused = await rt.pause(sub.task_id)
        assert paused.status is TaskStatus.PAUSED and paused.wake_at is None
        moves.parked.clear()
        await rt.resume(sub.task_id)
        # Resumed, it parks again at once (not held back until its deadline as a
        # delayed start), and can be answered.
        await asyncio.wait_for(moves.parked.wait(), 30)
        again = await rt.get(sub.task_id)
        assert again.status is TaskStatus.WAITING and again.wake_at == again.deadline
        await rt.respond(sub.task_id, answer="Lisbon")
        done = await ended(rt, sub.task_id)
    assert done.status is TaskStatus.COMPLETED and done.output == "done after: Lisbon"


async def test_an_agent_default_deadline_and_refused_values() -> None:
    slow = Agent(
        name="bounded",
        model=ScriptedModel(["ok"]),
        builtin_tools=BuiltinTools(plan=False),
        deadline=timedelta(minutes=10),
    )
    async with Runtime("memory://", agents=[slow], run_worker=False) as rt:
        default = await rt.get((await rt.submit("bounded", "a")).task_id)
        assert default.deadline is not None
        assert default.deadline - default.created_at == pytest.approx(
            timedelta(minutes=10), abs=timedelta(seconds=5)
        )
        at = datetime(2030, 1, 1, tzinfo=UTC)
        given = await rt.get((await rt.submit("bounded", "b", deadline=at)).task_id)
        assert given.deadline == at  # submit's deadline overrides the agent's
        for bad in (datetime(2030, 1, 1), -1, 0, timedelta(0), True, float("nan"), 1e300):
            with pytest.raises(UsageError):
                await rt.submit("bounded", "c", deadline=bad)
    with pytest.raises(UsageError, match="must be positive"):
        Agent(name="x", model="scripted:none", deadline=-5)


# --- durable across restarts: a real worker process, SIGKILLed -----------------------


@pytest.fixture(params=["sqlite", "postgres"])
def crash_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/crash.db"
        return
    base = require_postgres()
    schema = f"test_dl_{uuid.uuid4().hex[:12]}"
    try:
        yield f"{base}?schema={schema}"
    finally:
        drop_schema(schema)


@pytest.mark.slow
async def test_a_waiting_task_fails_at_its_deadline_after_its_worker_was_sigkilled(
    crash_url: str,
) -> None:
    from support.workerlib import WorkerProc
    from worker_agents import AGENTS

    workers: list[WorkerProc] = []
    try:
        async with Runtime(crash_url, agents=AGENTS, run_worker=False) as rt:
            first = WorkerProc(crash_url, ttl=1.0)
            workers.append(first)
            # Up and serving before the clock starts (its start-up is not the test's).
            while "asker" not in await served_agents(rt.store):
                await rt.store.wait_for_change(0.1)
            sub = await rt.submit("asker", "plan a trip", deadline=5)
            deadline = (await rt.get(sub.task_id)).deadline
            assert deadline is not None
            waiting = await rt.wait(
                sub.task_id,
                timeout=30,
                until=lambda t: t.status not in (TaskStatus.PENDING, TaskStatus.RUNNING),
            )
            assert waiting.status is TaskStatus.WAITING and waiting.status_reason == "input"
            assert waiting.wake_at == deadline  # the durable timer is the row's wake_at
            first.signal(signal.SIGKILL)
            first.proc.wait(10)
            assert (await rt.get(sub.task_id)).status is TaskStatus.WAITING  # nobody holds it
            # A new worker, started right away: it claims the task at its deadline.
            workers.append(WorkerProc(crash_url, ttl=1.0))
            task = await ended(rt, sub.task_id)
            view = await rt.messages(task.id)
    finally:
        for w in workers:
            w.stop()
    assert task.status is TaskStatus.FAILED and task.status_reason == "deadline"
    assert task.error is not None and task.error.startswith(
        f"deadline exceeded: {deadline.isoformat()} (5 s after submit)"
    )
    assert task.completed_at is not None and task.completed_at >= deadline
    assert one_result_per_call(view) == [
        "Tool call cancelled: the task's deadline passed while it waited."
    ]


@pytest.mark.slow
def test_the_guides_deadline_example_prints_what_it_says(tmp_path: Path) -> None:
    from support.readme import run, runnable_blocks

    done = run(runnable_blocks()["Deadlines"], tmp_path)
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert out[0].startswith("failed deadline deadline exceeded: ")
    assert out[0].endswith("(1 s after submit)") and out[1] == "ok"


@pytest.mark.slow
async def test_a_fork_does_not_copy_the_sources_deadline(store: Store) -> None:
    @tool(replay="safe")
    def look(q: str) -> str:
        """Look something up."""
        return f"found {q}"

    def script(messages: list[Any]) -> Any:
        n = sum(isinstance(m, AssistantMessage) for m in messages)
        if n == 0:
            return [ToolCall("look", {"q": "x"})]
        return [ToolCall("ask", {"question": f"question {n}"})]

    plain = Agent(
        name="ask2",
        model=ScriptedModel(script),
        tools=[look, ask],
        builtin_tools=BuiltinTools(plan=False),
    )
    bounded = Agent(
        name="ask2b",
        model=ScriptedModel(script),
        tools=[look, ask],
        builtin_tools=BuiltinTools(plan=False),
        deadline=timedelta(hours=1),
    )
    async with Runtime(store, agents=[plain, bounded], poll_interval=0.1) as rt:
        results = []
        for name in ("ask2", "ask2b"):
            sub = await rt.submit(name, "go", deadline=0.3)
            failed = await ended(rt, sub.task_id)
            assert failed.status_reason == "deadline" and failed.iterations == 1
            fork = await rt.fork(sub.task_id, at_round=1)
            results.append(
                await rt.wait(
                    fork.task_id, timeout=30, until=lambda t: t.status is TaskStatus.WAITING
                )
            )
    unbounded, defaulted = results
    assert unbounded.deadline is None and unbounded.wake_at is None
    assert defaulted.deadline is not None and defaulted.config["deadline"]["by"] == "fork"
    assert defaulted.deadline - utcnow() > timedelta(minutes=50)


async def test_a_waiting_task_is_claimable_once_its_wake_up_is_due(store: Store) -> None:
    """Store level: whatever it waits for, a waiting task with `wake_at` due is claimed
    (that is how a deadline reaches a task waiting for input), and one without is not."""
    from duragent.store._commits import Commit, TaskPatch

    async def parked(wake_at: datetime | None) -> str:
        task = Task(agent="a")
        await store.create_task(task)
        claimed = await store.claim_task("w1", task_id=task.id)
        assert claimed is not None
        patch = {"status": TaskStatus.WAITING, "status_reason": "input", "wake_at": wake_at}
        await store.commit(
            Commit(fence={task.id: claimed.lease.epoch}, patches=[TaskPatch(task.id, patch)])
        )
        await store.release_lease(task.id, claimed.lease.epoch)
        return task.id

    due = utcnow() - timedelta(seconds=1)
    never = await parked(None)
    later = await parked(utcnow() + timedelta(hours=1))
    assert await store.next_wake_at() is not None
    now_due = await parked(due)
    assert await store.next_wake_at() == due
    assert await store.claim_task("w2", task_id=never) is None
    assert await store.claim_task("w2", task_id=later) is None
    claimed = await store.claim_task("w2")
    assert claimed is not None and claimed.id == now_due and claimed.wake_at is None
    assert await store.claim_task("w2") is None


@pytest.mark.slow
async def test_a_task_whose_worker_died_in_a_tool_fails_at_its_deadline_without_rerunning_it(
    crash_url: str, tmp_path: Path
) -> None:
    from support.workerlib import WorkerProc
    from worker_agents import AGENTS

    ledger = tmp_path / "ledger.txt"
    workers: list[WorkerProc] = []
    try:
        async with Runtime(crash_url, agents=AGENTS, run_worker=False) as rt:
            first = WorkerProc(crash_url, ttl=1.0, HOLD="nap", LEDGER=str(ledger))
            workers.append(first)
            sub = await rt.submit("sleeper", "nap", deadline=timedelta(seconds=3))
            await first.wait_output(f"AT nap {sub.task_id}")
            first.signal(signal.SIGKILL)
            first.proc.wait(10)
            deadline = (await rt.get(sub.task_id)).deadline
            assert deadline is not None
            # The next worker comes after the deadline: it must not run anything more.
            await asyncio.sleep(max(0.0, (deadline - utcnow()).total_seconds()))
            workers.append(WorkerProc(crash_url, ttl=1.0, LEDGER=str(ledger)))
            task = await ended(rt, sub.task_id)
            view = await rt.messages(task.id)
    finally:
        for w in workers:
            w.stop()
    assert task.status is TaskStatus.FAILED and task.status_reason == "deadline"
    assert task.restarts == 1  # taken over once, by the worker that failed it
    assert [line.split()[:2] for line in ledger.read_text().splitlines()] == [["start", "nap"]]
    assert one_result_per_call(view) == [
        "Tool call cancelled: the task's deadline passed before it finished."
    ]
