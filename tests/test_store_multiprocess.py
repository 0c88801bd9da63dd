"""Four real processes claim from one shared store (a SQLite file, a PostgreSQL
schema): every task goes to exactly one of them."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from duragent.store import open_store
from duragent.types import Task

CLAIMER = r"""
import asyncio, json, os, sys
from duragent.store import open_store, Commit, TaskPatch

async def main(url, worker, out, barrier, n):
    store = open_store(url)
    await store.open()
    got = []
    while True:
        task = await store.claim_task(worker, ttl=3600)
        if task is None:
            break
        if not got:
            # A barrier, not a head start: nobody goes on until every claimer
            # holds a task, so all of them are claiming from the same queue at
            # once, however slowly each one started.
            open(os.path.join(barrier, worker), "w").close()
            waited = 0
            while len(os.listdir(barrier)) < int(n):
                await asyncio.sleep(0.005)
                waited += 1
                if waited > 20_000:
                    sys.exit(f"{worker}: the other claimers never arrived")
        await store.commit(Commit(fence={task.id: task.lease.epoch},
                                  patches=[TaskPatch(task.id, {"status": "completed"})]))
        got.append(task.id)
    await store.close()
    with open(out, "w") as f:
        json.dump(got, f)

asyncio.run(main(*sys.argv[1:]))
"""


@pytest.mark.slow
async def test_four_processes_claim_each_task_exactly_once(shared_url: str, tmp_path: Path) -> None:
    url = shared_url
    store = open_store(url)
    await store.open()
    ids = set()
    for i in range(500):
        t, _ = await store.create_task(Task(agent="a", input=i))
        ids.add(t.id)
    await store.close()
    outs = [tmp_path / f"w{i}.json" for i in range(4)]
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIMER, url, f"w{i}", str(out), str(barrier), str(len(outs))]
        )
        for i, out in enumerate(outs)
    ]
    try:
        codes = await asyncio.gather(*(asyncio.to_thread(p.wait, 120) for p in procs))
    finally:
        for p in procs:  # none is left running, whatever happened
            if p.poll() is None:
                p.kill()
                p.wait()
    assert codes == [0, 0, 0, 0]
    claimed = [tid for out in outs for tid in json.loads(out.read_text())]
    assert len(claimed) == 500 and set(claimed) == ids
    # Every claimer got work (the barrier guarantees it), so the claims contended.
    assert all(json.loads(out.read_text()) for out in outs)
    store = open_store(url)
    await store.open()
    for tid in list(ids)[:20]:
        t = await store.get_task(tid)
        assert t.lease.epoch == 1 and t.status.value == "completed"
    await store.close()


COMMITTER = r"""
import asyncio, sys
from duragent.store import open_store, Commit, TaskPatch

async def main(url, task_id, other_id):
    store = open_store(url)
    await store.open()
    control = {"action": "pause", "rollback": False, "reason": None}
    # Two commits at once: one batch of two (at durability=full, on the writer thread).
    await asyncio.gather(
        store.commit(Commit(patches=[TaskPatch(other_id, {"status_reason": "noise"})])),
        store.commit(Commit(patches=[TaskPatch(task_id, {"control": control})])),
    )
    await store.close()

asyncio.run(main(*sys.argv[1:]))
"""


@pytest.mark.slow
async def test_a_commit_in_another_process_wakes_waiters_and_control_watchers(
    shared_url: str,
) -> None:
    store = open_store(shared_url)
    await store.open()
    try:
        task, _ = await store.create_task(Task(agent="a", input="x"))
        other, _ = await store.create_task(Task(agent="a", input="y"))
        told: list[str] = []
        heard = asyncio.Event()

        def noted(task_id: str | None) -> None:
            if task_id is not None:
                told.append(task_id)
                heard.set()

        stop = store.watch_controls(noted)
        for _ in range(100):  # the first waits start listening (and may return early)
            if getattr(store, "listening", False):
                break
            await store.wait_for_change(0.2)
        assert getattr(store, "listening", False)
        change = asyncio.create_task(store.wait_for_change(120))
        done, _ = await asyncio.wait({change}, timeout=0.5)
        assert not done, "wait_for_change returned though nothing was committed"
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", COMMITTER, shared_url, task.id, other.id
        )
        assert await proc.wait() == 0
        # Woken by the other process's commit, long before the 120 s timeout.
        await asyncio.wait_for(change, 60)
        await asyncio.wait_for(heard.wait(), 60)
        assert told == [task.id]
        stop()
    finally:
        await store.close()
