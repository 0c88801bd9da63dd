"""Workers, leases and the task graph, with real processes (issue 4's acceptance)."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from duragent import Agent, BuiltinTools, Runtime, ScriptedModel, TaskStatus, ToolCall, tool
from duragent.runtime._presence import WORKERS_SCOPE, block_unserved, served_agents
from duragent.runtime._submit import new_task
from duragent.runtime._worker import Worker, WorkerOptions
from duragent.store._commits import LeaseRenewal
from duragent.store._memory import MemoryStore
from duragent.store._protocol import Store
from duragent.types import EntryKind, Task
from support.workerlib import WorkerProc, ledger_lines, one_result_per_call
from worker_agents import AGENTS, build_agents


@pytest.fixture
async def rt(tmp_path: Path) -> AsyncIterator[Runtime]:
    """A Runtime without a worker: it only submits, answers and reads."""
    async with Runtime(f"sqlite:///{tmp_path}/w.db", agents=AGENTS, run_worker=False) as runtime:
        yield runtime


@pytest.fixture
def workers() -> Iterator[list[WorkerProc]]:
    procs: list[WorkerProc] = []
    yield procs
    for p in procs:
        p.stop()


def url_of(rt: Runtime) -> str:
    return rt.store.url


async def until(
    rt: Runtime, task_id: str, cond: Callable[[Task], bool], timeout: float = 120
) -> Task:
    return await rt.wait(task_id, timeout=timeout, until=cond)


@pytest.mark.slow
async def test_three_workers_200_tasks_one_sigkilled(
    rt: Runtime, workers: list[WorkerProc], tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger.txt"
    ids = [(await rt.submit("sleeper", f"task {i}")).task_id for i in range(200)]
    # The victim blocks inside its first unsafe tool call, so it surely has
    # tasks in flight when it dies, however fast the other two are.
    victim = WorkerProc(url_of(rt), ttl=2.0, concurrency=80, LEDGER=str(ledger), HOLD="nap")
    workers.append(victim)
    held = (await victim.wait_output("AT nap ")).split()[2]
    for _ in range(2):
        workers.append(WorkerProc(url_of(rt), ttl=2.0, concurrency=80, LEDGER=str(ledger)))

    async def completed() -> int:
        page = await rt.list_tasks(status=TaskStatus.COMPLETED, limit=1000)
        return len(page.tasks)

    deadline = asyncio.get_running_loop().time() + 120
    while await completed() < 30:
        assert asyncio.get_running_loop().time() < deadline, "30 tasks not done within 120 s"
        await asyncio.sleep(0.05)
    victim.signal(signal.SIGKILL)
    victim.proc.wait(10)

    async def all_done() -> None:
        while await completed() < 200:
            await asyncio.sleep(0.1)

    await asyncio.wait_for(all_done(), 120)
    tasks = [await rt.get(i) for i in ids]
    assert all(t.status is TaskStatus.COMPLETED for t in tasks)
    starts = Counter(
        line.split()[2] for line in ledger_lines(ledger) if line.startswith("start nap ")
    )
    assert starts and max(starts.values()) == 1, "an unsafe tool ran twice"
    taken_over = [t for t in tasks if t.restarts > 0]
    assert held in {t.id for t in taken_over}, "the killed worker's task was not taken over"
    for t in taken_over:
        claims = await rt.store.entries(t.id, kinds=[EntryKind.STATUS])
        assert any(e.payload.get("takeover") for e in claims)
    for t in tasks[:50] + taken_over:
        await one_result_per_call(rt, t.id)


@pytest.mark.slow
async def test_zombie_worker_writes_nothing_after_takeover(
    rt: Runtime, workers: list[WorkerProc], tmp_path: Path
) -> None:
    ledger, release = tmp_path / "ledger.txt", tmp_path / "release"
    sub = await rt.submit("sleeper", "zombie")
    # Held until the heir has finished: stopped inside its tool, however slowly the
    # test gets to SIGSTOP it, and it tries to go on only once it lost the task.
    zombie = WorkerProc(
        url_of(rt), ttl=1.0, LEDGER=str(ledger), HOLD="nap_safe", HOLD_UNTIL=str(release)
    )
    workers.append(zombie)
    await zombie.wait_output("AT nap_safe")
    zombie.signal(signal.SIGSTOP)
    await until(
        rt,
        sub.task_id,
        lambda t: t.lease.expires_at is not None and t.lease.expires_at < datetime.now(UTC),
    )
    heir = WorkerProc(url_of(rt), ttl=30.0, LEDGER=str(ledger))
    workers.append(heir)
    task = await until(rt, sub.task_id, lambda t: t.status is TaskStatus.COMPLETED)
    before = [e.model_dump_json() for e in await rt.store.entries(sub.task_id)]
    release.touch()
    zombie.signal(signal.SIGCONT)
    await zombie.wait_output("abandon", stream="err", timeout=120)
    zombie.signal(signal.SIGTERM)
    zombie.proc.wait(30)
    after = [e.model_dump_json() for e in await rt.store.entries(sub.task_id)]
    assert after == before, "the zombie wrote to the task after losing it"
    entries = await rt.store.entries(sub.task_id)
    takeover = next(
        e.seq for e in entries if e.kind is EntryKind.STATUS and e.payload.get("takeover")
    )
    later = [
        e.payload["content"]
        for e in entries
        if e.kind is EntryKind.TOOL_RESULT and e.seq > takeover
    ]
    assert later and all(f"pid {heir.pid}" in r for r in later)
    assert task.restarts == 1 and task.lease.epoch == 2
    await one_result_per_call(rt, sub.task_id)


@pytest.mark.slow
async def test_restart_limit_blocks_then_resume_clears_it(
    rt: Runtime, workers: list[WorkerProc]
) -> None:
    sub = await rt.submit("sleeper", "crashy")
    for _ in range(2):
        w = WorkerProc(url_of(rt), ttl=1.0, HOLD="nap_safe", HOLD_EVERY="1", MAX_RESTARTS="1")
        workers.append(w)
        await w.wait_output("AT nap_safe")
        w.signal(signal.SIGKILL)
        w.proc.wait(10)
    workers.append(
        WorkerProc(url_of(rt), ttl=1.0, HOLD="nap_safe", HOLD_EVERY="1", MAX_RESTARTS="1")
    )
    task = await until(rt, sub.task_id, lambda t: t.status is TaskStatus.BLOCKED)
    assert task.status_reason == "restart_limit" and task.restarts == 2
    assert task.error is not None and "max_restarts=1" in task.error
    workers[-1].stop()
    resumed = await rt.resume(sub.task_id)
    assert resumed is not None and resumed.status is TaskStatus.PENDING and resumed.restarts == 0
    workers.append(WorkerProc(url_of(rt), ttl=1.0))
    done = await until(rt, sub.task_id, lambda t: t.status.terminal)
    assert done.status is TaskStatus.COMPLETED


@pytest.mark.slow
async def test_missing_tool_definition_blocks_naming_the_tool(
    rt: Runtime, workers: list[WorkerProc]
) -> None:
    sub = await rt.submit("sleeper", "lost tool")
    first = WorkerProc(url_of(rt), ttl=1.0, HOLD="nap")
    workers.append(first)
    await first.wait_output("AT nap")
    first.signal(signal.SIGKILL)
    first.proc.wait(10)
    # A deploy without the tool is another version of the agent: the task goes
    # there only by a migration, and blocks there on its call to the lost tool.
    full = (await rt.get(sub.task_id)).agent_version
    lost = {a.name: a.version for a in build_agents(dropped={"nap"})}["sleeper"]
    assert lost is not None and lost != full
    await rt.migrate(sub.task_id, lost)
    workers.append(WorkerProc(url_of(rt), ttl=1.0, DROP_TOOLS="nap"))
    task = await until(rt, sub.task_id, lambda t: t.status is TaskStatus.BLOCKED)
    assert task.status_reason == "missing_definition"
    assert task.error is not None and "'nap'" in task.error
    workers[-1].stop()
    assert full is not None
    await rt.migrate(sub.task_id, full)
    await rt.resume(sub.task_id)
    workers.append(WorkerProc(url_of(rt), ttl=1.0))
    done = await until(rt, sub.task_id, lambda t: t.status.terminal)
    assert done.status is TaskStatus.COMPLETED
    outcomes = [
        e.payload["outcome"]
        for e in await rt.store.entries(sub.task_id, kinds=[EntryKind.TOOL_RESULT])
    ]
    assert outcomes[0] == "interrupted"  # nap is not replay-safe


async def test_worker_never_claims_agents_it_does_not_know(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/k.db"
    chat_only = [a for a in AGENTS if a.name == "chat"]
    async with Runtime(url, agents=AGENTS, run_worker=False) as submitter:
        foreign = await submitter.submit("sleeper", "not for you")
        async with Runtime(url, agents=chat_only) as rt:
            mine = await rt.submit("chat", "hello")
            assert (await mine.wait(30)).status is TaskStatus.COMPLETED
            assert (await rt.get(foreign.task_id)).status is TaskStatus.PENDING
            assert rt.worker is not None and rt.worker.claimed == 1


async def _pending(store: Store, agent: str) -> str:
    task, first = new_task(Agent(name=agent, model="scripted:none"), "hello")
    stored, _ = await store.create_task(task, [first])
    return stored.id


@pytest.mark.slow
async def test_a_task_no_worker_can_run_is_blocked_after_the_grace_period(store: Store) -> None:
    lost = await _pending(store, "nobody-knows-me")
    agent = Agent(name="known", model=ScriptedModel(["fine"]))
    async with Runtime(store, agents=[agent], missing_agent_grace=0.2) as rt:
        done = await (await rt.submit("known", "x")).wait(30)
        task = await rt.wait(lost, timeout=30, until=lambda t: t.status is TaskStatus.BLOCKED)
        ui = await rt.ui_messages(lost)
    assert done.status is TaskStatus.COMPLETED  # the known agent's task is not held up
    assert task.status_reason == "missing_definition"
    assert task.error is not None and "'nobody-knows-me'" in task.error
    assert "start a worker that defines it" in task.error
    assert any(getattr(m, "detail", None) == task.error for m in ui)
    statuses = [e.payload for e in await store.entries(lost) if e.kind is EntryKind.STATUS]
    assert statuses[-1]["to"] == "blocked" and statuses[-1]["reason"] == "missing_definition"


async def test_a_live_worker_that_knows_the_agent_keeps_its_task_unblocked(store: Store) -> None:
    """Worker B knows agent "b" but every slot of it is busy: its pending task is
    not blocked by worker A, whatever the grace; once B is gone, it is."""
    release = asyncio.Event()

    @tool
    async def hold() -> str:
        """Hold the only slot."""
        await release.wait()
        return "held"

    b_agent = Agent(
        name="b",
        model=ScriptedModel(lambda m: [ToolCall("hold")] if len(m) < 2 else "ok"),
        tools=[hold],
    )
    busy = await _pending(store, "b")
    waiting = await _pending(store, "b")
    worker_b = Worker(store, [b_agent], WorkerOptions(concurrency=1, missing_agent_grace=3600))
    job = asyncio.ensure_future(worker_b.run())
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while "b" not in await served_agents(store) or not worker_b.runners:
            assert loop.time() < deadline, "worker B did not start"
            await asyncio.sleep(0.01)
        queued = waiting if busy in worker_b.runners else busy
        assert (await store.get_task(queued)).status is TaskStatus.PENDING
        assert await block_unserved(store, ["a"], grace=0) == []  # B is alive and knows "b"
    finally:
        release.set()
        await worker_b.stop(graceful=False)
        await job
    assert await store.get_document(WORKERS_SCOPE, worker_b.id) is None  # B withdrew
    blocked = await block_unserved(store, ["a"], grace=0)
    assert queued in blocked
    for tid in blocked:
        task = await store.get_task(tid)
        assert (task.status, task.status_reason) == (TaskStatus.BLOCKED, "missing_definition")


async def test_the_grace_period_counts_from_when_the_task_became_pending(store: Store) -> None:
    lost = await _pending(store, "ghost")
    assert await block_unserved(store, [], grace=3600) == []  # too soon
    assert await block_unserved(store, [], grace=0) == [lost]
    assert await block_unserved(store, [], grace=0) == []  # blocked once, not again
    # Resumed (someone says the worker is back): the grace starts again.
    async with Runtime(store, agents=[], run_worker=False) as rt:
        await rt.resume(lost)
    assert await block_unserved(store, [], grace=3600) == []


@pytest.mark.slow
async def test_timer_fires_after_every_process_restarted(
    rt: Runtime, workers: list[WorkerProc]
) -> None:
    sub = await rt.submit("timer", "wake me")
    # The only process that could fire the timer is killed well before it is due
    # (the timer's length is the safety net: the kill follows the wait at once).
    first = WorkerProc(url_of(rt), ttl=1.0, TIMER_SECONDS="6")
    workers.append(first)
    waiting = await until(rt, sub.task_id, lambda t: t.status is TaskStatus.WAITING)
    assert waiting.status_reason == "timer" and waiting.wake_at is not None
    assert datetime.now(UTC) < waiting.wake_at, "the timer was due before the kill"
    first.signal(signal.SIGKILL)
    first.proc.wait(10)
    assert (await rt.get(sub.task_id)).status is TaskStatus.WAITING  # nobody is sleeping on it
    workers.append(WorkerProc(url_of(rt), ttl=1.0))
    done = await until(rt, sub.task_id, lambda t: t.status.terminal)
    assert done.status is TaskStatus.COMPLETED and done.output.startswith("woke up: Slept until")
    assert done.completed_at is not None and done.completed_at >= waiting.wake_at


@pytest.mark.slow
async def test_subtask_survives_a_crash_of_its_worker(
    rt: Runtime, workers: list[WorkerProc], tmp_path: Path
) -> None:
    sub = await rt.submit("parent", "ask the researcher", owner="ann")
    first = WorkerProc(url_of(rt), ttl=1.0, HOLD="nap", LEDGER=str(tmp_path / "l.txt"))
    workers.append(first)
    await first.wait_output("AT nap")
    parent = await rt.get(sub.task_id)
    assert parent.status is TaskStatus.WAITING and parent.status_reason == "subtask"
    tree = await rt.tree(sub.task_id)
    assert len(tree.children) == 1
    child = tree.children[0].task
    assert child.agent == "researcher" and child.owner == "ann" and child.root_id == parent.id
    first.signal(signal.SIGKILL)
    first.proc.wait(10)
    workers.append(WorkerProc(url_of(rt), ttl=1.0))
    done = await until(rt, sub.task_id, lambda t: t.status.terminal)
    assert done.status is TaskStatus.COMPLETED and done.output == "the researcher says: 42"
    child = await rt.get(child.id)
    assert child.status is TaskStatus.COMPLETED and child.restarts == 1
    await one_result_per_call(rt, sub.task_id)


@pytest.mark.slow
async def test_approval_and_denial_answered_from_another_process(
    rt: Runtime, workers: list[WorkerProc], tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger.txt"
    workers.append(WorkerProc(url_of(rt), ttl=2.0, LEDGER=str(ledger)))
    approved = await rt.submit("banker", "pay bob and ann")
    denied = await rt.submit("banker", "pay bob and ann again")
    for s in (approved, denied):
        t = await until(rt, s.task_id, lambda t: t.status is TaskStatus.WAITING)
        assert t.status_reason == "input"
    small = [line for line in ledger_lines(ledger) if line.startswith("transfer 5.0")]
    assert len(small) == 2  # the small transfers ran without waiting
    await rt.respond(approved.task_id, approve=True)
    await rt.respond(denied.task_id, approve=False, reason="too much money")
    ok = await until(rt, approved.task_id, lambda t: t.status.terminal)
    no = await until(rt, denied.task_id, lambda t: t.status.terminal)
    assert "sent 500.0 to bob" in ok.output and "sent 5.0 to ann" in ok.output
    assert "denied this call: too much money" in no.output
    big = [line for line in ledger_lines(ledger) if line.startswith("transfer 500.0")]
    assert len(big) == 1 and approved.task_id in big[0]


@pytest.mark.slow
async def test_ask_user_waits_for_an_answer(rt: Runtime, workers: list[WorkerProc]) -> None:
    workers.append(WorkerProc(url_of(rt), ttl=2.0))
    sub = await rt.submit("asker", "plan a trip")
    t = await until(rt, sub.task_id, lambda t: t.status is TaskStatus.WAITING)
    assert t.status_reason == "input"
    with pytest.raises(Exception, match="pass answer="):
        await rt.respond(sub.task_id, approve=True)
    await rt.respond(sub.task_id, answer="Lisbon")
    done = await until(rt, sub.task_id, lambda t: t.status.terminal)
    assert done.output == "you chose Lisbon"


async def test_chat_continuation_is_not_resumption(tmp_path: Path) -> None:
    async with Runtime(f"sqlite:///{tmp_path}/c.db", agents=AGENTS) as rt:
        first = await (await rt.submit("chat", "hello", session_id="s1", owner="u")).wait(30)
        assert first.output == "I have heard 1 messages: hello"
        cont = await rt.submit("chat", "again", session_id="s1", owner="u", continue_session=True)
        second = await cont.wait(10)
        assert cont.task_id != first.id  # a new task with its own log
        assert second.output == "I have heard 2 messages: hello / again"
        view = await rt.model_view(cont.task_id)
        assert [type(m).__name__ for m in view] == [
            "UserMessage",
            "AssistantMessage",
            "UserMessage",
            "AssistantMessage",
        ]
        assert view[1].content == first.output
        fresh = await (await rt.submit("chat", "new topic", session_id="s1", owner="u")).wait(30)
        assert fresh.output == "I have heard 1 messages: new topic"
        # The first task's own log is untouched by the continuation.
        assert len(await rt.model_view(first.id)) == 2


@pytest.mark.slow
async def test_parent_pause_and_abort_reach_the_child(
    tmp_path: Path, workers: list[WorkerProc]
) -> None:
    url, release = f"sqlite:///{tmp_path}/g.db", tmp_path / "release"
    async with Runtime(url, agents=AGENTS, run_worker=False) as rt:
        sub = await rt.submit("parent", "delegate")
        # The child's tool is held until the pause is on the child's row, so the
        # child cannot finish first, however slowly the pause gets there.
        w = WorkerProc(url, ttl=2.0, HOLD="nap", HOLD_UNTIL=str(release), TOOL_GRACE="600")
        workers.append(w)
        await w.wait_output("AT nap")
        child = (await rt.tree(sub.task_id)).children[0].task
        pausing = asyncio.ensure_future(rt.pause(sub.task_id))
        await until(rt, child.id, lambda t: t.control is not None)
        release.touch()
        paused = await asyncio.wait_for(pausing, 60)
        assert paused.status is TaskStatus.PAUSED
        child = await until(rt, child.id, lambda t: t.status is not TaskStatus.RUNNING)
        assert child.status is TaskStatus.PAUSED
        await rt.resume(sub.task_id)
        assert (await rt.get(child.id)).status in (
            TaskStatus.PENDING,
            TaskStatus.RUNNING,
            TaskStatus.COMPLETED,
        )
        done = await until(rt, sub.task_id, lambda t: t.status.terminal)
        assert done.status is TaskStatus.COMPLETED

        release.unlink()  # the next child's tool is held again: it is aborted inside it
        second = await rt.submit("parent", "delegate again")
        await until(rt, second.task_id, lambda t: t.status is TaskStatus.WAITING)
        kid = (await rt.tree(second.task_id)).children[0].task
        await w.wait_output(f"AT nap {kid.id}")
        aborted = await rt.abort(second.task_id)
        assert aborted.status is TaskStatus.ABORTED
        kid = await until(rt, kid.id, lambda t: t.status.terminal)
        assert kid.status is TaskStatus.ABORTED


@pytest.mark.slow
async def test_sigterm_finishes_the_running_tool_and_hands_the_task_back(
    rt: Runtime, workers: list[WorkerProc], tmp_path: Path
) -> None:
    ledger, release = tmp_path / "ledger.txt", tmp_path / "release"
    sub = await rt.submit("sleeper", "graceful")
    first = WorkerProc(
        url_of(rt), ttl=30.0, LEDGER=str(ledger), HOLD="nap", HOLD_UNTIL=str(release)
    )
    workers.append(first)
    await first.wait_output("AT nap")
    first.signal(signal.SIGTERM)
    # The tool ends only once the worker is stopping: it cannot go on to the
    # next round first, however late the signal arrives.
    await first.wait_output("stopping:", stream="err")
    release.touch()
    assert first.proc.wait(30) == 0
    task = await rt.get(sub.task_id)
    # The tool finished within the grace period, its result was committed, and the
    # task went back to the queue at once (no waiting for a 30 s lease to expire).
    assert task.status is TaskStatus.PENDING
    outcomes = [
        e.payload["outcome"]
        for e in await rt.store.entries(sub.task_id, kinds=[EntryKind.TOOL_RESULT])
    ]
    assert outcomes == ["ok"]
    workers.append(WorkerProc(url_of(rt), ttl=30.0, LEDGER=str(ledger)))
    done = await until(rt, sub.task_id, lambda t: t.status.terminal)
    assert done.status is TaskStatus.COMPLETED and done.restarts == 0
    assert sum(1 for line in ledger_lines(ledger) if line.startswith("start nap ")) == 1


@pytest.mark.slow
async def test_worker_stopped_past_its_lease_and_continued_counts_one_restart(
    rt: Runtime, workers: list[WorkerProc], tmp_path: Path
) -> None:
    ledger, release = tmp_path / "ledger.txt", tmp_path / "release"
    ids = [(await rt.submit("sleeper", f"task {i}")).task_id for i in range(8)]
    # A short poll: once continued, this worker looks for work before its
    # heartbeat runs, and claims its own expired tasks again (a new epoch)
    # while their old runners are still there.
    stopped = WorkerProc(
        url_of(rt), ttl=2.0, poll=0.02, LEDGER=str(ledger), HOLD="nap", HOLD_UNTIL=str(release)
    )
    workers.append(stopped)
    for task_id in ids:
        await stopped.wait_output(f"AT nap {task_id}")
    stopped.signal(signal.SIGSTOP)
    for task_id in ids:
        await until(
            rt,
            task_id,
            lambda t: t.lease.expires_at is not None and t.lease.expires_at < datetime.now(UTC),
        )
    heir = WorkerProc(url_of(rt), ttl=30.0, concurrency=4, LEDGER=str(ledger))
    workers.append(heir)

    async def held_by_heir() -> list[str]:
        tasks = [await rt.get(task_id) for task_id in ids]
        return [t.id for t in tasks if f":{heir.pid}:" in (t.lease.owner or "")]

    deadline = asyncio.get_running_loop().time() + 120
    while len(taken := await held_by_heir()) < 4:
        assert asyncio.get_running_loop().time() < deadline, (
            f"the heir took {len(taken)} of the 4 expired tasks it can run within 120 s\n"
            + "\n".join(heir.err[-30:])
        )
        await asyncio.sleep(0.05)
    stopped.signal(signal.SIGCONT)
    # The continued worker learns it lost these (and stops their runners)...
    deadline = asyncio.get_running_loop().time() + 120
    for task_id in taken:
        while not any(task_id in line and "lease lost" in line for line in stopped.err):
            assert asyncio.get_running_loop().time() < deadline, (
                f"the continued worker did not log 'lease lost' for {task_id} within 120 s\n"
                + "\n".join(stopped.err[-30:])
            )
            await asyncio.sleep(0.05)
            assert stopped.proc.poll() is None, "\n".join(stopped.err[-30:])
    release.touch()  # ...before any held tool could finish and record its end.
    for task_id in ids:
        done = await until(rt, task_id, lambda t: t.status.terminal, timeout=120)
        assert done.status is TaskStatus.COMPLETED
        assert done.restarts <= 1, f"{task_id} was taken over {done.restarts} times"
        await one_result_per_call(rt, task_id)
    for task_id in taken:
        assert (await rt.get(task_id)).restarts == 1
    keys = {task_id: f"{task_id}:" for task_id in ids}
    lines = ledger_lines(ledger)
    for task_id in ids:
        restarts = (await rt.get(task_id)).restarts
        starts = [x for x in lines if x.startswith(f"start nap {keys[task_id]}")]
        ends = [x for x in lines if x.startswith(f"end nap {keys[task_id]}")]
        assert len(starts) == 1, (task_id, starts)
        # A runner that lost its task never finished its tool afterwards.
        assert len(ends) == (0 if restarts else 1), (task_id, restarts, ends)


@pytest.mark.slow
async def test_heartbeat_renews_every_lease_in_one_store_call() -> None:
    class CountingStore(MemoryStore):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[set[str]] = []
            self.singles = 0

        async def renew_leases(self, worker_id: str, leases: Any, ttl: float) -> LeaseRenewal:
            self.calls.append(set(leases))
            return await super().renew_leases(worker_id, leases, ttl)

        async def renew_lease(self, task_id: str, worker_id: str, epoch: int, ttl: float) -> Task:
            self.singles += 1
            return await super().renew_lease(task_id, worker_id, epoch, ttl)

    release = asyncio.Event()

    @tool
    async def hold() -> str:
        """Wait until the test lets go."""
        await release.wait()
        return "held"

    def script(messages: list[Any]) -> Any:
        return [ToolCall("hold", {})] if len(messages) == 1 else "done"

    agent = Agent(
        name="holder",
        model=ScriptedModel(script),
        tools=[hold],
        builtin_tools=BuiltinTools(plan=False),
    )
    store = CountingStore()
    async with Runtime(store, agents=[agent], lease_ttl=1.5, concurrency=30) as rt:
        ids = {(await rt.submit("holder", f"t{i}")).task_id for i in range(30)}

        async def three_full_beats() -> None:
            # Three beats that each found all 30 tasks running: one call each.
            while sum(1 for c in store.calls if c == ids) < 3:
                await asyncio.sleep(0.05)

        try:
            await asyncio.wait_for(three_full_beats(), 60)
        finally:
            release.set()
        assert all(c <= ids for c in store.calls) and store.singles == 0
        for task_id in ids:
            done = await rt.wait(task_id, timeout=60)
            assert done.status is TaskStatus.COMPLETED
