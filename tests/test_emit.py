"""Custom events from tools (`ctx.emit`): committed once, seen by the event stream
(progress entries), the history, the webhook outbox, across a SIGKILL."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import drop_schema, require_postgres
from duragent import Agent, Runtime, ScriptedModel, ToolCall, ToolContext, tool
from duragent.store import open_store
from duragent.types import EntryKind
from duragent.webhooks import OUTBOX
from support.crashlib import finish, kill_at, spawn


async def what_was_emitted(url: str) -> tuple[str, dict[str, Any], list[Any], list[Any]]:
    """(status, the call's result, its events in the log, the outbox's task.event bodies)."""
    store = open_store(url)
    await store.open()
    try:
        (task,) = (await store.list_tasks()).tasks
        (result,) = await store.entries(task.id, kinds=[EntryKind.TOOL_RESULT])
        progress = await store.entries(task.id, kinds=[EntryKind.PROGRESS])
        events = [(e.payload["event"], e.payload["data"], e.payload["n"]) for e in progress]
        outbox = [d.value["body"] for d in await store.list_documents(OUTBOX)]
        hooked = [
            (b["event"]["name"], b["event"]["data"]) for b in outbox if b["type"] == "task.event"
        ]
        return task.status.value, result.payload, events, hooked
    finally:
        await store.close()


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """One store that the killed process and the one after it open."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/emit.db"
        return
    schema = f"test_{uuid.uuid4().hex[:12]}"
    yield f"{require_postgres()}?schema={schema}"
    drop_schema(schema)


@pytest.mark.slow
async def test_an_event_committed_before_a_sigkill_is_not_emitted_again_by_the_rerun(
    url: str,
) -> None:
    kill_at(spawn("emit_agent.py", url, "after_emit", "safe"), "AT after_emit")
    out = finish(spawn("emit_agent.py", url, "none", "safe"))
    assert "DONE completed" in out
    status, result, events, hooked = await what_was_emitted(url)
    assert status == "completed" and result["content"] == "worked (attempt 2)"
    # The re-run's first emit was the one already committed: once each.
    assert events == [("phase", {"step": 1}, 1), ("done", {"step": 2}, 2)]
    assert hooked == [("phase", {"step": 1}), ("done", {"step": 2})]


@pytest.mark.slow
async def test_an_event_of_an_interrupted_never_call_stays_once(url: str) -> None:
    kill_at(spawn("emit_agent.py", url, "after_emit", "never"), "AT after_emit")
    out = finish(spawn("emit_agent.py", url, "none", "never"))
    assert "DONE completed" in out
    status, result, events, hooked = await what_was_emitted(url)
    assert status == "completed" and result["outcome"] == "interrupted"
    assert events == [("phase", {"step": 1}, 1)]
    assert hooked == [("phase", {"step": 1})]


async def test_events_show_in_history_and_bad_ones_are_clear_errors() -> None:
    @tool
    async def work(ctx: ToolContext) -> str:
        await ctx.emit("rows", {"count": 3})
        await ctx.emit("note")
        return "ok"

    @tool
    async def bad(what: str, ctx: ToolContext) -> str:
        await ctx.emit("" if what == "name" else "x", {1, 2} if what == "data" else "y" * 20_000)
        return "not reached"

    model = ScriptedModel(
        [
            [ToolCall("work", {}), ToolCall("bad", {"what": "name"})],
            [ToolCall("bad", {"what": "data"}), ToolCall("bad", {"what": "size"})],
            "Done.",
        ]
    )
    agent = Agent(name="e", model=model, tools=[work, bad])
    async with Runtime("memory://", agents=[agent]) as rt:
        task = await (await rt.submit("e", "go")).wait(30)
        history = await rt.history(task.id)
        results = await rt.store.entries(task.id, kinds=[EntryKind.TOOL_RESULT])
    first = history.rounds[0].calls[0]
    assert [(e.name, e.data) for e in first.events] == [("rows", {"count": 3}), ("note", None)]
    errors = [r.payload["content"] for r in results if r.payload["outcome"] == "error"]
    assert len(errors) == 3
    assert "an event name is a string of 1 to 100 characters" in errors[0]
    assert "its data must be JSON" in errors[1]
    assert "at most 16384" in errors[2]


async def test_an_event_reaches_the_tasks_event_stream(tmp_path: Path) -> None:
    import httpx

    from duragent.server import TokenStore, create_app
    from support.api import TOKENS, auth

    @tool
    async def work(ctx: ToolContext) -> str:
        await ctx.emit("rows", {"count": 3})
        return "ok"

    agent = Agent(name="e", model=ScriptedModel([[ToolCall("work", {})], "Done."]), tools=[work])
    async with Runtime(f"sqlite:///{tmp_path}/e.db", [agent]) as rt:
        task = await (await rt.submit("e", "go", owner="alice")).wait(30)
        app = create_app(rt, TokenStore.from_mapping(TOKENS))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as c:
            r = await c.get(f"/v1/tasks/{task.id}/events", headers=auth("alice"))
    assert r.status_code == 200
    frames = [f for f in r.text.split("\n\n") if "event: progress" in f]
    payloads = [json.loads(f.split("data: ", 1)[1])["payload"] for f in frames]
    assert payloads == [{"call_id": "call_0_0", "event": "rows", "data": {"count": 3}, "n": 1}]


async def test_a_rerun_skips_exactly_the_events_the_log_holds() -> None:
    """An earlier run's 2nd emit landed but its 1st did not (it failed, or they
    raced): the re-run commits the 1st and 3rd, and never the 2nd again."""
    from types import SimpleNamespace

    from duragent.runtime._context import ToolContext

    sent: list[int] = []

    async def tool_event(call_id: str, name: str, data: object, n: int) -> None:
        sent.append(n)

    task = SimpleNamespace(id="t", owner=None, session_id=None)
    host: Any = SimpleNamespace(task=task, store=None, tool_event=tool_event)
    ctx = ToolContext(host, "c", 1, 2, replay="safe", emitted=frozenset({2}))
    for i in range(3):
        await ctx.emit("step", {"i": i})
    assert sent == [1, 3]
