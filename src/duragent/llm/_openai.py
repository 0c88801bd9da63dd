"""OpenAI chat completions, streamed; also any OpenAI-compatible server via `base_url`
(vLLM, Ollama, llama.cpp, LM Studio...)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, NoReturn

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
    OutputSpec,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
    ToolSpec,
    UsageDelta,
)
from duragent.llm._http import (
    RETRYABLE_STATUS,
    SdkChat,
    body_message,
    connection_error,
    httpx_errors,
    raise_error,
    raise_status,
    resolve_key,
    retry_after as retry_after,  # re-exported
    scrub,
    status_text,
)
from duragent.llm._messages import wire_messages

try:
    import openai
except ImportError:  # the extra is not installed; OpenAIChat() says how to fix it
    openai = None  # type: ignore[assignment]

ENV_KEY = "OPENAI_API_KEY"

# The request fields the adapter owns; settings may not replace them.
_RESERVED = frozenset({"model", "messages", "tools", "stream", "stream_options"})

_FINISH: dict[str, FinishReason] = {
    "stop": "stop",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "length": "length",
    "content_filter": "content_filter",
}


class OpenAIChat(SdkChat):
    """A chat model served by the OpenAI API or an OpenAI-compatible server.

    The API key comes from `api_key=` or the OPENAI_API_KEY environment variable
    and is only ever sent in the Authorization header: it never appears in
    repr(), in error messages or in the task log. With `base_url` (a local
    server such as vLLM, Ollama, llama.cpp or LM Studio) a missing key is
    allowed and the placeholder "not-needed" is sent instead.

    `settings` (temperature, max_tokens, ...) are defaults merged under each
    request's own settings and sent as-is in the request body.

    The SDK's own retries are off: the duragent runtime owns the one retry
    policy, so transient failures surface as RetryableModelError at once.
    """

    provider = "OpenAI"

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout: float = 300.0,
        **settings: Any,
    ) -> None:
        if openai is None:
            raise MissingExtra("the OpenAI provider", "openai")
        key = resolve_key(self.provider, ENV_KEY, api_key, base_url)
        self.model = model
        self.name = f"openai:{model}"
        self.base_url = base_url
        self.settings = settings
        self._secret = key
        self._client = openai.AsyncOpenAI(
            api_key=key,
            base_url=base_url,
            max_retries=0,
            # A slow first token is normal for reasoning models; connecting is not.
            timeout=openai.Timeout(timeout, connect=min(timeout, 10.0)),
        )

    def request_body(self, request: ModelRequest) -> dict[str, Any]:
        """The JSON body sent for `request` (without the streaming fields)."""
        settings = {**self.settings, **request.settings}
        clash = sorted(_RESERVED & settings.keys())
        if clash:
            raise UsageError(
                f"model settings may not set {', '.join(clash)}; the OpenAI adapter sends those"
            )
        body: dict[str, Any] = {
            "model": _model_name(request.model, self.model),
            "messages": wire_messages(request.messages),
        }
        if request.tools:
            body["tools"] = [_tool(t) for t in request.tools]
        if request.output is not None:
            if "response_format" in settings:
                raise UsageError(
                    "model settings may not set response_format when the agent has an "
                    "output_type; the OpenAI adapter sends it"
                )
            body["response_format"] = _response_format(request.output)
        body.update(settings)
        return body

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        body = self.request_body(request)
        finish: FinishReason | None = None
        reported = UsageDelta()
        called = False
        started = False  # the response began: a failure now breaks an answer
        try:
            stream = await self._client.chat.completions.create(
                model=body.pop("model"),
                messages=body.pop("messages"),
                stream=True,
                stream_options={"include_usage": True},
                # Tools and settings go into the JSON body exactly as given.
                extra_body=body,
            )
            started = True
            async with stream:
                async for chunk in stream:
                    usage = getattr(chunk, "usage", None)
                    if usage is not None:
                        # Servers differ: OpenAI sends usage once at the end, some
                        # servers send running totals; emit only what is new.
                        delta = _usage_since(reported, usage)
                        if delta is not None:
                            yield delta
                    for choice in chunk.choices or ():
                        if choice.index not in (0, None):
                            continue  # n > 1 is not supported; keep the first choice
                        for event in _deltas(choice.delta):
                            called = called or isinstance(event, ToolCallDelta)
                            yield event
                        if choice.finish_reason:
                            finish = _FINISH.get(choice.finish_reason, "stop")
        except openai.APIStatusError as exc:
            _raise_status(exc, self._secret)
        except openai.APIConnectionError as exc:  # also APITimeoutError
            raise self._connection_error(exc, started) from exc
        except openai.APIError as exc:
            # An error event inside a 200 stream: the server failed mid-answer.
            _raise_stream_error(exc, self._secret)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise MalformedModelOutput(
                f"OpenAI sent a stream event that is not valid JSON: {exc}"
            ) from exc
        except openai.OpenAIError as exc:
            raise ModelError(scrub(f"OpenAI request failed: {exc}", self._secret)) from None
        except httpx_errors("RequestError") as exc:
            raise self._connection_error(exc, started) from exc
        if finish is None:
            raise RetryableModelError(
                "the OpenAI stream ended before the model finished (no finish_reason)"
            )
        if finish == "stop" and called:
            finish = "tool_calls"  # some compatible servers say "stop" after tool calls
        yield Finish(finish)

    def _connection_error(self, exc: BaseException, started: bool) -> RetryableModelError:
        return connection_error(
            "OpenAI",
            exc,
            started=started,
            base_url=self._client.base_url,
            sdk_connection_error=openai.APIConnectionError,
            sdk_timeout=openai.APITimeoutError,
        )


def _model_name(pinned: str, default: str) -> str:
    # The runtime may pin the full spec ("openai:gpt-4o-mini"); the API wants the bare name.
    name = pinned.removeprefix("openai:")
    return name or default


def _tool(spec: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": spec.name,
            "description": spec.description,
            "parameters": spec.parameters,
        },
    }


def _response_format(output: OutputSpec) -> dict[str, Any]:
    """OpenAI's native structured output: the answer's content is the JSON object."""
    schema = {"name": output.name, "schema": output.schema, "strict": output.strict}
    return {"type": "json_schema", "json_schema": schema}


def _deltas(delta: Any) -> list[StreamEvent]:
    events: list[StreamEvent] = []
    if delta is None:
        return events
    text = getattr(delta, "content", None) or getattr(delta, "refusal", None)
    if text:
        events.append(TextDelta(text))
    for position, call in enumerate(getattr(delta, "tool_calls", None) or ()):
        function = getattr(call, "function", None)
        index = call.index if call.index is not None else position
        events.append(
            ToolCallDelta(
                index=index,
                id=call.id or None,
                name=getattr(function, "name", None) or None,
                arguments=getattr(function, "arguments", None) or "",
            )
        )
    return events


def _usage_since(reported: UsageDelta, usage: Any) -> UsageDelta | None:
    prompt = getattr(usage, "prompt_tokens", None)
    completion = getattr(usage, "completion_tokens", None)
    prompt = reported.input_tokens if prompt is None else prompt
    completion = reported.output_tokens if completion is None else completion
    delta = UsageDelta(prompt - reported.input_tokens, completion - reported.output_tokens)
    reported.input_tokens, reported.output_tokens = prompt, completion
    return delta if delta.input_tokens or delta.output_tokens else None


# --- errors --------------------------------------------------------------------------


def _raise_status(exc: Any, secret: str) -> NoReturn:
    status = int(exc.status_code)
    text = status_text("OpenAI", status, body_message(exc.body))
    # A 429 for an exhausted quota or budget does not pass by waiting.
    out_of_quota = getattr(exc, "code", None) == "insufficient_quota"
    retryable = (status in RETRYABLE_STATUS or status >= 500) and not out_of_quota
    raise_status(exc, secret, text, retryable=retryable, env_var=ENV_KEY)


def _raise_stream_error(exc: Any, secret: str) -> NoReturn:
    kind = getattr(exc, "type", None)
    text = f"OpenAI failed mid-answer ({kind or 'error'}): {body_message(exc.body)}"
    raise_error(text, secret, exc, retryable=kind not in ("invalid_request_error",))
