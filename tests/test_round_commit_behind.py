"""The commit that closes a round is queued behind the next model call (issue 15).

The last tool result of a round is handed to the store without waiting for it
to be durable; the next model call starts at once, and its commit names the
queued one (`Commit.after`). These tests hold what that must keep: the two
land in order, in one transaction when the model answers at once, and a next
round never lands, nor runs its tools, without the result that closed the last.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from conftest import PG_URL, opened_store
from duragent import Agent, BuiltinTools, Runtime, ScriptedModel, ToolCall, ToolContext, tool
from duragent.errors import TaskNotFound
from duragent.store import Commit, TaskPatch
from duragent.store._commits import PendingCommit
from duragent.store._memory import MemoryStore
from duragent.store._postgres import PostgresStore
from duragent.store._protocol import Store
from duragent.store._sqlite import SQLiteStore
from duragent.types import EntryKind, NewEntry, Task, TaskStatus

ROUNDS = 12


def counting_agent(calls: list[int], ran: list[str]) -> Agent:
    @tool
    async def first() -> str:
        """The first step."""
        ran.append("first")
        return "poison"

    @tool
    async def second() -> str:
        """The second step."""
        ran.append("second")
        return "fine"

    def script(messages: list[Any]) -> Any:
        calls.append(len(messages))
        n = len(calls)
        if n == 1:
            return [ToolCall("first", {})]
        return [ToolCall("second", {})] if n == 2 else "done"

    return Agent(
        name="a",
        model=ScriptedModel(script),
        tools=[first, second],
        builtin_tools=BuiltinTools(plan=False),
    )


@pytest.mark.parametrize("durability", ["normal", "full"])
async def test_a_round_closed_behind_the_next_model_call_shares_its_transaction(
    tmp_path: Path, durability: str
) -> None:
    @tool
    async def step(n: int) -> str:
        """One step."""
        return f"step {n} done"

    def script(messages: list[Any]) -> Any:
        done = sum(1 for m in messages if getattr(m, "role", "") == "tool")
        return [ToolCall("step", {"n": done + 1})] if done < ROUNDS else "finished"

    store = SQLiteStore(str(tmp_path / "s.db"), durability=durability)  # type: ignore[arg-type]
    agent = Agent(
        name="a", model=ScriptedModel(script), tools=[step], builtin_tools=BuiltinTools(plan=False)
    )
    async with store, Runtime(store, agents=[agent]) as rt:
        sub = await rt.submit("a", "go")
        task = await sub.wait(30)
        assert task.status is TaskStatus.COMPLETED and task.iterations == ROUNDS + 1
        results = await store.entries(task.id, kinds=[EntryKind.TOOL_RESULT])
        assert [e.payload["content"] for e in results] == [
            f"step {n} done" for n in range(1, ROUNDS + 1)
        ]
        # Each round's result and the next round's answer went in one transaction:
        # the model was asked again before the result was durable.
        assert store.jobs_done - store.batches >= ROUNDS


def refuse_poison(store: Store, kind: str) -> None:
    """Make the store refuse a tool result that says "poison" (as a full disk or a
    damaged file would refuse a write): only that commit is at fault."""
    if kind == "postgres":
        import psycopg
        from psycopg import sql

        assert isinstance(store, PostgresStore) and store.schema is not None
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(store.schema)))
            conn.execute(
                "CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$"
                " BEGIN IF NEW.kind = 'tool_result' AND position('poison' IN NEW.payload) > 0"
                " THEN RAISE EXCEPTION 'refused by the test'; END IF; RETURN NEW; END $$"
            )
            conn.execute(
                "CREATE TRIGGER refuse_poison BEFORE INSERT ON entries"
                " FOR EACH ROW EXECUTE FUNCTION refuse_poison()"
            )
        return
    assert isinstance(store, SQLiteStore)
    with sqlite3.connect(store.path) as conn:
        conn.execute(
            "CREATE TRIGGER refuse_poison BEFORE INSERT ON entries"
            " WHEN NEW.kind = 4 AND instr(NEW.payload, 'poison') > 0"
            " BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
        )


@pytest.mark.parametrize("kind", ["sqlite", "sqlite-full", "postgres"])
async def test_a_next_round_never_lands_without_the_result_that_closed_the_last(
    tmp_path: Path, kind: str
) -> None:
    calls: list[int] = []
    ran: list[str] = []
    ended = asyncio.Event()

    async def trace(point: str, **info: Any) -> None:
        if point == "task_end":
            ended.set()

    async with opened_store(kind, tmp_path) as store:
        refuse_poison(store, kind)
        async with Runtime(store, agents=[counting_agent(calls, ran)], trace=trace) as rt:
            sub = await rt.submit("a", "go")
            await asyncio.wait_for(ended.wait(), 30)
            entries = await store.entries(sub.task_id)
            assert len(calls) == 2  # the second round's answer was made, and refused
            assert ran == ["first"]  # its tool never ran
            assert [e.kind for e in entries if e.round == 2] == []
            assert [e.kind for e in entries if e.kind is EntryKind.TOOL_RESULT] == []
            task = await rt.get(sub.task_id)
            assert task.iterations == 0  # the first round is still open, for recovery


async def test_once_a_queued_commit_failed_the_runner_can_still_end_the_task() -> None:
    class RefusesTheFirstQueuedCommit(MemoryStore):
        """Its first queued commit fails with an error that is no store error (a
        bug, say): the runner learns of it from the commit that follows."""

        refused = False

        def commit_soon(self, commit: Commit) -> PendingCommit:
            if self.refused:
                return super().commit_soon(commit)
            self.refused = True
            pending = PendingCommit()
            pending.failed = ValueError("refused by the test")
            pending.future = asyncio.get_running_loop().create_future()
            pending.future.set_exception(pending.failed)
            return pending

    calls: list[int] = []
    ran: list[str] = []
    store = RefusesTheFirstQueuedCommit()
    async with Runtime(store, agents=[counting_agent(calls, ran)]) as rt:
        task = await (await rt.submit("a", "go")).wait(30)
        # The failure ends the task as failed: that commit does not follow the
        # refused one, whose error reached the runner already.
        assert task.status is TaskStatus.FAILED
        assert task.error is not None and "refused by the test" in task.error
        assert ran == ["first"] and len(calls) == 2
        assert task.iterations == 0  # the first round stays open, as stored
        entries = await store.entries(task.id)
        assert [e.kind for e in entries if e.kind is EntryKind.TOOL_RESULT] == []
        # Nothing of the second round landed; the failure is told in round 1.
        assert max(e.round for e in entries) == 1


async def test_a_runner_cancelled_right_after_its_last_tool_still_stores_the_result(
    tmp_path: Path,
) -> None:
    box: dict[str, Any] = {}

    @tool
    async def charge(ctx: ToolContext) -> str:
        """Charge once (never run twice)."""
        # The worker stops at once (stop(graceful=False)) as the tool returns.
        job = box["rt"].worker._jobs[ctx.task_id]
        asyncio.get_running_loop().call_soon(job.cancel)
        box["job"] = job
        return "charged"

    def script(messages: list[Any]) -> Any:
        return [ToolCall("charge", {})] if len(messages) == 1 else "done"

    store = SQLiteStore(str(tmp_path / "s.db"))
    agent = Agent(
        name="a",
        model=ScriptedModel(script),
        tools=[charge],
        builtin_tools=BuiltinTools(plan=False),
    )
    async with store, Runtime(store, agents=[agent]) as rt:
        box["rt"] = rt
        sub = await rt.submit("a", "go")
        while "job" not in box:
            await rt.store.wait_for_change(1)
        with contextlib.suppress(asyncio.CancelledError):
            await box["job"]
        results = await store.entries(sub.task_id, kinds=[EntryKind.TOOL_RESULT])
        assert [e.payload["content"] for e in results] == ["charged"]
        assert (await store.get_task(sub.task_id)).iterations == 1


async def test_a_hook_that_stops_waiting_for_landed_changes_nothing(tmp_path: Path) -> None:
    @tool
    async def step(n: int) -> str:
        """One step."""
        return f"step {n} done"

    def script(messages: list[Any]) -> Any:
        done = sum(1 for m in messages if getattr(m, "role", "") == "tool")
        return [ToolCall("step", {"n": done + 1})] if done < 3 else "finished"

    async def trace(point: str, **info: Any) -> None:
        if point == "result" and "landed" in info:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(info["landed"], 1e-9)  # gives up at once

    store = SQLiteStore(str(tmp_path / "s.db"), durability="full")
    agent = Agent(
        name="a", model=ScriptedModel(script), tools=[step], builtin_tools=BuiltinTools(plan=False)
    )
    async with store, Runtime(store, agents=[agent], trace=trace) as rt:
        task = await (await rt.submit("a", "go")).wait(30)
        assert task.status is TaskStatus.COMPLETED and task.iterations == 4
        answers = await store.entries(task.id, kinds=[EntryKind.API_MESSAGE])
        rounds = [e.round for e in answers]
        assert rounds == [1, 1, 2, 3, 4]  # the input, then one answer per round


async def test_a_task_deleted_earlier_in_a_batch_is_not_found_by_the_jobs_after_it(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(str(tmp_path / "s.db"), durability="full")  # one batch for all
    await store.open()
    try:
        await store.create_task(Task(agent="a"))
        task = await store.claim_task("w")
        assert task is not None
        later = [
            asyncio.ensure_future(job)
            for job in (
                store.delete_task(task.id),
                store.commit(
                    Commit(patches=[TaskPatch(task.id, {"iterations": 2})], fence={task.id: 1})
                ),
                store.commit(
                    Commit(
                        entries=[NewEntry(task_id=task.id, kind=EntryKind.PROGRESS, payload={})],
                        fence={task.id: 1},
                    )
                ),
            )
        ]
        # Queued now, ahead of the three above: they queue theirs in their first
        # step, which the loop runs before the writer's turn this queueing asks
        # for (both wait in the loop's queue, theirs first). So the writer finds
        # all four waiting, whoever runs it and however loaded the machine is.
        first = store.commit_soon(
            Commit(patches=[TaskPatch(task.id, {"iterations": 1})], fence={task.id: 1})
        )
        batches = store.batches
        outcomes = await asyncio.gather(*later, return_exceptions=True)
        await first
        assert store.batches == batches + 1  # what this test is about: one transaction
        assert outcomes[0] is None
        assert isinstance(outcomes[1], TaskNotFound) and isinstance(outcomes[2], TaskNotFound)
    finally:
        await store.close()


class SettlesQueuedCommitsLate(SQLiteStore):
    """A store that tells of a queued commit's success late: only when the next
    commit is queued (a failure, at once). The order in which a store answers
    is not part of its contract: a runner must not take a late answer to an
    earlier queued commit for one to the commit it queued since."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self._queued: list[tuple[PendingCommit, PendingCommit]] = []  # (told, real)
        self._real: dict[int, PendingCommit] = {}

    def _as_real(self, commit: Commit) -> Commit:
        if commit.after is not None:
            commit.after = self._real.get(id(commit.after), commit.after)
        return commit

    def commit_soon(self, commit: Commit) -> PendingCommit:
        for told, real in self._queued:
            assert told.future is not None and real.future is not None
            if real.future.done() and real.future.exception() is None:
                told.future.set_result(real.future.result())
        self._queued = [(t, r) for t, r in self._queued if t.future and not t.future.done()]
        real = super().commit_soon(self._as_real(commit))
        told = PendingCommit()
        told.future = asyncio.get_running_loop().create_future()
        self._real[id(told)] = real
        self._queued.append((told, real))

        def failed(f: asyncio.Future[Any]) -> None:
            assert told.future is not None
            if not f.cancelled() and f.exception() is not None and not told.future.done():
                told.failed = f.exception()
                told.future.set_exception(told.failed)  # type: ignore[arg-type]

        assert real.future is not None
        real.future.add_done_callback(failed)
        return told

    async def commit(self, commit: Commit) -> Any:
        return await super().commit(self._as_real(commit))


async def test_a_late_answer_to_an_earlier_queued_commit_never_unlinks_the_next_round(
    tmp_path: Path,
) -> None:
    ran: list[int] = []
    ended = asyncio.Event()

    @tool
    async def step(n: int) -> str:
        """One step."""
        ran.append(n)
        if n == 3:
            ended.set()  # what must not happen: the test fails at once
        return "poison" if n == 2 else f"step {n} done"

    def script(messages: list[Any]) -> Any:
        done = sum(1 for m in messages if getattr(m, "role", "") == "tool")
        return [ToolCall("step", {"n": done + 1})] if done < 3 else "finished"

    class Answering(ScriptedModel):
        async def stream(self, request: Any) -> Any:
            await asyncio.sleep(0)  # a real model answers in a later turn of the loop
            async for event in super().stream(request):
                yield event

    async def trace(point: str, **info: Any) -> None:
        if point == "task_end":
            ended.set()

    store = SettlesQueuedCommitsLate(str(tmp_path / "s.db"))
    await store.open()
    refuse_poison(store, "sqlite")
    agent = Agent(
        name="a", model=Answering(script), tools=[step], builtin_tools=BuiltinTools(plan=False)
    )
    async with store, Runtime(store, agents=[agent], trace=trace) as rt:
        sub = await rt.submit("a", "go")
        await asyncio.wait_for(ended.wait(), 30)
        # Round 1's success is told only as round 2's result is queued, and
        # that result is refused: round 3's answer must follow it, and so be
        # refused too, whatever the late answer about round 1 said.
        assert ran == [1, 2]
        entries = await store.entries(sub.task_id)
        assert [e.kind for e in entries if e.round == 3] == []
        results = [e.payload["content"] for e in entries if e.kind is EntryKind.TOOL_RESULT]
        assert results == ["step 1 done"]
