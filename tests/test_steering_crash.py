"""SIGKILL during a fork: a fork is all there or not there at all, and runs nothing twice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from duragent import (
    Agent,
    BuiltinTools,
    Edit,
    Limits,
    Runtime,
    ScriptedModel,
    TaskQuery,
    TaskStatus,
    tool,
)
from duragent.store import open_store
from duragent.types import EntryKind, NewEntry, Task, ToolMessage, UserMessage
from support.crashlib import kill_at, spawn

ROUNDS = 700  # ~2,100 entries: a fork's commit takes long enough to be cut


def long_source() -> tuple[Task, list[NewEntry]]:
    task = Task(agent="calc", iterations=ROUNDS, status=TaskStatus.PENDING)
    out = [
        NewEntry(
            task_id=task.id,
            kind=EntryKind.API_MESSAGE,
            round=1,
            payload={"role": "user", "content": "count"},
        )
    ]
    for r in range(1, ROUNDS + 1):
        cid = f"call_{r}"
        fn = {"name": "step", "arguments": json.dumps({"n": r})}
        message = {
            "role": "assistant",
            "tool_calls": [{"id": cid, "type": "function", "function": fn}],
        }
        out += [
            NewEntry(task_id=task.id, kind=EntryKind.API_MESSAGE, round=r, payload=message),
            NewEntry(
                task_id=task.id,
                kind=EntryKind.TOOL_INTENT,
                round=r,
                payload={"call_id": cid, "name": "step", "replay": "never"},
            ),
            NewEntry(
                task_id=task.id,
                kind=EntryKind.TOOL_RESULT,
                round=r,
                payload={"role": "tool", "tool_call_id": cid, "content": f"{r}", "outcome": "ok"},
            ),
        ]
    return task, out


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sqlite", "jsonl"])
async def test_sigkill_during_forks_leaves_whole_forks_only(tmp_path: Path, kind: str) -> None:
    url = f"sqlite:///{tmp_path}/f.db" if kind == "sqlite" else f"jsonl:///{tmp_path}/f"
    store = open_store(url)
    await store.open()
    task, entries = long_source()
    await store.create_task(task, entries)
    await store.close()

    child = spawn("fork_child.py", url, task.id, str(ROUNDS))
    kill_at(child, "forked 2 ", timeout=120)  # killed at a random point of the fork loop

    runs: list[int] = []

    @tool
    def step(n: int) -> str:
        """Count."""
        runs.append(n)
        return str(n)

    agent = Agent(
        name="calc",
        model=ScriptedModel(lambda messages: "done"),
        tools=[step],
        builtin_tools=BuiltinTools(plan=False),
        limits=Limits(max_iterations=ROUNDS + 5),
    )
    async with Runtime(url, agents=[agent], run_worker=False) as rt:
        source_view = await rt.model_view(task.id)
        page = await rt.store.list_tasks(TaskQuery(limit=1000))
        forks = [t for t in page.tasks if t.id != task.id]
        assert len(forks) >= 3
        for fork in forks:
            # Whole: the record, its notice, every copied entry and the appended message.
            assert fork.config["forked_from"] == {"task_id": task.id, "round": ROUNDS}
            assert fork.last_seq == 2 + len(entries) - ROUNDS + 1
            view = await rt.model_view(fork.id)
            assert view[:-1] == source_view
            assert isinstance(view[-1], UserMessage) and view[-1].content.startswith("fork ")
        # The same request ids again: the committed forks come back, the cut one is made whole.
        for i in range(len(forks) + 1):
            sub = await rt.fork(
                task.id, ROUNDS, edit=Edit(append_user=f"fork {i}"), request_id=f"fork-{i}"
            )
            assert sub.created == (i == len(forks))
        source = await rt.get(task.id)
        assert source.last_seq == len(entries) and source.status is TaskStatus.PENDING
        await rt.store.delete_task(task.id)  # only the forks run
    async with Runtime(url, agents=[agent], poll_interval=0.05) as rt:
        for fork in forks:
            done = await rt.wait(fork.id, timeout=60)
            assert done.status is TaskStatus.COMPLETED and done.output == "done"
            tools = [m for m in await rt.model_view(fork.id) if isinstance(m, ToolMessage)]
            assert len(tools) == ROUNDS
    assert runs == []  # no copied call ran again
