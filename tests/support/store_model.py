"""Random commit sequences and the plain in-memory model every store must match."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, settings, strategies as st

from duragent.errors import InvalidTransition, StaleLease
from duragent.store import Commit, DocumentWrite, Store, TaskPatch, open_store
from duragent.types import EntryKind, NewEntry, Task, TaskStatus, UIText, dump_message

N_TASKS = 3

op = st.one_of(
    st.tuples(
        st.just("append"), st.integers(0, N_TASKS - 1), st.lists(st.text(max_size=5), max_size=3)
    ),
    st.tuples(
        st.just("context"),
        st.integers(0, N_TASKS - 1),
        st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    ),
    st.tuples(st.just("doc"), st.sampled_from(["a", "b"]), st.integers()),
    st.tuples(
        st.just("multi"),
        st.integers(0, N_TASKS - 1),
        st.integers(0, N_TASKS - 1),
        st.text(max_size=4),
        st.booleans(),
    ),
    st.tuples(st.just("claim")),
    st.tuples(st.just("stale"), st.integers(0, N_TASKS - 1)),
)


@dataclass
class Model:
    entries: list[list[str]] = field(default_factory=lambda: [[] for _ in range(N_TASKS)])
    context: list[dict[str, Any]] = field(default_factory=lambda: [{} for _ in range(N_TASKS)])
    epoch: list[int] = field(default_factory=lambda: [0] * N_TASKS)
    claimed: list[bool] = field(default_factory=lambda: [False] * N_TASKS)
    docs: dict[str, int] = field(default_factory=dict)


def ui(task_id: str, text: str) -> NewEntry:
    return NewEntry(
        task_id=task_id, kind=EntryKind.UI_MESSAGE, payload=dump_message(UIText(text=text))
    )


async def run(store: Store, ops: list[tuple[Any, ...]]) -> None:
    ids = []
    for _ in range(N_TASKS):
        t, _ = await store.create_task(Task(agent="a"))
        ids.append(t.id)
    m = Model()
    for o in ops:
        kind = o[0]
        if kind == "append":
            await store.commit(Commit(entries=[ui(ids[o[1]], x) for x in o[2]]))
            m.entries[o[1]] += o[2]
        elif kind == "context":
            await store.commit(Commit(patches=[TaskPatch(ids[o[1]], {"context": o[2]})]))
            m.context[o[1]] = o[2]
        elif kind == "doc":
            await store.commit(Commit(documents=[DocumentWrite("s", o[1], o[2])]))
            m.docs[o[1]] = o[2]
        elif kind == "multi":
            _, i, j, text, fail = o
            patches = (
                [TaskPatch(ids[j], {"status": TaskStatus.WAITING})] if fail else []
            )  # no reason: illegal
            c = Commit(entries=[ui(ids[i], text), ui(ids[j], text)], patches=patches)
            if fail:
                try:
                    await store.commit(c)
                except InvalidTransition:
                    continue
                raise AssertionError("an illegal transition was accepted")
            await store.commit(c)
            m.entries[i].append(text)
            m.entries[j].append(text)
        elif kind == "claim":
            got = await store.claim_task("w", ttl=3600)
            free = [i for i in range(N_TASKS) if not m.claimed[i]]
            if not free:
                assert got is None
                continue
            assert got is not None and got.id == ids[free[0]]
            m.claimed[free[0]] = True
            m.epoch[free[0]] += 1
        elif kind == "stale":
            i = o[1]
            try:
                await store.commit(
                    Commit(fence={ids[i]: m.epoch[i] - 1}, entries=[ui(ids[i], "stale")])
                )
            except StaleLease:
                continue
            raise AssertionError("a stale epoch was accepted")
    for i, tid in enumerate(ids):
        task = await store.get_task(tid)
        texts = [e.payload["text"] for e in await store.entries(tid, kinds=[EntryKind.UI_MESSAGE])]
        assert texts == m.entries[i]
        assert task.context == m.context[i]
        assert task.lease.epoch == m.epoch[i]
        seqs = [e.seq for e in await store.entries(tid)]
        assert seqs == list(range(1, len(seqs) + 1)) and task.last_seq == len(seqs)
    for key, value in m.docs.items():
        doc = await store.get_document("s", key)
        assert doc is not None and doc.value == value
    for key in {"a", "b"} - set(m.docs):
        assert await store.get_document("s", key) is None


async def _with_store(url: str, ops: list[tuple[Any, ...]]) -> None:
    store = open_store(url)
    await store.open()
    try:
        await run(store, ops)
    finally:
        await store.close()


SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
