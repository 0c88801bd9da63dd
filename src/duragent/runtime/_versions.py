"""Agent versions: which code a task runs on, across deploys.

An agent has a version: declared (`Agent(..., version="v3")`) or, when not, a
fingerprint of what decides how it answers: its instructions, its tools'
schemas, its output schema and its model, and the agents its handoffs reach
(runtime/_fingerprint.py). A task records the version it was created with
(`Task.agent_version`, a column of every store), and a worker claims only the
tasks of the versions it serves (`Store.claim_tasks(versions=...)`): after a
deploy, the old code finishes the old tasks and the new code takes the new ones.
A task from before versions has none: any worker of its agent runs it. A process
that only submits, naming the agent with a stand-in definition
(`model="scripted:none"`), pins no version unless it declares one, as it pins no
provider URL (runtime/_pins.py).

Workers announce the versions they serve in their presence records
(runtime/_presence.py); a pending task whose version no live worker serves
says so (`unserved_reason`) rather than sit silently pending. A migration
(`migration_commit`, `Runtime.migrate`) moves a task to another version on
purpose, recorded in its log (a `migration` status entry); it takes effect at
the task's next safe point: its next claim, and for a running task the
hand-back its worker makes at once (a `release` control on its row).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from duragent.runtime._fingerprint import VERSION_PATTERN, check_version
from duragent.runtime._log import notice
from duragent.runtime._pins import with_pins
from duragent.runtime._presence import served_versions
from duragent.store._commits import Commit, TaskPatch, TaskQuery
from duragent.store._protocol import Store
from duragent.store._rules import status_change_entry
from duragent.types import Entry, EntryKind, Task, TaskStatus

if TYPE_CHECKING:
    from duragent.runtime._agent import Agent

# A stand-in's model (docs/models.md): it names the agent, it does not define it.
STAND_IN_MODEL = "scripted:none"


def pinned_version(agent: Agent) -> str | None:
    """The version a task created with `agent` is pinned to (None: any)."""
    if not agent.version_declared and agent.model_name == STAND_IN_MODEL:
        return None
    return agent.version


def label(agent: str, version: str | None) -> str:
    """`assistant@v3`, or `assistant` for a task of any version."""
    return agent if version is None else f"{agent}@{version}"


def served_by(agents: Iterable[Agent]) -> dict[str, str]:
    """Agent name -> the version a worker running these definitions serves."""
    return {a.name: str(a.version) for a in agents}


def unserved_reason(task: Task, served: Mapping[str, set[str] | None]) -> str | None:
    """Why a pending task will not start: its version is one no live worker serves
    (`served`: agent -> versions, as runtime/_presence.py `served_versions` gives);
    None when some worker may take it."""
    if task.status is not TaskStatus.PENDING or task.agent_version is None:
        return None
    versions = served.get(task.agent, set())
    if versions is None or task.agent_version in versions:
        return None
    return f"waiting for {label(task.agent, task.agent_version)}: no worker serves it"


async def count_unserved(store: Store) -> dict[tuple[str, str], int]:
    """(agent, version) -> pending tasks pinned to a version no live worker serves,
    for the metrics (duragent_tasks_unserved). It reads every pending task, a
    page of 500 at a time: a scrape's cost grows with the backlog, not the store."""
    served = await served_versions(store)
    counts: dict[tuple[str, str], int] = {}
    cursor: str | None = None
    while True:
        page = await store.list_tasks(
            TaskQuery(status=TaskStatus.PENDING, limit=500, cursor=cursor)
        )
        for task in page.tasks:
            if task.agent_version is not None and unserved_reason(task, served):
                key = (task.agent, task.agent_version)
                counts[key] = counts.get(key, 0) + 1
        cursor = page.next_cursor
        if cursor is None:
            return counts


def migration_record(entry: Entry) -> dict[str, Any] | None:
    """The migration a status entry records ({"from", "to", "by"}), if it is one."""
    if entry.kind is not EntryKind.STATUS:
        return None
    record = entry.payload.get("migration")
    return record if isinstance(record, dict) else None


def migration_commit(
    task: Task, to_version: str, by: str | None, definition: Agent | None, live: bool
) -> Commit:
    """The commit that moves `task` to `to_version`: the new pin (re-pinned to
    `definition` when it is that version), a `migration` status entry and a
    notice; for a task a live worker runs (`live`), a request that the worker
    hand it back at its next safe point, so a worker of the new version goes on."""
    changes: dict[str, Any] = {"agent_version": to_version}
    if definition is not None and definition.version == to_version:
        changes["config"] = with_pins(definition, task.config)
    if live and not task.control:
        # A stop already asked for (pause, abort) hands the task back too, and must
        # stay: a release in its place would be cleared by the next claim.
        changes["control"] = {"action": "release", "reason": "migration"}
    record = {"from": task.agent_version, "to": to_version, "by": by}
    r = task.iterations + 1
    text = (
        f"Migrated from {label(task.agent, task.agent_version)} to "
        f"{label(task.agent, to_version)}"
        + ("; it goes on there from its next safe point." if live else ".")
    )
    return Commit(
        entries=[
            status_change_entry(task, task.status, task.status_reason, migration=record),
            notice(task.id, r, text),
        ],
        patches=[
            TaskPatch(task.id, changes, expect_status=[task.status], expect_version=task.version)
        ],
    )


__all__ = [
    "STAND_IN_MODEL",
    "VERSION_PATTERN",
    "check_version",
    "count_unserved",
    "label",
    "migration_commit",
    "migration_record",
    "pinned_version",
    "served_by",
    "unserved_reason",
]
