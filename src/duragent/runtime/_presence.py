"""Which agents (and versions) the live workers serve, and blocking tasks none can run.

A task for an agent no worker knows would otherwise stay `pending` forever
with no reason given. Every worker records the agents it serves in a document
of the store (scope `WORKERS_SCOPE`, key = worker id), renewed on its heartbeat
with an expiry one lease long, so a worker that died drops out of the record
when its leases would. A worker that sees a task pending for an agent it does
not know, for longer than the grace period, blocks it with
`blocked(missing_definition)` only if no live worker's record names that agent.

The record also names the version of each agent the worker serves
(runtime/_versions.py) and whether it is draining: `served_versions` counts
neither a draining worker nor an expired record, and is what says that a
pending task waits for a version no live worker serves.

Why a record and not only the grace period: a worker that knows the agent may
be alive but busy (every slot taken), and its tasks may rightly wait longer
than any grace period. The block is a conditional write (the task must still
be pending at the version read), so a worker claiming the task at that moment
wins, and many workers sweeping at once block it once. Documents exist on every
store, so this works the same on all of them; the expiry compares clocks of the
writer and the reader, as leases already do.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from duragent.errors import Conflict
from duragent.runtime._log import ui_entry
from duragent.store._commits import Commit, DocumentWrite, TaskPatch, TaskQuery
from duragent.store._protocol import Store
from duragent.types import BlockReason, Task, TaskStatus, UIError, utcnow

log = logging.getLogger("duragent.presence")

WORKERS_SCOPE = "duragent:workers"
# A record this long past its expiry belongs to a worker that is gone for good.
FORGET_AFTER = timedelta(hours=1)


async def announce(
    store: Store,
    worker_id: str,
    agents: Iterable[str],
    ttl: float,
    every: float | None = None,
    *,
    draining: bool = False,
    versions: Mapping[str, str] | None = None,
) -> None:
    """Record (or renew) that `worker_id` serves `agents` for the next `ttl` seconds;
    `every`: how often it renews the record (so a reader can tell one it missed);
    `draining`: it is stopping (claims nothing, hands its running tasks back);
    `versions`: the version of each agent it serves (runtime/_versions.py)."""
    now = utcnow()
    value: dict[str, Any] = {
        "agents": sorted(agents),
        "versions": dict(sorted((versions or {}).items())),
        "expires_at": (now + timedelta(seconds=ttl)).isoformat(),
        "seen_at": now.isoformat(),
        "draining": draining,
        **process_identity(),
    }
    if every is not None:
        value["every"] = every
    await store.commit(Commit(documents=[DocumentWrite(WORKERS_SCOPE, worker_id, value)]))


def process_identity() -> dict[str, Any]:
    """Where this process runs, precisely enough that a pid names the same process for
    a reader that shares it: the host's boot (a new id at every boot, shared by the
    host's containers), the pid namespace, the pid. Empty where /proc does not say;
    then no reader ever proves this process gone (see `exited`)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        pidns = os.readlink("/proc/self/ns/pid")
    except OSError:
        return {}
    return {"boot": boot, "pidns": pidns, "pid": os.getpid()}


async def exited(store: Store, worker_id: str) -> int | None:
    """The pid of `worker_id`'s process if it has provably exited, else None.

    Proven, not guessed: its record names this boot of this host and this pid
    namespace, so its pid means the same process here, and no process has that
    pid now. A pid taken since by another process (or a zombie not yet reaped)
    reads as alive, and so does a record without these fields: the caller then
    waits for the lease to end, as it would without a proof.
    """
    doc = await store.get_document(WORKERS_SCOPE, worker_id)
    value: dict[str, Any] = doc.value if doc is not None and isinstance(doc.value, dict) else {}
    mine = process_identity()
    pid = value.get("pid")
    if not mine or not isinstance(pid, int) or pid <= 0 or pid == mine["pid"]:
        return None
    if value.get("boot") != mine["boot"] or value.get("pidns") != mine["pidns"]:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return pid
    except OSError:
        return None  # alive, another user's
    return None


@dataclass(frozen=True)
class Sighting:
    """When a worker last recorded itself alive, and by when it should have again."""

    seen_at: datetime
    # Two renewals missed by then: it is presumably gone (stopped, crashed, cut off).
    gone_after: datetime

    def alive(self, now: datetime | None = None) -> bool:
        return (now or utcnow()) < self.gone_after


async def last_seen(store: Store, worker_id: str) -> Sighting | None:
    """The last sign of life of `worker_id`, if its record says (older records do not)."""
    doc = await store.get_document(WORKERS_SCOPE, worker_id)
    value = doc.value if doc is not None and isinstance(doc.value, dict) else {}
    try:
        seen = datetime.fromisoformat(str(value["seen_at"]))
        every = float(value["every"])
    except (KeyError, TypeError, ValueError):
        return None
    return Sighting(seen, seen + timedelta(seconds=2 * every + 1))


async def withdraw(store: Store, worker_id: str) -> None:
    """The worker stops: its record goes (else it would count as live until it expires)."""
    if await store.get_document(WORKERS_SCOPE, worker_id) is not None:
        await store.commit(Commit(documents=[DocumentWrite(WORKERS_SCOPE, worker_id, delete=True)]))


async def served_agents(store: Store, now: datetime | None = None) -> set[str]:
    """The agents some live worker serves (a draining one serves nothing more);
    forgets records long expired."""
    return set(await served_versions(store, now))


async def served_versions(store: Store, now: datetime | None = None) -> dict[str, set[str] | None]:
    """Agent name -> the versions live workers that are not draining serve (None:
    any, a worker from before versions); forgets records long expired."""
    now = now or utcnow()
    served: dict[str, set[str] | None] = {}
    for value in await _live_records(store, now):
        if value.get("draining"):
            continue
        versions = value.get("versions")
        for agent in (str(a) for a in value.get("agents", ())):
            have = served.setdefault(agent, set())
            if not isinstance(versions, dict) or agent not in versions:
                served[agent] = None  # it claims any version of the agent
            elif have is not None:
                have.add(str(versions[agent]))
    return served


async def _live_records(store: Store, now: datetime) -> list[dict[str, Any]]:
    """The records not expired; forgets records long expired."""
    live: list[dict[str, Any]] = []
    stale: list[DocumentWrite] = []
    for doc in await store.list_documents(WORKERS_SCOPE):
        value: dict[str, Any] = doc.value if isinstance(doc.value, dict) else {}
        try:
            expires = datetime.fromisoformat(str(value["expires_at"]))
        except (KeyError, ValueError):
            continue
        if expires > now:
            live.append(value)
        elif expires + FORGET_AFTER < now:
            stale.append(
                DocumentWrite(WORKERS_SCOPE, doc.key, delete=True, expect_version=doc.version)
            )
    if stale:
        with contextlib.suppress(Conflict):  # another worker forgot them first
            await store.commit(Commit(documents=stale))
    return live


async def block_unserved(
    store: Store, known: Iterable[str], grace: float, now: datetime | None = None
) -> list[str]:
    """Block every task pending longer than `grace` seconds for an agent no live worker
    serves; returns their ids. `known`: the agents of the calling worker."""
    now = now or utcnow()
    known = set(known)
    since = now - timedelta(seconds=grace)
    candidates: list[Task] = []
    cursor: str | None = None
    while True:
        page = await store.list_tasks(
            TaskQuery(status=TaskStatus.PENDING, limit=500, cursor=cursor)
        )
        # updated_at: when it last became pending (created, resumed, released).
        candidates += [t for t in page.tasks if t.agent not in known and t.updated_at <= since]
        cursor = page.next_cursor
        if cursor is None:
            break
    if not candidates:
        return []
    served = await served_agents(store, now) | known
    blocked: list[str] = []
    for task in candidates:
        if task.agent in served:
            continue
        message = (
            f"no running worker knows agent {task.agent!r}: the task waited {grace:g} s "
            "for one; start a worker that defines it, then resume the task"
        )
        r = task.iterations + 1
        commit = Commit(
            entries=[ui_entry(task.id, r, UIError(message="The task is blocked.", detail=message))],
            patches=[
                TaskPatch(
                    task.id,
                    {
                        "status": TaskStatus.BLOCKED,
                        "status_reason": BlockReason.MISSING_DEFINITION.value,
                        "error": message,
                    },
                    expect_status=[TaskStatus.PENDING],
                    expect_version=task.version,
                )
            ],
        )
        try:
            await store.commit(commit)
        except Conflict:
            continue  # claimed, resumed or blocked by someone else meanwhile
        log.warning("task %s blocked: %s", task.id, message)
        blocked.append(task.id)
    return blocked


__all__ = [
    "WORKERS_SCOPE",
    "Sighting",
    "announce",
    "block_unserved",
    "exited",
    "last_seen",
    "process_identity",
    "served_agents",
    "served_versions",
    "withdraw",
]
