"""GET /v1/tasks/{id}/wait: long polls that return when the task is finished or needs
a person, or at their timeout; many waiters on one task share one read per change."""

from __future__ import annotations

import asyncio

import httpx

from duragent import Runtime
from duragent.server._wait import TaskWatch
from duragent.types import TaskStatus
from support.api import assert_problem, auth, client, runtime, start, wait_for

__all__ = ["client", "runtime"]  # fixtures


def watch_of(client: httpx.AsyncClient) -> TaskWatch:
    watch: TaskWatch = client._transport.app.state.task_watch  # type: ignore[attr-defined]
    return watch


async def waiters_on(watch: TaskWatch, task_id: str, n: int) -> None:
    """Until `n` requests wait on the task (they register before anything can wake them)."""
    async with asyncio.timeout(30):
        while (w := watch._watched.get(task_id)) is None or w.waiters < n:
            await asyncio.sleep(0.01)


async def test_a_finished_task_answers_at_once(client: httpx.AsyncClient, runtime: Runtime) -> None:
    tid = await start(client, "quick")
    await wait_for(runtime, tid, TaskStatus.COMPLETED)
    r = await client.get(f"/v1/tasks/{tid}/wait", params={"timeout": 300}, headers=auth("alice"))
    assert r.status_code == 200
    body = r.json()
    assert body["timed_out"] is False and body["status"] == "completed" and body["id"] == tid
    assert watch_of(client).reads == 0  # answered from the request's own read


async def test_several_waiters_share_one_read_per_change(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    h = auth("alice")
    tid = await start(client, "approver")
    finished = [
        asyncio.create_task(client.get(f"/v1/tasks/{tid}/wait?until=finished", headers=h))
        for _ in range(5)
    ]
    asking = [
        asyncio.create_task(client.get(f"/v1/tasks/{tid}/wait?until=input", headers=h))
        for _ in range(3)
    ]
    await wait_for(runtime, tid, TaskStatus.WAITING)
    for r in await asyncio.gather(*asking):
        body = r.json()
        assert r.status_code == 200 and body["timed_out"] is False
        assert body["status"] == "waiting" and body["waiting_for"][0]["wait"] == "approval"
    watch = watch_of(client)
    await waiters_on(watch, tid, 5)
    assert not any(w.done() for w in finished), "an approval is not the end"
    reads, rounds = watch.reads, watch.rounds
    r = await client.post(f"/v1/tasks/{tid}/respond", json={"approve": True}, headers=h)
    assert r.status_code == 200
    answers = await asyncio.gather(*finished)
    assert {(a.status_code, a.json()["status"], a.json()["timed_out"]) for a in answers} == {
        (200, "completed", False)
    }
    # Five waiters, one task: each change heard was read once for all of them.
    assert watch.rounds > rounds
    assert watch.reads - reads == watch.rounds - rounds
    assert tid not in watch._watched  # nobody waits any more


async def test_the_timeout_answers_200_with_the_task_as_it_is(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    tid = await start(client, "approver")
    await wait_for(runtime, tid, TaskStatus.WAITING)
    r = await client.get(
        f"/v1/tasks/{tid}/wait", params={"until": "finished", "timeout": 0.2}, headers=auth("alice")
    )
    assert r.status_code == 200
    body = r.json()
    assert body["timed_out"] is True and body["status"] == "waiting"
    # until=input is met already: no wait at all.
    r = await client.get(f"/v1/tasks/{tid}/wait?until=input", headers=auth("alice"))
    assert r.json()["timed_out"] is False


async def test_another_users_task_is_404_and_bad_parameters_422(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    tid = await start(client, "approver")
    r = await client.get(f"/v1/tasks/{tid}/wait?timeout=300", headers=auth("bob"))
    body = assert_problem(r, 404, "Task not found")
    assert body["type"] == "/problems/task-not-found"
    assert_problem(await client.get(f"/v1/tasks/{tid}/wait"), 401, "Unauthorized")
    for bad in ("until=done", "timeout=0", "timeout=301", "timeout=abc"):
        r = await client.get(f"/v1/tasks/{tid}/wait?{bad}", headers=auth("alice"))
        assert_problem(r, 422, "Validation error")
