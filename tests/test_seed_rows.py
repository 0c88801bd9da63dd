"""The seed documents' last partial persistence rows (issue 38 item 2), on every store.

Per-task callbacks given at `load_task`, the application setting a task's plan,
the streamed answer so far as a field of the task, the public session API, and
blocked(incompatible_store) for one task whose log this version cannot read.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from duragent import (
    Agent,
    BuiltinTools,
    Runtime,
    ScriptedModel,
    TaskCallbacks,
    TaskStatus,
    Timing,
    ToolCall,
    tool,
)
from duragent.errors import IncompatibleEntry, SessionNotFound, TaskNotFound, UsageError
from duragent.store._commits import Commit
from duragent.store._protocol import Store
from duragent.store._sqlite_schema import KIND_CODES
from duragent.types import BlockReason, Entry, EntryKind, NewEntry, Task, UINotice
from support.seed_rows import FutureKind, streaming

TERMINAL = [s for s in TaskStatus if s.terminal]


def quick() -> Agent:
    return Agent(name="a", model=ScriptedModel(["done"]), builtin_tools=BuiltinTools(plan=False))


# --- blocked(incompatible_store) ---------------------------------------------


async def test_a_task_with_an_unknown_entry_kind_is_blocked_and_the_others_run(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with Runtime(store, agents=[quick()], run_worker=False) as writer:
        odd = (await writer.submit("a", "from the future")).task_id
        fine = (await writer.submit("a", "today")).task_id
        # What a later version would write: the SQLite store codes kinds as numbers.
        codes: dict[Any, int] = KIND_CODES
        monkeypatch.setitem(codes, FutureKind.HOLOGRAM, 99)
        entry = NewEntry(task_id=odd, kind=EntryKind.PROGRESS, payload={"x": 1}, round=1)
        entry.kind = FutureKind.HOLOGRAM  # type: ignore[assignment]
        await store.commit(Commit(entries=[entry]))
        monkeypatch.delitem(codes, FutureKind.HOLOGRAM)
    async with Runtime(store, agents=[quick()]) as rt:
        done = await rt.wait(fine, timeout=30)
        assert done.status is TaskStatus.COMPLETED and done.output == "done"
        blocked = await rt.wait(
            odd, timeout=30, until=lambda t: t.status in (TaskStatus.BLOCKED, *TERMINAL)
        )
        assert blocked.status is TaskStatus.BLOCKED
        assert blocked.status_reason == BlockReason.INCOMPATIBLE_STORE.value
        error = blocked.error or ""
        assert "\n" not in error and f"task {odd!r}: entry " in error, error
        assert "hologram" in error or "code 99" in error, error


# --- the application sets the plan ---------------------------------------------


async def test_the_application_sets_a_tasks_pending_steps(store: Store) -> None:
    async with Runtime(store, agents=[quick()], run_worker=False) as rt:
        tid = (await rt.submit("a", "go", owner="alice")).task_id
        steps = await rt.set_plan(tid, ["read the brief", "write the draft"], owner="alice")
        assert steps.pending == ["read the brief", "write the draft"]
        assert (await rt.steps(tid)).pending == ["read the brief", "write the draft"]
        notices = [m for m in await rt.ui_messages(tid) if isinstance(m, UINotice)]
        assert "1. read the brief; 2. write the draft" in notices[-1].message
        with pytest.raises(TaskNotFound):
            await rt.set_plan(tid, ["bob's step"], owner="bob")
        for bad in (["ok", ""], "one string", ["ok", 3]):
            with pytest.raises(UsageError):
                await rt.set_plan(tid, bad, owner="alice")  # type: ignore[arg-type]
        assert (await rt.steps(tid)).pending == ["read the brief", "write the draft"]
        assert (await rt.set_plan(tid, [])).pending == []
    async with Runtime(store, agents=[quick()]) as rt:
        assert (await rt.wait(tid, timeout=30)).status is TaskStatus.COMPLETED
        with pytest.raises(UsageError, match="has ended"):
            await rt.set_plan(tid, ["too late"])


# --- the answer so far -----------------------------------------------------------


async def test_a_running_tasks_partial_output_is_its_answer_streamed_so_far(store: Store) -> None:
    agent, held, release, trace = streaming(2)
    async with Runtime(store, agents=[agent], trace=trace) as rt:
        tid = (await rt.submit("s", "go")).task_id
        await asyncio.wait_for(held.wait(), 30)
        task = await rt.get(tid)
        assert task.status is TaskStatus.RUNNING
        assert task.partial_output == "abcdefgh"
        assert (await store.get_task(tid)).partial_output is None  # derived, not stored
        assert "partial" not in task.model_dump_json()
        release.set()
        done = await rt.wait(tid, timeout=30)
        assert done.output == "abcdefghijkl"
        assert (await rt.get(tid)).partial_output is None


# --- the session API -------------------------------------------------------------


def echo() -> Agent:
    def answer(messages: list[Any]) -> str:
        return "echo " + str([m for m in messages if m.role == "user"][-1].content)

    return Agent(name="chat", model=ScriptedModel(answer), builtin_tools=BuiltinTools(plan=False))


def said(transcript: list[Any]) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in transcript]


async def test_a_session_lists_reads_and_continues_for_its_owner_only(store: Store) -> None:
    async with Runtime(store, agents=[echo()]) as rt:
        first = await rt.submit("chat", "hi", owner="alice", session_id="s1")
        await first.wait(30)
        again = await rt.continue_session("s1", "again", owner="alice")
        assert again.created and not again.sent
        await again.wait(30)
        await (await rt.submit("chat", "bob here", owner="bob", session_id="s1")).wait(30)
        await (await rt.submit("chat", "other", owner="alice", session_id="s2")).wait(30)
        await (await rt.submit("chat", "no session", owner="alice")).wait(30)

        listed = await rt.sessions(owner="alice")
        assert [(s.session_id, s.turns) for s in listed] == [("s2", 1), ("s1", 2)]
        assert listed[1].latest_task_id == again.task_id
        assert listed[1].latest_status is TaskStatus.COMPLETED
        s1 = await rt.session("s1", owner="alice")
        assert [t.id for t in s1.tasks] == [first.task_id, again.task_id]
        assert said(s1.transcript) == [
            ("user", "hi"),
            ("assistant", "echo hi"),
            ("user", "again"),
            ("assistant", "echo again"),
        ]
        bobs = await rt.session("s1", owner="bob")
        assert said(bobs.transcript) == [("user", "bob here"), ("assistant", "echo bob here")]
        for name, owner in (("s1", "carol"), ("s1", None), ("nope", "alice")):
            with pytest.raises(SessionNotFound, match="no session"):
                await rt.session(name, owner=owner)
            with pytest.raises(SessionNotFound, match="no session"):
                await rt.continue_session(name, "x", owner=owner)
        assert await rt.sessions(owner="carol") == []


# --- callbacks given per task at load ----------------------------------------------


@tool(replay="safe")
async def look(q: str) -> str:
    """Look something up."""
    return f"found {q}"


def looker() -> Agent:
    model = ScriptedModel([[ToolCall("look", {"q": "x"})], "found it all"], chunk_size=4)
    return Agent(
        name="cb",
        model=model,
        tools=[look],
        timing=Timing(progress_interval=0),
        builtin_tools=BuiltinTools(plan=False),
    )


async def test_callbacks_given_at_load_hear_that_task_only(store: Store) -> None:
    async with Runtime(store, agents=[looker()], run_worker=False) as writer:
        mine = (await writer.submit("cb", "mine")).task_id
        other = (await writer.submit("cb", "other")).task_id
    before = (await store.get_task(mine)).last_seq
    heard: list[tuple[Any, ...]] = []
    ended = asyncio.Event()

    async def on_status(task: Task, old: TaskStatus, new: TaskStatus) -> None:
        await asyncio.sleep(0)  # awaited: the calls after it wait for it
        heard.append(("status", task.id, old.value, new.value))

    def on_entry(entry: Entry) -> None:
        heard.append(("entry", entry.task_id, entry.seq))

    async def on_end(task: Task) -> None:
        await asyncio.sleep(0)
        heard.append(("end", task.id, task.status.value))
        ended.set()

    callbacks = TaskCallbacks(on_status=on_status, on_entry=on_entry, on_end=on_end)
    async with Runtime(store, agents=[looker()]) as rt:
        assert (await rt.load_task(mine, callbacks=callbacks)).id == mine
        await rt.resume()
        assert (await rt.wait(other, timeout=30)).status is TaskStatus.COMPLETED
        assert (await rt.wait(mine, timeout=30)).status is TaskStatus.COMPLETED
        await asyncio.wait_for(ended.wait(), 30)
    assert {h[1] for h in heard} == {mine}
    # Every entry its runner committed, in order (status changes are on_status's).
    log = [e for e in await store.entries(mine) if e.seq > before and e.kind != EntryKind.STATUS]
    assert [h[2] for h in heard if h[0] == "entry"] == [e.seq for e in log]
    assert {e.kind for e in log} >= {EntryKind.PROGRESS, EntryKind.TOOL_INTENT}
    assert ("status", mine, "running", "completed") in heard
    assert heard[-1] == ("end", mine, "completed")


async def test_callbacks_given_while_the_task_runs_hear_the_rest_of_it(store: Store) -> None:
    agent, held, release, trace = streaming(1)
    heard: list[str] = []
    ended = asyncio.Event()

    def on_end(task: Task) -> None:
        ended.set()

    callbacks = TaskCallbacks(on_entry=lambda e: heard.append(e.kind.value), on_end=on_end)
    async with Runtime(store, agents=[agent], trace=trace) as rt:
        tid = (await rt.submit("s", "go")).task_id
        await asyncio.wait_for(held.wait(), 30)  # running, its first progress committed
        await rt.load_task(tid, callbacks=callbacks)
        release.set()
        assert (await rt.wait(tid, timeout=30)).status is TaskStatus.COMPLETED
        await asyncio.wait_for(ended.wait(), 30)
    assert heard == ["progress", "progress", "api_message"]


async def test_a_jsonl_store_with_a_later_versions_entry_still_opens_and_compacts(
    tmp_path: Path,
) -> None:
    url = f"jsonl:///{tmp_path}/store"
    async with Runtime(url, agents=[quick()], run_worker=False) as writer:
        odd = (await writer.submit("a", "from the future")).task_id
        fine = (await writer.submit("a", "today")).task_id
        entry = NewEntry(task_id=odd, kind=EntryKind.PROGRESS, payload={"x": 1}, round=1)
        entry.kind = FutureKind.HOLOGRAM  # type: ignore[assignment]
        await writer.store.commit(Commit(entries=[entry]))
    for _ in range(2):  # reopened from the log, then from the compacted log
        async with Runtime(url, agents=[quick()], run_worker=False) as rt:
            assert len(await rt.store.entries(fine)) == 1
            with pytest.raises(IncompatibleEntry, match="kind 'hologram'"):
                await rt.store.entries(odd)
            rt.store.compact()  # type: ignore[attr-defined]
