"""No owner and the empty owner are one owner for a session's history, as for its scope."""

from __future__ import annotations

import pytest

from duragent import Agent, BuiltinTools, Runtime, ScriptedModel
from duragent.store import Store
from duragent.types import TaskStatus


@pytest.mark.parametrize(("first", "then"), [(None, ""), ("", None)])
async def test_continue_session_finds_the_history_of_no_owner_and_the_empty_owner(
    store: Store, first: str | None, then: str | None
) -> None:
    agent = Agent(
        name="chat",
        model=ScriptedModel(["noted", "again"]),
        tools=[],
        builtin_tools=BuiltinTools(plan=False),
    )
    async with Runtime(store, [agent], poll_interval=0.05) as rt:
        one = await (await rt.submit("chat", "remember 42", owner=first, session_id="s")).wait(30)
        assert one.status is TaskStatus.COMPLETED, one.error
        sub = await rt.submit(
            "chat", "what was it?", owner=then, session_id="s", continue_session=True
        )
        two = await sub.wait(30)
        assert two.status is TaskStatus.COMPLETED, two.error
        assert two.config.get("continues_session") == 2  # the first task's question and answer
        seen = [str(getattr(m, "content", "")) for m in await rt.store.model_view(two.id)]
        assert "remember 42" in seen and "noted" in seen
