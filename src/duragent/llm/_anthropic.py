"""Anthropic messages, streamed."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, NoReturn, cast

from duragent.errors import (
    MalformedModelOutput,
    MissingExtra,
    ModelError,
    RetryableModelError,
    UsageError,
)
from duragent.llm._base import (
    Finish,
    FinishReason,
    ModelRequest,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
    ToolSpec,
    UsageDelta,
    parse_arguments,
)
from duragent.llm._http import (
    RETRYABLE_STATUS,
    SdkChat,
    body_message,
    connection_error,
    httpx_errors,
    raise_status,
    resolve_key,
    retry_after as retry_after,  # re-exported
    scrub,
    status_text,
)
from duragent.types import AssistantMessage, SystemMessage, ToolMessage, UserMessage

try:
    import anthropic
except ImportError:  # the extra is not installed; AnthropicChat() says how to fix it
    anthropic = None  # type: ignore[assignment]

ENV_KEY = "ANTHROPIC_API_KEY"

_RESERVED = frozenset({"model", "messages", "system", "tools", "stream"})

# The tool a model with a structured final answer calls to give it (Anthropic has
# no response format): its input is the answer; the adapter hands it on as text.
OUTPUT_TOOL = "final_result"

_FINISH: dict[str, FinishReason] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "refusal": "content_filter",
}

# Error types (in the body of an HTTP error or of a mid-stream `error` event)
# that a later attempt may not meet.
_RETRYABLE_TYPES = frozenset({"overloaded_error", "api_error", "rate_limit_error", "timeout_error"})


class AnthropicChat(SdkChat):
    """A chat model served by the Anthropic messages API.

    The API key comes from `api_key=` or the ANTHROPIC_API_KEY environment
    variable and is only ever sent in the SDK's authentication header: it never
    appears in repr(), in error messages or in the task log. With `base_url` (a
    proxy or gateway that holds the key itself) a missing key is allowed and the
    placeholder "not-needed" is sent instead.

    `max_tokens` is required by the API; `settings` (temperature, top_p,
    stop_sequences, ...) are defaults merged under each request's own settings
    and sent as-is in the request body.

    The SDK's own retries are off: the duragent runtime owns the one retry policy.
    """

    provider = "Anthropic"

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        max_tokens: int = 4096,
        timeout: float = 300.0,
        **settings: Any,
    ) -> None:
        if anthropic is None:
            raise MissingExtra("the Anthropic provider", "anthropic")
        key = resolve_key(self.provider, ENV_KEY, api_key, base_url)
        self.model = model
        self.name = f"anthropic:{model}"
        self.base_url = base_url
        self.max_tokens = max_tokens
        self.settings = settings
        self._secret = key
        self._client = anthropic.AsyncAnthropic(
            api_key=key,
            base_url=base_url,
            max_retries=0,
            timeout=anthropic.Timeout(timeout, connect=min(timeout, 10.0)),
        )

    def request_body(self, request: ModelRequest) -> dict[str, Any]:
        """The JSON body sent for `request` (without `stream`)."""
        settings = {"max_tokens": self.max_tokens, **self.settings, **request.settings}
        clash = sorted(_RESERVED & settings.keys())
        if clash:
            raise UsageError(
                f"model settings may not set {', '.join(clash)}; the Anthropic adapter sends those"
            )
        system, messages = to_anthropic_messages(request.messages)
        body: dict[str, Any] = {
            "model": request.model.removeprefix("anthropic:") or self.model,
            "messages": messages,
        }
        if system:
            body["system"] = system
        if request.tools:
            body["tools"] = [_tool(t) for t in request.tools]
        if request.output is not None:
            _ask_for_output(body, request, settings)
        body.update(settings)
        return body

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        body = self.request_body(request)
        finish: FinishReason | None = None
        usage = _UsageTotals()
        calls: dict[int, int] = {}  # content block index -> tool call index
        # Content blocks of the output tool: their input is the answer, sent on as text.
        answers: set[int] = set()
        output = request.output is not None
        started = False  # the response began: a failure now breaks an answer
        try:
            stream = await self._client.messages.create(
                model=body.pop("model"),
                max_tokens=body.pop("max_tokens"),
                messages=body.pop("messages"),
                stream=True,
                # System, tools and settings go into the JSON body exactly as given.
                extra_body=body,
            )
            started = True
            async with stream:
                # Read loosely: unknown (newer) event and block types are skipped.
                events = cast("AsyncIterator[Any]", stream)
                async for event in events:
                    kind = event.type
                    if kind == "message_start":
                        delta = usage.update(event.message.usage)
                        if delta is not None:
                            yield delta
                    elif kind == "content_block_start":
                        block = event.content_block
                        if block.type == "tool_use" and output and block.name == OUTPUT_TOOL:
                            answers.add(event.index)
                        elif block.type == "tool_use":
                            calls[event.index] = len(calls)
                            yield ToolCallDelta(calls[event.index], id=block.id, name=block.name)
                    elif kind == "content_block_delta":
                        piece = event.delta
                        if piece.type == "text_delta" and piece.text:
                            yield TextDelta(piece.text)
                        elif piece.type == "input_json_delta" and event.index in answers:
                            if piece.partial_json:
                                yield TextDelta(piece.partial_json)
                        elif piece.type == "input_json_delta" and event.index in calls:
                            fragment = piece.partial_json or ""
                            yield ToolCallDelta(calls[event.index], arguments=fragment)
                    elif kind == "message_delta":
                        delta = usage.update(event.usage)
                        if delta is not None:
                            yield delta
                        if event.delta.stop_reason:
                            finish = _FINISH.get(event.delta.stop_reason, "stop")
        except anthropic.APIStatusError as exc:
            _raise_status(exc, self._secret)
        except anthropic.APIConnectionError as exc:  # also APITimeoutError
            raise self._connection_error(exc, started) from exc
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise MalformedModelOutput(
                f"Anthropic sent a stream event that is not valid JSON: {exc}"
            ) from exc
        except anthropic.AnthropicError as exc:
            raise ModelError(scrub(f"Anthropic request failed: {exc}", self._secret)) from None
        except httpx_errors("RequestError") as exc:
            raise self._connection_error(exc, started) from exc
        if finish is None:
            raise RetryableModelError(
                "the Anthropic stream ended before the model finished (no stop_reason)"
            )
        if finish == "tool_calls" and answers and not calls:
            finish = "stop"  # the output tool was the only call: the answer is given
        yield Finish(finish)

    def _connection_error(self, exc: BaseException, started: bool) -> RetryableModelError:
        return connection_error(
            "Anthropic",
            exc,
            started=started,
            base_url=self._client.base_url,
            sdk_connection_error=anthropic.APIConnectionError,
            sdk_timeout=anthropic.APITimeoutError,
        )


def _ask_for_output(body: dict[str, Any], request: ModelRequest, settings: Any) -> None:
    """Anthropic's structured output: a tool whose input is the answer, which the
    model must call (the only tool it may call when it has no other, else any)."""
    output = request.output
    assert output is not None
    if "tool_choice" in settings:
        raise UsageError(
            "model settings may not set tool_choice when the agent has an output_type; "
            "the Anthropic adapter sends it"
        )
    if any(t.name == OUTPUT_TOOL for t in request.tools):
        raise UsageError(
            f"a tool is named {OUTPUT_TOOL!r}, the name the Anthropic adapter gives the "
            "tool of a structured answer; rename the tool"
        )
    tool = {
        "name": OUTPUT_TOOL,
        "description": "Give your final answer: call this, with the answer as its input, "
        "once you are done (and only then).",
        "input_schema": output.schema,
    }
    body["tools"] = [*body.get("tools", []), tool]
    if request.tools:
        body["tool_choice"] = {"type": "any"}
    else:
        body["tool_choice"] = {"type": "tool", "name": OUTPUT_TOOL}


def to_anthropic_messages(messages: Sequence[Any]) -> tuple[str, list[dict[str, Any]]]:
    """Split OpenAI-shaped API messages into Anthropic's `system` and `messages`.

    Every message becomes a list of content blocks, and consecutive messages of
    the same role are merged, because Anthropic wants all the tool results
    answering one assistant turn in the single user message that follows it.
    """
    system: list[str] = []
    out: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})

    for m in messages:
        if isinstance(m, SystemMessage):
            system.append(m.content)
        elif isinstance(m, UserMessage):
            add("user", _text(m.content))
        elif isinstance(m, ToolMessage):
            add(
                "user",
                [{"type": "tool_result", "tool_use_id": m.tool_call_id, "content": m.content}],
            )
        elif isinstance(m, AssistantMessage):
            blocks = _text(m.content or "")
            for call in m.tool_calls or ():
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": call.id,
                        "name": call.function.name,
                        "input": _tool_input(call.function.arguments),
                    }
                )
            add("assistant", blocks)
        else:
            raise UsageError(f"cannot send a {type(m).__name__} to Anthropic")
    return "\n\n".join(system), out


def _text(text: str) -> list[dict[str, Any]]:
    # Anthropic rejects empty text blocks.
    return [{"type": "text", "text": text}] if text else []


def _tool_input(arguments: str) -> dict[str, Any]:
    try:
        return parse_arguments(arguments)
    except ValueError:
        # The model once sent arguments that are not a JSON object; show it
        # what it sent rather than fail the whole conversation.
        return {"_unparsed_arguments": arguments}


def _tool(spec: ToolSpec) -> dict[str, Any]:
    return {"name": spec.name, "description": spec.description, "input_schema": spec.parameters}


class _UsageTotals:
    """Anthropic reports running totals, a field at a time; turn them into increments."""

    # Cached prompt tokens are prompt tokens too (as in OpenAI's prompt_tokens).
    INPUT = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")

    def __init__(self) -> None:
        self.latest = dict.fromkeys((*self.INPUT, "output_tokens"), 0)
        self.reported = UsageDelta()

    def update(self, usage: Any) -> UsageDelta | None:
        for name in self.latest:
            value = getattr(usage, name, None)
            if value is not None:  # a field left out keeps its last total
                self.latest[name] = value
        total = UsageDelta(
            sum(self.latest[name] for name in self.INPUT), self.latest["output_tokens"]
        )
        delta = UsageDelta(
            total.input_tokens - self.reported.input_tokens,
            total.output_tokens - self.reported.output_tokens,
        )
        self.reported = total
        return delta if delta.input_tokens or delta.output_tokens else None


# --- errors --------------------------------------------------------------------------


def _raise_status(exc: Any, secret: str) -> NoReturn:
    status = int(exc.status_code)
    error = exc.body.get("error") if isinstance(exc.body, Mapping) else None
    kind = error.get("type") if isinstance(error, Mapping) else None
    message = body_message(exc.body)
    if status == 200:
        # An `error` event inside a successful stream: the server failed mid-answer.
        text = f"Anthropic failed mid-answer ({kind or 'error'}): {message}"
        retryable = kind is None or kind in _RETRYABLE_TYPES
    else:
        text = status_text("Anthropic", status, message)
        retryable = status in RETRYABLE_STATUS or status >= 500 or kind in _RETRYABLE_TYPES
    raise_status(exc, secret, text, retryable=retryable, env_var=ENV_KEY)
