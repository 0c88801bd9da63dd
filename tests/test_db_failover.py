"""Failover of the database server under running workers (issue 40 item 4).

Each test makes its own pair of PostgreSQL clusters on free ports (bench/pg_pair.py):
a primary and a streaming standby, the store's URL naming both hosts with
`target_session_attrs=read-write`, so libpq finds whichever is writable. The
primary is stopped as a crash would stop it (`-m immediate`) while worker
processes run tasks with never-replay tools, and the standby is promoted. The
5432 cluster the other tests share is never touched.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from bench import pg_pair

from conftest import IN_CI
from duragent import Runtime, TaskStatus
from duragent.types import EntryKind
from support.pgproxy import Forwarder, forwarder
from support.workerlib import HERE, WorkerProc, ledger_lines, one_result_per_call
from worker_agents import AGENTS

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def _pair(sync: bool, upstream: int | None = None) -> Iterator[pg_pair.Pair]:
    reason = pg_pair.missing()
    if reason is not None:
        if IN_CI:
            pytest.fail(f"CI must run the failover tests: {reason}")
        pytest.skip(reason)
    with pg_pair.pair(sync=sync, upstream=upstream) as made:
        yield made


@pytest.fixture
def sync_pair() -> Iterator[pg_pair.Pair]:
    """A primary and its synchronous standby, dropped at the end whatever happened."""
    yield from _pair(sync=True)


class ChildWorker(WorkerProc):
    """tests/failover_worker.py: a worker that writes down every commit acknowledged to it."""

    def __init__(self, url: str, acks: Path, *, poll: float = 0.5, **env: str) -> None:
        self.acks = acks
        self.proc = subprocess.Popen(
            [
                *(sys.executable, str(HERE / "failover_worker.py"), url, str(acks)),
                *("--poll", str(poll), "--ttl", "3", "--concurrency", "8"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={
                **os.environ,
                "PYTHONPATH": f"{HERE}:{os.environ.get('PYTHONPATH', '')}",
                "PYTHONUNBUFFERED": "1",
                **env,
            },
        )
        self.out: list[str] = []
        self.err: list[str] = []
        self._threads = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, self.out), daemon=True),
            threading.Thread(target=self._pump, args=(self.proc.stderr, self.err), daemon=True),
        ]
        for t in self._threads:
            t.start()


@pytest.fixture
def children() -> Iterator[list[ChildWorker]]:
    procs: list[ChildWorker] = []
    yield procs
    for p in procs:
        p.stop()
        print(f"--- worker {p.pid} stderr:", *p.err[-40:], sep="\n")


def acks_of(workers: list[ChildWorker]) -> list[tuple[float, str, int, str]]:
    """Every entry a worker was told is committed: (when, task, seq, kind)."""
    out = []
    for w in workers:
        for line in ledger_lines(w.acks):
            when, task_id, seq, kind = line.split()
            out.append((float(when), task_id, int(seq), kind))
    return out


async def until(condition: object, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        await asyncio.sleep(0.02)


TASKS = 24


async def test_sync_failover_under_running_workers_completes_every_task_and_loses_nothing(
    sync_pair: pg_pair.Pair, children: list[ChildWorker], tmp_path: Path
) -> None:
    """Synchronous replication: every commit a worker was told of is on the standby
    before the answer, so the promoted standby has all of them; the workers'
    connections (pool, lease thread, LISTEN) find the new primary on their own."""
    url = sync_pair.url(schema="fo")
    ledger, release = tmp_path / "ledger.txt", tmp_path / "release"
    async with Runtime(url, agents=AGENTS, run_worker=False) as rt:
        ids = [(await rt.submit("sleeper", f"task {i}")).task_id for i in range(TASKS)]
        # Each worker holds its first `nap` until after the failover (a tool surely
        # mid-run across it); the others run, commit and start more meanwhile.
        for n in range(2):
            children.append(
                ChildWorker(
                    url,
                    tmp_path / f"acks-{n}.txt",
                    poll=600,
                    LEDGER=str(ledger),
                    HOLD="nap",
                    HOLD_ONCE="1",
                    HOLD_UNTIL=str(release),
                )
            )
        for w in children:
            await w.wait_output("AT nap")
        await until(
            lambda: sum(line.startswith("start nap ") for line in ledger_lines(ledger)) >= 6,
            "tools running",
        )
        promote = sync_pair.fail_over()
        release.touch()
        tasks = [await rt.wait(task_id, timeout=120) for task_id in ids]
        for task in tasks:
            assert task.status is TaskStatus.COMPLETED, (task.id, task.status, task.error)
            await one_result_per_call(rt, task.id)
        # 0 acknowledged commits lost: each entry a worker was told of is stored, as told.
        acks = acks_of(children)
        stored: dict[tuple[str, int], str] = {}
        for task_id in ids:
            for e in await rt.store.entries(task_id):
                stored[(task_id, e.seq)] = e.kind.value
            done = await rt.store.entries(task_id, kinds=[EntryKind.STATUS])
            assert sum(e.payload["to"] == "completed" for e in done) == 1
        lost = [(t, s, k) for _, t, s, k in acks if stored.get((t, s)) != k]
        assert acks and not lost, f"acknowledged but not on the new primary: {lost[:10]}"
        # 0 duplicate runs of a never-replay tool.
        starts = Counter(
            line.split()[2] for line in ledger_lines(ledger) if line.startswith("start nap ")
        )
        assert len(starts) == TASKS and max(starts.values()) == 1, starts
        # Their LISTEN connections found the new primary: with a poll interval of
        # 600 s, only a notification wakes an idle worker for a new task.
        late = await rt.submit("chat", "after the failover")
        assert (await rt.wait(late.task_id, timeout=60)).status is TaskStatus.COMPLETED
        assert sync_pair.promoted_at is not None
        first = min(when for when, *_ in acks if when > sync_pair.promoted_at)
        print(
            f"promotion took {promote * 1000:.0f} ms; first acknowledged commit "
            f"{(first - sync_pair.promoted_at) * 1000:.0f} ms after it began"
        )


@pytest.fixture
def async_pair() -> Iterator[tuple[pg_pair.Pair, Forwarder]]:
    """A primary and its asynchronous standby, which streams through a forwarder
    the test can cut: commits made after the cut reach the primary only."""
    reason = pg_pair.missing()
    if reason is not None:
        if IN_CI:
            pytest.fail(f"CI must run the failover tests: {reason}")
        pytest.skip(reason)
    made = pg_pair.Pair(sync=False)
    try:
        with forwarder("127.0.0.1", made.primary.port) as link:
            made.upstream = link.port
            yield made.create(), link
    finally:
        made.drop()


def replayed_all(made: pg_pair.Pair) -> bool:
    """Whether the standby has replayed everything the primary has written so far."""
    with made.primary.connect() as primary, made.standby.connect() as standby:
        written = primary.execute("SELECT pg_current_wal_lsn()").fetchone()
        assert written is not None
        row = standby.execute("SELECT pg_last_wal_replay_lsn() >= %s", (written[0],)).fetchone()
        return bool(row and row[0])


def stale_lease_over(made: pg_pair.Pair, task_id: str) -> bool:
    """Whether the task's lease, as the standby has it, has ended by the standby's clock."""
    with made.standby.connect("test") as standby:
        row = standby.execute(
            "SELECT lease_expires < now() FROM fo.tasks WHERE id = %s", (task_id,)
        ).fetchone()
        return bool(row and row[0])


@pytest.mark.parametrize("lost", ["second-nap", "second-nap-lease-over", "claim"])
async def test_async_failover_that_loses_acknowledged_commits_blocks_the_task_never_reruns(
    async_pair: tuple[pg_pair.Pair, Forwarder],
    children: list[ChildWorker],
    tmp_path: Path,
    lost: str,
) -> None:
    """Asynchronous replication: commits the primary acknowledged after the
    standby stopped receiving are gone once it is promoted. Run on from the
    shorter log, a never-replay tool whose intent was lost would run again (the
    model, asked again, gives the same call). The worker that was told of the
    lost commits finds the store's log behind them and blocks the
    task(lost_commits) instead: no nap runs twice.

    `second-nap`: lost are the first nap's result and the second nap's intent,
    made while the second nap runs (found by the runner's next commit, or its
    hand-back). `second-nap-lease-over`: the same, once the promoted standby's
    copy of the lease has ended (the task is claimable there at once).
    `claim`: lost are the worker's claim and the first nap's intent, made while
    that nap runs; the promoted standby has the task pending, so the renewal
    finds the lease gone and the worker claims the task again (the epoch it had
    is the one the new claim gets): found by the worker, which remembers what
    its runner of the task was told (`TaskRunner(acked=)`).
    """
    made, link = async_pair
    url = made.url(schema="fo")
    ledger, release = tmp_path / "ledger.txt", tmp_path / "release"

    def naps() -> Counter[str]:
        return Counter(
            line.split()[2] for line in ledger_lines(ledger) if line.startswith("start nap ")
        )

    async with Runtime(url, agents=AGENTS, run_worker=False) as rt:
        sub = await rt.submit("twonaps", "nap twice")
        if lost == "claim":
            await until(lambda: replayed_all(made), "the standby has the task")
            link.cut()  # from here on, the standby receives nothing
        worker = ChildWorker(
            url,
            tmp_path / "acks.txt",
            LEDGER=str(ledger),
            HOLD="nap",
            HOLD_ONCE="1",
            HOLD_UNTIL=str(release),
            NAP2_SECONDS="2" if lost == "second-nap" else "8",
        )
        children.append(worker)
        await worker.wait_output("AT nap")  # its intent is committed: the first nap runs
        if lost != "claim":
            await until(lambda: replayed_all(made), "the standby has the first nap's intent")
            link.cut()
            release.touch()
            await until(lambda: len(naps()) == 2, "the second nap runs")
        if lost == "second-nap-lease-over":
            await until(lambda: stale_lease_over(made, sub.task_id), "the standby's lease is over")
        made.fail_over()
        task = await rt.wait(
            sub.task_id,
            timeout=120,
            until=lambda t: t.status.terminal or t.status is TaskStatus.BLOCKED,
        )
        release.touch()
        assert task.status is TaskStatus.BLOCKED, (task.status, task.error, worker.err[-20:])
        assert task.status_reason == "lost_commits"
        assert task.error is not None and "lost commits" in task.error
        # The failover did lose entries the worker had been told are stored.
        stored = {e.seq: e.kind.value for e in await rt.store.entries(sub.task_id)}
        acked = [(s, k) for _, t, s, k in acks_of(children) if t == sub.task_id]
        assert [(s, k) for s, k in acked if stored.get(s) != k], (acked, stored)
    assert naps() and max(naps().values()) == 1, naps()
    assert len(naps()) == (1 if lost == "claim" else 2)
