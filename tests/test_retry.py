"""`failed` is not a dead end (issue 11 item 4), on every store.

`Runtime.retry` continues a failed task from its last commit: completed rounds
are kept, a notice records the retry, and the round the failure interrupted is
recovered by the same table as after a crash. A request id reused with another
input is refused.
"""

from __future__ import annotations

from typing import Any

import pytest

from duragent import (
    Agent,
    BuiltinTools,
    DuplicateRequest,
    InvalidTransition,
    ModelError,
    Runtime,
    ScriptedModel,
    TaskStatus,
    ToolCall,
    UsageError,
    tool,
)
from duragent.errors import TaskNotFound
from duragent.store._protocol import Store
from duragent.types import EntryKind, ToolMessage, UINotice


def agent_failing_once(ran: list[str], *, model_fails: bool = True) -> Agent:
    """Round 1 calls a never-replay and a replay-safe tool; round 2 answers, except
    that (if `model_fails`) the first time round 2 is asked, the model fails for good."""
    failed: list[bool] = [] if model_fails else [True]

    @tool
    async def send(to: str) -> str:
        """Send a message (never replayed)."""
        ran.append(f"send:{to}")
        return f"sent to {to}"

    @tool(replay="safe")
    async def look(q: str) -> str:
        """Look something up."""
        ran.append(f"look:{q}")
        return f"found {q}"

    def script(messages: list[Any]) -> Any:
        done = sum(1 for m in messages if getattr(m, "role", "") == "assistant")
        if done == 0:
            return [ToolCall("send", {"to": "bob"}), ToolCall("look", {"q": "x"})]
        if not failed:
            failed.append(True)
            raise ModelError("the provider refused the request")
        return "all done"

    return Agent(
        name="a",
        model=ScriptedModel(script),
        tools=[send, look],
        builtin_tools=BuiltinTools(plan=False),
    )


async def test_retry_continues_a_failed_task_keeping_its_completed_rounds(store: Store) -> None:
    ran: list[str] = []
    agent = agent_failing_once(ran)
    async with Runtime(store, agents=[agent]) as rt:
        sub = await rt.submit("a", "go", owner="alice")
        failed = await sub.wait(30)
        assert failed.status is TaskStatus.FAILED and "refused" in (failed.error or "")
        retried = await rt.retry(sub.task_id, owner="alice")
        assert retried.status is TaskStatus.PENDING and retried.error is None
        assert retried.completed_at is None
        task = await rt.wait(sub.task_id, timeout=10)
        view = await rt.messages(task.id)
        ui = await rt.ui_messages(task.id)
    assert task.status is TaskStatus.COMPLETED and task.output == "all done"
    assert ran == ["send:bob", "look:x"]  # round 1 was kept, not redone
    assert [m.content for m in view if isinstance(m, ToolMessage)] == ["sent to bob", "found x"]
    assert task.iterations == 2
    notices = [m.message for m in ui if isinstance(m, UINotice)]
    assert any(n.startswith("Retried after the failure") and "refused" in n for n in notices)
    moves = [
        (e.payload["from"], e.payload["to"])
        for e in await store.entries(task.id)
        if e.kind is EntryKind.STATUS
    ]
    assert ("failed", "pending") in moves and moves[-1] == ("running", "completed")


async def test_retry_recovers_the_interrupted_round_by_the_recovery_table(store: Store) -> None:
    ran: list[str] = []
    agent = agent_failing_once(ran, model_fails=False)
    broken = [True]

    async def trace(point: str, **info: Any) -> None:
        if point == "tool_start" and broken:  # a bug in the worker, as the tools start
            raise RuntimeError("the worker hit a bug")

    async with Runtime(store, agents=[agent], trace=trace) as rt:
        sub = await rt.submit("a", "go")
        failed = await sub.wait(30)
        assert failed.status is TaskStatus.FAILED and "worker hit a bug" in (failed.error or "")
        results = [e for e in await store.entries(failed.id) if e.kind is EntryKind.TOOL_RESULT]
        assert results == [] and ran == []  # both calls have an intent and no result
        broken.clear()
        await rt.retry(failed.id)
        task = await rt.wait(failed.id, timeout=10)
        view = await rt.messages(task.id)
    assert task.status is TaskStatus.COMPLETED
    tool_results = [m.content for m in view if isinstance(m, ToolMessage)]
    # The never-replay call may have started: reported interrupted, not run again.
    # The replay-safe call is run again.
    assert len(tool_results) == 2
    assert tool_results[0].startswith("Tool call interrupted")
    assert tool_results[1] == "found x"
    assert ran == ["look:x"]


async def test_only_a_failed_task_of_the_caller_can_be_retried(store: Store) -> None:
    agent = Agent(name="a", model=ScriptedModel(["ok"]), builtin_tools=BuiltinTools(plan=False))
    async with Runtime(store, agents=[agent]) as rt:
        sub = await rt.submit("a", "go", owner="alice")
        done = await sub.wait(30)
        assert done.status is TaskStatus.COMPLETED
        with pytest.raises(InvalidTransition, match="only a failed task can be retried"):
            await rt.retry(done.id)
        with pytest.raises(TaskNotFound):
            await rt.retry(done.id, owner="bob")
        with pytest.raises(TaskNotFound):
            await rt.retry("t_" + "0" * 32)
        after = await rt.get(done.id)
    assert (after.status, after.version) == (TaskStatus.COMPLETED, done.version)


async def test_a_request_id_reused_with_another_input_is_refused(store: Store) -> None:
    agent = Agent(name="a", model=ScriptedModel(["ok"]), builtin_tools=BuiltinTools(plan=False))
    other = Agent(name="b", model=ScriptedModel(["ok"]), builtin_tools=BuiltinTools(plan=False))
    async with Runtime(store, agents=[agent, other], run_worker=False) as rt:
        first = await rt.submit("a", {"text": "hi", "n": 1}, request_id="r1", owner="alice")
        again = await rt.submit("a", {"n": 1, "text": "hi"}, request_id="r1", owner="alice")
        assert (again.task_id, again.created) == (first.task_id, False)
        with pytest.raises(DuplicateRequest, match="'r1'") as info:
            await rt.submit("a", {"text": "hello", "n": 1}, request_id="r1", owner="alice")
        assert isinstance(info.value, UsageError) and info.value.task_id == first.task_id
        with pytest.raises(DuplicateRequest):
            await rt.submit("b", {"text": "hi", "n": 1}, request_id="r1", owner="alice")
        # Request ids are per owner: bob's r1 is a new task.
        bobs = await rt.submit("a", "something else", request_id="r1", owner="bob")
        assert bobs.created and bobs.task_id != first.task_id
        page = await rt.list_tasks(owner="alice")
    assert [t.id for t in page.tasks] == [first.task_id]  # nothing else was created
