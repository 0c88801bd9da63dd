"""A deterministic model for tests and the demo: no network, same answer after a restart."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from duragent.llm.base import (
    Finish,
    ModelRequest,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
    UsageDelta,
)
from duragent.types import AssistantMessage


@dataclass
class ToolCall:
    """A tool call a scripted turn makes."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    raw_arguments: str | None = None  # exact argument text, e.g. to script malformed JSON


@dataclass
class Turn:
    """A scripted answer: text, tool calls, or both."""

    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)


TurnLike = str | Sequence[ToolCall] | Turn
ScriptFn = Callable[[list[Any]], TurnLike]


def _as_turn(turn: TurnLike) -> Turn:
    if isinstance(turn, Turn):
        return turn
    if isinstance(turn, str):
        return Turn(text=turn)
    return Turn(tool_calls=list(turn))


class ScriptedModel:
    """Turn *i* answers the *i*-th model call of a task, counted from the
    assistant messages already in the model view, so it answers the same after
    a restart. `ScriptedModel(fn)` asks `fn(messages)` instead.

    `chunk_delay` streams text in pieces of `chunk_size` characters with that
    pause between them (seconds), to show and test streaming.
    """

    def __init__(
        self,
        turns: Sequence[TurnLike] | ScriptFn,
        *,
        name: str = "scripted",
        chunk_delay: float = 0.0,
        chunk_size: int = 8,
        final: str = "Done.",
    ) -> None:
        self.name = name
        self._fn: ScriptFn | None = turns if callable(turns) else None
        self._turns: list[TurnLike] = [] if callable(turns) else list(turns)
        self.chunk_delay = chunk_delay
        self.chunk_size = chunk_size
        self.final = final
        self.calls = 0  # model calls made through this instance

    def turn_for(self, messages: list[Any]) -> Turn:
        if self._fn is not None:
            return _as_turn(self._fn(messages))
        i = sum(1 for m in messages if isinstance(m, AssistantMessage))
        return _as_turn(self._turns[i] if i < len(self._turns) else self.final)

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        self.calls += 1
        turn = self.turn_for(request.messages)
        i = sum(1 for m in request.messages if isinstance(m, AssistantMessage))
        text = turn.text
        step = max(1, self.chunk_size)
        for start in range(0, len(text), step):
            if self.chunk_delay:
                await asyncio.sleep(self.chunk_delay)
            yield TextDelta(text[start : start + step])
        for j, call in enumerate(turn.tool_calls):
            args = call.raw_arguments
            if args is None:
                args = json.dumps(call.arguments)
            yield ToolCallDelta(index=j, id=f"call_{i}_{j}", name=call.name, arguments=args)
        prompt = sum(len(str(getattr(m, "content", "") or "")) for m in request.messages)
        yield UsageDelta(input_tokens=max(1, prompt // 4), output_tokens=max(1, len(text) // 4))
        yield Finish("tool_calls" if turn.tool_calls else "stop")
