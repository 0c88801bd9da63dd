"""Handoffs between native agents (runtime/_handoffs.py): the target runs the next
rounds with its instructions, tools, settings and handoffs on the same conversation;
the agent in force is read from the log (fork, retry, rollback); the targets are
pinned; bad configurations are refused at Agent(). Every store."""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from typing import Any

import pytest

from duragent import (
    Agent,
    BuiltinTools,
    Runtime,
    ScriptedModel,
    TaskStatus,
    Timing,
    ToolCall,
    tool,
)
from duragent.errors import InvalidOption, ModelError
from duragent.runtime._handoffs import MULTIPLE, in_force, transfer_name
from duragent.runtime._log import RoundState, rollback
from duragent.runtime._steering import Edit
from duragent.store._protocol import Store
from duragent.types import (
    AssistantMessage,
    Entry,
    EntryKind,
    FunctionCall,
    NewEntry,
    ToolCallData,
    ToolMessage,
    UINotice,
    UserMessage,
)

PLAIN = BuiltinTools(plan=False)


def last(messages: list[Any]) -> Any:
    return messages[-1]


class Desk:
    """triage looks the order up, then hands the task to billing; billing refunds it
    and answers with what the tools said. billing can hand it back (a cycle)."""

    def __init__(self, *, billing_fails: int = 0, triage_turn: Any = None) -> None:
        self.runs: Counter[str] = Counter()
        self.billing_fails = billing_fails

        @tool
        def lookup(order: str) -> str:
            """Find an order."""
            self.runs["lookup"] += 1
            return f"order {order}: paid"

        @tool
        def refund(order: str) -> str:
            """Refund an order."""
            self.runs["refund"] += 1
            return f"refunded {order}"

        def triage_says(messages: list[Any]) -> Any:
            if isinstance(last(messages), UserMessage):
                return [ToolCall("lookup", {"order": "42"})]
            return [ToolCall("transfer_to_billing", {})]

        def billing_says(messages: list[Any]) -> Any:
            if self.billing_fails:
                self.billing_fails -= 1
                raise ModelError("billing's provider is down")
            if last(messages).content == '{"assistant": "billing"}':
                return [ToolCall("refund", {"order": "42"})]
            said = [m.content for m in messages if isinstance(m, ToolMessage)]
            return "Billing: " + " | ".join(said)

        self.billing_model = ScriptedModel(billing_says)
        self.triage_model = ScriptedModel(triage_turn or triage_says)
        self.billing = Agent(
            name="billing",
            model=self.billing_model,
            instructions="You are billing.",
            tools=[refund],
            model_settings={"temperature": 0.1},
            builtin_tools=PLAIN,
            handoff_description="Refunds and invoices.",
        )
        self.refunds = Agent(name="refunds", model=ScriptedModel(["Refunds."]), builtin_tools=PLAIN)
        self.triage = Agent(
            name="triage",
            model=self.triage_model,
            instructions="You triage.",
            tools=[lookup],
            builtin_tools=PLAIN,
            handoffs=[self.billing, self.refunds],
        )
        self.billing.handoffs = [self.triage]  # a cycle is fine


ANSWER = 'Billing: order 42: paid | {"assistant": "billing"} | refunded 42'


@pytest.mark.slow
async def test_the_target_runs_the_next_rounds_with_its_own_definition(store: Store) -> None:
    desk = Desk()
    async with Runtime(store, agents=[desk.triage]) as rt:
        task = await (await rt.submit("triage", "refund order 42", owner="u")).wait(30)
        hist = await rt.history(task.id)
        ui = await rt.ui_messages(task.id)
    assert task.status is TaskStatus.COMPLETED and task.output == ANSWER
    assert desk.runs == {"lookup": 1, "refund": 1}
    (handoff,) = await store.entries(task.id, kinds=[EntryKind.HANDOFF])
    assert handoff.round == 2
    assert handoff.payload == {"call_id": "call_1_0", "from": "triage", "to": "billing"}
    # triage was offered its tool and one transfer tool per target, described by it.
    first = desk.triage_model.last_request
    assert first is not None
    assert [t.name for t in first.tools] == ["lookup", "transfer_to_billing", "transfer_to_refunds"]
    assert "Refunds and invoices." in first.tools[1].description
    # billing: its instructions, tools, handoffs and settings, on the same conversation.
    asked = desk.billing_model.last_request
    assert asked is not None
    assert asked.messages[0].content == "You are billing."
    assert [t.name for t in asked.tools] == ["refund", "transfer_to_triage"]
    assert asked.settings == {"temperature": 0.1}
    assert asked.messages[1] == UserMessage(content="refund order 42")
    assert [(r.agent, r.handoff is not None) for r in hist.rounds] == [
        ("triage", False),
        ("triage", True),
        ("billing", False),
        ("billing", False),
    ]
    h = hist.rounds[1].handoff
    assert h is not None and (h.from_agent, h.to_agent) == ("triage", "billing")
    notices = [m.message for m in ui if isinstance(m, UINotice)]
    assert "Handed off from triage to billing." in notices


@pytest.mark.slow
async def test_other_calls_of_the_turn_run_and_a_second_handoff_is_refused(store: Store) -> None:
    turn = [
        ToolCall("transfer_to_billing", {}),
        ToolCall("lookup", {"order": "42"}),
        ToolCall("transfer_to_refunds", {}),
    ]
    desk = Desk(triage_turn=lambda messages: turn)
    async with Runtime(store, agents=[desk.triage]) as rt:
        task = await (await rt.submit("triage", "refund order 42")).wait(30)
    assert task.status is TaskStatus.COMPLETED
    results = [
        e.payload["content"]
        for e in await store.entries(task.id, kinds=[EntryKind.TOOL_RESULT])
        if e.round == 1
    ]
    assert sorted(results) == sorted(['{"assistant": "billing"}', "order 42: paid", MULTIPLE])
    handoffs = await store.entries(task.id, kinds=[EntryKind.HANDOFF])
    assert [h.payload["to"] for h in handoffs] == ["billing"]
    assert desk.runs["lookup"] == 1  # the turn's own call ran, by triage's tool
    assert desk.billing_model.calls >= 1 and desk.refunds.model.calls == 0  # type: ignore[union-attr]


@pytest.mark.slow
async def test_a_fork_before_the_handoff_runs_the_earlier_agent(store: Store) -> None:
    desk = Desk()
    async with Runtime(store, agents=[desk.triage]) as rt:
        source = await (await rt.submit("triage", "refund order 42")).wait(30)
        before = await (await rt.fork(source.id, at_round=1)).wait(30)
        after = await (await rt.fork(source.id, at_round=2)).wait(30)
        early, late = await rt.history(before.id), await rt.history(after.id)
    assert before.output == after.output == ANSWER
    # Forked at round 1: triage runs round 2 again and hands off anew.
    assert [r.agent for r in early.rounds] == ["triage", "triage", "billing", "billing"]
    assert len(await store.entries(before.id, kinds=[EntryKind.HANDOFF])) == 1
    # Forked at round 2: the handoff is copied; billing runs round 3.
    assert [r.agent for r in late.rounds] == ["triage", "triage", "billing", "billing"]
    assert late.rounds[1].handoff is not None
    assert desk.runs == {"lookup": 1, "refund": 3}  # copied rounds never re-run


@pytest.mark.slow
async def test_a_retry_after_the_target_failed_goes_on_with_the_target(store: Store) -> None:
    desk = Desk(billing_fails=1)
    async with Runtime(store, agents=[desk.triage]) as rt:
        failed = await (await rt.submit("triage", "refund order 42")).wait(30)
        assert failed.status is TaskStatus.FAILED and "billing's provider" in (failed.error or "")
        await rt.retry(failed.id)
        task = await rt.wait(failed.id, timeout=30)
        hist = await rt.history(task.id)
    assert task.status is TaskStatus.COMPLETED and task.output == ANSWER
    assert [r.agent for r in hist.rounds][-2:] == ["billing", "billing"]
    assert desk.runs == {"lookup": 1, "refund": 1}


@pytest.mark.slow
async def test_the_targets_are_pinned_and_a_changed_set_blocks_until_repinned(
    store: Store,
) -> None:
    desk = Desk()
    submitter = Runtime(store, agents=[desk.triage], run_worker=False)
    async with submitter:
        sub = await submitter.submit("triage", "refund order 42")
    task = await store.get_task(sub.task_id)
    assert sorted(task.config["handoffs"]) == ["billing", "refunds"]
    assert task.config["handoffs"]["billing"]["request"]["settings"] == {"temperature": 0.1}
    # The same version declared (a new build under the old version): the pin, not
    # the version, is what tells the changed handoffs apart.
    alone = Agent(
        name="triage",
        model=ScriptedModel(["Alone."]),
        builtin_tools=PLAIN,
        version=desk.triage.version,
    )
    async with Runtime(store, agents=[alone]) as rt:
        blocked = await rt.wait(
            sub.task_id, timeout=30, until=lambda t: t.status is TaskStatus.BLOCKED
        )
        assert blocked.status_reason == "pinned"
        assert "handoffs are pinned to ['billing', 'refunds']" in (blocked.error or "")
        assert "hands off to no agent" in (blocked.error or "")
        repinned = await rt.repin(sub.task_id)
        assert repinned.config["handoffs"] == {}
        await rt.resume(sub.task_id)
        task = await rt.wait(sub.task_id, timeout=30)
    assert task.status is TaskStatus.COMPLETED  # alone, as re-pinned


def test_a_bad_handoff_configuration_is_refused_at_agent() -> None:
    b = Agent(name="b", model="scripted:none")
    with pytest.raises(InvalidOption, match=r"holds agents \(duragent.Agent\), not 'b'"):
        Agent(name="a", model="scripted:none", handoffs=["b"])  # type: ignore[list-item]
    with pytest.raises(InvalidOption, match="hands off twice to 'transfer_to_b'"):
        Agent(name="a", model="scripted:none", handoffs=[b, Agent(name="B", model="scripted:none")])

    @tool
    def transfer_to_b() -> str:
        return "mine"

    with pytest.raises(InvalidOption, match="has a tool named 'transfer_to_b'"):
        Agent(name="a", model="scripted:none", tools=[transfer_to_b], handoffs=[b])
    a = Agent(name="a", model="scripted:none", handoffs=[b])
    with pytest.raises(InvalidOption, match="holds agents"):
        b.handoffs = [a, 3]  # type: ignore[list-item]
    b.handoffs = [a]  # a cycle is fine
    assert list(b.transfers) == ["transfer_to_a"] and isinstance(b.handoffs, tuple)
    # Two different agents under one name among those reached: refused at Runtime().
    other_b = Agent(name="b", model="scripted:none")
    c = Agent(name="c", model="scripted:none", handoffs=[other_b])
    with pytest.raises(InvalidOption, match="two agents are named 'b'"):
        Runtime("memory://", agents=[a, c])


def _entry(seq: int, kind: EntryKind, rnd: int, payload: dict[str, Any]) -> Entry:
    return Entry(task_id="t", seq=seq, kind=kind, round=rnd, payload=payload)


def test_the_agent_in_force_is_the_last_handoff_not_rolled_back() -> None:
    h1 = _entry(5, EntryKind.HANDOFF, 1, {"call_id": "c1", "from": "a", "to": "b"})
    h2 = _entry(9, EntryKind.HANDOFF, 3, {"call_id": "c3", "from": "b", "to": "c"})
    assert in_force([h1, h2], 2) == ("b", None)
    assert in_force([h1, h2], 3) == ("b", "c")
    assert in_force([h1, h2], 4) == ("c", None)
    void = _entry(10, EntryKind.ROLLBACK, 3, {"scope": "api", "from_seq": 7, "to_seq": 9})
    assert in_force([h1, h2, void], 4) == ("b", None)
    assert in_force([h1, h2, void], 1) == (None, "b")  # taken in round 1: after it closes


def test_a_rollback_that_voids_a_handoff_result_voids_its_entry_too() -> None:
    calls = [
        ToolCallData(id="k", function=FunctionCall(name="charge", arguments="{}")),
        ToolCallData(id="h", function=FunctionCall(name="transfer_to_b", arguments="{}")),
    ]
    rs = RoundState(
        2,
        assistant=AssistantMessage(tool_calls=calls),
        intents={
            "k": {"call_id": "k", "name": "charge", "replay": "never"},
            "h": {"call_id": "h", "name": "transfer_to_b", "replay": "safe"},
        },
        results={"k": {"role": "tool", "tool_call_id": "k", "content": "ok"}},
        result_seqs={"k": 4},
    )
    pending = [
        NewEntry(
            task_id="t",
            kind=EntryKind.TOOL_RESULT,
            round=2,
            payload={"role": "tool", "tool_call_id": "h", "content": "{}"},
        ),
        NewEntry(
            task_id="t",
            kind=EntryKind.HANDOFF,
            round=2,
            payload={"call_id": "h", "from": "a", "to": "b"},
        ),
    ]
    plan = rollback("t", rs, 2, 4, pending, "paused")
    voids = [e.payload for e in plan.entries if e.kind is EntryKind.ROLLBACK]
    assert [(v["from_seq"], v["to_seq"]) for v in voids] == [(5, 6)]  # the result and the handoff


def rolled_back_desk(turn: list[ToolCall]) -> tuple[Agent, Agent, asyncio.Event, asyncio.Event]:
    """triage hands off in a turn whose `lookup` holds until released: something a
    new message can roll back while the handoff is committed."""
    release, entered = asyncio.Event(), asyncio.Event()

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

    def triage_says(messages: list[Any]) -> Any:
        said = last(messages)
        if isinstance(said, UserMessage) and said.content == "go":
            return turn
        return f"triage: {getattr(said, 'content', '')}"

    billing = Agent(name="billing", model=ScriptedModel(["Billing here."]), builtin_tools=PLAIN)
    triage = Agent(
        name="triage",
        model=ScriptedModel(triage_says),
        tools=[send, lookup],
        builtin_tools=PLAIN,
        timing=Timing(tool_grace=0.0),
        handoffs=[billing],
    )
    return triage, billing, release, entered


@pytest.mark.slow
@pytest.mark.parametrize("keeps_a_call", [False, True])
async def test_a_rollback_of_the_handoff_round_keeps_the_earlier_agent(
    store: Store, keeps_a_call: bool
) -> None:
    """Rolled back with nothing kept, the round is voided whole; with a never-replay
    call kept, the handoff's result is voided (and its entry with it) and answered
    "rolled back". Either way the handoff is not in force: triage answers."""
    turn = [ToolCall("transfer_to_billing", {}), ToolCall("lookup", {})]
    if keeps_a_call:
        turn.insert(0, ToolCall("send", {}))
    triage, billing, _release, entered = rolled_back_desk(turn)
    async with Runtime(store, agents=[triage]) as rt:
        sub = await rt.submit("triage", "go", owner="u")
        await entered.wait()
        await wait_for_handoff(store, sub.task_id)
        await rt.send(sub.task_id, "never mind", owner="u", multitask_strategy="rollback")
        task = await sub.wait(20)
        hist = await rt.history(task.id)
    assert task.status is TaskStatus.COMPLETED and task.output == "triage: never mind"
    assert billing.model.calls == 0  # type: ignore[union-attr]
    assert all(r.handoff is None and r.agent == "triage" for r in hist.rounds)
    assert len(await store.entries(task.id, kinds=[EntryKind.HANDOFF])) == 1  # kept, voided


async def wait_for_handoff(store: Store, task_id: str) -> None:
    """Until the handoff is committed (the call needs no tool: it is at once)."""
    async with asyncio.timeout(20):
        while not await store.entries(task_id, kinds=[EntryKind.HANDOFF]):
            await asyncio.sleep(0.01)


@pytest.mark.slow
async def test_a_task_a_stand_in_submitted_resumes_with_the_agent_in_force(store: Store) -> None:
    """Submitted by a process whose stand-in agent pins no handoffs, run by a worker
    whose agent hands off, paused in billing's first round: resumed, billing goes on."""
    desk = Desk()
    stand_in = Agent(name="triage", model="scripted:none")
    async with Runtime(store, agents=[stand_in], run_worker=False) as submitter:
        sub = await submitter.submit("triage", "refund order 42")
    assert "handoffs" not in (await store.get_task(sub.task_id)).config
    holder: list[Runtime] = []
    pausing: list[asyncio.Future[Any]] = []

    async def trace(point: str, **info: Any) -> None:
        if point == "round_start" and info["round"] == 3 and holder:
            rt, holder[:] = holder[0], []
            pausing.append(asyncio.ensure_future(rt.pause(sub.task_id)))
            assert rt.worker is not None
            while (runner := rt.worker.runner(sub.task_id)) is None or runner.control is None:
                await asyncio.sleep(0.01)

    async with Runtime(store, agents=[desk.triage], trace=trace) as rt:
        holder.append(rt)
        paused = await rt.wait(sub.task_id, timeout=30, until=lambda t: t.status.value == "paused")
        await pausing[0]
        assert paused.iterations == 2  # billing's first round had not begun
        await rt.resume(sub.task_id)
        task = await rt.wait(sub.task_id, timeout=30)
        hist = await rt.history(task.id)
    assert task.output == ANSWER
    assert [r.agent for r in hist.rounds] == ["triage", "triage", "billing", "billing"]
    assert len(await store.entries(task.id, kinds=[EntryKind.HANDOFF])) == 1


@pytest.mark.slow
async def test_a_fork_that_drops_the_handing_off_message_drops_the_handoff(store: Store) -> None:
    desk = Desk()
    async with Runtime(store, agents=[desk.triage]) as rt:
        source = await (await rt.submit("triage", "refund order 42")).wait(30)
        edit = Edit(drop_last_assistant=True)
        fork = await (await rt.fork(source.id, at_round=2, edit=edit)).wait(30)
        hist = await rt.history(fork.id)
    assert fork.output == ANSWER
    # The copied handoff went with the dropped message: triage asks again in round 3.
    assert hist.rounds[1].handoff is None
    assert [r.agent for r in hist.rounds] == ["triage", "triage", "triage", "billing", "billing"]
    assert hist.rounds[2].handoff is not None


def test_transfer_tool_names_keep_the_providers_tool_name_rule() -> None:
    """OpenAI (and Anthropic) refuse a tool name outside ^[a-zA-Z0-9_-]{1,64}$: a long
    agent name still gives a valid transfer tool, and two long names sharing their
    first 64 characters give two tools (not a clash)."""
    rule = re.compile(r"[a-zA-Z0-9_-]{1,64}")
    long_a = "customer support for enterprise billing and invoicing disputes, tier one"
    long_b = "customer support for enterprise billing and invoicing disputes, tier two"
    names = [long_a, long_b, "Billing Team", "账单", "a" * 200]
    for name in names:
        assert rule.fullmatch(transfer_name(name)), transfer_name(name)
    assert transfer_name("Billing Team") == "transfer_to_billing_team"  # short: the SDK's name
    targets = [Agent(name=n, model="scripted:none") for n in (long_a, long_b)]
    a = Agent(name="a", model="scripted:none", handoffs=targets)
    assert [t.name for t in a.transfers.values()] == [long_a, long_b]
    assert transfer_name(long_a) == transfer_name(long_a)  # stable: logs name it
