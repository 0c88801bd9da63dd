"""`duragent worker` processes sharing one PostgreSQL schema (issue 5's acceptance).

Real worker processes, a real server: wake-ups through LISTEN/NOTIFY, a worker
whose connections the server kills mid-tool, and four workers running 500
tasks while two of them are SIGKILLed.
"""

from __future__ import annotations

import asyncio
import functools
import random
import signal
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

sys.path.insert(0, str(Path(__file__).parent))

from conftest import PG_URL, drop_schema, require_postgres
from duragent import Runtime, TaskStatus
from duragent.types import Entry, EntryKind, Task
from support.workerlib import WorkerProc, ledger_lines, one_result_per_call
from worker_agents import AGENTS

pytestmark = pytest.mark.postgres


class PgWorker(WorkerProc):
    """A `duragent worker` on PostgreSQL with a chosen poll interval.

    Its connections show up in pg_stat_activity as `duragent-<pid>` (the
    store's default application_name).
    """

    def __init__(
        self,
        url: str,
        *,
        poll_interval: float,
        ttl: float = 5.0,
        concurrency: int = 50,
        **env: str,
    ) -> None:
        # PGAPPNAME would override the store's application_name, which `app` relies on.
        extra: dict[str, Any] = dict(env)  # environment variables, never WorkerProc's options
        super().__init__(
            url, ttl=ttl, concurrency=concurrency, poll=poll_interval, unset=("PGAPPNAME",), **extra
        )

    @property
    def app(self) -> str:
        return f"duragent-{self.pid}"


# --- fixtures and helpers ---------------------------------------------------


@pytest.fixture
def schema() -> Iterator[str]:
    require_postgres()
    name = f"test_{uuid.uuid4().hex[:12]}"
    yield name
    drop_schema(name)


@pytest.fixture
def url(schema: str) -> str:
    return f"{PG_URL}?schema={schema}"


@pytest.fixture
async def rt(url: str) -> AsyncIterator[Runtime]:
    """A Runtime without a worker, in this (test) process: it submits and reads."""
    async with Runtime(url, agents=AGENTS, run_worker=False) as runtime:
        yield runtime


@pytest.fixture
def workers(rt: Runtime) -> Iterator[list[PgWorker]]:
    procs: list[PgWorker] = []
    yield procs
    for p in procs:
        p.stop()


def admin() -> psycopg.Connection[Any]:
    return psycopg.connect(PG_URL, autocommit=True, row_factory=dict_row)


def backends(app: str) -> list[dict[str, Any]]:
    """The server processes serving connections named `app`."""
    with admin() as conn:
        return conn.execute(
            "SELECT pid, state, query, query_start FROM pg_stat_activity"
            " WHERE application_name = %s AND pid <> pg_backend_pid() ORDER BY pid",
            (app,),
        ).fetchall()


def listening(app: str) -> bool:
    return any(b["query"].startswith("LISTEN") for b in backends(app))


def terminate(app: str) -> set[int]:
    """pg_terminate_backend every connection named `app`; the pids terminated."""
    with admin() as conn:
        rows = conn.execute(
            "SELECT pid, pg_terminate_backend(pid) AS ok FROM pg_stat_activity"
            " WHERE application_name = %s AND pid <> pg_backend_pid()",
            (app,),
        ).fetchall()
    return {r["pid"] for r in rows if r["ok"]}


async def until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        await asyncio.sleep(0.02)


def started(task: Task) -> bool:
    return task.status is not TaskStatus.PENDING


# --- wake-ups ------------------------------------------------------------------


@pytest.mark.slow
async def test_idle_worker_is_woken_by_notify_not_by_polling(
    rt: Runtime, workers: list[PgWorker]
) -> None:
    """With a 600 s poll interval, only a NOTIFY can explain a start within 60 s."""
    worker = PgWorker(rt.store.url, poll_interval=600)
    workers.append(worker)
    await until(lambda: listening(worker.app), 30, "the worker LISTENs")
    # ...to the commits that can make work, and to control requests (pause/abort
    # of a task, rare), not to every commit in the cluster.
    assert [b["query"] for b in backends(worker.app) if b["query"].startswith("LISTEN")] == [
        'LISTEN "duragent_work"; LISTEN "duragent_control"'
    ]

    def quiet_for_a_second() -> bool:
        # Idle means no statement from the worker at all: the query_start of each
        # of its connections stays the same across one second.
        first = [(b["pid"], b["query_start"]) for b in backends(worker.app)]
        time.sleep(1.0)
        return first == [(b["pid"], b["query_start"]) for b in backends(worker.app)]

    for i in range(3):
        await until(quiet_for_a_second, 15, "the idle worker sends no queries (no polling)")
        sub = await rt.submit("sleeper", f"wake up {i}")
        # TimeoutError here means the worker slept through the NOTIFY.
        await rt.wait(sub.task_id, timeout=60, until=started)
        done = await rt.wait(sub.task_id, timeout=60)
        assert done.status is TaskStatus.COMPLETED

    # Work made runnable by updating a row (an answer), not only by inserting one.
    asker = await rt.submit("asker", "plan a trip")
    question = await rt.wait(asker.task_id, timeout=60, until=lambda t: t.status_reason == "input")
    assert question.status is TaskStatus.WAITING
    await until(quiet_for_a_second, 15, "the idle worker sends no queries (no polling)")
    await rt.respond(asker.task_id, answer="Lisbon")  # waiting -> pending, in this process
    answered = await rt.wait(asker.task_id, timeout=60)
    assert answered.output == "you chose Lisbon"
    assert worker.proc.poll() is None


@pytest.mark.slow
async def test_subtasks_and_timers_run_on_workers_with_a_long_poll_interval(
    rt: Runtime, workers: list[PgWorker]
) -> None:
    """A child task, its parent's wake-up and a due timer reach workers whose
    poll interval (600 s) is longer than the test's timeouts."""
    for _ in range(2):  # long leases too: no lease expiry wakes them up by chance
        workers.append(PgWorker(rt.store.url, poll_interval=600, ttl=600, TIMER_SECONDS="1"))
    for w in workers:
        await until(functools.partial(listening, w.app), 30, "the worker LISTENs")
    parent = await rt.submit("parent", "ask the researcher")
    timer = await rt.submit("timer", "wake me in a second")
    done = await rt.wait(parent.task_id, timeout=60)
    assert done.status is TaskStatus.COMPLETED and done.output == "the researcher says: 42"
    woke = await rt.wait(timer.task_id, timeout=60)
    assert woke.status is TaskStatus.COMPLETED and woke.output.startswith("woke up")


# --- the server drops the worker's connections ------------------------------------


@pytest.mark.slow
async def test_worker_reconnects_after_its_backends_are_terminated_mid_tool(
    rt: Runtime, workers: list[PgWorker], tmp_path: Path
) -> None:
    ledger, release = tmp_path / "ledger.txt", tmp_path / "release"
    sub = await rt.submit("sleeper", "hold on")
    # The tool is held until the connections are gone: it surely is mid-tool.
    worker = PgWorker(
        rt.store.url, poll_interval=600, LEDGER=str(ledger), HOLD="nap", HOLD_UNTIL=str(release)
    )
    workers.append(worker)
    await worker.wait_output("AT nap")
    await until(lambda: listening(worker.app), 60, "the worker LISTENs")
    killed = terminate(worker.app)
    # Both the pool and the LISTEN connection went, and the tool was still running.
    assert len(killed) >= 2, killed
    assert not any(line.startswith("end nap") for line in ledger_lines(ledger))
    release.touch()

    done = await rt.wait(sub.task_id, timeout=60)
    assert done.status is TaskStatus.COMPLETED, (done.status, done.error, worker.err[-20:])
    # The same owner carried on: no takeover, no restart, nothing re-run or lost.
    assert done.restarts == 0 and done.lease.epoch == 1
    lines = ledger_lines(ledger)
    assert sum(line.startswith("start nap ") for line in lines) == 1
    assert sum(line.startswith("end nap ") for line in lines) == 1
    results = await rt.store.entries(sub.task_id, kinds=[EntryKind.TOOL_RESULT])
    assert [e.payload["outcome"] for e in results] == ["ok", "ok"]
    assert all(f"pid {worker.pid}" in e.payload["content"] for e in results)
    await one_result_per_call(rt, sub.task_id)

    # It works on new connections, and hears NOTIFY again (30 s poll interval).
    fresh = {b["pid"] for b in backends(worker.app)}
    assert fresh and not fresh & killed
    await until(lambda: listening(worker.app), 60, "the worker LISTENs again")
    again = await rt.submit("sleeper", "after the drop")
    await rt.wait(again.task_id, timeout=60, until=started)
    assert (await rt.wait(again.task_id, timeout=60)).status is TaskStatus.COMPLETED


# --- four workers, 500 tasks, two SIGKILLs ------------------------------------------

TASKS = 500
TTL = 3.0

AUDIT = """
CREATE TABLE {s}.lease_audit (
    task_id text NOT NULL, at timestamptz NOT NULL,
    old_status text, new_status text, old_owner text, new_owner text,
    old_epoch bigint, new_epoch bigint, old_expires timestamptz, new_expires timestamptz
);
CREATE FUNCTION {s}.audit_lease() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {s}.lease_audit VALUES (
        NEW.id, clock_timestamp(), OLD.status, NEW.status, OLD.lease_owner, NEW.lease_owner,
        OLD.lease_epoch, NEW.lease_epoch, OLD.lease_expires, NEW.lease_expires);
    RETURN NEW;
END $$;
CREATE TRIGGER audit_lease AFTER UPDATE ON {s}.tasks
    FOR EACH ROW EXECUTE FUNCTION {s}.audit_lease();
"""


def install_lease_audit(schema: str) -> None:
    with admin() as conn:
        conn.execute(sql.SQL(AUDIT).format(s=sql.Identifier(schema)))


def lease_audit(schema: str) -> list[dict[str, Any]]:
    with admin() as conn:
        return conn.execute(
            sql.SQL("SELECT * FROM {}.lease_audit ORDER BY at").format(sql.Identifier(schema))
        ).fetchall()


def count_completed(schema: str) -> int:
    with admin() as conn:
        row = conn.execute(
            sql.SQL("SELECT count(*) AS n FROM {}.tasks WHERE status = 'completed'").format(
                sql.Identifier(schema)
            )
        ).fetchone()
    return int(row["n"]) if row else 0


def completed_at_least(schema: str, n: int) -> Callable[[], bool]:
    return lambda: count_completed(schema) >= n


def pid_of(worker_id: str) -> int:
    return int(worker_id.split(":")[-2])  # host:pid:nonce


def check_task_log(task_id: str, entries: list[Entry]) -> tuple[int, list[int]]:
    """One task's log, seq by seq: claims, completion and who wrote each tool result.

    Returns (completed status entries, pids of its owners in claim order).
    """
    epochs: list[int] = []
    owners: list[int] = []
    completed = 0
    for e in entries:
        if e.kind is EntryKind.STATUS and "epoch" in e.payload:
            epochs.append(e.payload["epoch"])
            owners.append(pid_of(e.payload["worker"]))
        elif e.kind is EntryKind.STATUS and e.payload["to"] == "completed":
            completed += 1
        elif e.kind is EntryKind.TOOL_RESULT and e.payload["outcome"] == "ok":
            # Fencing, seen in the log: a result is committed only by the owner of
            # the latest claim before it, never by an earlier (dead or stale) one.
            assert owners, f"{task_id}: a tool result before any claim"
            assert f"by pid {owners[-1]}" in e.payload["content"], (task_id, owners, e.payload)
    assert epochs == list(range(1, len(epochs) + 1)), f"{task_id}: claim epochs {epochs}"
    return completed, owners


@pytest.mark.slow
@pytest.mark.usefixtures("pg_wire")  # both wires, the workers' too
async def test_four_workers_500_tasks_two_sigkilled(
    rt: Runtime, workers: list[PgWorker], schema: str, tmp_path: Path
) -> None:
    """Every task completes exactly once, unsafe tools run at most once, and no
    task ever has two live owners.

    "Two live owners" means two workers each holding an unexpired lease on the
    same task at the same moment. The proof comes from the database itself: a
    trigger on the tasks table records every change of every row (old and new
    status, owner, epoch, lease expiry) with the server's clock at the moment
    of the write. Claims lock the row (FOR UPDATE), so the old values a claim
    replaces are the lease exactly as last renewed. Then
      - epochs never go down, and every claim raises the epoch by exactly one;
      - every claim happened when the row had no live owner: it was not
        running, or had no owner (released), or its lease had expired
        (old expiry <= server time of the claim).
    So the lease of epoch n ended before epoch n+1 began: at most one live
    owner at any instant. On top of that, what the owners *did* is fenced: each
    tool result in a task's log names the pid that ran the tool, and it is
    always the pid of the owner of the latest claim before it; each ledger
    line of a tool run names a pid that owned the task; and no `nap` (not
    replay-safe) ran twice for one idempotency key.
    """
    rng = random.Random()
    seed = rng.randrange(1 << 30)
    rng.seed(seed)
    print(f"seed {seed}")
    install_lease_audit(schema)
    ledger = tmp_path / "ledger.txt"
    ids = [(await rt.submit("sleeper", f"task {i}")).task_id for i in range(TASKS)]
    # Each victim holds its first `nap` until it dies (and runs the rest as usual),
    # so it surely has a task in flight when killed, however slowly it started.
    chosen = rng.sample(range(4), 2)
    never = str(tmp_path / "never")
    for i in range(4):
        hold = {"HOLD": "nap", "HOLD_ONCE": "1", "HOLD_UNTIL": never} if i in chosen else {}
        workers.append(
            PgWorker(
                rt.store.url, poll_interval=5, ttl=TTL, concurrency=40, LEDGER=str(ledger), **hold
            )
        )
    victims = [workers[i] for i in chosen]
    kill_at = sorted([rng.randrange(40, 180), rng.randrange(200, 350)])
    killed_at: dict[int, float] = {}
    held: dict[str, int] = {}  # task id -> pid of the victim that held it
    started_at = time.monotonic()
    for victim, threshold in zip(victims, kill_at, strict=True):
        held[(await victim.wait_output("AT nap ", timeout=120)).split()[2]] = victim.pid
        await until(completed_at_least(schema, threshold), 120, f"{threshold} tasks done")
        await asyncio.sleep(rng.uniform(0, 0.3))  # a random moment, not a wait for anything
        victim.signal(signal.SIGKILL)
        victim.proc.wait(10)
        killed_at[victim.pid] = time.monotonic() - started_at
    await until(lambda: count_completed(schema) >= TASKS, 150, "all tasks done")
    elapsed = time.monotonic() - started_at
    print(f"{TASKS} tasks in {elapsed:.1f}s; killed {killed_at}")
    survivors = [w for w in workers if w not in victims]
    assert all(w.proc.poll() is None for w in survivors), "a surviving worker died"

    # Every task completed exactly once; claims and results are as fencing allows.
    owners_of: dict[str, list[int]] = {}
    takeovers = 0
    for task_id in ids:
        task = await rt.get(task_id)
        assert task.status is TaskStatus.COMPLETED, (task_id, task.status, task.error)
        entries = await rt.store.entries(task_id)
        completed, owners = check_task_log(task_id, entries)
        assert completed == 1, f"{task_id} completed {completed} times"
        owners_of[task_id] = owners
        if task.restarts:
            takeovers += 1
            assert task.restarts == len(owners) - 1
    print(f"{takeovers} tasks taken over")
    assert len(held) == 2 and takeovers >= 2
    for task_id, pid in held.items():  # in flight at the kill: taken over from the victim
        owners = owners_of[task_id]
        assert pid in owners and owners[-1] != pid, (task_id, pid, owners)

    # Unsafe tools ran at most once, and only ever in a process that owned the task.
    starts: Counter[tuple[str, str]] = Counter()
    for line in ledger_lines(ledger):
        words = line.split()
        if words[0] != "start":
            continue
        tool, key, pid = words[1], words[2], int(words[3].removeprefix("pid="))
        task_id = key.split(":")[0]
        assert pid in owners_of[task_id], f"{tool} for {task_id} ran in pid {pid}, not an owner"
        starts[(tool, key)] += 1
    naps = {key: n for (tool, key), n in starts.items() if tool == "nap"}
    assert naps and max(naps.values()) == 1, "an unsafe tool ran twice"

    # Never two live owners: the database's own record of every lease change.
    audit = lease_audit(schema)
    by_task: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in audit:
        by_task[row["task_id"]].append(row)
        assert row["new_epoch"] >= row["old_epoch"], f"epoch went back: {row}"
        if row["new_epoch"] == row["old_epoch"]:
            continue
        assert row["new_epoch"] == row["old_epoch"] + 1, f"epoch skipped: {row}"
        live = (
            row["old_status"] == "running"
            and row["old_owner"] is not None
            and row["old_expires"] > row["at"]
        )
        assert not live, f"claimed while another owner's lease was live: {row}"
    claims = sum(1 for r in audit if r["new_epoch"] > r["old_epoch"])
    assert claims == sum(len(o) for o in owners_of.values())
    assert set(by_task) == set(ids)
