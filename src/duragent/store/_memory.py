"""The in-memory store: dicts in one process, nothing survives it. For tests and examples."""

from __future__ import annotations

import asyncio
import bisect
import json
import operator
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

from duragent.errors import TaskNotFound
from duragent.store._codec import decode_cursor, encode_cursor, entry_kind
from duragent.store._commits import CopyEntries, EntryHead, PendingCommit, TaskPage, TaskQuery
from duragent.store._queues import QUEUES_SCOPE, Candidate, candidate_of
from duragent.store._rules import claim_order, claimable
from duragent.store._signals import (
    ChangeSignal,
    ControlCallback,
    ControlWatchers,
    TasksCallback,
    TaskWatchers,
)
from duragent.store._tx import Notes, TxWrites
from duragent.store._views import (
    VIEW_KINDS,
    build_model_view,
    build_ui_view,
    view_data,
    view_start,
    view_text,
)
from duragent.types import (
    ApiMessage,
    Document,
    Entry,
    EntryKind,
    Task,
    TaskStatus,
    UIMessage,
    utcnow,
)

_T = TypeVar("_T")

# The version of the state a memory store holds, which a JSONL log (replayed
# into one, _jsonl.py) records in its header and migrates on opening.
# Version 2: session documents are scoped per owner (`session:<owner>:<id>`).
# Version 3: queues, priorities and metadata on tasks.
# Versions 4 and 5 changed PostgreSQL's entries only (_postgres_schema.py); they
# were one number then, so a JSONL log is at 5, its header rewritten once.
SCHEMA_VERSION = 5


def request_key(owner: str | None, request_id: str) -> tuple[str, str]:
    """Request ids are per owner; no owner and the empty owner are one (as in the SQL stores)."""
    return (owner or "", request_id)


def serves(
    task: Task,
    agents: Collection[str] | None,
    queues: Collection[str] | None,
    versions: Mapping[str, str] | None = None,
) -> bool:
    """Whether a worker of these agents, queues and agent versions (None: any) may
    run the task."""
    return (
        (agents is None or task.agent in agents)
        and (queues is None or (task.queue or task.agent) in queues)
        and (
            versions is None
            or task.agent_version is None
            or versions.get(task.agent) == task.agent_version
        )
    )


class _MemoryTx:
    """Reads see this transaction's own writes; nothing reaches the store until `install`."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.tasks: dict[str, str] = {}
        self.entries: list[Entry] = []
        self.docs: dict[tuple[str, str], str | None] = {}
        self.notes = Notes()

    def load_task(self, task_id: str) -> Task | None:
        raw = self.tasks.get(task_id) or self.store._tasks.get(task_id)
        if raw is None:
            return None
        task = Task.model_validate_json(raw)
        self.notes.read(task)
        return task

    def find_by_request(self, owner: str | None, request_id: str) -> Task | None:
        task_id = self.store._requests.get(request_key(owner, request_id))
        return None if task_id is None else self.load_task(task_id)

    def insert_task(self, task: Task) -> None:
        self.tasks[task.id] = task.model_dump_json()

    def update_task(self, task: Task) -> None:
        self.tasks[task.id] = task.model_dump_json()
        self.notes.wrote(task)

    def append(self, entries: list[Entry]) -> None:
        self.entries.extend(entries)

    def copy_entries(self, copy: CopyEntries, task_id: str, after_seq: int, now: datetime) -> int:
        wanted = {k.value for k in copy.kinds}
        rows = [
            r
            for r in self.store._entries.get(copy.source_id, ())
            if copy.first_seq <= r[0] <= copy.last_seq and r[1] in wanted and r[2] <= copy.max_round
        ]
        self.entries.extend(
            Entry.model_construct(
                task_id=task_id,
                seq=after_seq + i,
                kind=EntryKind(kind),
                round=rnd,
                payload=json.loads(payload),
                created_at=now,
            )
            for i, (_seq, kind, rnd, payload, _at) in enumerate(rows, 1)
        )
        return len(rows)

    def load_document(self, scope: str, key: str) -> Document | None:
        if (scope, key) in self.docs:
            raw = self.docs[(scope, key)]
        else:
            raw = self.store._docs.get((scope, key))
        return None if raw is None else Document.model_validate_json(raw)

    def put_document(self, doc: Document) -> None:
        self.docs[(doc.scope, doc.key)] = doc.model_dump_json()

    def delete_document(self, scope: str, key: str) -> None:
        self.docs[(scope, key)] = None

    def find_claimable(
        self,
        now: datetime,
        agents: Sequence[str] | None,
        task_id: str | None,
        limit: int,
        closed: set[str],
        queues: Sequence[str] | None = None,
        versions: Mapping[str, str] | None = None,
    ) -> list[Candidate]:
        ids = [task_id] if task_id else list(self.store._tasks)
        out = []
        for tid in ids:
            task = self.load_task(tid)
            if task is None or not serves(task, agents, queues, versions):
                continue
            ready = task.status is TaskStatus.PENDING and task.wake_at is None
            if ready and task.queue in closed:
                continue
            if claimable(task, now):
                out.append(task)
        return [candidate_of(t) for t in sorted(out, key=claim_order)[:limit]]

    def lease_now(self) -> datetime:
        return utcnow()  # one process: the host's clock

    def load_queues(self) -> list[Document]:
        return [
            Document.model_validate_json(raw)
            for (scope, _k), raw in self.store._docs.items()
            if scope == QUEUES_SCOPE
        ]

    def running_counts(
        self, queues: Sequence[str]
    ) -> list[tuple[str, str | None, str | None, int]]:
        counts: Counter[tuple[str, str | None, str | None]] = Counter()
        wanted = set(queues)
        for raw in self.store._tasks.values():
            t = Task.model_validate_json(raw)
            if t.status is TaskStatus.RUNNING and t.queue in wanted:
                counts[(t.queue, t.owner, t.lease.owner)] += 1
        return [(q, o, w, n) for (q, o, w), n in counts.items()]

    def install(self) -> None:
        s = self.store
        for task_id, raw in self.tasks.items():
            s._tasks[task_id] = raw
            task = Task.model_validate_json(raw)
            if task.request_id is not None:
                s._requests.setdefault(request_key(task.owner, task.request_id), task_id)
        for e in self.entries:
            s._entries.setdefault(e.task_id, []).append(
                (e.seq, e.kind.value, e.round, json.dumps(e.payload), e.created_at)
            )
        for k, raw_doc in self.docs.items():
            if raw_doc is None:
                s._docs.pop(k, None)
            else:
                s._docs[k] = raw_doc
        for task_id in self.notes.controlled:
            s._controls.fire(task_id)


class MemoryStore(TxWrites):
    """Holds everything as JSON text, so what comes back is a fresh copy, as from disk."""

    notifies_across_processes = False  # one process: nothing else commits
    schema_version = SCHEMA_VERSION
    migrated_from: int | None = None  # new on every open: nothing to migrate

    def __init__(self, url: str = "memory://") -> None:
        self.url = url
        self._tasks: dict[str, str] = {}
        self._requests: dict[tuple[str, str], str] = {}
        self._entries: dict[str, list[tuple[int, str, int, str, datetime]]] = {}
        self._docs: dict[tuple[str, str], str] = {}
        self._signal = ChangeSignal()
        self._controls = ControlWatchers()
        self._moved = TaskWatchers()

    async def open(self) -> None:
        """Nothing to connect to: a memory store is usable from its construction."""
        return None

    async def close(self) -> None:
        return None

    async def __aenter__(self) -> MemoryStore:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _readable(self) -> None:
        """Reads may run (a memory store's always may; JSONL's only once open)."""

    def _run(self, job: Callable[[_MemoryTx], _T]) -> _T:
        """Run a job in one transaction: all of its writes are installed, or none."""
        tx = _MemoryTx(self)
        result = job(tx)
        tx.install()
        if tx.entries or tx.tasks or tx.docs:
            self._signal.notify()
            self._moved.fire(frozenset(tx.tasks))
        return result

    async def _write(self, job: Callable[[Any], _T]) -> _T:
        return self._run(job)

    def _enqueue(self, job: Callable[[Any], _T], link: PendingCommit) -> asyncio.Future[_T]:
        # Nothing to queue behind: the job runs now, durable when _run returns.
        future: asyncio.Future[_T] = asyncio.get_running_loop().create_future()
        try:
            future.set_result(self._run(job))
        except Exception as exc:
            link.failed = exc
            future.set_exception(exc)
        return future

    async def get_task(self, task_id: str) -> Task:
        self._readable()
        raw = self._tasks.get(task_id)
        if raw is None:
            raise TaskNotFound(task_id)
        return Task.model_validate_json(raw)

    async def list_tasks(self, query: TaskQuery | None = None) -> TaskPage:
        self._readable()
        q = query or TaskQuery()
        tasks = [Task.model_validate_json(raw) for raw in self._tasks.values()]
        tasks.sort(key=lambda t: (t.created_at.timestamp(), t.id), reverse=True)
        if q.cursor:
            ts, cid = decode_cursor(q.cursor)
            tasks = [t for t in tasks if (round(t.created_at.timestamp(), 6), t.id) < (ts, cid)]
        out = []
        for t in tasks:
            if not q.matches(t):
                continue
            out.append(t)
            if len(out) > q.limit:
                break
        more = len(out) > q.limit
        out = out[: q.limit]
        return TaskPage(out, encode_cursor(out[-1]) if more and out else None)

    async def count_tasks(self, query: TaskQuery | None = None) -> dict[tuple[str, str], int]:
        self._readable()
        q = query or TaskQuery()
        counts: Counter[tuple[str, str]] = Counter()
        for raw in self._tasks.values():
            t = Task.model_validate_json(raw)
            if q.matches(t):
                counts[(t.queue or t.agent, t.status.value)] += 1
        return dict(counts)

    async def entries(
        self,
        task_id: str,
        *,
        after_seq: int = 0,
        kinds: Iterable[EntryKind] | None = None,
        limit: int | None = None,
    ) -> list[Entry]:
        self._readable()
        wanted = None if kinds is None else {EntryKind(k).value for k in kinds}
        out = []
        for seq, kind, rnd, payload, created in self._entries.get(task_id, ()):
            if seq <= after_seq or (wanted is not None and kind not in wanted):
                continue
            out.append(
                Entry(
                    task_id=task_id,
                    seq=seq,
                    kind=entry_kind(task_id, seq, kind),
                    round=rnd,
                    payload=json.loads(payload),
                    created_at=created,
                )
            )
            if limit is not None and len(out) >= limit:
                break
        return out

    async def entry_heads(self, task_id: str, *, kinds: Iterable[EntryKind]) -> list[EntryHead]:
        self._readable()
        wanted = {EntryKind(k).value for k in kinds}
        return [
            EntryHead(seq, EntryKind(kind), rnd, json.loads(payload).get("role"))
            for seq, kind, rnd, payload, _at in self._entries.get(task_id, ())
            if kind in wanted
        ]

    async def model_view(self, task_id: str) -> list[ApiMessage]:
        self._readable()
        return build_model_view(self._view_rows(task_id))

    async def model_view_data(self, task_id: str) -> list[dict[str, Any]]:
        self._readable()
        return view_data(view_text(self._view_rows(task_id)))

    async def start_reads(
        self, task_id: str, after_seq: int
    ) -> tuple[list[Entry], list[dict[str, Any]]]:
        return await self.entries(task_id, after_seq=after_seq), await self.model_view_data(task_id)

    def _view_rows(self, task_id: str) -> list[tuple[int, str, str]]:
        """The view's rows from the last compaction's `upto` on (`view_start`)."""
        rows = self._entries.get(task_id, [])
        raw = self._tasks.get(task_id)
        start = view_start(json.loads(raw).get("config")) if raw is not None else 0
        first = bisect.bisect_left(rows, start, key=operator.itemgetter(0)) if start else 0
        return [(s, k, p) for s, k, _r, p, _c in rows[first:] if k in VIEW_KINDS]

    async def ui_messages(self, task_id: str) -> list[UIMessage]:
        self._readable()
        rows = self._entries.get(task_id, ())
        return build_ui_view((s, p) for s, k, _r, p, _c in rows if k == EntryKind.UI_MESSAGE)

    async def get_document(self, scope: str, key: str) -> Document | None:
        self._readable()
        raw = self._docs.get((scope, key))
        return None if raw is None else Document.model_validate_json(raw)

    async def list_documents(self, scope: str) -> list[Document]:
        self._readable()
        return [
            Document.model_validate_json(raw)
            for (s, _k), raw in sorted(self._docs.items())
            if s == scope
        ]

    async def next_wake_at(
        self, agents: Iterable[str] | None = None, queues: Iterable[str] | None = None
    ) -> datetime | None:
        self._readable()
        names = None if agents is None else set(agents)
        only = None if queues is None else set(queues)
        wakes = []
        for raw in self._tasks.values():
            t = Task.model_validate_json(raw)
            if not serves(t, names, only):
                continue
            if t.status is TaskStatus.PENDING and t.wake_at:
                wakes.append(t.wake_at)  # a delayed start
            elif t.status is TaskStatus.WAITING and t.wake_at:  # a timer, an expiry, a deadline
                wakes.append(t.wake_at)
            elif t.status is TaskStatus.RUNNING and t.lease.expires_at:
                wakes.append(t.lease.expires_at)
        return min(wakes, default=None)

    async def delete_task(self, task_id: str) -> None:
        if task_id not in self._tasks:
            raise TaskNotFound(task_id)
        self._delete_trees([task_id])

    def _subtrees(self, roots: Iterable[str]) -> list[str]:
        """The roots and every task under them, each once, parents before children."""
        children: dict[str, list[str]] = {}
        for tid, raw in self._tasks.items():
            parent = Task.model_validate_json(raw).parent_id
            if parent is not None:
                children.setdefault(parent, []).append(tid)
        doomed = list(dict.fromkeys(roots))
        seen = set(doomed)
        for tid in doomed:  # grows while we walk it: breadth-first
            for child in children.get(tid, ()):
                if child not in seen:
                    seen.add(child)
                    doomed.append(child)
        return doomed

    def _delete_trees(self, roots: list[str]) -> int:
        doomed = self._subtrees(roots)
        self._record_delete(doomed)
        self._forget(doomed)
        self._signal.notify()
        self._moved.fire(frozenset(doomed))
        return len(doomed)

    def _record_delete(self, task_ids: list[str]) -> None:
        """Make a delete durable before the tasks leave memory (nothing to do here)."""

    def _forget(self, task_ids: Iterable[str]) -> None:
        for tid in task_ids:
            raw = self._tasks.pop(tid, None)
            self._entries.pop(tid, None)
            if raw is not None:
                task = Task.model_validate_json(raw)
                if task.request_id is not None:
                    self._requests.pop(request_key(task.owner, task.request_id), None)
            for k in [k for k in self._docs if k[0] == f"task:{tid}"]:
                del self._docs[k]

    async def purge_tasks(self, query: TaskQuery) -> int:
        """Delete up to `query.limit` matching tasks (and their sub-tasks)."""
        roots = []
        for tid, raw in self._tasks.items():
            if query.matches(Task.model_validate_json(raw)):
                roots.append(tid)
                if len(roots) >= query.limit:
                    break
        return self._delete_trees(roots) if roots else 0

    async def reclaim_space(self) -> None:
        return None

    async def wait_for_work(self, timeout: float) -> None:
        await self.wait_for_change(timeout)  # every commit may be work: no way to tell

    async def wait_for_change(self, timeout: float) -> None:
        await self._signal.wait(timeout)

    def watch_tasks(self, callback: TasksCallback) -> Callable[[], None]:
        return self._moved.add(callback)

    def watch_controls(self, callback: ControlCallback) -> Callable[[], None]:
        """Call `callback(task_id)` when a commit sets a control request on a task."""
        return self._controls.add(callback)
