"""Approvals that edit and expire, and several decided at once (issue 13, item 3)."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from duragent import (
    Agent,
    BuiltinTools,
    Conflict,
    Decision,
    InvalidArguments,
    Runtime,
    ScriptedModel,
    Store,
    Task,
    TaskStatus,
    ToolCall,
    ToolContext,
    ToolMessage,
    UsageError,
    tool,
)
from duragent._payloads import WaitCheckpoint
from duragent.runtime._waits import open_waits
from duragent.types import AssistantMessage, EntryKind, UIToolCard, utcnow
from support.readme import first_block_under


class Outbox:
    """A `send` tool that asks for approval and records what it really sent."""

    def __init__(self, approval_timeout: float | timedelta | None = None) -> None:
        self.sent: list[tuple[str, str]] = []

        @tool(requires_approval=True, approval_timeout=approval_timeout)
        def send(to: str, body: str) -> str:
            """Send a message."""
            self.sent.append((to, body))
            return f"sent to {to}"

        self.tool = send


def echo_last_result(messages: list[Any]) -> str:
    results = [m.content for m in messages if isinstance(m, ToolMessage)]
    return " | ".join(results)


def agent(outbox: Outbox, *calls: ToolCall) -> Agent:
    """Round 1 makes `calls`; round 2 answers with the results it saw."""

    def script(messages: list[Any]) -> Any:
        if not any(isinstance(m, AssistantMessage) for m in messages):
            return list(calls)
        return echo_last_result(messages)

    return Agent(
        name="a",
        model=ScriptedModel(script),
        tools=[outbox.tool],
        builtin_tools=BuiltinTools(plan=False),
    )


def answered_once(view: list[Any]) -> bool:
    """Every tool call of the view has exactly one result, right after its message."""
    asked = [c.id for m in view if isinstance(m, AssistantMessage) for c in m.tool_calls or ()]
    answered = [m.tool_call_id for m in view if isinstance(m, ToolMessage)]
    return sorted(asked) == sorted(answered) and len(set(answered)) == len(answered)


async def parked(rt: Runtime, n: int = 1) -> Task:
    sub = await rt.submit("a", "write to bob", owner="u")
    task = await rt.wait(sub.task_id, timeout=20, until=lambda t: t.status.value == "waiting")
    assert len((await rt.get(task.id)).status_reason or "") > 0
    return task


async def test_edited_approval_runs_with_the_edit_and_the_model_and_ui_see_it(
    store: Store,
) -> None:
    outbox = Outbox()
    a = agent(outbox, ToolCall("send", {"to": "bob", "body": "hi"}))
    async with Runtime(store, agents=[a]) as rt:
        task = await parked(rt)
        await rt.respond(task.id, approve=True, arguments={"to": "carol", "body": "hello"})
        done = await rt.wait(task.id, timeout=20)
        assert done.status is TaskStatus.COMPLETED
        assert outbox.sent == [("carol", "hello")]
        # The decision, with the edit, is in the log.
        (decision,) = [
            e.payload
            for e in await store.entries(task.id)
            if e.kind is EntryKind.CHECKPOINT and e.payload.get("type") == "decision"
        ]
        assert decision["approved"] is True
        assert decision["arguments"] == {"to": "carol", "body": "hello"}
        # The model sees its own call and one result saying what was run.
        view = await rt.model_view(task.id)
        assert answered_once(view)
        (result,) = [m for m in view if isinstance(m, ToolMessage)]
        assert "a person edited this call's arguments" in result.content
        assert '{"body": "hello", "to": "carol"}' in result.content
        assert result.content.endswith("sent to carol")
        assert done.output == result.content
        # The UI shows the arguments it ran with and the model's.
        (card,) = [m for m in await rt.messages(task.id, view="ui") if isinstance(m, UIToolCard)]
        assert card.arguments == {"to": "carol", "body": "hello"}
        assert card.original_arguments == {"to": "bob", "body": "hi"}
        assert card.state == "ok"
        # The round's history shows both too.
        (call,) = (await rt.history(task.id)).rounds[0].calls
        assert call.arguments == '{"to": "bob", "body": "hi"}'
        assert call.edited_arguments == {"to": "carol", "body": "hello"}


async def test_an_edit_equal_to_the_model_arguments_is_a_plain_approval(store: Store) -> None:
    outbox = Outbox()
    a = agent(outbox, ToolCall("send", {"to": "bob", "body": "hi"}))
    async with Runtime(store, agents=[a]) as rt:
        task = await parked(rt)
        await rt.respond(task.id, approve=True, arguments={"to": "bob", "body": "hi"})
        done = await rt.wait(task.id, timeout=20)
        assert done.output == "sent to bob" and outbox.sent == [("bob", "hi")]


async def test_an_invalid_edit_is_refused_and_changes_nothing(store: Store) -> None:
    outbox = Outbox()
    a = agent(outbox, ToolCall("send", {"to": "bob", "body": "hi"}))
    async with Runtime(store, agents=[a]) as rt:
        task = await parked(rt)
        before = await rt.get(task.id)
        with pytest.raises(InvalidArguments, match=r"invalid arguments for send: body: Field"):
            await rt.respond(task.id, approve=True, arguments={"to": "carol"})
        with pytest.raises(InvalidArguments, match="cc: Extra inputs are not permitted"):
            await rt.respond(task.id, approve=True, arguments={"to": "c", "body": "b", "cc": "d"})
        with pytest.raises(UsageError, match="approve=true only"):
            await rt.respond(task.id, approve=False, arguments={"to": "c", "body": "b"})
        after = await rt.get(task.id)
        assert (after.version, after.last_seq, after.status) == (
            before.version,
            before.last_seq,
            TaskStatus.WAITING,
        )
        assert outbox.sent == []


async def test_an_edit_needs_the_tool_definition_to_be_checked(store: Store) -> None:
    outbox = Outbox()
    a = agent(outbox, ToolCall("send", {"to": "bob", "body": "hi"}))
    async with Runtime(store, agents=[a]) as rt:
        task = await parked(rt)
    blind = Runtime(store, run_worker=False)  # knows no agent, so no schema
    with pytest.raises(UsageError, match=r"cannot check edited arguments for tool 'send'"):
        await blind.respond(task.id, approve=True, arguments={"to": "carol", "body": "x"})
    assert (await blind.get(task.id)).status is TaskStatus.WAITING


async def test_several_approvals_are_decided_in_one_commit(store: Store) -> None:
    outbox = Outbox()
    calls = [ToolCall("send", {"to": n, "body": "hi"}) for n in ("bob", "ann", "eve")]
    a = agent(outbox, *calls)
    async with Runtime(store, agents=[a]) as rt:
        task = await parked(rt)
        waits = sorted(w for w in await _open_approvals(store, task))
        assert len(waits) == 3
        bob, ann, eve = waits
        commits = 0
        real_commit = store.commit

        async def counting(commit: Any) -> Any:
            nonlocal commits
            commits += 1
            return await real_commit(commit)

        store.commit = counting  # type: ignore[method-assign]
        try:
            answered = await rt.respond(
                task.id,
                decisions={
                    bob: Decision(approve=True),
                    ann: Decision(approve=True, arguments={"to": "anne", "body": "hi"}),
                    eve: Decision(approve=False, reason="not her"),
                },
            )
        finally:
            store.commit = real_commit  # type: ignore[method-assign]
        assert commits == 1 and answered.status is TaskStatus.PENDING
        done = await rt.wait(task.id, timeout=20)
        assert sorted(outbox.sent) == [("anne", "hi"), ("bob", "hi")]
        view = await rt.model_view(task.id)
        assert answered_once(view)
        results = {m.tool_call_id: m.content for m in view if isinstance(m, ToolMessage)}
        assert results[bob] == "sent to bob"
        assert "edited" in results[ann] and results[ann].endswith("sent to anne")
        assert results[eve] == "The user denied this call: not her"
        assert done.status is TaskStatus.COMPLETED


async def test_a_batch_with_one_bad_decision_commits_none(store: Store) -> None:
    outbox = Outbox()
    calls = [ToolCall("send", {"to": n, "body": "hi"}) for n in ("bob", "ann")]
    async with Runtime(store, agents=[agent(outbox, *calls)]) as rt:
        task = await parked(rt)
        bob, ann = sorted(await _open_approvals(store, task))
        before = await rt.get(task.id)
        with pytest.raises(InvalidArguments):
            await rt.respond(
                task.id,
                decisions={bob: Decision(approve=True), ann: Decision(approve=True, arguments={})},
            )
        with pytest.raises(UsageError, match="no approval open for call 'nope'"):
            await rt.respond(
                task.id, decisions={bob: Decision(approve=True), "nope": Decision(approve=True)}
            )
        with pytest.raises(UsageError, match="decisions= alone"):
            await rt.respond(task.id, approve=True, decisions={bob: Decision(approve=True)})
        assert (await rt.get(task.id)).last_seq == before.last_seq
        # Deciding part of them leaves the task waiting for the rest.
        left = await rt.respond(task.id, decisions={bob: Decision(approve=False)})
        assert left.status is TaskStatus.WAITING
        assert set(await _open_approvals(store, left)) == {ann}


@pytest.mark.slow
async def test_an_undecided_approval_is_denied_when_its_time_is_up(store: Store) -> None:
    outbox = Outbox(approval_timeout=timedelta(seconds=0.3))
    a = agent(outbox, ToolCall("send", {"to": "bob", "body": "hi"}))
    async with Runtime(store, agents=[a]) as rt:
        sub = await rt.submit("a", "write to bob", owner="u")
        done = await rt.wait(sub.task_id, timeout=20)
    assert done.status is TaskStatus.COMPLETED and outbox.sent == []
    assert done.output == (
        "The call was denied: no decision within 0.3 seconds (the approval expired)."
    )
    entries = await store.entries(done.id)
    (wait,) = [e for e in entries if e.payload.get("type") == "wait"]
    (result,) = [e for e in entries if e.kind is EntryKind.TOOL_RESULT]
    assert wait.payload["timeout"] == 0.3 and result.payload["outcome"] == "denied"
    # The task parked with a person's status reason (the durable timer is its
    # wake_at), and the denial came no earlier than the expiry.
    parked = [
        e.payload for e in entries if e.kind is EntryKind.STATUS and e.payload["to"] == "waiting"
    ]
    assert parked and all(p.get("reason") == "input" for p in parked)
    assert result.created_at >= datetime.fromisoformat(wait.payload["expires_at"])


def forward(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """Move the clock approvals are checked by `seconds` ahead (not the store's)."""
    import duragent.runtime._approvals as approvals

    monkeypatch.setattr(approvals, "utcnow", lambda: utcnow() + timedelta(seconds=seconds))


async def test_a_decision_after_the_time_limit_is_refused(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    outbox = Outbox(approval_timeout=600)
    a = agent(outbox, ToolCall("send", {"to": "bob", "body": "hi"}))
    async with Runtime(store, agents=[a]) as rt:
        task = await parked(rt)
    rt = Runtime(store, agents=[a], run_worker=False)
    forward(monkeypatch, 601)  # ten minutes later, before any worker fired the timer
    before = await rt.get(task.id)
    with pytest.raises(Conflict, match=r"approval of call '\w+' expired at .*: the call is denied"):
        await rt.respond(task.id, approve=True)
    calls = await _open_approvals(store, task)
    with pytest.raises(Conflict, match="expired"):
        await rt.respond(task.id, decisions={c: Decision(approve=False) for c in calls})
    after = await rt.get(task.id)
    assert (after.version, after.last_seq) == (before.version, before.last_seq)


async def test_a_paused_task_denies_its_expired_approval_when_resumed(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    outbox = Outbox(approval_timeout=600)
    a = agent(outbox, ToolCall("send", {"to": "bob", "body": "hi"}))
    async with Runtime(store, agents=[a]) as rt:
        task = await parked(rt)
        paused = await rt.pause(task.id)
        assert paused.status is TaskStatus.PAUSED
        forward(monkeypatch, 601)
        with pytest.raises(Conflict, match="expired"):
            await rt.respond(task.id, approve=True)
        await rt.resume(task.id)
        done = await rt.wait(task.id, timeout=20)
    assert done.output == (
        "The call was denied: no decision within 10 minutes (the approval expired)."
    )
    assert outbox.sent == []


@pytest.mark.slow
async def test_a_question_waits_on_while_a_sibling_timer_fires(store: Store) -> None:
    """A task waiting for a person and a timer is woken by the timer (it used to wait for
    the person first); the question stays open."""

    @tool
    def nap(ctx: ToolContext) -> Any:
        """Sleep a moment."""
        return ctx.sleep(0.2)

    def script(messages: list[Any]) -> Any:
        if not any(isinstance(m, AssistantMessage) for m in messages):
            return [ToolCall("ask_user", {"question": "Which city?"}), ToolCall("nap")]
        return echo_last_result(messages)

    a = Agent(
        name="a",
        model=ScriptedModel(script),
        tools=[nap],
        builtin_tools=BuiltinTools(plan=False, ask_user=True),
    )
    async with Runtime(store, agents=[a]) as rt:
        sub = await rt.submit("a", "plan a trip", owner="u")
        # Woken by the timer while the question is open: waiting for the person alone.
        slept = await rt.wait(
            sub.task_id,
            timeout=20,
            until=lambda t: t.status.value == "waiting" and t.wake_at is None,
        )
        waits = await open_waits(store, slept)
        assert [w["wait"] for w in waits.values()] == ["input"]
        assert slept.status_reason == "input"
        task = slept
        await rt.respond(task.id, answer="Lisbon")
        done = await rt.wait(task.id, timeout=20)
    # The timer's result was stored first, but the model reads the results in call
    # order (the question was the first call): the person's answer, then the timer's.
    assert done.output.startswith("Lisbon | ") and " | Slept until" in done.output


async def test_approval_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):

        @tool(requires_approval=True, approval_timeout=0)
        def f() -> None:
            """F."""


async def _open_approvals(store: Store, task: Task) -> dict[str, WaitCheckpoint]:
    task = await store.get_task(task.id)
    return {c: w for c, w in (await open_waits(store, task)).items() if w["wait"] == "approval"}


@pytest.mark.slow
def test_the_guides_approval_example_runs(tmp_path: Path) -> None:
    script = tmp_path / "approve.py"
    script.write_text(first_block_under("Approvals that edit and expire"))
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert "The user denied this call: Ann is on leave" in out
    assert "a person edited this call's arguments" in out
    assert "sent 'see you at 5' to bob@example.com" in out
