"""`Runtime.wait` on a task another process holds: a holder proven gone (this host,
its pid gone) is taken over at once; any other holder's lease is waited for, and
the wait says so once, with when the lease ends."""

from __future__ import annotations

import logging
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from duragent import Agent, BuiltinTools, Runtime, ScriptedModel
from duragent.runtime._presence import WORKERS_SCOPE, process_identity
from duragent.store import open_store
from duragent.store._commits import Commit, DocumentWrite
from duragent.types import Task, TaskStatus, utcnow

HOLDER = "elsewhere:4242:0badc0de"


def agent() -> Agent:
    return Agent(
        name="greeter", model=ScriptedModel(["Hello."]), builtin_tools=BuiltinTools(plan=False)
    )


def a_dead_pid() -> int:
    """The pid of a process of ours that has exited and been reaped."""
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(done.stdout)


async def held_task(url: str, identity: dict[str, Any]) -> str:
    """A running task under a 10-minute lease of HOLDER, whose presence record says
    `identity` (where its process runs)."""
    store = open_store(url)
    await store.open()
    try:
        task, _ = await store.create_task(Task(agent="greeter", input="hi"))
        assert await store.claim_task(HOLDER, task_id=task.id, ttl=600) is not None
        now = utcnow()
        record = {
            "agents": ["greeter"],
            "expires_at": (now + timedelta(seconds=15)).isoformat(),
            "seen_at": now.isoformat(),
            "every": 5.0,
            **identity,
        }
        await store.commit(Commit(documents=[DocumentWrite(WORKERS_SCOPE, HOLDER, record)]))
        return task.id
    finally:
        await store.close()


def said(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


async def test_a_holder_whose_process_exited_on_this_host_is_taken_over_at_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    identity = process_identity()
    if not identity:
        pytest.skip("no /proc: no process is ever proven gone here")
    url = f"sqlite:///{tmp_path}/lease.db"
    task_id = await held_task(url, {**identity, "pid": a_dead_pid()})
    caplog.set_level(logging.WARNING, "duragent.runtime")
    async with Runtime(url, agents=[agent()]) as rt:
        task = await rt.wait(task_id, timeout=30)  # the lease would hold 600 s more
    assert task.status is TaskStatus.COMPLETED and task.output == "Hello."
    assert task.restarts == 1  # a takeover like any other: crash loops still count
    taken = said(caplog, "has exited; this runtime takes the task over now")
    assert len(taken) == 1 and HOLDER in taken[0]
    assert said(caplog, "waiting for task") == []


@pytest.mark.slow
@pytest.mark.parametrize(
    "where",
    ["another boot", "another pid namespace", "a live process", "an unknown place"],
)
async def test_a_holder_not_proven_gone_is_waited_for_and_the_wait_is_said_once(
    where: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    identity = process_identity()
    if not identity:
        pytest.skip("no /proc here")
    elsewhere = {
        "another boot": {**identity, "boot": "0" * 32, "pid": a_dead_pid()},
        "another pid namespace": {**identity, "pidns": "pid:[1]", "pid": a_dead_pid()},
        "a live process": identity,  # this very process: alive
        "an unknown place": {},  # a record from an older version
    }[where]
    url = f"sqlite:///{tmp_path}/lease.db"
    task_id = await held_task(url, elsewhere)
    caplog.set_level(logging.WARNING, "duragent.runtime")
    async with Runtime(url, agents=[agent()]) as rt:
        with pytest.raises(TimeoutError):
            await rt.wait(task_id, timeout=2)  # several polls: said once, not at each
        assert (await rt.get(task_id)).lease.owner == HOLDER
    waits = said(caplog, "waiting for task")
    assert len(waits) == 1, waits
    assert HOLDER in waits[0] and "holds its lease, which ends at" in waits[0]
    assert "if that process is gone, this runtime takes it over then" in waits[0]
    assert said(caplog, "has exited") == []
