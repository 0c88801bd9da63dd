from __future__ import annotations

import functools
import gc
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pluggy
import pytest

from duragent.store import Store, open_store

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# A command without --store uses the user's store ($XDG_DATA_HOME/duragent): the
# tests, and every CLI process they start, get a data directory of their own.
os.environ["XDG_DATA_HOME"] = tempfile.mkdtemp(prefix="duragent-test-data-")
os.environ.pop("DURAGENT_STORE", None)

# name -> factory(tmp_path) -> an open store. Later backends add themselves here.
StoreFactory = Callable[[Path], Awaitable[Store]]


async def _memory(tmp_path: Path) -> Store:
    return open_store("memory://")


async def _sqlite(tmp_path: Path) -> Store:
    return open_store(f"sqlite:///{tmp_path}/store.db")


async def _sqlite_full(tmp_path: Path) -> Store:
    return open_store(f"sqlite:///{tmp_path}/store.db?durability=full")


async def _jsonl(tmp_path: Path) -> Store:
    return open_store(f"jsonl:///{tmp_path}/jsonl-store")


PG_URL = os.environ.get("DURAGENT_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")


@functools.cache
def postgres_unreachable() -> str | None:
    """Why the test server cannot be used, or None when it can."""
    try:
        import psycopg
    except ImportError as exc:  # pragma: no cover - the postgres extra is not installed
        return f"psycopg is not installed: {exc}"
    try:
        psycopg.connect(PG_URL, connect_timeout=3).close()
    except psycopg.Error as exc:
        return f"PostgreSQL at {PG_URL} is unreachable: {exc}"
    return None


def require_postgres() -> str:
    """The test server's URL; skip the test without one, except in CI where that fails."""
    reason = postgres_unreachable()
    if reason is not None:
        if IN_CI:
            pytest.fail(f"CI must run the PostgreSQL tests: {reason}")
        pytest.skip(reason)
    return PG_URL


def drop_schema(schema: str) -> None:
    import psycopg
    from psycopg import sql

    drop = sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
    # A server or worker may still be using the schema: PostgreSQL can then pick
    # the DROP as a deadlock's victim. That is the test's cleanup losing a race,
    # not a result: try again (a few times, then let it fail).
    for attempt in range(5):
        try:
            with psycopg.connect(PG_URL, autocommit=True) as conn:
                conn.execute(drop)
            return
        except psycopg.errors.DeadlockDetected:
            if attempt == 4:
                raise


async def _postgres(tmp_path: Path, wire: str | None = None) -> Store:
    from duragent.store._postgres import PostgresStore

    class ThrowawayPostgresStore(PostgresStore):
        """A store in its own schema, dropped on close: every test starts empty."""

        async def close(self) -> None:
            try:
                await super().close()
            finally:
                assert self.schema is not None
                drop_schema(self.schema)

    url = require_postgres() + ("" if wire is None else f"?wire={wire}")
    return ThrowawayPostgresStore(url, schema=f"test_{uuid.uuid4().hex[:12]}", max_size=4)


async def _postgres_psycopg(tmp_path: Path) -> Store:
    return await _postgres(tmp_path, "psycopg")


STORE_FACTORIES: dict[str, StoreFactory] = {
    "memory": _memory,
    "sqlite": _sqlite,
    "sqlite-full": _sqlite_full,
    "jsonl": _jsonl,
    "postgres": _postgres,
}
# The PostgreSQL store on psycopg's documented API (`?wire=psycopg`), for the
# suites run on both wires (tests/test_store_conformance.py, the crash tests),
# not every test of the `store` fixture.
WIRE_FACTORIES: dict[str, StoreFactory] = {"postgres-psycopg": _postgres_psycopg}


PG_WIRES = ("raw", "psycopg")  # the PostgreSQL store's wires (_postgres_message.py)


@pytest.fixture(params=PG_WIRES)
def pg_wire(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test on both wires of the PostgreSQL store: $DURAGENT_PG_WIRE, which
    the stores it opens and the processes it starts take theirs from."""
    monkeypatch.setenv("DURAGENT_PG_WIRE", request.param)
    return str(request.param)


def pg_schema_url(kind: str, schema: str) -> str:
    """The test server's URL for `schema`, on the wire `kind` names ("postgres":
    raw, "postgres-psycopg": psycopg's), for fixtures that give the URLs of both."""
    wire = "&wire=psycopg" if kind == "postgres-psycopg" else ""
    return f"{require_postgres()}?schema={schema}{wire}"


@asynccontextmanager
async def opened_store(kind: str, tmp_path: Path) -> AsyncIterator[Store]:
    """A store of `kind` (a key of STORE_FACTORIES), opened, and closed on the way out."""
    s = await {**STORE_FACTORIES, **WIRE_FACTORIES}[kind](tmp_path)
    await s.open()
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture(params=sorted(STORE_FACTORIES))
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    async with opened_store(request.param, tmp_path) as s:
        yield s


@pytest.fixture(params=["jsonl", "sqlite", "sqlite-full"])
async def file_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """The stores kept in files, which a test can close and open again."""
    async with opened_store(request.param, tmp_path) as s:
        yield s


@pytest.fixture(params=["sqlite", "sqlite-full", "postgres"])
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """One store (a SQLite file, or a PostgreSQL schema) that several processes open."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/shared.db"
        return
    if request.param == "sqlite-full":  # batches of several commits run on the writer thread
        yield f"sqlite:///{tmp_path}/shared.db?durability=full"
        return
    schema = f"test_{uuid.uuid4().hex[:12]}"
    yield f"{require_postgres()}?schema={schema}"
    drop_schema(schema)


# --- The fast lane's time limit ------------------------------------------------
# A test not marked slow must take at most FAST_TEST_SECONDS: its setup, call and
# teardown, without the setup of fixtures it shares with other tests (a session's
# server is paid once, not by whichever test comes first) and without the cyclic
# collector's pauses. A loaded machine must not fail a test, so the limit is
# scaled by how much slower than on a quiet machine a fixed CPU-bound loop runs
# and by how many processes wait for a core, and a test fails only beyond four
# times that; one between twice and four times the limit is listed at the end of
# the run (a test near the line must not pass or fail with the machine's load).

FAST_TEST_SECONDS = 0.25
# The reference loop's best time on the development machine, quiet (Python 3.11).
# A faster machine keeps the 0.25 s (the factor never goes below 1).
REFERENCE_QUIET_SECONDS = 0.017


def reference_loop_seconds() -> float:
    """The median time of five runs of a fixed CPU-bound loop."""
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        total = 0
        for i in range(200_000):
            total += i * i % 7
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


def load_factor() -> float:
    """How many times slower than a quiet machine this one runs now (at least 1).

    The loop measures this moment, on one core; the one-minute load average per
    core covers the test that just ran too, when the load came and went while it
    ran, and the processes a test waits on (a server, a child): at one runnable
    process per core, a test that needs two of them (itself and PostgreSQL)
    already waits for one, so that counts twice.
    """
    measured = reference_loop_seconds() / REFERENCE_QUIET_SECONDS
    runnable = os.getloadavg()[0] / (os.cpu_count() or 1)
    return max(1.0, measured, 2 * runnable)


class CollectorTime:
    """Seconds spent in the cyclic garbage collector (a gc callback), so far."""

    def __init__(self) -> None:
        self.total = 0.0
        self._started: float | None = None

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self.total += time.perf_counter() - self._started
            self._started = None


COLLECTOR = CollectorTime()


@dataclass
class OwnTime:
    """One test's time so far, in seconds."""

    spent: float = 0.0  # in its setup, call and teardown
    shared_setup: float = 0.0  # of that, setting up fixtures wider than the test
    # A full collection late in a long run walks every object the earlier tests
    # left alive: its pause is the run's, not the test's.
    collector_before: float = field(default_factory=lambda: COLLECTOR.total)
    passed: bool = True
    modules_before: int = field(default_factory=lambda: len(sys.modules))


@dataclass
class FastLane:
    factor_at_start: float
    current: OwnTime | None = None
    near: list[str] = field(default_factory=list)  # over twice the limit, under four times


FAST_LANE = pytest.StashKey[FastLane]()


def pytest_configure(config: pytest.Config) -> None:
    if not (config.option.usepdb or config.option.trace):  # a debugger's pauses are not the test's
        config.stash[FAST_LANE] = FastLane(factor_at_start=load_factor())
        gc.callbacks.append(COLLECTOR)


def _clock(item: pytest.Item) -> OwnTime | None:
    lane = item.config.stash.get(FAST_LANE, None)
    if lane is None or item.get_closest_marker("slow") is not None:
        return None
    return lane.current


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(
    fixturedef: pytest.FixtureDef[object], request: pytest.FixtureRequest
) -> Generator[None, None, None]:
    start = time.perf_counter()
    yield
    lane = request.config.stash.get(FAST_LANE, None)
    if lane is not None and lane.current is not None and fixturedef.scope != "function":
        lane.current.shared_setup += time.perf_counter() - start


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    lane = item.config.stash.get(FAST_LANE, None)
    if lane is not None:
        lane.current = OwnTime()
    start = time.perf_counter()
    yield
    clock = _clock(item)
    if clock is not None:
        clock.spent += time.perf_counter() - start


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    start = time.perf_counter()
    yield
    clock = _clock(item)
    if clock is not None:
        clock.spent += time.perf_counter() - start


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, None, None]:
    start = time.perf_counter()
    yield
    clock = _clock(item)
    # Only when the next test has the same parent is nothing wider than this
    # test torn down here (a module's last test also closes the module's fixtures).
    if clock is not None and nextitem is not None and nextitem.parent is item.parent:
        clock.spent += time.perf_counter() - start


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pluggy.Result[pytest.TestReport], None]:
    outcome = yield
    report = outcome.get_result()
    clock = _clock(item)
    if clock is None:
        return
    clock.passed = clock.passed and report.passed
    if report.when != "teardown" or not clock.passed:
        return
    if len(sys.modules) > clock.modules_before:
        return  # it imported a module first (an SDK, the server): a one-off cost, not its own
    lane = item.config.stash[FAST_LANE]
    own = clock.spent - clock.shared_setup - (COLLECTOR.total - clock.collector_before)
    if own <= 2 * FAST_TEST_SECONDS * lane.factor_at_start:
        return
    # Over the limit the start allowed: measure the load again before judging.
    factor = max(lane.factor_at_start, load_factor())
    if own <= 2 * FAST_TEST_SECONDS * factor:
        return
    if own <= 4 * FAST_TEST_SECONDS * factor:
        lane.near.append(f"{item.nodeid}: {own:.2f} s (load factor {factor:.1f})")
        return
    report.outcome = "failed"
    report.longrepr = (
        f"{item.nodeid} took {own:.2f} s, over four times the fast lane's "
        f"{FAST_TEST_SECONDS} s (scaled by {factor:.1f} for this machine's load): "
        "mark it @pytest.mark.slow or make it faster."
    )


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    lane = terminalreporter.config.stash.get(FAST_LANE, None)
    if lane is not None and lane.near:
        terminalreporter.section("fast-lane tests over twice the 0.25 s limit")
        for line in lane.near:
            terminalreporter.write_line(line)
