"""Callers outlive a PostgreSQL server they cannot reach (issue 37 item 14).

A forwarder the test cuts and restores stands between the caller and the
server: a wait keeps waiting through the cut and returns the task's result
once the server answers again; a `duragent worker` started while the server
is out of reach waits for it, says so once, and then runs tasks.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from conftest import require_postgres
from duragent import Agent, Runtime, ScriptedModel, TaskStatus
from duragent.store._postgres import PostgresStore
from support.pgproxy import Forwarder, proxy, schema
from support.workerlib import WorkerProc
from worker_agents import AGENTS

__all__ = ["proxy", "schema"]  # the fixtures this module uses from support.pgproxy

pytestmark = [pytest.mark.postgres, pytest.mark.usefixtures("pg_wire")]  # both wires

WAITING = "the store cannot be reached"


async def until(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, f"still not {what} after {timeout}s"
        await asyncio.sleep(0.02)


@pytest.mark.slow
async def test_a_wait_keeps_waiting_through_a_cut_and_returns_the_tasks_result(
    schema: str, proxy: Forwarder, caplog: pytest.LogCaptureFixture
) -> None:
    url = require_postgres()
    caplog.set_level(logging.WARNING, logger="duragent.runtime")
    caplog.set_level(logging.DEBUG, logger="psycopg.pool")  # to see its attempts at all
    agent = Agent(name="a", model=ScriptedModel(["all done"]))
    # connect_timeout: how long one attempt waits for a connection from the pool.
    through = PostgresStore(proxy.url(url), schema=schema, connect_timeout=1)
    await through.open()
    try:
        async with Runtime(through, agents=[agent], run_worker=False) as client:
            submitted = await client.submit("a", "hi")
            waiting = asyncio.ensure_future(submitted.wait(timeout=120))
            await until(lambda: through.listening, "listening")
            proxy.cut()

            def said() -> int:
                return sum(WAITING in r.getMessage() for r in caplog.records)

            await until(
                lambda: (said() == 1 and proxy.refused >= 3) or waiting.done(),
                "waiting for the store",
            )
            assert not waiting.done(), waiting.exception()
            # Meanwhile a worker that reaches the server runs the task to its end.
            direct = PostgresStore(url, schema=schema)
            await direct.open()
            try:
                async with Runtime(direct, agents=[agent]) as worker:
                    ended = await worker.wait(submitted.task_id, timeout=60)
            finally:
                await direct.close()
            assert ended.status is TaskStatus.COMPLETED
            assert not waiting.done()  # the caller is still waiting, not failed
            proxy.restore()
            task = await asyncio.wait_for(waiting, 60)
    finally:
        await through.close()
    assert task.status is TaskStatus.COMPLETED and task.output == "all done"
    assert said() == 1  # once, however many attempts, on one line
    assert all("\n" not in r.getMessage() for r in caplog.records if WAITING in r.getMessage())
    attempts = [r for r in caplog.records if r.name == "psycopg.pool" and "connecting" in r.msg]
    assert attempts and all(r.levelno == logging.DEBUG for r in attempts)  # not on stderr
    assert any("answers again" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
async def test_a_worker_started_while_postgres_is_out_of_reach_waits_for_it_then_runs_tasks(
    schema: str, proxy: Forwarder
) -> None:
    url = require_postgres()
    proxy.cut()
    worker = WorkerProc(f"{proxy.url(url)}?schema={schema}")
    try:
        await worker.wait_output(WAITING, stream="err")
        await until(lambda: proxy.refused >= 3, "tried again")
        assert worker.proc.poll() is None, worker.err
        store = PostgresStore(url, schema=schema)
        await store.open()
        try:
            async with Runtime(store, agents=AGENTS, run_worker=False) as rt:
                submitted = await rt.submit("chat", "hello")
                proxy.restore()
                task = await rt.wait(submitted.task_id, timeout=60)
                said = [n for n, line in enumerate(worker.err) if WAITING in line]
                assert len(said) == 1, worker.err
                # one line: what follows it is not the rest of its message
                assert not any(line.startswith(("\t", " ")) for line in worker.err), worker.err
                # Cut while it runs: its claims fail, its pool tries again and again,
                # and it says so once, not at every attempt.
                proxy.cut()
                refused = proxy.refused
                await worker.wait_output("claim failed", stream="err")
                await until(lambda: proxy.refused >= refused + 5, "tried again")
                later = await rt.submit("chat", "again")
                proxy.restore()
                again = await rt.wait(later.task_id, timeout=60)
        finally:
            await store.close()
        assert task.status is TaskStatus.COMPLETED, task
        assert task.output == "I have heard 1 messages: hello"
        assert again.status is TaskStatus.COMPLETED, again
        assert sum("claim failed" in line for line in worker.err) == 1, worker.err
        assert not any("error connecting" in line for line in worker.err), worker.err
    finally:
        worker.stop()


@pytest.mark.slow
def test_a_worker_the_server_refuses_says_why_at_once(schema: str) -> None:
    """Not reached is waited for; turned away (an unknown role) is a mistake to fix."""
    url = urlsplit(require_postgres())
    refused = url._replace(netloc=f"no_such_role_{schema}@{url.hostname}:{url.port or 5432}")
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "duragent", "worker"),
            *("--store", refused.geturl(), "--agents", "worker_agents:AGENTS"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).parent,
    )
    assert proc.returncode == 1, proc.stderr
    assert WAITING not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "refused" in lines[0] and "no_such_role" in lines[0], lines
