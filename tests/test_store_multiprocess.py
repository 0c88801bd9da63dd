"""Four real processes claim from one shared store (a SQLite file, a PostgreSQL
schema): every task goes to exactly one of them."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import drop_schema, require_postgres
from duragent.store import open_store
from duragent.types import Task

CLAIMER = r"""
import asyncio, json, os, sys
from duragent.store import open_store, Commit, TaskPatch

async def main(url, worker, out, gate):
    store = open_store(url)
    while not os.path.exists(gate):  # start together, so claims really contend
        await asyncio.sleep(0.001)
    got = []
    while True:
        task = await store.claim_task(worker, ttl=3600)
        if task is None:
            break
        await store.commit(Commit(fence={task.id: task.lease.epoch},
                                  patches=[TaskPatch(task.id, {"status": "completed"})]))
        got.append(task.id)
    await store.close()
    with open(out, "w") as f:
        json.dump(got, f)

asyncio.run(main(*sys.argv[1:]))
"""


@pytest.fixture(params=["sqlite", "postgres"])
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/shared.db"
        return
    schema = f"test_{uuid.uuid4().hex[:12]}"
    yield f"{require_postgres()}?schema={schema}"
    drop_schema(schema)


async def test_four_processes_claim_each_task_exactly_once(shared_url: str, tmp_path: Path) -> None:
    url = shared_url
    store = open_store(url)
    ids = set()
    for i in range(500):
        t, _ = await store.create_task(Task(agent="a", input=i))
        ids.add(t.id)
    await store.close()
    outs = [tmp_path / f"w{i}.json" for i in range(4)]
    gate = tmp_path / "go"
    procs = [
        subprocess.Popen([sys.executable, "-c", CLAIMER, url, f"w{i}", str(out), str(gate)])
        for i, out in enumerate(outs)
    ]
    await asyncio.sleep(1.0)  # not a correctness wait: only gives the claimers time to start
    gate.touch()
    codes = await asyncio.gather(*(asyncio.to_thread(p.wait, 120) for p in procs))
    assert codes == [0, 0, 0, 0]
    claimed = [tid for out in outs for tid in json.loads(out.read_text())]
    assert len(claimed) == 500 and set(claimed) == ids
    busy = sum(1 for out in outs if json.loads(out.read_text()))
    assert busy >= 2, "the processes did not contend; the test proves nothing"
    store = open_store(url)
    for tid in list(ids)[:20]:
        t = await store.get_task(tid)
        assert t.lease.epoch == 1 and t.status.value == "completed"
    await store.close()
