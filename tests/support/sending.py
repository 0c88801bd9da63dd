"""What the tests of messages sent into a live task share: a tool that holds its
round open, a model script that says what it has seen, and a view in short."""

from __future__ import annotations

import asyncio
from typing import Any

from duragent import ToolCall, tool
from duragent.types import AssistantMessage, ToolMessage, UserMessage


class Gate:
    """A tool that holds its round open until the test lets it go."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.runs = 0

    def tools(self) -> list[Any]:
        @tool
        async def slow() -> str:
            """Take a while."""
            self.runs += 1
            self.entered.set()
            await self.release.wait()
            return "slow done"

        @tool(replay="safe")
        async def lookup() -> str:
            """Look something up (harmless to repeat)."""
            self.runs += 1
            self.entered.set()
            await self.release.wait()
            return "looked up"

        return [slow, lookup]


def script(messages: list[Any]) -> Any:
    """'start' calls slow, 'look' calls lookup; a tool result or another user
    message is answered with what the model has seen."""
    last = messages[-1]
    if isinstance(last, ToolMessage):
        return f"answer after {last.content!r}"
    if isinstance(last, UserMessage) and last.content == "start":
        return [ToolCall("slow")]
    if isinstance(last, UserMessage) and last.content == "look":
        return [ToolCall("lookup")]
    seen = sum(isinstance(m, AssistantMessage) for m in messages)
    return f"re {last.content!r} having said {seen}"


def roles(view: list[Any]) -> list[str]:
    out = []
    for m in view:
        content = getattr(m, "content", None) or ""
        out.append(f"{m.role}:{content}" if content else m.role)
    return out
