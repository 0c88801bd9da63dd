"""The Anthropic adapter, through the real `anthropic` SDK, against a local server
that speaks the messages streaming wire format."""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import AsyncGenerator, Callable
from email.utils import formatdate
from typing import Any

import pytest

from duragent.errors import (
    MalformedModelOutput,
    MissingCredential,
    ModelError,
    RetryableModelError,
    UsageError,
)
from duragent.llm import resolve_model
from duragent.llm._anthropic import AnthropicChat, to_anthropic_messages
from duragent.llm._base import (
    Finish,
    ModelRequest,
    Response,
    ResponseAssembler,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
    ToolSpec,
    UsageDelta,
)
from duragent.types import (
    AssistantMessage,
    FunctionCall,
    SystemMessage,
    ToolCallData,
    ToolMessage,
    UserMessage,
)
from support.llm_servers import (
    Answer,
    Reply,
    ScriptedAnthropicServer,
    ScriptedServer,
    ToolCall,
    sse,
)
from support.providers import provider_fixtures

KEY = "sk-ant-test-5ecret-0123456789abcdef"
HELLO = ModelRequest(model="", messages=[UserMessage(content="Hi")])
ANTHROPIC_ENV = (
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "ANTHROPIC_BASE_URL",
    "ANTHROPIC_PROFILE",
)


Serve = Callable[..., ScriptedAnthropicServer]
Chat = Callable[..., AnthropicChat]


class Anthropic:
    name = "anthropic"
    server_type = ScriptedAnthropicServer
    env = ANTHROPIC_ENV

    def model(self, server: ScriptedServer, **options: Any) -> AnthropicChat:
        options.setdefault("api_key", KEY)
        return AnthropicChat("claude-sonnet-5", base_url=server.base_url, **options)


provider, serve, chat, _no_provider_env = provider_fixtures(Anthropic())


async def collect(model: AnthropicChat, request: ModelRequest = HELLO) -> list[StreamEvent]:
    return [event async for event in model.stream(request)]


def assemble(events: list[StreamEvent]) -> Response:
    assembler = ResponseAssembler()
    for event in events:
        assembler.add(event)
    return assembler.response()


async def fails(
    model: AnthropicChat, request: ModelRequest = HELLO
) -> tuple[list[StreamEvent], Any]:
    """The events streamed before the stream raised, and the error."""
    events: list[StreamEvent] = []
    with pytest.raises(ModelError) as caught:
        async for event in model.stream(request):
            events.append(event)
    return events, caught.value


def leaks(error: BaseException) -> bool:
    shown = "".join(traceback.format_exception(error)) + repr(error) + str(error)
    return KEY in shown


def stream_of(*events: bytes) -> Reply:
    return Reply(headers={"content-type": "text/event-stream"}, chunks=list(events))


MESSAGE_START = sse(
    {
        "type": "message_start",
        "message": {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-5",
            "content": [],
            "stop_reason": None,
            "usage": {"input_tokens": 5, "output_tokens": 1},
        },
    },
    "message_start",
)


# --- streaming ---------------------------------------------------------------------------


async def test_text_streams_in_pieces_and_assembles_exactly(serve: Serve, chat: Chat) -> None:
    text = "Héllo, wörld! 🌍 Streaming works."
    # 5-byte writes cut events, lines and multi-byte characters apart.
    server = serve([Answer(text, input_tokens=31, output_tokens=17)], text_chunk=4, write_size=5)
    events = await collect(chat(server))

    pieces = [e.text for e in events if isinstance(e, TextDelta)]
    assert pieces == [text[i : i + 4] for i in range(0, len(text), 4)]
    assert events[0] == UsageDelta(31, 1)  # message_start: the prompt and the first token
    assert events[-2:] == [UsageDelta(0, 16), Finish("stop")]  # message_delta: the total
    response = assemble(events)
    assert (response.text, response.tool_calls, response.finish) == (text, [], "stop")
    assert (response.usage.input_tokens, response.usage.output_tokens) == (31, 17)


async def test_parallel_tool_calls_with_split_arguments_assemble(serve: Serve, chat: Chat) -> None:
    calls = [ToolCall("get_weather", {"city": "Paris", "unit": "C"}), ToolCall("get_time", {})]
    server = serve([Answer("Let me check.", calls)], args_chunk=3, write_size=7)
    events = await collect(chat(server))

    fragments = [e for e in events if isinstance(e, ToolCallDelta) and e.index == 0]
    assert len(fragments) > 5  # the arguments really arrived in pieces
    assert fragments[0] == ToolCallDelta(0, id="toolu_0_0", name="get_weather")
    response = assemble(events)
    assert response.text == "Let me check."
    assert response.tool_calls == [
        ToolCallData(
            id="toolu_0_0",
            function=FunctionCall(name="get_weather", arguments='{"city": "Paris", "unit": "C"}'),
        ),
        ToolCallData(id="toolu_0_1", function=FunctionCall(name="get_time", arguments="{}")),
    ]
    assert response.finish == "tool_calls"


@pytest.mark.parametrize(
    ("native", "finish"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("refusal", "content_filter"),
    ],
)
async def test_stop_reasons_map(serve: Serve, chat: Chat, native: str, finish: str) -> None:
    events = await collect(chat(serve([Answer("cut", finish=native)])))
    assert events[-1] == Finish(finish)  # type: ignore[arg-type]


async def test_cached_prompt_tokens_count_as_input(serve: Serve, chat: Chat) -> None:
    start = sse(
        {
            "type": "message_start",
            "message": {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": "m",
                "content": [],
                "usage": {
                    "input_tokens": 3,
                    "cache_creation_input_tokens": 100,
                    "cache_read_input_tokens": 2000,
                    "output_tokens": 1,
                },
            },
        },
        "message_start",
    )
    reply = stream_of(
        start,
        sse({"type": "content_block_start", "index": 0, "content_block": {"type": "text"}}),
        sse(
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "x"},
            },
            "content_block_delta",
        ),
        sse(
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn"},
                # A running total of one field; the cache fields keep theirs.
                "usage": {"input_tokens": 3, "output_tokens": 9},
            },
            "message_delta",
        ),
        sse({"type": "message_stop"}, "message_stop"),
    )
    response = assemble(await collect(chat(serve([reply]))))
    assert (response.usage.input_tokens, response.usage.output_tokens) == (2103, 9)


async def test_thinking_blocks_are_not_text(serve: Serve, chat: Chat) -> None:
    def delta(index: int, piece: dict[str, Any]) -> bytes:
        data = {"type": "content_block_delta", "index": index, "delta": piece}
        return sse(data, "content_block_delta")

    reply = stream_of(
        MESSAGE_START,
        sse(
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "thinking", "thinking": "", "signature": ""},
            },
            "content_block_start",
        ),
        delta(0, {"type": "thinking_delta", "thinking": "Let me think."}),
        delta(0, {"type": "signature_delta", "signature": "sig"}),
        sse(
            {"type": "content_block_start", "index": 1, "content_block": {"type": "text"}},
            "content_block_start",
        ),
        delta(1, {"type": "text_delta", "text": "Answer."}),
        sse(
            {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {}},
            "message_delta",
        ),
        sse({"type": "message_stop"}, "message_stop"),
    )
    response = assemble(await collect(chat(serve([reply]))))
    assert response.text == "Answer."


# --- the request -------------------------------------------------------------------------


async def test_request_translates_system_tools_and_merged_tool_results(
    serve: Serve, chat: Chat
) -> None:
    server = serve(["ok"])
    model = chat(server, max_tokens=1000, temperature=0.5)
    calls = [
        ToolCallData(id="toolu_a", function=FunctionCall(name="add", arguments='{"a": 1, "b": 2}')),
        ToolCallData(id="toolu_b", function=FunctionCall(name="now", arguments="")),
    ]
    messages = [
        SystemMessage(content="Be brief."),
        SystemMessage(content="Use tools."),
        UserMessage(content="Add, and tell the time."),
        AssistantMessage(content="On it.", tool_calls=calls),
        ToolMessage(tool_call_id="toolu_a", content="3"),
        ToolMessage(tool_call_id="toolu_b", content="noon"),
        UserMessage(content="And?"),
        AssistantMessage(content="3, at noon."),
        UserMessage(content="Thanks"),
    ]
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    request = ModelRequest(
        model="anthropic:claude-sonnet-5",
        messages=messages,
        tools=[ToolSpec("add", "Adds numbers.", schema)],
        settings={"temperature": 0.0, "stop_sequences": ["END"]},
    )
    await collect(model, request)

    sent = server.requests[0]
    assert (sent.method, sent.path) == ("POST", "/v1/messages")
    assert sent.json == {
        "model": "claude-sonnet-5",
        "max_tokens": 1000,
        "stream": True,
        "system": "Be brief.\n\nUse tools.",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Add, and tell the time."}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "On it."},
                    {"type": "tool_use", "id": "toolu_a", "name": "add", "input": {"a": 1, "b": 2}},
                    {"type": "tool_use", "id": "toolu_b", "name": "now", "input": {}},
                ],
            },
            {
                # Both results, then the user's words, in ONE user message.
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_a", "content": "3"},
                    {"type": "tool_result", "tool_use_id": "toolu_b", "content": "noon"},
                    {"type": "text", "text": "And?"},
                ],
            },
            {"role": "assistant", "content": [{"type": "text", "text": "3, at noon."}]},
            {"role": "user", "content": [{"type": "text", "text": "Thanks"}]},
        ],
        "tools": [{"name": "add", "description": "Adds numbers.", "input_schema": schema}],
        "temperature": 0.0,  # the request's settings win over the model's defaults
        "stop_sequences": ["END"],
    }
    # The key travels in the one header the SDK authenticates with, nowhere else.
    carriers = [k for k, v in sent.headers.items() if KEY in v]
    assert carriers in (["x-api-key"], ["authorization"])
    assert sent.raw().count(KEY.encode()) == 1


def test_malformed_tool_arguments_in_history_are_shown_not_fatal() -> None:
    call = ToolCallData(id="t1", function=FunctionCall(name="f", arguments='{"a": '))
    _, messages = to_anthropic_messages([AssistantMessage(tool_calls=[call])])
    assert messages[0]["content"][0]["input"] == {"_unparsed_arguments": '{"a": '}


def test_empty_assistant_text_is_left_out() -> None:
    system, messages = to_anthropic_messages(
        [UserMessage(content="a"), AssistantMessage(content=""), UserMessage(content="b")]
    )
    assert system == ""
    assert messages == [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    ]


async def test_settings_may_not_replace_what_the_adapter_sends(serve: Serve, chat: Chat) -> None:
    model = chat(serve(["ok"]))
    with pytest.raises(UsageError, match="system"):
        await collect(model, ModelRequest(model="", messages=[], settings={"system": "x"}))


# --- errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "headers", "expected"),
    [
        (429, {"retry-after": "7"}, 7.0),
        (529, {"retry-after": "3"}, 3.0),
        (503, {"retry-after-ms": "1500"}, 1.5),
        (500, {}, None),
    ],
)
async def test_overload_and_rate_limit_are_retryable(
    serve: Serve, chat: Chat, status: int, headers: dict[str, str], expected: float | None
) -> None:
    server = serve(["after the wait"])
    server.fail_next(1, status, "Overloaded", headers=headers)
    model = chat(server)

    events, error = await fails(model)
    assert events == []
    assert type(error) is RetryableModelError
    assert error.retry_after == expected
    assert f"({status}): Overloaded" in str(error)
    assert "[request id req_scripted]" in str(error)

    # The fault did not use up the turn: the retry gets it.
    assert assemble(await collect(model)).text == "after the wait"


async def test_retry_after_as_an_http_date(serve: Serve, chat: Chat) -> None:
    server = serve()
    server.fail_next(1, 529, "Overloaded", headers={"retry-after": formatdate(time.time() + 30)})
    _, error = await fails(chat(server))
    assert isinstance(error, RetryableModelError)
    assert str(error).startswith("Anthropic is overloaded (529): Overloaded")
    assert error.retry_after is not None
    assert 25 <= error.retry_after <= 31


@pytest.mark.parametrize(
    ("status", "wording"),
    [
        (400, "Anthropic rejected the request (400)"),
        (403, "Anthropic refused access (403)"),
        (404, "Anthropic does not know this model or endpoint (404)"),
        (413, "Anthropic rejected the request (413)"),
        (422, "Anthropic rejected the request (422)"),
    ],
)
async def test_request_errors_are_final(
    serve: Serve, chat: Chat, status: int, wording: str
) -> None:
    server = serve()
    server.fail_next(1, status, "nope")
    _, error = await fails(chat(server))
    assert type(error) is ModelError
    assert str(error).startswith(f"{wording}: nope")


async def test_rejected_key_names_the_variable_and_never_shows_the_key(
    serve: Serve, chat: Chat
) -> None:
    server = serve()
    server.fail_next(1, 401, f"invalid x-api-key {KEY}")
    _, error = await fails(chat(server))
    assert type(error) is ModelError
    assert "Anthropic rejected the API key (401)" in str(error)
    assert "ANTHROPIC_API_KEY" in str(error)
    assert not leaks(error)


@pytest.mark.parametrize(
    ("kind", "retryable"),
    [("overloaded_error", True), ("api_error", True), ("invalid_request_error", False)],
)
async def test_error_event_inside_the_stream(
    serve: Serve, chat: Chat, kind: str, retryable: bool
) -> None:
    error_event = sse({"type": "error", "error": {"type": kind, "message": "Overloaded"}}, "error")
    reply = stream_of(MESSAGE_START, error_event)
    events, error = await fails(chat(serve([reply])))
    assert events == [UsageDelta(5, 1)]
    assert type(error) is (RetryableModelError if retryable else ModelError)
    assert f"Anthropic failed mid-answer ({kind}): Overloaded" in str(error)


async def test_connection_dropped_mid_stream_is_retryable(serve: Serve, chat: Chat) -> None:
    server = serve(["a long answer that will not arrive in full"], text_chunk=4)
    server.drop_next(after=6)  # message_start, ping, block start, three deltas
    model = chat(server)

    events, error = await fails(model)
    assert type(error) is RetryableModelError
    assert "broke mid-answer" in str(error)
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["a lo", "ng a", "nswe"]
    assert assemble(await collect(model)).text == "a long answer that will not arrive in full"


async def test_stream_ending_without_a_stop_reason_is_retryable(serve: Serve, chat: Chat) -> None:
    events = ScriptedAnthropicServer().render(Answer("never finished"), 0, {})
    # The body ends cleanly, but before message_delta and message_stop.
    reply = Reply(headers={"content-type": "text/event-stream"}, chunks=events[:5])
    _, error = await fails(chat(serve([reply])))
    assert type(error) is RetryableModelError
    assert "ended before the model finished" in str(error)


async def test_unparseable_event_is_malformed_output(serve: Serve, chat: Chat) -> None:
    cut = b'event: content_block_delta\ndata: {"type": "content_block_delta", "ind\n\n'
    events, error = await fails(chat(serve([stream_of(MESSAGE_START, cut)])))
    assert type(error) is MalformedModelOutput
    assert "not valid JSON" in str(error)
    assert events == [UsageDelta(5, 1)]


async def test_unreachable_server_is_retryable() -> None:
    with socket.socket() as s:  # a port that was free a moment ago, now closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    model = AnthropicChat("m", base_url=f"http://127.0.0.1:{port}", api_key=KEY)
    try:
        _, error = await fails(model)
    finally:
        await model.aclose()
    assert type(error) is RetryableModelError
    assert "could not reach Anthropic" in str(error)


@pytest.mark.slow
async def test_silent_server_times_out_as_retryable(serve: Serve, chat: Chat) -> None:
    server = serve(["slow"])
    server.stall_next(after=1)  # headers and one event, then nothing until released
    try:
        _, error = await fails(chat(server, timeout=0.5))
    finally:
        server.release()
    assert type(error) is RetryableModelError
    assert "timeout" in str(error)


async def test_leaving_the_stream_early_closes_the_response(serve: Serve, chat: Chat) -> None:
    server = serve(["one two three four five six"], text_chunk=4)
    server.stall_next(after=4)
    model = chat(server)
    stream = model.stream(HELLO)
    assert isinstance(stream, AsyncGenerator)  # so it has aclose()
    gc.disable()  # the connection must close because the adapter closes it, not the GC
    try:
        first = await anext(stream)
        await asyncio.to_thread(server.wait_stalled)
        await stream.aclose()
        await asyncio.to_thread(server.wait_hangups, 1, 5.0)
    finally:
        gc.enable()
    assert first == UsageDelta(10, 1)
    assert assemble(await collect(model)).text == "one two three four five six"


# --- construction and credentials -----------------------------------------------------------


def test_missing_key_names_the_environment_variable() -> None:
    with pytest.raises(MissingCredential) as caught:
        AnthropicChat("claude-sonnet-5")
    assert caught.value.env_var == "ANTHROPIC_API_KEY"
    assert "set the ANTHROPIC_API_KEY environment variable" in str(caught.value)


async def test_key_from_the_environment_is_used(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    server = serve(["ok"])
    model = AnthropicChat("claude-sonnet-5", base_url=server.base_url)
    try:
        await collect(model)
    finally:
        await model.aclose()
    assert server.requests[0].raw().count(KEY.encode()) == 1


async def test_gateway_base_url_needs_no_key(serve: Serve) -> None:
    server = serve(["via the gateway"])
    model = AnthropicChat("claude-sonnet-5", base_url=server.base_url)
    try:
        assert assemble(await collect(model)).text == "via the gateway"
    finally:
        await model.aclose()
    assert b"not-needed" in server.requests[0].raw()


def test_repr_and_name_never_show_the_key() -> None:
    model = AnthropicChat("claude-sonnet-5", api_key=KEY)
    assert model.name == "anthropic:claude-sonnet-5"
    assert repr(model) == "AnthropicChat(model='claude-sonnet-5')"
    assert KEY not in repr(model) + str(model)


async def test_no_log_line_shows_the_key(
    serve: Serve, chat: Chat, caplog: pytest.LogCaptureFixture
) -> None:
    for name in ("", "anthropic", "httpx", "httpx2", "httpcore", "httpcore2"):
        caplog.set_level(logging.DEBUG, logger=name)
    server = serve(["ok"])
    server.fail_next(1, 401, f"bad key {KEY}")
    model = chat(server)
    await fails(model)
    await collect(model)
    assert caplog.records  # the SDK did log at debug level
    logged = "\n".join(r.getMessage() + repr(r.args) for r in caplog.records)
    assert KEY not in logged


@pytest.mark.slow
def test_missing_sdk_says_which_extra_to_install() -> None:
    code = (
        "import sys; sys.modules['anthropic'] = None\n"
        "from duragent.llm._anthropic import AnthropicChat\n"
        "from duragent.errors import MissingExtra\n"
        "try:\n"
        "    AnthropicChat('claude-sonnet-5', api_key='k')\n"
        "except MissingExtra as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install 'duragent[anthropic]'" in out.stdout


async def test_resolve_model_builds_a_working_adapter(serve: Serve) -> None:
    server = serve([Answer("resolved", input_tokens=2, output_tokens=3)])
    model = resolve_model("anthropic:claude-sonnet-5", base_url=server.base_url, api_key=KEY)
    assert isinstance(model, AnthropicChat)
    assert model.name == "anthropic:claude-sonnet-5"
    try:
        response = assemble(await collect(model))
    finally:
        await model.aclose()
    assert (response.text, response.finish) == ("resolved", "stop")
    assert (response.usage.input_tokens, response.usage.output_tokens) == (2, 3)
    assert server.requests[0].json["model"] == "claude-sonnet-5"
