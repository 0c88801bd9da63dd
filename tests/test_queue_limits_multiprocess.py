"""Four real processes claim from one queue limited to 3 (a SQLite file, a
PostgreSQL schema): the store itself never shows more than 3 running."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from duragent.store import open_store
from duragent.store._queues import Queue, define_queue
from duragent.types import Task

CLAIMER = r"""
import asyncio, json, os, sys
from duragent.store import open_store, Commit, TaskPatch, TaskQuery

async def running(store):
    return sum((await store.count_tasks(TaskQuery(queue="q", status="running"))).values())


async def pending(store):
    return sum((await store.count_tasks(TaskQuery(queue="q", status="pending"))).values())


async def main(url, worker, out, ready, gate):
    store = open_store(url)
    await store.open()
    await pending(store)  # connected: only the claims are left to do
    open(ready, "w").close()
    while not os.path.exists(gate):  # start together, so claims really contend
        await asyncio.sleep(0.001)
    seen, done = [], 0
    while True:
        got = await store.claim_tasks(worker, 2, ttl=3600)
        if not got:
            if not await pending(store):
                break
            await asyncio.sleep(0.002)  # the queue is full: look again soon
            continue
        # What the store says is running in the queue, with ours still held.
        now = await running(store)
        waited = 0
        while not seen and now < 3 and await pending(store):
            # A barrier, not a hope: a claimer's first tasks are held until the
            # queue is full (another process took the rest of the limit) or
            # nothing is left to take, so the limit is surely reached, and by
            # more than one process.
            await asyncio.sleep(0.005)
            now = await running(store)
            waited += 1
            if waited > 20_000:
                sys.exit(f"{worker}: the queue never filled up")
        seen.append(now)
        await asyncio.sleep(0.005)  # hold the slots a moment, as real work would
        for task in got:
            await store.commit(Commit(fence={task.id: task.lease.epoch},
                                      patches=[TaskPatch(task.id, {"status": "completed"})]))
            done += 1
    await store.close()
    with open(out, "w") as f:
        json.dump({"seen": seen, "done": done}, f)

asyncio.run(main(*sys.argv[1:]))
"""


@pytest.mark.slow
async def test_a_limit_of_three_holds_under_four_processes(
    shared_url: str,
    tmp_path: Path,
) -> None:
    url = shared_url
    store = open_store(url)
    await store.open()
    await define_queue(store, Queue("q", concurrency=3))
    for i in range(120):
        await store.create_task(Task(agent="a", queue="q", input=i))
    await store.close()
    outs = [tmp_path / f"w{i}.json" for i in range(4)]
    ready = [tmp_path / f"w{i}.ready" for i in range(4)]
    gate = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIMER, url, f"w{i}", str(out), str(ready[i]), str(gate)]
        )
        for i, out in enumerate(outs)
    ]
    try:
        deadline = asyncio.get_running_loop().time() + 120
        while not all(r.exists() for r in ready):  # every claimer is up and connected
            assert asyncio.get_running_loop().time() < deadline, "the claimers did not start"
            assert all(p.poll() is None for p in procs), "a claimer died while starting"
            await asyncio.sleep(0.02)
        gate.touch()
        codes = await asyncio.gather(*(asyncio.to_thread(p.wait, 180) for p in procs))
    finally:
        for p in procs:  # none is left running, whatever happened
            if p.poll() is None:
                p.kill()
                p.wait()
    assert codes == [0, 0, 0, 0]
    results = [json.loads(out.read_text()) for out in outs]
    assert sum(r["done"] for r in results) == 120
    seen = [n for r in results for n in r["seen"]]
    assert max(seen) <= 3, f"the store showed {max(seen)} running at once"
    assert max(seen) == 3, "the limit was never reached; the test proves nothing"
    assert sum(1 for r in results if r["done"]) >= 2, "the processes did not contend"
