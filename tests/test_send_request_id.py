"""A message sent with a request_id is sent once: a retried `send` (a REST POST that
timed out, say) sends nothing again, before or after the task took the message,
on every store and across a reopen of the store."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import drop_schema, require_postgres
from duragent import (
    Agent,
    BuiltinTools,
    DuplicateRequest,
    Runtime,
    ScriptedModel,
    Store,
    TaskStatus,
    Timing,
    UsageError,
)
from duragent.store import Commit
from duragent.types import EntryKind, NewEntry
from support.sending import Gate, roles, script


def agent(first: Gate, second: Gate) -> Agent:
    """'start' runs slow (held by `first`), 'look' runs lookup (held by `second`)."""
    slow, _ = first.tools()
    _, lookup = second.tools()
    return Agent(
        name="a",
        model=ScriptedModel(script),
        tools=[slow, lookup],
        builtin_tools=BuiltinTools(plan=False),
        timing=Timing(tool_grace=0),
    )


async def message_records(store: Store, task_id: str) -> list[dict[str, Any]]:
    entries = await store.entries(task_id, kinds=[EntryKind.CHECKPOINT])
    return [dict(e.payload) for e in entries if e.payload.get("type") in ("message", "delivered")]


async def test_a_repeat_sends_nothing_before_or_after_the_message_is_taken(store: Store) -> None:
    first, second = Gate(), Gate()
    async with Runtime(store, agents=[agent(first, second)]) as rt:
        sub = await rt.submit("a", "start", owner="u")
        await first.entered.wait()
        sent = await rt.send(sub.task_id, "look", owner="u", request_id="r1")
        again = await rt.send(sub.task_id, "look", owner="u", request_id="r1")
        assert again.id == sent.id and again.last_seq == sent.last_seq  # nothing written
        assert [m["text"] for m in again.config["inbox"]] == ["look"]
        assert sent.config["inbox"][0]["request_id"] == "r1"
        with pytest.raises(DuplicateRequest, match="another message"):
            await rt.send(sub.task_id, "something else", owner="u", request_id="r1")
        # The turn ends, the task takes the message and runs lookup with it.
        first.release.set()
        await second.entered.wait()
        live = await rt.get(sub.task_id)
        assert live.status is TaskStatus.RUNNING and "inbox" not in live.config
        repeat = await rt.send(sub.task_id, "look", owner="u", request_id="r1")
        assert repeat.last_seq == live.last_seq and "inbox" not in repeat.config
        with pytest.raises(DuplicateRequest):
            await rt.send(sub.task_id, "other", owner="u", request_id="r1")
        second.release.set()
        task = await sub.wait(20)
        # A repeat after the task ended is still the same request, not a new message.
        assert (await rt.send(task.id, "look", owner="u", request_id="r1")).id == task.id
        assert (await rt.get(task.id)).last_seq == task.last_seq
        view = await rt.model_view(task.id)
        records = await message_records(store, task.id)
    assert task.status is TaskStatus.COMPLETED
    assert roles(view).count("user:look") == 1
    assert [(r["type"], r.get("request_id")) for r in records] == [
        ("message", "r1"),
        ("delivered", None),
    ]
    assert first.runs == 1 and second.runs == 1


async def test_request_ids_are_per_task_and_checked(store: Store) -> None:
    first, second = Gate(), Gate()
    async with Runtime(store, agents=[agent(first, second)], run_worker=False) as rt:
        one = (await rt.submit("a", "start", owner="u")).task_id
        two = (await rt.submit("a", "start", owner="u")).task_id
        await rt.send(one, "hi", owner="u", request_id="same")
        await rt.send(two, "hi", owner="u", request_id="same")  # another task: sent too
        # Without a request_id the same text is another message.
        await rt.send(one, "hi", owner="u")
        with pytest.raises(UsageError, match="request_id"):
            await rt.send(one, "hi", owner="u", request_id="")
        assert [m["text"] for m in (await rt.get(one)).config["inbox"]] == ["hi", "hi"]
        assert len((await rt.get(two)).config["inbox"]) == 1


async def test_concurrent_repeats_send_one_message(store: Store) -> None:
    first, second = Gate(), Gate()
    async with Runtime(store, agents=[agent(first, second)], run_worker=False) as rt:
        tid = (await rt.submit("a", "start")).task_id
        got = await asyncio.gather(*(rt.send(tid, "hi", request_id="r") for _ in range(5)))
        assert {t.id for t in got} == {tid}
        task = await rt.get(tid)
        assert [m["text"] for m in task.config["inbox"]] == ["hi"]
        assert [r["type"] for r in await message_records(rt.store, tid)] == ["message"]


async def test_continue_session_retried_with_its_request_id_sends_once(store: Store) -> None:
    first, second = Gate(), Gate()
    async with Runtime(store, agents=[agent(first, second)]) as rt:
        live = await rt.submit("a", "start", owner="u", session_id="s")
        await first.entered.wait()
        for _ in range(2):
            sub = await rt.submit(
                "a", "look", owner="u", session_id="s", continue_session=True, request_id="c1"
            )
            assert sub.sent and sub.task_id == live.task_id
        with pytest.raises(DuplicateRequest):
            await rt.submit(
                "a", "other", owner="u", session_id="s", continue_session=True, request_id="c1"
            )
        assert [m["text"] for m in (await rt.get(live.task_id)).config["inbox"]] == ["look"]
        first.release.set()
        second.release.set()
        await live.wait(20)


async def test_a_request_id_is_found_past_the_first_page_of_the_log(store: Store) -> None:
    first, second = Gate(), Gate()
    async with Runtime(store, agents=[agent(first, second)], run_worker=False) as rt:
        tid = (await rt.submit("a", "start")).task_id

        def checkpoint(payload: dict[str, Any]) -> NewEntry:
            return NewEntry(task_id=tid, kind=EntryKind.CHECKPOINT, round=1, payload=payload)

        # A long log, then the record of a message already taken (out of the inbox).
        filler = [checkpoint({"type": "step", "n": i}) for i in range(520)]
        taken = checkpoint({"type": "message", "id": "m1", "text": "hi", "request_id": "deep"})
        await store.commit(Commit(entries=[*filler, taken]))
        before = await rt.get(tid)
        assert (await rt.send(tid, "hi", request_id="deep")).last_seq == before.last_seq
        with pytest.raises(DuplicateRequest):
            await rt.send(tid, "ho", request_id="deep")
        assert "inbox" not in (await rt.get(tid)).config


async def test_a_retried_continue_session_that_started_the_live_task_sends_nothing(
    store: Store,
) -> None:
    first, second = Gate(), Gate()
    async with Runtime(store, agents=[agent(first, second)]) as rt:
        asked: dict[str, Any] = {
            "owner": "u",
            "session_id": "s",
            "continue_session": True,
            "request_id": "c0",
        }
        started = await rt.submit("a", "start", **asked)
        assert started.created
        await first.entered.wait()
        retried = await rt.submit("a", "start", **asked)
        assert retried.task_id == started.task_id and not retried.created and not retried.sent
        with pytest.raises(DuplicateRequest):
            await rt.submit("a", "other", **asked)
        assert "inbox" not in (await rt.get(started.task_id)).config
        first.release.set()
        task = await started.wait(20)
        assert roles(await rt.model_view(task.id)).count("user:start") == 1


@pytest.fixture(params=["sqlite", "jsonl", "postgres"])
def durable_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/s.db"
    elif request.param == "jsonl":
        yield f"jsonl:///{tmp_path}/s"
    else:
        schema = f"test_{uuid.uuid4().hex[:12]}"
        yield f"{require_postgres()}?schema={schema}"
        drop_schema(schema)


async def test_the_request_id_outlives_a_reopen_of_the_store(durable_url: str) -> None:
    first, second = Gate(), Gate()
    first.release.set()
    second.release.set()
    agents = [agent(first, second)]
    async with Runtime(durable_url, agents=agents, run_worker=False) as rt:
        tid = (await rt.submit("a", "start")).task_id
        await rt.send(tid, "look", request_id="r1")
    async with Runtime(durable_url, agents=agents) as rt:
        done = await rt.wait(tid, timeout=20)
        assert done.status is TaskStatus.COMPLETED
    async with Runtime(durable_url, agents=agents, run_worker=False) as rt:
        assert (await rt.send(tid, "look", request_id="r1")).last_seq == done.last_seq
        with pytest.raises(DuplicateRequest):
            await rt.send(tid, "not that", request_id="r1")
        assert roles(await rt.model_view(tid)).count("user:look") == 1
