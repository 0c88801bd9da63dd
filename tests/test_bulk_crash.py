"""A bulk operation SIGKILLed halfway finishes the rest once, never twice (issue 43 item 3).

A worker process runs a bulk retry of 15 failed tasks, 4 a page, and is killed
right after the 7th retry was committed (in the middle of the second page, whose
step is not recorded). Before a second worker finishes the operation, the
tasks already retried fail again, so a re-run that trusted their status alone
would retry them a second time. Every task must be retried exactly once.
The same kill in a bulk migrate: every task migrated by exactly one recorded
migration.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import drop_schema, require_postgres
from duragent import Runtime, TaskStatus
from duragent.runtime._bulk import TaskFilter
from support.bulk import (
    failed_tasks,
    failing_agent,
    migrations_of,
    retries_of,
    waiting_agent,
    waiting_tasks,
)
from support.crashlib import finish, kill_at, spawn


@pytest.fixture(params=["jsonl", "sqlite", "sqlite-full", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A store kept outside the process, which a killed process leaves behind."""
    if request.param == "jsonl":
        yield f"jsonl:///{tmp_path}/jsonl-store"
    elif request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/bulk.db"
    elif request.param == "sqlite-full":
        yield f"sqlite:///{tmp_path}/bulk.db?durability=full"
    else:
        schema = f"test_bulk_{uuid.uuid4().hex[:12]}"
        yield f"{require_postgres()}?schema={schema}"
        drop_schema(schema)


@pytest.mark.slow
async def test_sigkill_halfway_through_a_bulk_retry_retries_each_task_once(url: str) -> None:
    # The failing agent's worker serves its queue only, so the bulk operation waits
    # for the child's worker.
    async with Runtime(url, agents=[failing_agent()], worker_queues=["flaky"]) as rt:
        ids = await failed_tasks(rt, 15, "alice")
        op = await rt.bulk("retry", TaskFilter(owner="alice"), owner="alice", page_size=4)

    kill_at(spawn("bulk_child.py", url, "7"), "AT 7")

    async with Runtime(url, agents=[failing_agent()], worker_queues=["flaky"]) as rt:
        retried = [t for t in ids if await retries_of(rt.store, t) == 1]
        assert len(retried) == 7  # the kill came after the 7th retry's commit
        assert all([await retries_of(rt.store, t) <= 1 for t in ids])
        await rt.resume()
        for task_id in retried:  # they run and fail again: failed, as before the retry
            await rt.wait(task_id, timeout=30, until=lambda t: t.status is TaskStatus.FAILED)
        assert (await rt.bulk_operation(op.id)).status == "running"

    out = finish(spawn("bulk_child.py", url, "0"))
    assert "ACTED 11" in out, out  # the second page again (4), then the last two (4 + 3)

    async with Runtime(url, run_worker=False) as rt:
        assert [await retries_of(rt.store, t) for t in ids] == [1] * 15
        done = await rt.bulk_operation(op.id, owner="alice")
        assert (done.status, done.total, done.done, done.skipped, done.failed) == (
            "done",
            15,
            15,
            0,
            0,
        )


@pytest.mark.slow
async def test_a_bulk_retry_finished_after_a_kill_counts_the_tasks_retried_before_it(
    tmp_path: Path,
) -> None:
    """The tasks retried before the kill stay retried (pending: no worker runs them)
    and so no longer match the filter: the page the kill cut short still counts them
    done, as it acted on them, and the operation reports every task done."""
    url = f"sqlite:///{tmp_path}/bulk.db"
    async with Runtime(url, agents=[failing_agent()], worker_queues=["flaky"]) as rt:
        ids = await failed_tasks(rt, 15, "alice")
        op = await rt.bulk("retry", TaskFilter(owner="alice"), owner="alice", page_size=4)

    kill_at(spawn("bulk_child.py", url, "7"), "AT 7")
    out = finish(spawn("bulk_child.py", url, "0"))
    assert "ACTED 11" in out, out  # the second page again (4), then the last two (4 + 3)

    async with Runtime(url, run_worker=False) as rt:
        assert [await retries_of(rt.store, t) for t in ids] == [1] * 15
        assert {(await rt.get(t)).status for t in ids} == {TaskStatus.PENDING}
        done = await rt.bulk_operation(op.id, owner="alice")
        assert (done.status, done.total, done.done, done.skipped, done.failed) == (
            "done",
            15,
            15,
            0,
            0,
        )


@pytest.mark.slow
async def test_sigkill_halfway_through_a_bulk_migrate_migrates_each_task_once(url: str) -> None:
    """The same kill in a bulk migrate of 15 waiting tasks from v1 to v2: each task
    ends on v2 with exactly one migration in its log, the operation's own."""
    async with Runtime(url, agents=[waiting_agent(version="v1")], worker_queues=["slow"]) as rt:
        ids = await waiting_tasks(rt, "slow", 15, "alice")
        flt = TaskFilter(owner="alice", agent="slow")
        op = await rt.bulk("migrate", flt, owner="alice", page_size=4, options={"to": "v2"})

    kill_at(spawn("bulk_child.py", url, "7"), "AT 7")

    async with Runtime(url, run_worker=False) as rt:
        moved = [t for t in ids if (await rt.get(t)).agent_version == "v2"]
        assert len(moved) == 7  # the kill came after the 7th migration's commit
        assert [len(await migrations_of(rt.store, t)) for t in ids].count(1) == 7
        assert (await rt.bulk_operation(op.id)).status == "running"

    out = finish(spawn("bulk_child.py", url, "0"))
    assert "ACTED 11" in out, out  # the second page again (4), then the last two (4 + 3)

    async with Runtime(url, run_worker=False) as rt:
        by = f"bulk operation {op.id}"
        for task_id in ids:
            assert await migrations_of(rt.store, task_id) == [{"from": "v1", "to": "v2", "by": by}]
            task = await rt.get(task_id)
            assert (task.agent_version, task.status) == ("v2", TaskStatus.WAITING)
        done = await rt.bulk_operation(op.id, owner="alice")
        assert (done.status, done.total, done.done, done.skipped, done.failed) == (
            "done",
            15,
            15,
            0,
            0,
        )
