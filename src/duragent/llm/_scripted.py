"""A deterministic model for tests and the demo: no network, same answer after a restart."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from duragent.llm._base import (
    Finish,
    ModelRequest,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
    UsageDelta,
)
from duragent.llm._messages import Messages, typed_list
from duragent.types import AssistantMessage


@dataclass
class ToolCall:
    """A tool call a scripted turn makes."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    raw_arguments: str | None = None  # exact argument text, e.g. to script malformed JSON


@dataclass
class Turn:
    """A scripted answer: text, tool calls, or both. `output` (a pydantic model or
    a JSON value) is a structured answer: its JSON is the text."""

    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    output: Any = None

    def __post_init__(self) -> None:
        if self.output is not None:
            dump = getattr(self.output, "model_dump_json", None)
            self.text = dump() if dump is not None else json.dumps(self.output)


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
    a restart. `ScriptedModel(fn)` asks `fn(messages)` instead, and so does a
    turn that is a function: a scripted answer can then depend on what the
    tools returned (a result, an error, an interrupted call), as a model's would.

    `chunk_delay` streams text in pieces of `chunk_size` characters with that
    pause between them (seconds), to show and test streaming.
    """

    def __init__(
        self,
        turns: Sequence[TurnLike | ScriptFn] | ScriptFn,
        *,
        name: str = "scripted",
        chunk_delay: float = 0.0,
        chunk_size: int = 8,
        final: str = "Done.",
    ) -> None:
        self.name = name
        self._fn: ScriptFn | None = turns if callable(turns) else None
        self._turns: list[TurnLike | ScriptFn] = [] if callable(turns) else list(turns)
        self.chunk_delay = chunk_delay
        self.chunk_size = chunk_size
        self.final = final
        self.calls = 0  # model calls made through this instance
        self.last_request: ModelRequest | None = None  # what the last call asked
        # id(last message) -> (that message, its index, assistants, characters)
        self._counted: dict[int, tuple[Any, int, int, int]] = {}

    def turn_for(self, messages: Sequence[Any]) -> Turn:
        return self._turn(messages, 0 if self._fn is not None else self._count(messages)[0])

    def _turn(self, messages: Sequence[Any], assistants: int) -> Turn:
        """The answer to `messages`, which hold `assistants` assistant messages."""
        if self._fn is not None:
            return _as_turn(self._fn(typed_list(messages)))
        turns = self._turns
        turn = turns[assistants] if assistants < len(turns) else self.final
        if callable(turn):
            turn = turn(typed_list(messages))
        return _as_turn(turn)

    def _count(self, messages: Sequence[Any]) -> tuple[int, int]:
        """(assistant messages, characters of content) in `messages`.

        A task's next request is its previous one plus a few messages, so the
        counts are carried over from the last request that ended with the same
        message object: a long task is not rescanned on every call, and this
        test model does not dominate what a long-task benchmark measures.
        """
        if isinstance(messages, Messages):
            messages = messages.typed_list()  # a list, copied in C: indexed without a call each
        start, assistants, chars = 0, 0, 0
        for j in range(len(messages) - 1, max(-1, len(messages) - 9), -1):
            hit = self._counted.get(id(messages[j]))
            if hit is not None and hit[0] is messages[j] and hit[1] == j:
                start, assistants, chars = j + 1, hit[2], hit[3]
                break
        for m in messages[start:]:
            assistants += isinstance(m, AssistantMessage)
            chars += len(str(getattr(m, "content", "") or ""))
        if messages:
            if len(self._counted) > 4096:
                self._counted.clear()
            last = messages[-1]
            self._counted[id(last)] = (last, len(messages) - 1, assistants, chars)
        return assistants, chars

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        self.calls += 1
        self.last_request = request
        i, prompt = self._count(request.messages)
        turn = self._turn(request.messages, i)
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
        yield UsageDelta(input_tokens=max(1, prompt // 4), output_tokens=max(1, len(text) // 4))
        yield Finish("tool_calls" if turn.tool_calls else "stop")
