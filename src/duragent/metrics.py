"""Prometheus metrics for `duragent worker` and `duragent serve` (extra `metrics`).

Built from what already exists, not sprinkled through the runtime: the
store every commit goes through (wrapped, to time commits and lease renewals),
the trace points of each task (rounds, model and tool calls, restarts), and
a count of the store's tasks by status and agent, taken at scrape time.

They are served on their own port (`--metrics-port`, bound to 127.0.0.1 unless
`--metrics-host` says otherwise): the API's tokens belong to users and the
metrics describe every user's tasks, so they are not on the API port.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter as Tally
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from duragent._payloads import status_of
from duragent.errors import Conflict, MissingExtra, StaleLease
from duragent.runtime._versions import count_unserved
from duragent.store._commits import (
    Commit,
    CommitResult,
    CopyEntries,
    EntryHead,
    LeaseRenewal,
    PendingCommit,
    TaskPage,
    TaskQuery,
)
from duragent.store._protocol import Store
from duragent.store._queues import QUEUES_SCOPE
from duragent.store._signals import ControlCallback, TasksCallback
from duragent.types import ApiMessage, Document, Entry, EntryKind, NewEntry, Task, UIMessage

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

log = logging.getLogger("duragent.metrics")

try:  # guarded: the core install has no prometheus-client
    import prometheus_client as prom
    from prometheus_client.core import GaugeMetricFamily
except ImportError:  # pragma: no cover - exercised without the extra
    prom = None  # type: ignore[assignment]

LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class MeteredStore:
    """A store that times its commits and lease renewals; everything else passes through."""

    def __init__(self, store: Store, metrics: Metrics) -> None:
        self._store = store
        self._metrics = metrics
        self._renewed_at: dict[str, float] = {}
        self.url = store.url

    @property
    def notifies_across_processes(self) -> bool:
        return self._store.notifies_across_processes

    @property
    def schema_version(self) -> int:
        return self._store.schema_version

    @property
    def migrated_from(self) -> int | None:
        return self._store.migrated_from

    async def commit(self, commit: Commit) -> CommitResult:
        start = time.perf_counter()
        error: BaseException | None = None
        try:
            return await self._store.commit(commit)
        except Exception as exc:
            error = exc
            raise
        finally:
            self._count(start, error)

    def commit_soon(self, commit: Commit) -> PendingCommit:
        start = time.perf_counter()
        pending = self._store.commit_soon(commit)
        assert pending.future is not None
        pending.future.add_done_callback(
            lambda f: self._count(start, None if f.cancelled() else f.exception())
        )
        return pending

    def _count(self, start: float, error: BaseException | None) -> None:
        outcome = "ok"
        if isinstance(error, StaleLease):
            outcome = "stale_lease"
        elif isinstance(error, Conflict):
            outcome = "conflict"
        elif error is not None:
            outcome = "error"
        self._metrics.commits.labels(outcome).inc()
        self._metrics.commit_seconds.observe(time.perf_counter() - start)

    async def claim_task(self, worker_id: str, **kw: Any) -> Task | None:
        task = await self._store.claim_task(worker_id, **kw)
        if task is not None:
            self._renewed_at[task.id] = time.monotonic()
        return task

    async def renew_leases(
        self, worker_id: str, leases: Mapping[str, int], ttl: float
    ) -> LeaseRenewal:
        now = time.monotonic()
        for task_id in leases:
            last = self._renewed_at.get(task_id)
            if last is not None:
                # How late this renewal is against the heartbeat: near the lease
                # TTL means the task was about to be taken over.
                self._metrics.renew_lag.observe(max(0.0, now - last - self._metrics.heartbeat))
        renewal = await self._store.renew_leases(worker_id, leases, ttl)
        done = time.monotonic()
        for task_id in renewal.kept:
            self._renewed_at[task_id] = done
        for task_id in renewal.lost:
            self._renewed_at.pop(task_id, None)
        return renewal

    # --- the rest passes through as it is ---

    async def open(self) -> None:
        await self._store.open()

    async def close(self) -> None:
        await self._store.close()

    async def create_task(self, task: Task, entries: Sequence[NewEntry] = ()) -> tuple[Task, bool]:
        return await self._store.create_task(task, entries)

    async def create_fork(
        self, task: Task, log: Sequence[NewEntry | CopyEntries]
    ) -> tuple[Task, bool]:
        return await self._store.create_fork(task, log)

    async def get_task(self, task_id: str) -> Task:
        self._metrics.reads.labels("get_task").inc()
        return await self._store.get_task(task_id)

    async def list_tasks(self, query: TaskQuery | None = None) -> TaskPage:
        return await self._store.list_tasks(query)

    async def count_tasks(self, query: TaskQuery | None = None) -> dict[tuple[str, str], int]:
        return await self._store.count_tasks(query)

    async def entries(
        self,
        task_id: str,
        *,
        after_seq: int = 0,
        kinds: Iterable[EntryKind] | None = None,
        limit: int | None = None,
    ) -> list[Entry]:
        self._metrics.reads.labels("entries").inc()
        return await self._store.entries(task_id, after_seq=after_seq, kinds=kinds, limit=limit)

    async def entry_heads(self, task_id: str, *, kinds: Iterable[EntryKind]) -> list[EntryHead]:
        return await self._store.entry_heads(task_id, kinds=kinds)

    async def model_view(self, task_id: str) -> list[ApiMessage]:
        return await self._store.model_view(task_id)

    async def model_view_data(self, task_id: str) -> list[dict[str, Any]]:
        return await self._store.model_view_data(task_id)

    async def start_reads(
        self, task_id: str, after_seq: int
    ) -> tuple[list[Entry], list[dict[str, Any]]]:
        return await self._store.start_reads(task_id, after_seq)

    async def ui_messages(self, task_id: str) -> list[UIMessage]:
        return await self._store.ui_messages(task_id)

    async def get_document(self, scope: str, key: str) -> Document | None:
        return await self._store.get_document(scope, key)

    async def list_documents(self, scope: str) -> list[Document]:
        return await self._store.list_documents(scope)

    async def claim_tasks(self, worker_id: str, n: int = 1, **kw: Any) -> list[Task]:
        return await self._store.claim_tasks(worker_id, n, **kw)

    async def renew_lease(self, task_id: str, worker_id: str, epoch: int, ttl: float) -> Task:
        return await self._store.renew_lease(task_id, worker_id, epoch, ttl)

    async def release_lease(self, task_id: str, epoch: int) -> None:
        await self._store.release_lease(task_id, epoch)

    async def next_wake_at(
        self, agents: Iterable[str] | None = None, queues: Iterable[str] | None = None
    ) -> datetime | None:
        return await self._store.next_wake_at(agents, queues)

    async def delete_task(self, task_id: str) -> None:
        await self._store.delete_task(task_id)

    async def purge_tasks(self, query: TaskQuery) -> int:
        return await self._store.purge_tasks(query)

    async def reclaim_space(self) -> None:
        await self._store.reclaim_space()

    async def wait_for_change(self, timeout: float) -> None:
        await self._store.wait_for_change(timeout)

    async def wait_for_work(self, timeout: float) -> None:
        await self._store.wait_for_work(timeout)

    def watch_controls(self, callback: ControlCallback) -> Callable[[], None]:
        return self._store.watch_controls(callback)

    def watch_tasks(self, callback: TasksCallback) -> Callable[[], None]:
        return self._store.watch_tasks(callback)


class Metrics:
    """One registry per process: `Metrics(store)`, then run with `metrics.store`
    and `trace=metrics.trace`, and `serve()` the registry."""

    def __init__(
        self, store: Store, *, heartbeat: float = 10.0, queues: Iterable[str] = ()
    ) -> None:
        if prom is None:
            raise MissingExtra("Prometheus metrics", "metrics")
        self.registry = prom.CollectorRegistry()
        self.heartbeat = heartbeat
        # Queues named in duragent_tasks besides the ones with limits in the store:
        # the default queues of this process's agents, given or seen running
        # (agents are this process's code, not a client's words; see count_tasks).
        self.queues = set(queues)
        r = self.registry
        self.rounds = prom.Counter("duragent_rounds", "Rounds started.", ["agent"], registry=r)
        self.commits = prom.Counter(
            "duragent_commits", "Store commits, by outcome.", ["outcome"], registry=r
        )
        self.reads = prom.Counter(
            "duragent_store_reads",
            "Reads of a task row or of its entries (what event streams and waits cost).",
            ["method"],
            registry=r,
        )
        self.commit_seconds = prom.Histogram(
            "duragent_commit_seconds", "Store commit latency.", buckets=LATENCY, registry=r
        )
        self.model_seconds = prom.Histogram(
            "duragent_model_call_seconds",
            "Model call latency (a streamed answer, start to end).",
            ["agent", "model"],
            buckets=LATENCY,
            registry=r,
        )
        self.tokens = prom.Counter(
            "duragent_model_tokens", "Tokens used.", ["agent", "kind"], registry=r
        )
        self.tool_seconds = prom.Histogram(
            "duragent_tool_call_seconds",
            "Tool call latency, by outcome.",
            ["tool", "outcome"],
            buckets=LATENCY,
            registry=r,
        )
        self.retries = prom.Counter(
            "duragent_model_retries",
            "Model calls made again after an error.",
            ["agent"],
            registry=r,
        )
        self.runs = prom.Counter(
            "duragent_task_runs",
            "Task runs started on this process (claims).",
            ["agent"],
            registry=r,
        )
        self.takeovers = prom.Counter(
            "duragent_takeovers",
            "Tasks taken over from a worker whose lease expired.",
            ["agent"],
            registry=r,
        )
        self.renew_lag = prom.Histogram(
            "duragent_lease_renew_lag_seconds",
            "How late lease renewals are against the heartbeat interval.",
            buckets=LATENCY,
            registry=r,
        )
        self._metered = MeteredStore(store, self)
        self.store: Store = self._metered
        self._inner = store
        self._loop: asyncio.AbstractEventLoop | None = None
        self._open: dict[tuple[str, str], tuple[float, str]] = {}  # (task, what) -> start, label
        self._agents: dict[str, str] = {}
        self._register_gauges()

    def _register_gauges(self) -> None:
        """The gauges counted in the store at each scrape."""
        self.registry.register(
            _Scraped(
                self,
                "duragent_tasks",
                "Tasks in the store.",
                ["status", "queue"],
                lambda: count_tasks(self._inner, self.queues),
            )
        )
        self.registry.register(
            _Scraped(
                self,
                "duragent_tasks_unserved",
                "Pending tasks whose agent version no live worker serves "
                "(waiting for agent@version: no worker serves it).",
                ["agent", "version"],
                lambda: count_unserved(self._inner),
            )
        )

    # --- trace points ---

    async def trace(self, point: str, **info: Any) -> None:
        self._loop = asyncio.get_running_loop()
        task_id = info.get("task_id", "")
        now = time.perf_counter()
        if point == "task_start":
            task: Task = info["task"]
            self._agents[task_id] = task.agent
            self.queues.add(task.agent)
            self.runs.labels(task.agent).inc()
            if await self._was_takeover(task):
                self.takeovers.labels(task.agent).inc()
        elif point == "task_end":
            self._agents.pop(task_id, None)
            self._metered._renewed_at.pop(task_id, None)
            for key in [k for k in self._open if k[0] == task_id]:
                del self._open[key]
        elif point == "round_start":
            self.rounds.labels(self._agents.get(task_id, "")).inc()
        elif point == "model_start":
            if (task_id, "model") in self._open:  # the last attempt never ended: a retry
                self.retries.labels(self._agents.get(task_id, "")).inc()
            self._open[(task_id, "model")] = (now, info.get("model", ""))
        elif point == "model_end":
            start, model = self._open.pop((task_id, "model"), (now, ""))
            agent = self._agents.get(task_id, "")
            self.model_seconds.labels(agent, model).observe(now - start)
            usage = info.get("usage")
            if usage is not None:
                self.tokens.labels(agent, "input").inc(usage.input_tokens)
                self.tokens.labels(agent, "output").inc(usage.output_tokens)
        elif point == "tool_start":
            self._open[(task_id, "tool:" + info["call_id"])] = (now, info.get("tool", ""))
        elif point == "result":
            opened = self._open.pop((task_id, "tool:" + info["call_id"]), None)
            if opened is not None:
                start, tool = opened
                self.tool_seconds.labels(tool, info.get("outcome", "")).observe(now - start)

    async def _was_takeover(self, task: Task) -> bool:
        """Whether the claim that started this run took the task from a dead worker."""
        if task.restarts == 0:
            return False
        last = await self._inner.entries(task.id, after_seq=max(0, task.last_seq - 1))
        return bool(
            last and last[-1].kind is EntryKind.STATUS and status_of(last[-1]).get("takeover")
        )

    # --- serving ---

    def serve(self, port: int, host: str = "127.0.0.1") -> WSGIServer:
        """Serve /metrics on host:port from a thread; returns the server (shutdown() it)."""
        self._loop = asyncio.get_running_loop()
        server, _thread = prom.start_http_server(port, addr=host, registry=self.registry)
        return server

    def text(self) -> str:
        return str(prom.generate_latest(self.registry).decode())


class _Scraped:
    """A gauge counted in the store at scrape time, on the metrics' event loop:
    duragent_tasks{status, queue} (one grouped query), duragent_tasks_unserved
    {agent, version} (runtime/_versions.py `count_unserved`)."""

    def __init__(
        self,
        metrics: Metrics,
        name: str,
        doc: str,
        labels: list[str],
        count: Callable[[], Coroutine[Any, Any, Mapping[tuple[str, str], int]]],
    ) -> None:
        self.metrics, self.name, self.doc, self.labels, self.count = (
            metrics,
            name,
            doc,
            labels,
            count,
        )

    def describe(self) -> Iterable[Any]:
        return []  # no collect() at registration: the store may not be open yet

    def collect(self) -> Iterator[Any]:
        family = GaugeMetricFamily(self.name, self.doc, labels=self.labels)
        loop = self.metrics._loop
        if loop is None or loop.is_closed():
            yield family
            return
        try:
            if _in_loop(loop):
                counts: Mapping[tuple[str, str], int] = {}  # cannot block the loop it runs on
            else:
                future = asyncio.run_coroutine_threadsafe(self.count(), loop)
                counts = future.result(timeout=30)
        except Exception as exc:  # a scrape must answer even when the store does not
            log.warning("counting for /metrics (%s) failed: %s", self.name, exc)
            counts = {}
        for key, n in sorted(counts.items()):
            family.add_metric(list(key), n)
        yield family


def _in_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


OTHER_QUEUES = "(other)"


async def count_tasks(store: Store, known: Iterable[str] = ()) -> Tally[tuple[str, str]]:
    """(status, queue) -> number of tasks, from the store's grouped count.

    A queue is named when it is declared: it has limits in the store, or it is
    in `known` (the default queues of the agents served here). Every other
    queue, any name a client sent, is counted under OTHER_QUEUES: each label
    value is a series kept for good, so users must not be able to add them."""
    declared = set(known) | {d.key for d in await store.list_documents(QUEUES_SCOPE)}
    counts: Tally[tuple[str, str]] = Tally()
    for (queue, status), n in (await store.count_tasks()).items():
        counts[(status, queue if queue in declared else OTHER_QUEUES)] += n
    return counts


__all__ = ["OTHER_QUEUES", "MeteredStore", "Metrics", "count_tasks"]
