"""Recovery's rules, one by one, on every store (issue 38, "Tests that prove the core").

A worker that died mid-round leaves a log; the next one to claim the task
decides every call of the open round from that log alone (runtime/_recovery.py,
runtime/_calls.py). Each test here writes such a log as a crash would have left
it (the task row and its entries, committed with `Store.create_task`), lets a
real `Runtime` claim the task, and checks what it made of each call: run again
or not, the result and outcome label stored, what the model saw next.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from duragent import (
    Agent,
    BuiltinTools,
    Limits,
    Runtime,
    ScriptedModel,
    TaskStatus,
    Timing,
    ToolCall,
    ToolContext,
    tool,
)
from duragent.runtime._approvals import edited_note
from duragent.runtime._engine import TaskRunner
from duragent.runtime._log import INTERRUPTED
from duragent.runtime._submit import new_task
from duragent.store._commits import Commit
from duragent.store._protocol import Store
from duragent.types import (
    AssistantMessage,
    Entry,
    EntryKind,
    NewEntry,
    Task,
    ToolMessage,
    utcnow,
)
from support.sending import Gate, script

# --- a crashed round, written as the dead worker left it ----------------------


def tool_messages(messages: Sequence[Any]) -> dict[str, str]:
    return {m.tool_call_id: m.content for m in messages if isinstance(m, ToolMessage)}


class Model:
    """A scripted model that answers "done" and keeps the tool results it was shown."""

    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []

    def __call__(self, messages: list[Any]) -> Any:
        self.seen.append(tool_messages(messages))
        return "done"


# A call of the crashed round: its id, tool, arguments and its intent's replay policy.
Call = tuple[str, str, dict[str, Any], str]


def entry(tid: str, kind: EntryKind, payload: dict[str, Any]) -> NewEntry:
    return NewEntry(task_id=tid, kind=kind, round=1, payload=payload)


def checkpoint(tid: str, **payload: Any) -> NewEntry:
    return entry(tid, EntryKind.CHECKPOINT, payload)


def round_of_calls(
    tid: str, calls: Sequence[tuple[str, str, dict[str, Any], str]]
) -> list[NewEntry]:
    """Round 1's assistant message and intents: (call id, tool, arguments, intent's replay)."""
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(a)}}
            for cid, name, a, _ in calls
        ],
    }
    intents = [
        entry(tid, EntryKind.TOOL_INTENT, {"call_id": cid, "name": name, "replay": replay})
        for cid, name, _, replay in calls
    ]
    return [entry(tid, EntryKind.API_MESSAGE, message), *intents]


async def crashed(
    store: Store, agent: Agent, log: Callable[[str], list[NewEntry]], **row: Any
) -> str:
    """A task of `agent` whose worker claimed it, committed `log(task_id)` in its
    round 1 and died: its lease has run out, so the next claim is a takeover."""
    task, first = new_task(agent, "go")
    if row:
        task = task.model_copy(update=row)
    await store.create_task(task, [first])
    dead = await store.claim_task("dead-worker", task_id=task.id, ttl=0.0)
    assert dead is not None
    await store.commit(Commit(entries=log(task.id), fence={task.id: dead.lease.epoch}))
    return task.id


async def run_to_end(
    store: Store, agents: list[Agent], tid: str, on_status: Any = None, trace: Any = None
) -> tuple[Task, list[Entry]]:
    async with Runtime(
        store, agents=agents, poll_interval=0.05, on_status_change=on_status, trace=trace
    ) as rt:
        task = await rt.wait(tid, timeout=30)
    return task, await store.entries(tid)


async def run_to_end_or_block(
    store: Store, agents: list[Agent], tid: str
) -> tuple[Task, list[Entry]]:
    async with Runtime(store, agents=agents, poll_interval=0.05) as rt:
        task = await rt.wait(
            tid, timeout=30, until=lambda t: t.status.terminal or t.status is TaskStatus.BLOCKED
        )
    return task, await store.entries(tid)


def results(entries: Sequence[Entry]) -> dict[str, tuple[str, str]]:
    """call id -> (outcome label, content) of each stored result."""
    return {
        e.payload["tool_call_id"]: (e.payload["outcome"], e.payload["content"])
        for e in entries
        if e.kind is EntryKind.TOOL_RESULT
    }


def checkpoints(entries: Sequence[Entry], kind: str) -> list[dict[str, Any]]:
    return [
        e.payload for e in entries if e.kind is EntryKind.CHECKPOINT and e.payload["type"] == kind
    ]


# --- the replay rule: both the intent and the tool must say so ----------------


async def test_a_cut_off_call_is_run_again_only_if_its_intent_and_its_tool_both_say_so(
    store: Store,
) -> None:
    """Intent `never` + tool now `safe` (someone marked a payment safe after it was
    logged): not run again. Intent `safe` + tool now `never`: not run again. Both
    `safe`, both `resume`: run again, as attempt 2."""
    ran: list[tuple[str, int]] = []

    def recorder(name: str, replay: Any) -> Any:
        @tool(name=name, replay=replay)
        def fn(n: int, ctx: ToolContext) -> str:
            """Record the run."""
            ran.append((ctx.call_id, ctx.attempt))
            return f"{name} ran {n}"

        return fn

    tools = [
        recorder("pay", "safe"),  # logged as never, marked safe since
        recorder("fetch", "never"),  # logged as safe, marked never since
        recorder("lookup", "safe"),
        recorder("resumable", "resume"),
    ]
    model = Model()
    agent = Agent(name="a", model=ScriptedModel(model), tools=tools)
    calls: list[Call] = [
        ("c_pay", "pay", {"n": 1}, "never"),
        ("c_fetch", "fetch", {"n": 2}, "safe"),
        ("c_lookup", "lookup", {"n": 3}, "safe"),
        ("c_resume", "resumable", {"n": 4}, "resume"),
    ]

    def log(tid: str) -> list[NewEntry]:
        partial = [  # the output c_fetch reported before its worker died
            entry(tid, EntryKind.PROGRESS, {"call_id": "c_fetch", "text": text})
            for text in ("half ", "done")
        ]
        return [*round_of_calls(tid, calls), *partial]

    tid = await crashed(store, agent, log)
    seen: list[tuple[str, str]] = []
    hook = lambda t, a, b: seen.append((a.value, b.value))  # noqa: E731
    starts: list[tuple[str, str, int, str]] = []

    async def trace(point: str, **info: Any) -> None:
        if point == "tool_start":
            starts.append((info["call_id"], info["tool"], info["attempt"], info["replay"]))

    task, entries = await run_to_end(store, [agent], tid, hook, trace)

    assert task.status is TaskStatus.COMPLETED and task.output == "done"
    assert seen == [("running", "completed")]  # a takeover is no change of status
    assert task.restarts == 1
    assert sorted(ran) == [("c_lookup", 2), ("c_resume", 2)]
    assert sorted(starts) == [
        ("c_lookup", "lookup", 2, "safe"),
        ("c_resume", "resumable", 2, "resume"),
    ]
    got = results(entries)
    assert got == {
        "c_pay": ("interrupted", INTERRUPTED),
        "c_fetch": ("interrupted", INTERRUPTED + " Partial output: half done"),
        "c_lookup": ("ok", "lookup ran 3"),
        "c_resume": ("ok", "resumable ran 4"),
    }
    assert model.seen[-1] == {cid: content for cid, (_, content) in got.items()}
    assert task.iterations == 2


# --- open waits seen on a claim a sibling's timer caused ----------------------


@pytest.mark.slow
async def test_open_input_and_subtask_waits_are_kept_when_a_sibling_timer_wakes_the_task(
    store: Store,
) -> None:
    """One round parks on a timer, a question and a sub-task. The timer fires and a
    worker claims the task: the timer's call gets its result, the other two wait
    on as before: neither tool runs again, no second sub-task, no "interrupted"."""
    runs: list[str] = []

    @tool
    def nap(ctx: ToolContext) -> Any:
        """Sleep a moment."""
        runs.append("nap")
        return ctx.sleep(0.2)

    @tool(replay="safe")  # safe: only the open wait keeps it from running again
    def ask(ctx: ToolContext) -> Any:
        """Ask where to go."""
        runs.append("ask")
        return ctx.wait_for_input("Which city?")

    @tool
    def delegate(ctx: ToolContext) -> Any:
        """Hand the sum to a helper."""
        runs.append("delegate")
        return ctx.spawn("helper", "add 40 and 2")

    def parent_script(messages: list[Any]) -> Any:
        if not any(isinstance(m, AssistantMessage) for m in messages):
            return [ToolCall("nap"), ToolCall("ask"), ToolCall("delegate")]
        return "done: " + ", ".join(sorted(tool_messages(messages).values()))

    parent = Agent(name="parent", model=ScriptedModel(parent_script), tools=[nap, ask, delegate])
    helper = Agent(
        name="helper",
        model=ScriptedModel([[ToolCall("ask_user", {"question": "n?"})], "42"]),
        builtin_tools=BuiltinTools(ask_user=True),
    )
    async with Runtime(store, agents=[parent, helper], poll_interval=0.05) as rt:
        tid = (await rt.submit("parent", "plan")).task_id
        # Parked on three waits; then the nap's timer wakes it and it parks again on two.
        task = await rt.wait(
            tid,
            timeout=30,
            until=lambda t: t.status is TaskStatus.WAITING and t.wake_at is None,
        )
        entries = await store.entries(tid)
        assert results(entries) == {"call_0_0": ("ok", results(entries)["call_0_0"][1])}
        assert results(entries)["call_0_0"][1].startswith("Slept until ")
        assert sorted(runs) == ["ask", "delegate", "nap"]  # nothing ran twice
        waits = checkpoints(entries, "wait")
        assert sorted(w["call_id"] for w in waits) == ["call_0_0", "call_0_1", "call_0_2"]
        assert checkpoints(entries, "started") == []
        (child,) = (await rt.tree(tid)).children  # one sub-task, never two
        sub = next(w for w in waits if w["wait"] == "subtask")
        assert sub["child_id"] == child.task.id
        assert task.status_reason == "input"

        await rt.wait(child.task.id, timeout=30, until=lambda t: t.status is TaskStatus.WAITING)
        await rt.respond(child.task.id, answer="40 + 2")
        await rt.wait(child.task.id, timeout=30)
        await rt.wait(tid, timeout=30, until=lambda t: t.status_reason == "input" and not t.wake_at)
        await rt.respond(tid, answer="Lisbon")
        done = await rt.wait(tid, timeout=30)
    assert done.status is TaskStatus.COMPLETED
    assert done.output == f"done: 42, Lisbon, {results(entries)['call_0_0'][1]}"
    assert sorted(runs) == ["ask", "delegate", "nap"]
    assert len((await store.list_tasks()).tasks) == 2


# --- what a tool returns: stored and shown to the model as it was -------------


class Forecast(BaseModel):
    city: str
    high: float


def returning_tools(replay: Any) -> list[Any]:
    @tool(name="as_dict", replay=replay)
    async def as_dict() -> dict[str, Any]:
        """A dict."""
        return {"city": "Zürich", "rain": [0.5, 1], "alerts": None}

    @tool(name="as_list", replay=replay)
    def as_list() -> list[Any]:
        """A list (a sync tool: it runs in a thread)."""
        return [1, "two", None, True]

    @tool(name="as_number", replay=replay)
    async def as_number() -> float:
        """A number."""
        return 2.5

    @tool(name="as_none", replay=replay)
    async def as_none() -> None:
        """Nothing."""

    @tool(name="as_model", replay=replay)
    async def as_model() -> Forecast:
        """A pydantic model."""
        return Forecast(city="Oslo", high=-3.5)

    return [as_dict, as_list, as_number, as_none, as_model]


RENDERED = {
    "as_dict": '{"city": "Zürich", "rain": [0.5, 1], "alerts": null}',
    "as_list": '[1, "two", null, true]',
    "as_number": "2.5",
    "as_none": "null",
    "as_model": '{"city":"Oslo","high":-3.5}',
}


async def test_a_tool_returning_data_has_its_result_stored_and_shown_to_the_model(
    store: Store,
) -> None:
    model = Model()
    names = list(RENDERED)

    def script(messages: list[Any]) -> Any:
        if not any(isinstance(m, AssistantMessage) for m in messages):
            return [ToolCall(n) for n in names]
        return model(messages)

    agent = Agent(name="a", model=ScriptedModel(script), tools=returning_tools("never"))
    async with Runtime(store, agents=[agent]) as rt:
        task = await (await rt.submit("a", "go")).wait(30)
        entries = await store.entries(task.id)
    assert task.status is TaskStatus.COMPLETED
    expected = {f"call_0_{i}": RENDERED[n] for i, n in enumerate(names)}
    assert results(entries) == {cid: ("ok", text) for cid, text in expected.items()}
    assert model.seen == [expected]


async def test_a_tool_returning_data_run_again_after_a_crash_has_its_result_kept(
    store: Store,
) -> None:
    model = Model()
    agent = Agent(name="a", model=ScriptedModel(model), tools=returning_tools("safe"))
    calls: list[Call] = [(f"c_{n}", n, {}, "safe") for n in RENDERED]
    tid = await crashed(store, agent, lambda tid: round_of_calls(tid, calls))
    task, entries = await run_to_end(store, [agent], tid)
    assert task.status is TaskStatus.COMPLETED
    expected = {f"c_{n}": text for n, text in RENDERED.items()}
    assert results(entries) == {cid: ("ok", text) for cid, text in expected.items()}
    assert model.seen == [expected]


# --- approvals on the recovery path -------------------------------------------


async def test_approvals_decided_before_the_crash_are_honoured_and_a_denied_call_never_runs(
    store: Store,
) -> None:
    """A denied call, an expired approval and an approved call that had started
    when its worker died: none runs. An approved call that had not started runs
    once, its start recorded first."""
    ran: list[tuple[str, int]] = []

    @tool(requires_approval=True, approval_timeout=60)
    def pay(amount: int, ctx: ToolContext) -> str:
        """Pay."""
        ran.append((ctx.call_id, ctx.attempt))
        return f"paid {amount}"

    model = Model()
    agent = Agent(name="a", model=ScriptedModel(model), tools=[pay])
    calls: list[Call] = [(cid, "pay", {"amount": n}, "never") for n, cid in enumerate("dxsae")]
    past = (utcnow() - timedelta(seconds=1)).isoformat()
    later = (utcnow() + timedelta(hours=1)).isoformat()

    def asked(tid: str, cid: str, expires_at: str) -> NewEntry:
        return checkpoint(
            tid,
            type="wait",
            call_id=cid,
            wait="approval",
            question="Approve pay?",
            tool="pay",
            arguments={},
            timeout=60,
            expires_at=expires_at,
        )

    def log(tid: str) -> list[NewEntry]:
        return [
            *round_of_calls(tid, calls),
            asked(tid, "d", later),
            checkpoint(tid, type="decision", call_id="d", approved=False, reason="too much"),
            asked(tid, "x", past),  # nobody decided in time
            asked(tid, "s", later),
            checkpoint(tid, type="decision", call_id="s", approved=True, reason=None),
            checkpoint(tid, type="started", call_id="s"),  # it was running
            asked(tid, "a", later),
            checkpoint(tid, type="decision", call_id="a", approved=True, reason=None),
            asked(tid, "e", later),  # approved with the amount a person edited
            checkpoint(
                tid,
                type="decision",
                call_id="e",
                approved=True,
                reason=None,
                arguments={"amount": 9},
            ),
        ]

    tid = await crashed(store, agent, log)
    task, entries = await run_to_end(store, [agent], tid)

    assert task.status is TaskStatus.COMPLETED
    assert sorted(ran) == [("a", 1), ("e", 1)]  # their first runs
    assert results(entries) == {
        "d": ("denied", "The user denied this call: too much"),
        "x": ("denied", "The call was denied: no decision within 1 minute (the approval expired)."),
        "s": ("interrupted", INTERRUPTED),
        "a": ("ok", "paid 3"),
        "e": ("ok", edited_note({"amount": 9}) + "paid 9"),
    }
    assert sorted(c["call_id"] for c in checkpoints(entries, "started")) == ["a", "e", "s"]
    started = next(
        e.seq for e in entries if e.payload.get("type") == "started" and e.payload["call_id"] == "a"
    )
    result = next(e.seq for e in entries if e.payload.get("tool_call_id") == "a")
    assert started < result  # its start is durable before it runs


async def test_an_open_approval_seen_on_a_claim_is_asked_on_and_its_tool_not_run(
    store: Store,
) -> None:
    ran: list[str] = []

    @tool(requires_approval=True)
    def pay(amount: int) -> str:
        """Pay."""
        ran.append("pay")
        return f"paid {amount}"

    @tool(replay="safe")
    def quote(amount: int) -> str:
        """A price (safe: it runs again)."""
        ran.append("quote")
        return f"{amount} EUR"

    agent = Agent(name="a", model=ScriptedModel(Model()), tools=[pay, quote])
    calls: list[Call] = [
        ("p", "pay", {"amount": 7}, "never"),
        ("q", "quote", {"amount": 7}, "safe"),
    ]

    def log(tid: str) -> list[NewEntry]:
        wait = {"wait": "approval", "question": "Approve pay(7)?", "tool": "pay"}
        return [*round_of_calls(tid, calls), checkpoint(tid, type="wait", call_id="p", **wait)]

    tid = await crashed(store, agent, log)
    async with Runtime(store, agents=[agent], poll_interval=0.05) as rt:
        task = await rt.wait(tid, timeout=30, until=lambda t: t.status is TaskStatus.WAITING)
        entries = await store.entries(tid)
        assert ran == ["quote"]
        assert results(entries) == {"q": ("ok", "7 EUR")}
        assert [w["call_id"] for w in checkpoints(entries, "wait")] == ["p"]  # not asked twice
        assert task.status_reason == "input"
        await rt.respond(tid, approve=False, reason="no")
        task = await rt.wait(tid, timeout=30)
        entries = await store.entries(tid)
    assert task.status is TaskStatus.COMPLETED and ran == ["quote"]
    assert results(entries)["p"] == ("denied", "The user denied this call: no")


# --- a crash mid-stream: the partial answer voided, exactly its range ---------


async def test_a_stream_cut_by_a_crash_is_voided_over_exactly_its_progress_seqs(
    store: Store,
) -> None:
    """The void marker recovery writes covers the cut attempt's progress, first to
    last, and nothing an earlier marker voided already."""
    agent = Agent(name="a", model=ScriptedModel(["the whole answer"]))

    def text(tid: str, t: str) -> NewEntry:
        return entry(tid, EntryKind.PROGRESS, {"text": t})

    # An attempt a retry voided already, then the attempt the crash cut.
    tid = await crashed(store, agent, lambda tid: [text(tid, "old "), text(tid, "try")])
    old = [e.seq for e in await store.entries(tid) if e.kind is EntryKind.PROGRESS]
    retry = {"scope": "progress", "from_seq": old[0], "to_seq": old[-1], "reason": "retry"}
    cut = [text(tid, t) for t in ("the ", "whole ", "ans")]
    await store.commit(Commit(entries=[entry(tid, EntryKind.ROLLBACK, retry), *cut]))
    progress = [e.seq for e in await store.entries(tid) if e.kind is EntryKind.PROGRESS]
    assert len(progress) == 5

    task, entries = await run_to_end(store, [agent], tid)

    assert task.status is TaskStatus.COMPLETED and task.output == "the whole answer"
    markers = [e.payload for e in entries if e.kind is EntryKind.ROLLBACK]
    assert markers == [
        retry,
        {
            "scope": "progress",
            "from_seq": progress[2],
            "to_seq": progress[4],
            "reason": "interrupted stream",
        },
    ]
    notices = [e.payload for e in entries if e.kind is EntryKind.UI_MESSAGE]
    assert {"type": "notice", "message": "The model's answer was interrupted; asking again."} in (
        notices
    )


# --- what the claim finds before any call is decided -------------------------


async def test_a_tool_the_agent_no_longer_defines_blocks_the_task_and_nothing_runs(
    store: Store,
) -> None:
    ran: list[str] = []

    @tool(replay="safe")
    def kept() -> str:
        """Still defined."""
        ran.append("kept")
        return "kept"

    agent = Agent(name="a", model=ScriptedModel(Model()), tools=[kept])
    calls: list[Call] = [("k", "kept", {}, "safe"), ("g", "gone", {}, "safe")]
    tid = await crashed(store, agent, lambda tid: round_of_calls(tid, calls))
    task, entries = await run_to_end_or_block(store, [agent], tid)
    assert (task.status, task.status_reason) == (TaskStatus.BLOCKED, "missing_definition")
    assert task.error == (
        "tool 'gone' (call g) has no result and agent 'a' no longer defines it; "
        "restore the tool, then resume the task"
    )
    assert ran == [] and results(entries) == {}


async def test_a_removed_tool_whose_call_waits_is_answered_not_blocked(store: Store) -> None:
    """A call parked on a wait is answered by whoever answers the wait, not by its
    tool: the tool's removal does not block the task (the call reports it gone)."""
    agent = Agent(name="a", model=ScriptedModel(Model()), tools=[])
    calls: list[Call] = [("g", "gone", {}, "never")]

    def log(tid: str) -> list[NewEntry]:
        wait = {"wait": "input", "question": "Which city?"}
        return [*round_of_calls(tid, calls), checkpoint(tid, type="wait", call_id="g", **wait)]

    tid = await crashed(store, agent, log)
    task, entries = await run_to_end_or_block(store, [agent], tid)
    assert task.status is TaskStatus.COMPLETED
    assert results(entries) == {
        "g": ("error", "Error: unknown tool 'gone'. Available tools: update_plan.")
    }


async def test_a_task_taken_over_more_than_max_restarts_times_is_blocked_unrun(
    store: Store,
) -> None:
    ran: list[str] = []

    @tool(replay="safe")
    def work() -> str:
        """Work."""
        ran.append("work")
        return "worked"

    agent = Agent(
        name="a", model=ScriptedModel(Model()), tools=[work], limits=Limits(max_restarts=2)
    )
    calls: list[Call] = [("w", "work", {}, "safe")]
    at_limit = await crashed(store, agent, lambda tid: round_of_calls(tid, calls), restarts=1)
    past = await crashed(store, agent, lambda tid: round_of_calls(tid, calls), restarts=2)
    done, _ = await run_to_end_or_block(store, [agent], at_limit)
    task, entries = await run_to_end_or_block(store, [agent], past)
    assert done.status is TaskStatus.COMPLETED and done.restarts == 2 and ran == ["work"]
    assert (task.status, task.status_reason, task.restarts) == (
        TaskStatus.BLOCKED,
        "restart_limit",
        3,
    )
    assert task.error == (
        "the task was taken over 3 times after its worker died or lost its lease "
        "(max_restarts=2); fix the cause, then resume it"
    )
    assert results(entries) == {}


async def test_a_task_pinned_elsewhere_is_blocked_before_anything_runs(store: Store) -> None:
    ran: list[str] = []

    @tool(replay="safe")
    def work() -> str:
        """Work."""
        ran.append("work")
        return "worked"

    agent = Agent(name="a", model=ScriptedModel(Model()), tools=[work])
    config = {"request": {"model": "scripted", "settings": {}, "base_url": "http://other.test"}}
    calls: list[Call] = [("w", "work", {}, "safe")]
    tid = await crashed(store, agent, lambda tid: round_of_calls(tid, calls), config=config)
    task, entries = await run_to_end_or_block(store, [agent], tid)
    assert (task.status, task.status_reason) == (TaskStatus.BLOCKED, "pinned")
    assert task.error is not None and task.error.startswith(
        f"task {tid}: its model requests are pinned to http://other.test"
    )
    assert ran == [] and results(entries) == {}


async def test_a_runner_without_a_status_hook_runs_a_claimed_task(store: Store) -> None:
    """The status hook is optional: a runner without one reports nothing and runs on."""
    agent = Agent(name="a", model=ScriptedModel(["fine"]))
    task, first = new_task(agent, "go")
    await store.create_task(task, [first])
    claimed = await store.claim_task("w", task_id=task.id)
    assert claimed is not None
    done = await TaskRunner(store, agent, claimed).run()
    assert done.status is TaskStatus.COMPLETED and done.output == "fine"


async def test_an_interrupting_message_is_taken_after_the_round_read_back_from_the_log(
    store: Store,
) -> None:
    """A message sent to interrupt cuts the running call short; the runner then
    reads the open round back from the log (as a claim would) and closes it, so
    the message opens the next round."""
    gate = Gate()
    agent = Agent(
        name="a",
        model=ScriptedModel(script),
        tools=gate.tools(),
        builtin_tools=BuiltinTools(plan=False),
        timing=Timing(tool_grace=0.0),
        multitask_strategy="interrupt",
    )
    async with Runtime(store, agents=[agent]) as rt:
        sub = await rt.submit("a", "start")
        await gate.entered.wait()
        await rt.send(sub.task_id, "stop that")
        task = await sub.wait(30)
        entries = await store.entries(task.id)
    assert task.status is TaskStatus.COMPLETED and gate.runs == 1
    assert task.output == "re 'stop that' having said 1"
    rounds = [
        (e.round, e.payload.get("role"), e.payload.get("content"))
        for e in entries
        if e.kind in (EntryKind.API_MESSAGE, EntryKind.TOOL_RESULT)
    ]
    (cut,) = [c for r, role, c in rounds if role == "tool"]
    assert rounds == [
        (1, "user", "start"),
        (1, "assistant", None),
        (1, "tool", cut),
        (2, "user", "stop that"),
        (2, "assistant", "re 'stop that' having said 1"),
    ]
    assert results(entries) == {"call_0_0": ("interrupted", cut)}
    assert task.iterations == 2


# --- waits and approvals asked again, steps replayed --------------------------


async def test_a_timer_not_yet_due_seen_on_a_claim_waits_on_to_its_recorded_time(
    store: Store,
) -> None:
    ran: list[str] = []

    @tool
    def nap(ctx: ToolContext) -> Any:
        """Sleep an hour."""
        ran.append("nap")
        return ctx.sleep(3600)

    agent = Agent(name="a", model=ScriptedModel(Model()), tools=[nap])
    wake = utcnow() + timedelta(hours=1)

    def log(tid: str) -> list[NewEntry]:
        wait = {"wait": "timer", "wake_at": wake.isoformat()}
        calls: list[Call] = [("n", "nap", {}, "never")]
        return [*round_of_calls(tid, calls), checkpoint(tid, type="wait", call_id="n", **wait)]

    tid = await crashed(store, agent, log)
    async with Runtime(store, agents=[agent], poll_interval=0.05) as rt:
        task = await rt.wait(tid, timeout=30, until=lambda t: t.status is TaskStatus.WAITING)
    entries = await store.entries(tid)
    assert (task.status_reason, task.wake_at) == ("timer", wake)
    assert ran == [] and results(entries) == {} and checkpoints(entries, "started") == []
    assert [w["call_id"] for w in checkpoints(entries, "wait")] == ["n"]


async def test_an_approval_never_asked_before_the_crash_is_asked_with_its_first_expiry(
    store: Store,
) -> None:
    """The worker died after the call's intent, before its approval's wait: the
    next one asks for the approval (never runs the call unapproved), and the time
    limit counts from when the call was made, not from the asking again."""
    ran: list[str] = []

    @tool(requires_approval=True, approval_timeout=600)
    def pay(amount: int) -> str:
        """Pay."""
        ran.append("pay")
        return f"paid {amount}"

    agent = Agent(name="a", model=ScriptedModel(Model()), tools=[pay])
    calls: list[Call] = [("p", "pay", {"amount": 5}, "never")]
    tid = await crashed(store, agent, lambda tid: round_of_calls(tid, calls))
    async with Runtime(store, agents=[agent], poll_interval=0.05) as rt:
        task = await rt.wait(tid, timeout=30, until=lambda t: t.status is TaskStatus.WAITING)
    entries = await store.entries(tid)
    (intent,) = [e for e in entries if e.kind is EntryKind.TOOL_INTENT]
    (wait,) = checkpoints(entries, "wait")
    expires = intent.created_at + timedelta(seconds=600)
    assert wait == {
        "type": "wait",
        "call_id": "p",
        "wait": "approval",
        "question": 'Approve pay({"amount": 5})?',
        "tool": "pay",
        "arguments": {"amount": 5},
        "timeout": 600,
        "expires_at": expires.isoformat(),
    }
    assert task.status_reason == "input" and task.wake_at == expires
    assert ran == [] and results(entries) == {}


async def test_a_resumed_call_replays_its_recorded_steps_and_stops_at_a_cut_unsafe_one(
    store: Store,
) -> None:
    """Run again after a crash (replay "resume"): a step recorded before is not run
    again, its value comes from the log; a step that is not safe to repeat and
    began without being recorded stops the call, "interrupted" in that step."""
    effects: list[str] = []

    def effect(name: str) -> str:
        effects.append(name)
        return f"{name} done"

    @tool(replay="resume")
    async def book(ctx: ToolContext) -> str:
        """Quote, then book."""
        quote = await ctx.step("quote", effect, "quote", safe=True)
        booked = await ctx.step("book", effect, "book")
        return f"{quote}; {booked}"

    @tool(replay="resume")
    async def charge(ctx: ToolContext) -> str:
        """Charge the card (a step not safe to repeat)."""
        return str(await ctx.step("charge", effect, "charge"))

    model = Model()
    agent = Agent(name="a", model=ScriptedModel(model), tools=[book, charge])
    calls: list[Call] = [
        ("q", "book", {}, "resume"),
        ("c", "book", {}, "resume"),
        ("k", "charge", {}, "resume"),
    ]

    def log(tid: str) -> list[NewEntry]:
        return [
            *round_of_calls(tid, calls),
            # q: its safe step recorded (a safe step writes no start), then the crash.
            checkpoint(tid, type="step", call_id="q", step="quote", value="quote from log"),
            # c: its quote recorded, its booking begun and never recorded.
            checkpoint(tid, type="step", call_id="c", step="quote", value="quote from log"),
            checkpoint(tid, type="step_started", call_id="c", step="book"),
            # k: its first step begun and never recorded.
            checkpoint(tid, type="step_started", call_id="k", step="charge"),
        ]

    tid = await crashed(store, agent, log)
    task, entries = await run_to_end(store, [agent], tid)
    assert task.status is TaskStatus.COMPLETED
    assert effects == ["book"]  # q's booking, once; no quote, no charge ran again
    assert results(entries) == {
        "q": ("ok", "quote from log; book done"),
        "c": (
            "interrupted",
            "Tool call interrupted in step 'book': the process running it stopped after the "
            "step began and before its result was saved. It may or may not have taken "
            "effect; it was not re-run because it is not marked safe. Steps completed before "
            "it: 'quote'.",
        ),
        "k": (
            "interrupted",
            "Tool call interrupted in step 'charge': the process running it stopped after the "
            "step began and before its result was saved. It may or may not have taken "
            "effect; it was not re-run because it is not marked safe. Steps completed before "
            "it: none.",
        ),
    }


# --- what a call's run ends with: each outcome label --------------------------


async def test_each_way_a_call_can_end_is_stored_with_its_outcome_label(store: Store) -> None:
    """ok, error (unknown tool, bad arguments, an exception, a time limit, a sub-task
    for an agent nobody defines); an invalid call that needs approval is refused
    before any approval is asked."""
    never = asyncio.Event()

    @tool(timeout=0.05)
    async def limited() -> str:
        """Hangs past its time limit."""
        await never.wait()
        return "never"

    @tool(timeout=60)
    async def own_timeout(bare: bool) -> str:
        """Raises a TimeoutError of its own."""
        raise TimeoutError() if bare else TimeoutError("the bank did not answer")

    @tool
    async def unlimited_bare() -> str:
        """Raises a bare TimeoutError without a time limit of its own."""
        raise TimeoutError()

    @tool
    def boom() -> str:
        """Fails."""
        raise ValueError("no such account")

    @tool
    def delegate(ctx: ToolContext) -> Any:
        """Hand work to an agent nobody defines."""
        return ctx.spawn("nobody", "work")

    @tool(requires_approval=True)
    def pay(amount: int) -> str:
        """Pay."""
        return f"paid {amount}"

    @tool
    def fine() -> str:
        """Works."""
        return "fine"

    calls = [
        ToolCall("limited"),
        ToolCall("own_timeout", {"bare": True}),
        ToolCall("own_timeout", {"bare": False}),
        ToolCall("unlimited_bare"),
        ToolCall("boom"),
        ToolCall("delegate"),
        ToolCall("pay", {"amount": "lots"}),
        ToolCall("nope"),
        ToolCall("fine"),
    ]
    model = Model()

    def script(messages: list[Any]) -> Any:
        if not any(isinstance(m, AssistantMessage) for m in messages):
            return calls
        return model(messages)

    tools = [limited, own_timeout, unlimited_bare, boom, delegate, pay, fine]
    agent = Agent(
        name="a", model=ScriptedModel(script), tools=tools, builtin_tools=BuiltinTools(plan=False)
    )
    async with Runtime(store, agents=[agent]) as rt:
        task = await (await rt.submit("a", "go")).wait(30)
    entries = await store.entries(task.id)
    assert task.status is TaskStatus.COMPLETED
    got = [results(entries)[f"call_0_{i}"] for i in range(len(calls))]
    assert got == [
        ("error", "Error: Tool call timed out after 0.05 s (the tool's time limit)."),
        ("error", "Error: Tool call timed out after 60 s (the tool's time limit)."),
        ("error", "Error: TimeoutError: the bank did not answer"),
        ("error", "Error: TimeoutError"),
        ("error", "Error: ValueError: no such account"),
        ("error", "Error: no agent named 'nobody' to run a sub-task; known: a"),
        (
            "error",
            "Error: invalid arguments for pay: amount: Input should be a valid integer, "
            "unable to parse string as an integer",
        ),
        (
            "error",
            "Error: unknown tool 'nope'. Available tools: boom, delegate, fine, limited, "
            "own_timeout, pay, unlimited_bare.",
        ),
        ("ok", "fine"),
    ]
    assert checkpoints(entries, "wait") == []  # no approval asked, no sub-task
    assert len((await store.list_tasks()).tasks) == 1
