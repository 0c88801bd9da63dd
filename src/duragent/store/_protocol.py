"""The Store protocol: what every backend offers, whatever it writes to.

A backend decides how bytes reach disk; what a commit means is written once
(`store/_rules.py`, `store/_tx.py`) so that every backend applies it identically.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

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
from duragent.store._signals import ControlCallback, TasksCallback
from duragent.types import ApiMessage, Document, Entry, EntryKind, NewEntry, Task, UIMessage


@runtime_checkable
class Store(Protocol):
    """Everything duragent persists goes through one of these.

    `open_store(url)` returns one; `docs/architecture.md` §5 groups the methods
    (writing, reading, ownership, waiting). Every backend passes the same
    conformance suite (`tests/test_store_conformance.py`). A missing task is
    `TaskNotFound`; a store that cannot be reached is `StoreUnavailable`.
    """

    url: str

    # What a backend can do beyond the methods every one has: read as they are,
    # each store says what it offers (the defaults are memory's).

    @property
    def notifies_across_processes(self) -> bool:
        """Whether `wait_for_change` and `wait_for_work` hear other processes'
        commits, so a worker may sleep on them; False (memory, JSONL: one
        process) when a worker must poll for work another process made."""
        ...

    @property
    def schema_version(self) -> int:
        """The schema version this duragent keeps the store at; each backend
        numbers its own (its schema module's `SCHEMA_VERSION`)."""
        ...

    @property
    def migrated_from(self) -> int | None:
        """The schema version the store was at when opened (0: new, it was
        created); None for a backend with no schema to migrate (memory)."""
        ...

    async def open(self) -> None:
        """Connect, creating or migrating the schema if needed; call before anything
        else (`async with store:` does). A constructor only checks its arguments;
        opening an open store does nothing."""
        ...

    async def close(self) -> None:
        """Flush and release files, connections and locks; the store is unusable after."""
        ...

    async def commit(self, commit: Commit) -> CommitResult:
        """Apply a `Commit` atomically: entries, task patches, documents and new tasks.

        Fenced: a commit whose lease epoch is not current raises `StaleLease`
        and writes nothing; a patch whose expectation fails raises `Conflict`.
        """
        ...

    def commit_soon(self, commit: Commit) -> PendingCommit:
        """Queue `commit` without waiting for it to be durable; `await` the result.

        It lands before any commit asked for after it. A runner uses it for the
        commit that closes a round, so the next model call starts while it
        syncs; its next commit names it (`Commit.after`) and so never lands
        without it. Call it from the event loop the store is used on.
        """
        ...

    async def create_task(self, task: Task, entries: Sequence[NewEntry] = ()) -> tuple[Task, bool]:
        """Insert a pending task with its first entries; `(task, created)`.

        A task with the `(owner, request_id)` of an existing one is not created:
        the existing one is returned with `False` (the caller compares inputs).
        """
        ...

    async def get_task(self, task_id: str) -> Task:
        """The task row as stored now; `TaskNotFound` if there is none."""
        ...

    async def list_tasks(self, query: TaskQuery | None = None) -> TaskPage:
        """Tasks matching `query`, newest first, one cursor-paged `TaskPage` at a time."""
        ...

    async def count_tasks(self, query: TaskQuery | None = None) -> dict[tuple[str, str], int]:
        """How many tasks match `query`, keyed by `(queue or agent, status)`."""
        ...

    async def entries(
        self,
        task_id: str,
        *,
        after_seq: int = 0,
        kinds: Iterable[EntryKind] | None = None,
        limit: int | None = None,
    ) -> list[Entry]:
        """A task's log entries after `after_seq`, in seq order, of `kinds` if given."""
        ...

    async def entry_heads(self, task_id: str, *, kinds: Iterable[EntryKind]) -> list[EntryHead]:
        """Seq, kind, round and role of a task's entries of `kinds`, without payloads."""
        ...

    async def create_fork(
        self, task: Task, log: Sequence[NewEntry | CopyEntries]
    ) -> tuple[Task, bool]:
        """Like `create_task`, with `CopyEntries` runs copied from another task inside
        the store; a source that changed since the plan refuses the write (`Conflict`)."""
        ...

    async def model_view(self, task_id: str) -> list[ApiMessage]:
        """The messages a model sees for this task (voided rounds left out), typed."""
        ...

    async def model_view_data(self, task_id: str) -> list[dict[str, Any]]:
        """`model_view` as plain dicts in their wire form, decoded but not validated."""
        ...

    async def start_reads(
        self, task_id: str, after_seq: int
    ) -> tuple[list[Entry], list[dict[str, Any]]]:
        """`entries(task_id, after_seq=after_seq)` and `model_view_data(task_id)`, the
        two reads a runner starts with, read together: in one round trip where the
        store is remote. Not one snapshot unless the store says so."""
        ...

    async def ui_messages(self, task_id: str) -> list[UIMessage]:
        """The task's conversation as the page and the API show it (voided rounds kept)."""
        ...

    async def get_document(self, scope: str, key: str) -> Document | None:
        """The document at `(scope, key)`, or None."""
        ...

    async def list_documents(self, scope: str) -> list[Document]:
        """Every document in `scope`, ordered by key."""
        ...

    async def claim_task(
        self,
        worker_id: str,
        *,
        agents: Iterable[str] | None = None,
        ttl: float = 30.0,
        task_id: str | None = None,
        queues: Iterable[str] | None = None,
        versions: Mapping[str, str] | None = None,
    ) -> Task | None:
        """Take the lease of one runnable task (of `agents`/`queues`, or exactly
        `task_id`) for `ttl` seconds; None if there is none. See `claim_tasks`."""
        ...

    async def claim_tasks(
        self,
        worker_id: str,
        n: int = 1,
        *,
        agents: Iterable[str] | None = None,
        ttl: float = 30.0,
        task_id: str | None = None,
        queues: Iterable[str] | None = None,
        versions: Mapping[str, str] | None = None,
    ) -> list[Task]:
        """Take the leases of up to `n` runnable tasks in claim order, within every
        queue's limits. `versions` (agent name to the version served): a task
        pinned to an agent version is taken only if it maps its agent to it; a
        task with no version (made before versions) by any worker of its agent.
        Each claim bumps the lease epoch, so the previous owner's commits are
        refused from then on (recovery goes through this same claim)."""
        ...

    async def renew_lease(self, task_id: str, worker_id: str, epoch: int, ttl: float) -> Task:
        """Extend a held lease by `ttl` seconds; `StaleLease` if `epoch` is no longer current."""
        ...

    async def renew_leases(
        self, worker_id: str, leases: Mapping[str, int], ttl: float
    ) -> LeaseRenewal:
        """Renew many leases (task id to epoch) in one transaction; lost ones are
        reported in the `LeaseRenewal`, not raised."""
        ...

    async def release_lease(self, task_id: str, epoch: int) -> None:
        """Give a lease up so another worker may claim the task at once."""
        ...

    async def next_wake_at(
        self, agents: Iterable[str] | None = None, queues: Iterable[str] | None = None
    ) -> datetime | None:
        """The earliest time a task of `agents`/`queues` becomes claimable (a delayed
        start, a timer or deadline, a lease expiring); None if nothing is scheduled."""
        ...

    async def delete_task(self, task_id: str) -> None:
        """Delete a task and its sub-tasks, with their entries and task documents."""
        ...

    async def purge_tasks(self, query: TaskQuery) -> int:
        """Delete up to `query.limit` matching tasks (and their sub-tasks); how many went."""
        ...

    async def reclaim_space(self) -> None:
        """Give the space of deleted rows back (VACUUM, compaction); a no-op where none."""
        ...

    async def wait_for_change(self, timeout: float) -> None:
        """Return when a commit that may matter happened (in any process, for shared
        backends), or after `timeout` seconds."""
        ...

    async def wait_for_work(self, timeout: float) -> None:
        """Like `wait_for_change`, for the commits that may make a task claimable:
        what a worker waits on. A store that cannot tell those apart (memory,
        JSONL) returns at every change, as `wait_for_change` does."""
        ...

    def watch_controls(self, callback: ControlCallback) -> Callable[[], None]:
        """Call `callback(task_id)` when a commit sets a control request on a task
        (None: some task, re-read them all); returns the function that stops it."""
        ...

    def watch_tasks(self, callback: TasksCallback) -> Callable[[], None]:
        """Call `callback(task_ids)` after each commit, by any process for shared
        backends, with the ids of the tasks it wrote or deleted; None whenever
        commits may have gone unheard (re-read every task you watch). A commit
        that moves no task is not told. Call it on the event loop that waits;
        the callback runs there. Returns the function that stops the calls."""
        ...


async def iter_entries(
    store: Store, task_id: str, *, after_seq: int = 0, page: int = 500
) -> AsyncIterator[Entry]:
    """Stream a task's entries in pages so a huge log never sits in memory at once."""
    while True:
        batch = await store.entries(task_id, after_seq=after_seq, limit=page)
        for entry in batch:
            yield entry
        if len(batch) < page:
            return
        after_seq = batch[-1].seq
