"""The streaming model protocol every provider adapter implements."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from duragent.types import AssistantMessage, FunctionCall, ToolCallData, Usage

FinishReason = Literal["stop", "tool_calls", "length", "content_filter", "error"]


@dataclass(slots=True)
class TextDelta:
    text: str


@dataclass(slots=True)
class ToolCallDelta:
    """A piece of one tool call; pieces with the same index belong together."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""  # a fragment of the JSON argument text


@dataclass(slots=True)
class UsageDelta:
    input_tokens: int = 0
    output_tokens: int = 0


@dataclass(slots=True)
class Finish:
    reason: FinishReason


StreamEvent = TextDelta | ToolCallDelta | UsageDelta | Finish


@dataclass(slots=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema of the arguments object


@dataclass(slots=True, frozen=True)
class OutputSpec:
    """The shape a final answer must have (`Agent(output_type=...)`): a JSON schema
    of an object, and whether it meets OpenAI's strict subset (every property
    required, no other properties). Each adapter asks for it its own way: OpenAI
    with `response_format`, Anthropic with a tool the model must call to finish;
    either way the answer arrives as text, the JSON of the object."""

    name: str
    schema: dict[str, Any]
    strict: bool = False


@dataclass(slots=True)
class ModelRequest:
    """Everything a model call depends on. Pinned in the log before the call,
    so a resend after a crash asks the same question."""

    model: str
    # ApiMessage models, system message first. From the runtime a `Messages`
    # (llm/_messages.py): typed on access, or sent as plain data with `wire_messages`.
    messages: Sequence[Any]
    tools: list[ToolSpec] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    output: OutputSpec | None = None  # a structured final answer, pinned with the task


@runtime_checkable
class ChatModel(Protocol):
    """A model that streams its answer to a request.

    `stream` yields TextDelta / ToolCallDelta / UsageDelta events and ends with
    one Finish. Transient failures raise RetryableModelError (with
    retry_after when the server said so); others raise ModelError.
    """

    name: str

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]: ...


@dataclass
class Response:
    text: str
    tool_calls: list[ToolCallData]
    usage: Usage
    finish: FinishReason

    def message(self) -> AssistantMessage:
        return AssistantMessage(content=self.text or None, tool_calls=self.tool_calls or None)


class ResponseAssembler:
    """Turns a stream of events into the complete assistant message."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.usage = Usage()
        self.finish: FinishReason | None = None

    def add(self, event: StreamEvent) -> None:
        if isinstance(event, TextDelta):
            self.text.append(event.text)
        elif isinstance(event, ToolCallDelta):
            call = self.calls.setdefault(event.index, {"id": None, "name": "", "arguments": []})
            if event.id:
                call["id"] = event.id
            if event.name:
                call["name"] += event.name
            call["arguments"].append(event.arguments)
        elif isinstance(event, UsageDelta):
            self.usage = self.usage + Usage(
                input_tokens=event.input_tokens, output_tokens=event.output_tokens
            )
        elif isinstance(event, Finish):
            self.finish = event.reason

    def response(self, call_id_prefix: str = "call") -> Response:
        calls = []
        for i in sorted(self.calls):
            c = self.calls[i]
            calls.append(
                ToolCallData(
                    id=c["id"] or f"{call_id_prefix}_{i}",
                    function=FunctionCall(name=c["name"], arguments="".join(c["arguments"])),
                )
            )
        finish = self.finish or ("tool_calls" if calls else "stop")
        return Response("".join(self.text), calls, self.usage, finish)


def parse_arguments(text: str) -> dict[str, Any]:
    """Parse a tool call's argument text; raises ValueError with a readable reason."""
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"the arguments are not valid JSON ({exc.msg} at {exc.pos}): {text[:200]!r}"
        ) from exc
    if not isinstance(value, dict):
        raise ValueError(f"the arguments must be a JSON object, got {type(value).__name__}")
    return value
