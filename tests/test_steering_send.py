"""Messages into a live task (double texting, issue 13 item 2), on every store."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from duragent import (
    Agent,
    BuiltinTools,
    History,
    InvalidTransition,
    Runtime,
    ScriptedModel,
    Store,
    TaskBusy,
    TaskNotFound,
    TaskStatus,
    Timing,
    ToolCall,
    ToolContext,
    UsageError,
    tool,
)
from duragent.runtime._inbox import MultitaskStrategy
from duragent.types import EntryKind, Task, ToolMessage, UserMessage
from support.readme import first_block_under
from support.sending import Gate, roles, script


def agent(gate: Gate, **kw: Any) -> Agent:
    return Agent(
        name="a",
        model=ScriptedModel(script),
        tools=gate.tools(),
        builtin_tools=BuiltinTools(plan=False),
        timing=Timing(tool_grace=0.0),
        **kw,
    )


async def test_enqueue_takes_the_message_after_the_turn_seeing_its_answer(store: Store) -> None:
    gate = Gate()
    async with Runtime(store, agents=[agent(gate)]) as rt:
        sub = await rt.submit("a", "start", owner="u")
        await gate.entered.wait()
        sent = await rt.send(sub.task_id, "and then?", owner="u")
        assert sent.status is TaskStatus.RUNNING
        assert [m["text"] for m in sent.config["inbox"]] == ["and then?"]
        gate.release.set()
        task = await sub.wait(20)
        view = await rt.model_view(task.id)
    assert task.status is TaskStatus.COMPLETED
    assert task.output == "re 'and then?' having said 2"
    assert roles(view) == [
        "user:start",
        "assistant",
        "tool:slow done",
        "assistant:answer after 'slow done'",
        "user:and then?",
        "assistant:re 'and then?' having said 2",
    ]
    assert "inbox" not in task.config and gate.runs == 1
    kinds = [(e.kind, e.payload.get("type")) for e in await store.entries(task.id)]
    assert kinds.count((EntryKind.CHECKPOINT, "message")) == 1
    assert kinds.count((EntryKind.CHECKPOINT, "delivered")) == 1


@pytest.mark.slow
async def test_interrupt_stops_the_round_and_goes_on_with_the_message(store: Store) -> None:
    gate = Gate()
    async with Runtime(store, agents=[agent(gate, multitask_strategy="interrupt")]) as rt:
        sub = await rt.submit("a", "start", owner="u")
        await gate.entered.wait()
        await rt.send(sub.task_id, "stop that", owner="u")
        task = await sub.wait(20)
        view = await rt.model_view(task.id)
        statuses = [e.payload["to"] for e in await store.entries(task.id, kinds=[EntryKind.STATUS])]
    assert task.status is TaskStatus.COMPLETED
    # The call keeps exactly one result (cut short), then the message comes in.
    assert roles(view)[:2] == ["user:start", "assistant"]
    assert isinstance(view[2], ToolMessage) and "cancelled" in view[2].content
    assert roles(view)[3:] == ["user:stop that", "assistant:re 'stop that' having said 1"]
    assert "paused" not in statuses and gate.runs == 1


async def test_rollback_voids_the_round_and_goes_on_with_the_message(store: Store) -> None:
    gate = Gate()
    async with Runtime(store, agents=[agent(gate)]) as rt:
        sub = await rt.submit("a", "look", owner="u")
        await gate.entered.wait()
        await rt.send(sub.task_id, "never mind", owner="u", multitask_strategy="rollback")
        task = await sub.wait(20)
        view = await rt.model_view(task.id)
        hist = await rt.history(task.id)
    assert task.status is TaskStatus.COMPLETED
    # The replay-safe round is gone from the model's view; the audit trail keeps it.
    assert roles(view) == [
        "user:look",
        "user:never mind",
        "assistant:re 'never mind' having said 0",
    ]
    assert hist.rounds[0].voided and gate.runs == 1


def rollback_agent(release: asyncio.Event, entered: asyncio.Event) -> Agent:
    @tool
    async def send() -> str:
        """Send (never replayed: its result stays)."""
        return "sent"

    @tool(replay="safe")
    async def lookup() -> str:
        """Look up (harmless to repeat)."""
        entered.set()
        await release.wait()
        return "looked up"

    def say(messages: list[Any]) -> Any:
        last = messages[-1]
        if isinstance(last, UserMessage) and last.content == "go":
            return [ToolCall("send"), ToolCall("lookup")]
        return f"re {getattr(last, 'content', '')!r}"

    return Agent(
        name="r",
        model=ScriptedModel(say),
        tools=[send, lookup],
        builtin_tools=BuiltinTools(plan=False),
        timing=Timing(tool_grace=0.0),
    )


async def test_a_round_rolled_back_by_a_new_message_says_so_not_paused(store: Store) -> None:
    release, entered = asyncio.Event(), asyncio.Event()
    async with Runtime(store, agents=[rollback_agent(release, entered)]) as rt:
        sub = await rt.submit("r", "go", owner="u")
        await entered.wait()
        await rt.send(sub.task_id, "never mind", owner="u", multitask_strategy="rollback")
        task = await sub.wait(20)
        view = await rt.model_view(task.id)
    assert task.status is TaskStatus.COMPLETED
    rolled = [m.content for m in view if isinstance(m, ToolMessage) and "Rolled back" in m.content]
    assert len(rolled) == 1, view
    assert "a new message came in" in rolled[0] and "paused" not in rolled[0]


async def test_reject_refuses_while_a_turn_runs_and_accepts_when_paused(store: Store) -> None:
    gate = Gate()
    async with Runtime(store, agents=[agent(gate, multitask_strategy="reject")]) as rt:
        sub = await rt.submit("a", "start", owner="u")
        await gate.entered.wait()
        with pytest.raises(TaskBusy, match="multitask_strategy is 'reject'"):
            await rt.send(sub.task_id, "hello?", owner="u")
        assert "inbox" not in (await rt.get(sub.task_id)).config
        pause = asyncio.ensure_future(rt.pause(sub.task_id))
        paused = await pause
        assert paused.status is TaskStatus.PAUSED
        # No turn runs: the message waits in the inbox, the task stays paused.
        kept = await rt.send(sub.task_id, "when you are back", owner="u")
        assert kept.status is TaskStatus.PAUSED and len(kept.config["inbox"]) == 1
        await rt.resume(sub.task_id)
        task = await sub.wait(20)
        view = await rt.model_view(task.id)
    assert task.status is TaskStatus.COMPLETED
    assert roles(view)[3:] == [
        "user:when you are back",
        "assistant:re 'when you are back' having said 1",
    ]


async def test_a_finished_task_takes_no_message_and_others_ids_are_not_found(
    store: Store,
) -> None:
    gate = Gate()
    gate.release.set()
    async with Runtime(store, agents=[agent(gate)]) as rt:
        task = await (await rt.submit("a", "start", owner="u")).wait(20)
        with pytest.raises(InvalidTransition, match="continue_session=True"):
            await rt.send(task.id, "more", owner="u")
        with pytest.raises(TaskNotFound):
            await rt.send(task.id, "more", owner="intruder")
        with pytest.raises(UsageError, match="needs some text"):
            await rt.send(task.id, "  ", owner="u")
        with pytest.raises(UsageError, match="unknown multitask_strategy"):
            await rt.send(task.id, "x", multitask_strategy="shout")  # type: ignore[arg-type]
        assert (await rt.get(task.id)).last_seq == task.last_seq  # nothing written


@pytest.mark.slow
async def test_continue_session_while_a_turn_runs_follows_the_strategy(store: Store) -> None:
    gate = Gate()
    async with Runtime(store, agents=[agent(gate)]) as rt:
        first = await rt.submit("a", "start", owner="u", session_id="s")
        await gate.entered.wait()
        with pytest.raises(TaskBusy):
            await rt.submit(
                "a",
                "too soon",
                owner="u",
                session_id="s",
                continue_session=True,
                multitask_strategy="reject",
            )
        second = await rt.submit("a", "also this", owner="u", session_id="s", continue_session=True)
        assert second.sent and not second.created and second.task_id == first.task_id
        # Another owner's session of the same name is another session: a new task.
        other = await rt.submit("a", "look", owner="v", session_id="s", continue_session=True)
        assert other.created and other.task_id != first.task_id
        gate.release.set()
        task = await first.wait(20)
        await other.wait(20)
        assert task.output == "re 'also this' having said 2"
        assert len((await rt.list_tasks(owner="u")).tasks) == 1  # never a silent fork
        # Once the turn is over, continuing the session starts a new task from it.
        third = await rt.submit("a", "next", owner="u", session_id="s", continue_session=True)
        assert third.created and not third.sent
        view = await rt.model_view((await third.wait(20)).id)
    assert roles(view)[-2:] == ["user:next", "assistant:re 'next' having said 3"]


@pytest.mark.slow
async def test_a_task_waiting_for_a_subtask_takes_an_interrupting_message_when_it_ends(
    store: Store,
) -> None:
    """A sub-task runs on after an interrupt (cutting the wait would orphan it): the
    parent keeps waiting and takes the message after the sub-task's result."""

    @tool
    def delegate(ctx: ToolContext) -> Any:
        """Hand the question to a helper."""
        return ctx.spawn("helper", "ask")

    def boss(messages: list[Any]) -> Any:
        last = messages[-1]
        if isinstance(last, UserMessage) and last.content == "ship":
            return [ToolCall("delegate")]
        return f"saw {getattr(last, 'content', '')!r}"

    def helper(messages: list[Any]) -> Any:
        if isinstance(messages[-1], UserMessage):
            return [ToolCall("ask_user", {"question": "Which city?"})]
        return f"helper heard {messages[-1].content}"

    a = Agent(
        name="w",
        model=ScriptedModel(boss),
        tools=[delegate],
        builtin_tools=BuiltinTools(plan=False),
    )
    h = Agent(
        name="helper",
        model=ScriptedModel(helper),
        builtin_tools=BuiltinTools(plan=False, ask_user=True),
    )
    async with Runtime(store, agents=[a, h]) as rt:
        sub = await rt.submit("w", "ship", owner="u", multitask_strategy="interrupt")
        await rt.wait(sub.task_id, timeout=20, until=waiting)
        tree = await rt.tree(sub.task_id)
        (child,) = tree.children
        await rt.wait(child.task.id, timeout=20, until=waiting)
        sent = await rt.send(sub.task_id, "quickly please", owner="u")
        assert sent.status is TaskStatus.WAITING and sent.control is None
        assert sent.status_reason == "subtask"
        await rt.respond(child.task.id, answer="Lisbon")
        task = await sub.wait(20)
        view = await rt.model_view(task.id)
    assert roles(view)[2:] == [
        "tool:helper heard Lisbon",
        "user:quickly please",
        "assistant:saw 'quickly please'",
    ]


@pytest.mark.slow
def test_the_guides_send_example_runs(tmp_path: Path) -> None:
    script = tmp_path / "send.py"
    script.write_text(first_block_under("Messages into a live task (double texting)"))
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=True
    ).stdout.splitlines()
    assert out[4:] == [
        "user: and bats?",
        "assistant: Answering 'and bats?' after 2 model turns.",
        "Answering 'and bats?' after 2 model turns.",
        "Answering 'never mind, just say hi' after 1 model turns.",
    ]


async def test_a_pause_asked_during_an_interrupt_wins_and_the_message_waits(
    store: Store,
) -> None:
    gate = Gate()
    slow_agent = Agent(
        name="a",
        model=ScriptedModel(script),
        tools=gate.tools(),
        builtin_tools=BuiltinTools(plan=False),
        timing=Timing(tool_grace=30),
    )
    async with Runtime(store, agents=[slow_agent]) as rt:
        sub = await rt.submit("a", "start", owner="u")
        await gate.entered.wait()
        await rt.send(sub.task_id, "stop that", multitask_strategy="interrupt")
        assert rt.worker is not None
        runner = rt.worker.runner(sub.task_id)
        assert runner is not None and runner.control is not None and runner.control.resume
        pausing = asyncio.ensure_future(rt.pause(sub.task_id))
        while runner.control is None or runner.control.resume:  # the pause is heard
            await asyncio.sleep(0.01)
        gate.release.set()  # the held tool finishes within the grace period
        paused = await pausing
        assert paused.status is TaskStatus.PAUSED
        assert [m["text"] for m in paused.config["inbox"]] == ["stop that"]
        await rt.resume(sub.task_id)
        task = await sub.wait(20)
        view = await rt.model_view(task.id)
    assert roles(view) == [
        "user:start",
        "assistant",
        "tool:slow done",
        "user:stop that",
        "assistant:re 'stop that' having said 1",
    ]


def waiting_agent() -> tuple[Agent, list[str]]:
    """'nap' sleeps an hour, 'mail' waits for approval, 'ask' asks the user; a result
    or another message is answered with what the model has seen last."""
    ran: list[str] = []

    @tool
    def nap(ctx: ToolContext) -> Any:
        """Sleep an hour."""
        return ctx.sleep(3600)

    @tool(requires_approval=True)
    def mail() -> str:
        """Send a mail."""
        ran.append("mail")
        return "sent"

    def say(messages: list[Any]) -> Any:
        last = messages[-1]
        if isinstance(last, UserMessage) and last.content in ("nap", "mail"):
            return [ToolCall(last.content)]
        if isinstance(last, UserMessage) and last.content == "ask":
            return [ToolCall("ask_user", {"question": "Which city?"})]
        return f"re {last.content!r}"

    a = Agent(
        name="a",
        model=ScriptedModel(say),
        tools=[nap, mail],
        builtin_tools=BuiltinTools(plan=False, ask_user=True),
    )
    return a, ran


def waiting(t: Task) -> bool:
    return t.status is TaskStatus.WAITING


async def message_a_waiting_task(
    store: Store, start: str, strategy: MultitaskStrategy, text: str
) -> tuple[Task, list[Any], History, list[str]]:
    """Start `start` (see waiting_agent), send `text` once it waits; the task as it
    ends (an hour's sleep or nobody answering would keep it waiting), its view,
    its history, and the calls that ran."""
    a, ran = waiting_agent()
    async with Runtime(store, agents=[a]) as rt:
        sub = await rt.submit("a", start, owner="u", multitask_strategy=strategy)
        await rt.wait(sub.task_id, timeout=20, until=waiting)
        await rt.send(sub.task_id, text, owner="u")
        task = await sub.wait(20)
        return task, await rt.model_view(task.id), await rt.history(task.id), ran


@pytest.mark.parametrize(
    ("start", "cut"),
    [
        ("nap", "Interrupted by a new message before the timer ended."),
        ("ask", "Interrupted by a new message instead of an answer."),
        ("mail", "Not run: a new message interrupted the wait for its approval."),
    ],
)
async def test_interrupt_cuts_a_wait_short_and_the_task_goes_on_with_the_message(
    store: Store, start: str, cut: str
) -> None:
    task, view, _, ran = await message_a_waiting_task(store, start, "interrupt", "forget it")
    assert task.status is TaskStatus.COMPLETED and task.output == "re 'forget it'"
    assert roles(view)[-3:] == [f"tool:{cut}", "user:forget it", "assistant:re 'forget it'"]
    assert ran == []  # the call waiting for its approval never ran
    (result,) = [e for e in await store.entries(task.id) if e.kind is EntryKind.TOOL_RESULT]
    assert result.payload["outcome"] == "interrupted"


@pytest.mark.parametrize(
    ("start", "kept"),
    [
        # The call never ran: the round leaves the model's view.
        ("mail", []),
        # ask_user ran (it asked): as with any call that ran and may not be
        # replayed, the call and its result stay; nothing else of the round does.
        ("ask", ["assistant", "tool:Interrupted by a new message instead of an answer."]),
    ],
)
async def test_rollback_cuts_a_wait_and_takes_the_round_out_of_the_view(
    store: Store, start: str, kept: list[str]
) -> None:
    task, view, hist, ran = await message_a_waiting_task(store, start, "rollback", "never mind")
    assert task.status is TaskStatus.COMPLETED and ran == []
    assert roles(view) == [
        f"user:{start}",
        *kept,
        "user:never mind",
        "assistant:re 'never mind'",
    ]
    assert hist.rounds[0].voided == (not kept)  # a round with a kept call is closed, not voided


async def test_enqueue_leaves_a_wait_alone(store: Store) -> None:
    a, _ = waiting_agent()
    async with Runtime(store, agents=[a]) as rt:
        sub = await rt.submit("a", "ask", owner="u")
        await rt.wait(sub.task_id, timeout=20, until=waiting)
        sent = await rt.send(sub.task_id, "also this", owner="u")
        assert sent.status is TaskStatus.WAITING and sent.status_reason == "input"
        await rt.respond(sub.task_id, answer="Lisbon")
        task = await sub.wait(20)
        view = await rt.model_view(task.id)
    assert roles(view)[-4:] == [
        "tool:Lisbon",
        "assistant:re 'Lisbon'",
        "user:also this",
        "assistant:re 'also this'",
    ]


async def test_a_call_that_asks_to_wait_after_an_interrupt_came_in_never_parks(
    store: Store,
) -> None:
    """The message came while the tool ran; the tool then asked to sleep an hour
    within its grace period: the task does not park, and the call's result says
    that its wait never began (it used to read as a crash's lost result)."""
    entered, release = asyncio.Event(), asyncio.Event()

    @tool
    async def nap_later(ctx: ToolContext) -> Any:
        """Work a moment, then sleep an hour."""
        entered.set()
        await release.wait()
        return ctx.sleep(3600)

    def say(messages: list[Any]) -> Any:
        last = messages[-1]
        if isinstance(last, UserMessage) and last.content == "start":
            return [ToolCall("nap_later")]
        return f"re {last.content!r}"

    a = Agent(
        name="a",
        model=ScriptedModel(say),
        tools=[nap_later],
        builtin_tools=BuiltinTools(plan=False),
    )
    async with Runtime(store, agents=[a]) as rt:
        sub = await rt.submit("a", "start", owner="u", multitask_strategy="interrupt")
        await entered.wait()
        sent = await rt.send(sub.task_id, "wake up", owner="u")
        assert sent.control is not None  # asked to stop at the next safe point
        release.set()
        task = await sub.wait(20)
        view = await rt.model_view(task.id)
    assert roles(view)[-3:] == [
        "tool:Tool call cancelled: the task was paused before its wait began.",
        "user:wake up",
        "assistant:re 'wake up'",
    ]
