"""Property: for any log of rounds with rolled-back attempts and any fork of it (any round,
any edit), the fork's model view answers every tool call exactly once, holds nothing voided,
and is the source's view through that round with the edit applied."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from duragent import Edit, Runtime
from duragent.store import open_store
from duragent.store.base import Commit, TaskPatch
from duragent.store.memory import MemoryStore
from duragent.types import (
    AssistantMessage,
    EntryKind,
    NewEntry,
    Task,
    ToolMessage,
    UserMessage,
)

# A round: the calls of each voided attempt, then the calls of the live attempt.
round_ = st.tuples(st.lists(st.integers(0, 2), max_size=2), st.integers(0, 3))
edit_ = st.builds(
    Edit,
    replace_last_user=st.none() | st.just("replaced"),
    append_user=st.none() | st.just("appended"),
    drop_last_assistant=st.booleans(),
)


async def build(store: Any, rounds: list[tuple[list[int], int]]) -> Task:
    task, _ = await store.create_task(Task(agent="p"))
    tid = task.id

    async def put(entries: list[NewEntry]) -> list[int]:
        res = await store.commit(Commit(entries=entries))
        return [e.seq for e in res.entries]

    def attempt(r: int, tag: str, calls: int) -> list[NewEntry]:
        ids = [f"c{r}_{tag}_{i}" for i in range(calls)]
        message: dict[str, Any] = {"role": "assistant", "content": f"{tag} {r}"}
        if ids:
            fn = {"name": "t", "arguments": json.dumps({})}
            message["tool_calls"] = [{"id": c, "type": "function", "function": fn} for c in ids]
        out = [NewEntry(task_id=tid, kind=EntryKind.API_MESSAGE, round=r, payload=message)]
        for c in ids:
            payload = {
                "role": "tool",
                "tool_call_id": c,
                "content": f"{tag} result",
                "outcome": "ok",
            }
            out.append(NewEntry(task_id=tid, kind=EntryKind.TOOL_RESULT, round=r, payload=payload))
        return out

    user = {"role": "user", "content": "start"}
    await put([NewEntry(task_id=tid, kind=EntryKind.API_MESSAGE, round=1, payload=user)])
    for r, (voided, live) in enumerate(rounds, start=1):
        for k, calls in enumerate(voided):
            seqs = await put(attempt(r, f"voided{k}", calls))
            marker = {"scope": "api", "from_seq": seqs[0], "to_seq": seqs[-1], "reason": "test"}
            await put([NewEntry(task_id=tid, kind=EntryKind.ROLLBACK, round=r, payload=marker)])
        await put(attempt(r, "live", live))
    res = await store.commit(Commit(patches=[TaskPatch(tid, {"iterations": len(rounds)})]))
    return res.tasks[tid]


def expected(view: list[Any], at_round: int, edit: Edit) -> list[Any]:
    """The edit applied to the source's view through `at_round`, written out plainly."""
    # The live view through round N: the user message, then N rounds of (assistant, results).
    out, rounds = [view[0]], 0
    for m in view[1:]:
        if isinstance(m, AssistantMessage):
            rounds += 1
        if rounds > at_round:
            break
        out.append(m)
    if edit.drop_last_assistant:
        last = max(i for i, m in enumerate(out) if isinstance(m, AssistantMessage))
        out = out[:last]
    if edit.replace_last_user is not None:
        last = max(i for i, m in enumerate(out) if isinstance(m, UserMessage))
        out[last] = UserMessage(content=edit.replace_last_user)
    if edit.append_user is not None:
        out.append(UserMessage(content=edit.append_user))
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(round_, min_size=1, max_size=5), st.data(), edit_)
def test_a_forks_view_is_the_sources_through_round_n_with_its_edit(
    rounds: list[tuple[list[int], int]], data: st.DataObject, edit: Edit
) -> None:
    at_round = data.draw(st.integers(1, len(rounds)))

    async def go() -> None:
        store = open_store("memory://")
        assert isinstance(store, MemoryStore)
        await store.open()
        source = await build(store, rounds)
        rt = Runtime(store, run_worker=False)
        source_view = await rt.model_view(source.id)
        fork = await rt.fork(source.id, at_round, edit=edit)
        view = await rt.model_view(fork.task_id)
        assert view == expected(source_view, at_round, edit)
        calls = [c.id for m in view if isinstance(m, AssistantMessage) for c in m.tool_calls or ()]
        answers = [m.tool_call_id for m in view if isinstance(m, ToolMessage)]
        assert sorted(calls) == sorted(answers) and len(set(answers)) == len(answers)
        assert not any("voided" in (getattr(m, "content", "") or "") for m in view)
        assert (await rt.get(fork.task_id)).iterations == at_round
        await store.close()

    asyncio.run(go())
