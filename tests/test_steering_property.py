"""Properties of the model's view under steering.

For any log of rounds with rolled-back attempts and any fork of it (any round, any edit),
the fork's model view answers every tool call exactly once, holds nothing voided, and is
the source's view through that round with the edit applied. And for a real task driven
by any sequence of send (every strategy) / pause / rollback / resume / fork, every view
(the task's and its forks') answers each call exactly once, right after the call, never
shows a rolled-back turn, and the task takes every accepted message exactly once."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from duragent import (
    Agent,
    BuiltinTools,
    Edit,
    Limits,
    Runtime,
    ScriptedModel,
    TaskStatus,
    Timing,
    ToolCall,
    ToolContext,
    Turn,
    UsageError,
    tool,
)
from duragent._payloads import is_voided, voided_ranges
from duragent.store import Store, open_store
from duragent.store._commits import Commit, TaskPatch
from duragent.store._memory import MemoryStore
from duragent.types import (
    AssistantMessage,
    EntryKind,
    NewEntry,
    Task,
    ToolMessage,
    UserMessage,
)

# A round: the calls of each voided attempt, then the calls of the live attempt.
round_ = st.tuples(st.lists(st.integers(0, 2), max_size=2), st.integers(0, 3))
edit_ = st.builds(
    Edit,
    replace_last_user=st.none() | st.just("replaced"),
    append_user=st.none() | st.just("appended"),
    drop_last_assistant=st.booleans(),
)


async def build(store: Store, rounds: list[tuple[list[int], int]]) -> Task:
    task, _ = await store.create_task(Task(agent="p"))
    tid = task.id

    async def put(entries: list[NewEntry]) -> list[int]:
        res = await store.commit(Commit(entries=entries))
        return [e.seq for e in res.entries]

    def attempt(r: int, tag: str, calls: int) -> list[NewEntry]:
        ids = [f"c{r}_{tag}_{i}" for i in range(calls)]
        message: dict[str, Any] = {"role": "assistant", "content": f"{tag} {r}"}
        if ids:
            fn = {"name": "t", "arguments": json.dumps({})}
            message["tool_calls"] = [{"id": c, "type": "function", "function": fn} for c in ids]
        out = [NewEntry(task_id=tid, kind=EntryKind.API_MESSAGE, round=r, payload=message)]
        for c in ids:
            payload = {
                "role": "tool",
                "tool_call_id": c,
                "content": f"{tag} result",
                "outcome": "ok",
            }
            out.append(NewEntry(task_id=tid, kind=EntryKind.TOOL_RESULT, round=r, payload=payload))
        return out

    user = {"role": "user", "content": "start"}
    await put([NewEntry(task_id=tid, kind=EntryKind.API_MESSAGE, round=1, payload=user)])
    for r, (voided, live) in enumerate(rounds, start=1):
        for k, calls in enumerate(voided):
            seqs = await put(attempt(r, f"voided{k}", calls))
            marker = {"scope": "api", "from_seq": seqs[0], "to_seq": seqs[-1], "reason": "test"}
            await put([NewEntry(task_id=tid, kind=EntryKind.ROLLBACK, round=r, payload=marker)])
        await put(attempt(r, "live", live))
    res = await store.commit(Commit(patches=[TaskPatch(tid, {"iterations": len(rounds)})]))
    return res.tasks[tid]


def expected(view: list[Any], at_round: int, edit: Edit) -> list[Any]:
    """The edit applied to the source's view through `at_round`, written out plainly."""
    # The live view through round N: the user message, then N rounds of (assistant, results).
    out, rounds = [view[0]], 0
    for m in view[1:]:
        if isinstance(m, AssistantMessage):
            rounds += 1
        if rounds > at_round:
            break
        out.append(m)
    if edit.drop_last_assistant:
        last = max(i for i, m in enumerate(out) if isinstance(m, AssistantMessage))
        out = out[:last]
    if edit.replace_last_user is not None:
        last = max(i for i, m in enumerate(out) if isinstance(m, UserMessage))
        out[last] = UserMessage(content=edit.replace_last_user)
    if edit.append_user is not None:
        out.append(UserMessage(content=edit.append_user))
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(round_, min_size=1, max_size=5), st.data(), edit_)
def test_a_forks_view_is_the_sources_through_round_n_with_its_edit(
    rounds: list[tuple[list[int], int]], data: st.DataObject, edit: Edit
) -> None:
    at_round = data.draw(st.integers(1, len(rounds)))

    async def go() -> None:
        store = open_store("memory://")
        await store.open()
        assert isinstance(store, MemoryStore)
        await store.open()
        source = await build(store, rounds)
        rt = Runtime(store, run_worker=False)
        source_view = await rt.model_view(source.id)
        fork = await rt.fork(source.id, at_round, edit=edit)
        view = await rt.model_view(fork.task_id)
        assert view == expected(source_view, at_round, edit)
        calls = [c.id for m in view if isinstance(m, AssistantMessage) for c in m.tool_calls or ()]
        answers = [m.tool_call_id for m in view if isinstance(m, ToolMessage)]
        assert sorted(calls) == sorted(answers) and len(set(answers)) == len(answers)
        assert not any("voided" in (getattr(m, "content", "") or "") for m in view)
        assert (await rt.get(fork.task_id)).iterations == at_round
        await store.close()

    asyncio.run(go())


# --- the engine under random steering ----------------------------------------------

OPS = st.sampled_from(
    [
        "step",
        "step",
        "send:enqueue",
        "send:interrupt",
        "send:rollback",
        "send:reject",
        "pause",
        "pause:rollback",
        "resume",
        "fork",
    ]
)
STOPPED = {"paused", "completed", "failed", "blocked", "aborted"}


class Steered:
    """A task whose tools hold until the test lets a step through; every model turn
    is labelled, so a rolled-back one can be recognised in any view."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.holding = 0  # tools of the steered task waiting at the current gate
        self.turns = 0
        self.steered: str | None = None

    def agent(self) -> Agent:
        async def hold(ctx: ToolContext) -> str:
            if ctx.task_id == self.steered:  # forks run through
                gate = self.gate
                self.holding += 1
                try:
                    await gate.wait()
                finally:
                    if gate is self.gate:  # cut short (a pause) before its step came
                        self.holding -= 1
            return f"result of {ctx.call_id}"

        safe = tool(name="safe_t", replay="safe")(hold)
        never = tool(name="never_t")(hold)

        def script(messages: list[Any]) -> Any:
            self.turns += 1
            since_user = 0
            for m in reversed(messages):
                if isinstance(m, UserMessage):
                    break
                since_user += isinstance(m, AssistantMessage)
            label = f"turn {self.turns}"
            if since_user >= 2:
                return label
            # Every other turn calls only a replay-safe tool: a rollback voids all of it.
            calls = [ToolCall("safe_t")] + ([ToolCall("never_t")] if self.turns % 2 else [])
            return Turn(text=label, tool_calls=calls)

        return Agent(
            name="steered",
            model=ScriptedModel(script),
            tools=[safe, never],
            builtin_tools=BuiltinTools(plan=False),
            timing=Timing(tool_grace=0.0),
            limits=Limits(max_iterations=200),
        )

    def step(self) -> None:
        """Let the tools now holding through; later ones hold at a new gate."""
        self.gate.set()
        self.gate = asyncio.Event()
        self.holding = 0


def check_view(view: list[Any], voided_labels: set[str]) -> None:
    """Each call answered exactly once, right after its assistant message (no user
    message in between), and no message of a rolled-back turn."""
    i = 0
    while i < len(view):
        m = view[i]
        assert not isinstance(m, ToolMessage), f"a result without its call at {i}: {view}"
        if isinstance(m, AssistantMessage):
            assert (m.content or "") not in voided_labels, f"a voided turn in the view: {m}"
            ids = [c.id for c in m.tool_calls or ()]
            answers = view[i + 1 : i + 1 + len(ids)]
            assert all(isinstance(a, ToolMessage) for a in answers), view
            assert sorted(a.tool_call_id for a in answers) == sorted(ids), view
            i += len(ids)
        i += 1


async def voided_labels(store: Any, task_id: str) -> set[str]:
    entries = await store.entries(task_id)
    ranges = voided_ranges(e.payload for e in entries if e.kind is EntryKind.ROLLBACK)
    return {
        str(e.payload.get("content") or "")
        for e in entries
        if e.kind is EntryKind.API_MESSAGE
        and e.payload.get("role") == "assistant"
        and is_voided(e.seq, ranges)
    }


@pytest.mark.slow
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(OPS, st.integers(0, 50)), max_size=12))
def test_random_send_pause_rollback_resume_fork_keep_every_view_sound(
    ops: list[tuple[str, int]],
) -> None:
    async def go() -> None:
        steered = Steered()
        store = open_store("memory://")
        await store.open()
        rt = Runtime(store, agents=[steered.agent()], poll_interval=0.01)
        async with rt:
            sub = await rt.submit("steered", "begin")
            steered.steered = sub.task_id
            tid = sub.task_id
            sent: list[str] = []
            forks: list[str] = []

            async def settle() -> Any:
                """Until the task's tools hold at the gate, or it stopped."""
                while True:
                    t = await rt.get(tid)
                    if t.status.value in STOPPED or (
                        steered.holding and t.status is TaskStatus.RUNNING and not t.control
                    ):
                        return t
                    await store.wait_for_change(0.02)

            for n, (op, k) in enumerate(ops):
                t = await settle()
                try:
                    if op == "step":
                        steered.step()
                    elif op.startswith("send:"):
                        text = f"message {n}"
                        await rt.send(tid, text, multitask_strategy=op[5:])  # type: ignore[arg-type]
                        sent.append(text)
                    elif op.startswith("pause"):
                        await rt.pause(tid, rollback=op == "pause:rollback", timeout=10)
                    elif op == "resume":
                        await rt.resume(tid)
                    elif op == "fork" and t.iterations:
                        forks.append((await rt.fork(tid, 1 + k % t.iterations)).task_id)
                except UsageError:
                    pass  # refused as documented: finished, busy, not paused, ...
            for _ in range(200):  # run it out: resume what is paused, let tools through
                t = await settle()
                if t.status.value in ("completed", "failed", "aborted"):
                    break
                if t.status.value in ("paused", "blocked"):
                    await rt.resume(tid)
                steered.step()
            assert t.status is TaskStatus.COMPLETED, (t.status, t.error)
            for fid in forks:
                await rt.wait(fid, timeout=30)
            view = await rt.model_view(tid)
            check_view(view, await voided_labels(store, tid))
            users = [m.content for m in view if isinstance(m, UserMessage)]
            # Every accepted message taken, once (an interrupting one may pass an enqueued one).
            assert users[0] == "begin" and sorted(users[1:]) == sorted(sent)
            assert "inbox" not in (await rt.get(tid)).config
            for fid in forks:
                check_view(await rt.model_view(fid), await voided_labels(store, fid))
        await store.close()

    asyncio.run(go())
