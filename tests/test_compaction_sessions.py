"""A session whose turns compact: its transcript and its next turn's history are
the whole conversation, never a turn's summary."""

from __future__ import annotations

from duragent import Runtime, ScriptedModel, Store, TaskStatus
from duragent.types import EntryKind
from support.long_task import WindowedModel, agent_with, long_task_script

SUMMARY = "[Summary of rounds"


async def test_a_compacted_session_keeps_its_whole_conversation(store: Store) -> None:
    model = WindowedModel(ScriptedModel(long_task_script(20)), window=6_000)
    async with Runtime(store, agents=[agent_with(model, window=6_000)]) as rt:
        sub = await rt.submit("long", "Fetch every page, one by one.", session_id="s1")
        first = await sub.wait(timeout=120)
        assert first.status is TaskStatus.COMPLETED, first.error
        logged = await store.entries(first.id, kinds=[EntryKind.API_MESSAGE, EntryKind.TOOL_RESULT])
        assert await store.entries(first.id, kinds=[EntryKind.COMPACTION])
        assert len(logged) == 42  # the task, 20 calls and their results, the answer
        # The next turn starts from all of it (its own view then compacts).
        second = await (await rt.continue_session("s1", "Say it again.")).wait(timeout=120)
        assert second.status is TaskStatus.COMPLETED, second.error
        api = [EntryKind.API_MESSAGE, EntryKind.TOOL_RESULT]
        round0 = [e for e in await store.entries(second.id, kinds=api) if e.round == 0]
        assert second.config["continues_session"] == 42
        assert [e.payload["content"] for e in round0[:1]] == ["Fetch every page, one by one."]
        assert not any(SUMMARY in str(e.payload.get("content")) for e in round0)
        assert await store.entries(second.id, kinds=[EntryKind.COMPACTION])
        session = await rt.session("s1")
    said = session.transcript
    assert len(said) == 42 + 2  # turn 1 whole, then turn 2's question and answer
    assert not any(SUMMARY in (m.content or "") for m in said if m.role == "user")
    assert said[0].content == "Fetch every page, one by one."
    assert said[-2].content == "Say it again." and said[-1].content == "All 20 steps done."
