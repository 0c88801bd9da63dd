"""Bulk operations (issue 43 item 3) through the library, on every store.

`Runtime.bulk(action, filter)` acts on every matching task once, as a task of
the built-in agent `duragent.bulk`; `dry_run=True` only counts. The crash
tests (SIGKILL halfway through an operation) are in test_bulk_crash.py.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from duragent import Runtime, TaskStatus
from duragent.errors import InvalidOption, TaskNotFound
from duragent.runtime._bulk import TaskFilter
from duragent.runtime._bulk_run import BULK_AGENT
from duragent.store._protocol import Store
from duragent.types import task_scope
from support.bulk import (
    failed_tasks,
    failing_agent,
    migrations_of,
    retries_of,
    waiting_agent,
    waiting_tasks,
)


@pytest.mark.slow
async def test_bulk_retry_retries_each_matching_task_once(store: Store) -> None:
    async with Runtime(store, agents=[failing_agent()], worker_queues=["flaky"]) as rt:
        mine = await failed_tasks(rt, 5, "alice", team="a")
        other_label = await failed_tasks(rt, 2, "alice", team="b")
        others = await failed_tasks(rt, 2, "bob", team="a")
        flt = TaskFilter(owner="alice", metadata={"team": "a"})
        assert await rt.bulk("retry", flt, dry_run=True) == 5
        for task_id in mine:  # a dry run touched nothing
            assert await retries_of(store, task_id) == 0
        op = await rt.bulk("retry", flt, owner="alice", page_size=2)
        assert op.status == "running" and op.action == "retry" and op.filter == flt
    # The in-process worker served only the queue "flaky": the operation waits for a worker.
    async with Runtime(store, agents=[failing_agent()]) as rt:
        await rt.resume()
        await rt.wait(op.id, timeout=60)
        done = await rt.bulk_operation(op.id, owner="alice")
        assert (done.status, done.total, done.done, done.skipped, done.failed) == (
            "done",
            5,
            5,
            0,
            0,
        )
        for task_id in mine:
            assert await retries_of(store, task_id) == 1
        for task_id in other_label + others:
            assert await retries_of(store, task_id) == 0
        with pytest.raises(TaskNotFound):
            await rt.bulk_operation(op.id, owner="bob")
        listed, _ = await rt.bulk_operations(owner="alice")
        assert [o.id for o in listed] == [op.id]
        assert (await rt.bulk_operations(owner="bob"))[0] == []


@pytest.mark.slow
async def test_bulk_pause_resume_abort_and_purge(store: Store) -> None:
    async with Runtime(store, agents=[waiting_agent(), failing_agent()]) as rt:
        waiting = [(await rt.submit("slow", f"w{i}", owner="al")).task_id for i in range(3)]
        for task_id in waiting:
            await rt.wait(task_id, timeout=30, until=lambda t: t.status is TaskStatus.WAITING)
        failed = await failed_tasks(rt, 2, "al")
        slow = TaskFilter(agent="slow")

        async def run(action: str, flt: TaskFilter) -> tuple[int, int, int]:
            op = await rt.bulk(action, flt, owner="al")
            await rt.wait(op.id, timeout=60)
            got = await rt.bulk_operation(op.id)
            assert got.status == "done", got
            return got.done, got.skipped, got.failed

        assert await run("pause", slow) == (3, 0, 0)
        assert {(await rt.get(t)).status for t in waiting} == {TaskStatus.PAUSED}
        assert await rt.bulk("resume", slow, dry_run=True) == 3
        assert await run("resume", slow) == (3, 0, 0)
        for task_id in waiting:
            await rt.wait(task_id, timeout=30, until=lambda t: t.status is TaskStatus.WAITING)
        assert await run("abort", slow) == (3, 0, 0)
        assert {(await rt.get(t)).status for t in waiting} == {TaskStatus.ABORTED}
        # Purge: finished tasks only; bulk operations themselves are never matched.
        assert await rt.bulk("purge", TaskFilter(), dry_run=True) == 5
        assert await run("purge", TaskFilter(status=[TaskStatus.ABORTED])) == (3, 0, 0)
        for task_id in waiting:
            with pytest.raises(TaskNotFound):
                await rt.get(task_id)
        assert {(await rt.get(t)).status for t in failed} == {TaskStatus.FAILED}
        assert len((await rt.bulk_operations())[0]) == 4
        assert (await rt.list_tasks(agent=BULK_AGENT)).tasks  # shown like any task


async def test_bulk_refuses_an_unknown_action_and_never_matches_other_statuses() -> None:
    async with Runtime("memory://", agents=[failing_agent()]) as rt:
        with pytest.raises(InvalidOption, match="unknown bulk action 'restart'; one of: retry"):
            await rt.bulk("restart", dry_run=True)
        with pytest.raises(InvalidOption, match=r"retry takes no option to \(it takes: none\)"):
            await rt.bulk("retry", options={"to": "v2"})
        await rt.submit("flaky", "x", start_at=timedelta(hours=1))  # pending for an hour
        assert await rt.bulk("abort", dry_run=True) == 1
        assert await rt.bulk("retry", TaskFilter(status=[TaskStatus.PENDING]), dry_run=True) == 0
        assert await rt.bulk("purge", TaskFilter(status=[TaskStatus.PENDING]), dry_run=True) == 0
        assert await rt.bulk("purge", dry_run=True) == 0  # finished tasks only
        op = await rt.bulk("retry", TaskFilter(status=[TaskStatus.PENDING]))
        await rt.wait(op.id, timeout=10)
        done = await rt.bulk_operation(op.id)
        assert (done.status, done.total, done.done) == ("done", 0, 0)
        with pytest.raises(ValueError, match="a time needs a zone"):
            TaskFilter.model_validate({"created_after": "2030-01-01T00:00:00"})


async def test_bulk_counts_only_the_tasks_the_page_search_shows(store: Store) -> None:
    """The page's search box (an id prefix) is part of the filter a bulk action
    gets: the action acts on the tasks the list shows, not on more."""
    async with Runtime(store, agents=[failing_agent()]) as rt:
        ids = await failed_tasks(rt, 3, "alice", team="a")
        flt = TaskFilter(owner="alice", id_prefix=ids[0])
        assert await rt.bulk("retry", flt, dry_run=True) == 1
        assert await rt.bulk("retry", TaskFilter(owner="alice"), dry_run=True) == 3


@pytest.mark.slow
async def test_a_finished_bulk_operation_keeps_no_marker_documents(store: Store) -> None:
    """The markers (one per task acted on) only guard a re-run of the operation's
    pages; once its last page is recorded they are deleted, not kept until the
    operation itself is purged."""
    async with Runtime(store, agents=[failing_agent()]) as rt:
        ids = await failed_tasks(rt, 5, "alice")
        op = await rt.bulk("retry", TaskFilter(owner="alice"), page_size=2)
        await rt.wait(op.id, timeout=60)
        done = await rt.bulk_operation(op.id)
        assert (done.status, done.done) == ("done", 5)
        assert [await retries_of(store, t) for t in ids] == [1] * 5
        docs = await store.list_documents(task_scope(op.id))
        assert [d.key for d in docs if d.key.startswith("acted:")] == []


@pytest.mark.slow
async def test_bulk_migrate_moves_each_matching_task_once(store: Store) -> None:
    """Migrate by filter (agent and version): only the matching tasks move, each by
    one recorded migration; one already on the target is skipped; a second run
    of the same operation migrates nothing again."""
    agents = [waiting_agent(version="v1"), waiting_agent("other", version="v1")]
    async with Runtime(store, agents=agents) as rt:
        slow = await waiting_tasks(rt, "slow", 4, "al")
        other = await waiting_tasks(rt, "other", 2, "al")
        theirs = await waiting_tasks(rt, "slow", 1, "bo")
        await rt.migrate(slow[0], "v2", by="al")  # already on the target: skipped
        v1 = TaskFilter(agent="slow", version="v1", owner="al")
        assert await rt.bulk("migrate", v1, dry_run=True, options={"to": "v2"}) == 3
        assert {t.id for t in (await rt.list_tasks(version="v1", agent="slow")).tasks} == {
            *slow[1:],
            *theirs,
        }
        with pytest.raises(InvalidOption, match="migrate needs the version"):
            await rt.bulk("migrate", v1)
        with pytest.raises(InvalidOption, match="agent version"):
            await rt.bulk("migrate", v1, options={"to": "v 2"})
        op = await rt.bulk("migrate", TaskFilter(agent="slow", owner="al"), options={"to": "v2"})
        await rt.wait(op.id, timeout=60)
        got = await rt.bulk_operation(op.id)
        assert (got.status, got.total, got.done, got.skipped, got.failed) == (
            "done",
            4,
            3,
            1,
            0,
        )
        by = f"bulk operation {op.id}"
        for task_id in slow[1:]:
            assert await migrations_of(store, task_id) == [{"from": "v1", "to": "v2", "by": by}]
            assert (await rt.get(task_id)).agent_version == "v2"
        assert await migrations_of(store, slow[0]) == [{"from": "v1", "to": "v2", "by": "al"}]
        for task_id in other + theirs:
            assert await migrations_of(store, task_id) == []
            assert (await rt.get(task_id)).agent_version == "v1"
        listed = await rt.list_tasks(version="v2", owner="al")
        assert {t.id for t in listed.tasks} == set(slow)
        again = await rt.bulk("migrate", TaskFilter(agent="slow", owner="al"), options={"to": "v2"})
        await rt.wait(again.id, timeout=60)
        got = await rt.bulk_operation(again.id)
        assert (got.done, got.skipped) == (0, 4)
        for task_id in slow[1:]:
            assert len(await migrations_of(store, task_id)) == 1


def test_the_bulk_agent_declares_its_version() -> None:
    """Its version is declared, not a fingerprint of its tool's text: a duragent
    upgrade that rewords the tool leaves the operations in flight served."""
    agent = Runtime("memory://", run_worker=False).bulk_agent
    assert agent.name == BULK_AGENT and agent.version_declared and agent.version == "1"
