"""The OpenAI adapter, through the real `openai` SDK, against a local server that
speaks the chat-completions streaming wire format."""

from __future__ import annotations

import asyncio
import gc
import json
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
from duragent.llm._openai import OpenAIChat, retry_after
from duragent.types import (
    AssistantMessage,
    FunctionCall,
    SystemMessage,
    ToolCallData,
    ToolMessage,
    UserMessage,
)
from support.llm_servers import Answer, Reply, ScriptedOpenAIServer, ScriptedServer, ToolCall, sse
from support.providers import provider_fixtures

KEY = "sk-test-5ecret-0123456789abcdef"
HELLO = ModelRequest(model="", messages=[UserMessage(content="Hi")])


Serve = Callable[..., ScriptedOpenAIServer]
Chat = Callable[..., OpenAIChat]


class OpenAI:
    name = "openai"
    server_type = ScriptedOpenAIServer
    env = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_ORG_ID", "OPENAI_PROJECT_ID")

    def model(self, server: ScriptedServer, **options: Any) -> OpenAIChat:
        options.setdefault("api_key", KEY)
        return OpenAIChat("gpt-4o-mini", base_url=server.base_url, **options)


provider, serve, chat, _no_provider_env = provider_fixtures(OpenAI())


async def collect(model: OpenAIChat, request: ModelRequest = HELLO) -> list[StreamEvent]:
    return [event async for event in model.stream(request)]


def assemble(events: list[StreamEvent]) -> Response:
    assembler = ResponseAssembler()
    for event in events:
        assembler.add(event)
    return assembler.response()


async def fails(model: OpenAIChat, request: ModelRequest = HELLO) -> tuple[list[StreamEvent], Any]:
    """The events streamed before the stream raised, and the error."""
    events: list[StreamEvent] = []
    with pytest.raises(ModelError) as caught:
        async for event in model.stream(request):
            events.append(event)
    return events, caught.value


def leaks(error: BaseException) -> bool:
    shown = "".join(traceback.format_exception(error)) + repr(error) + str(error)
    return KEY in shown


# --- streaming ---------------------------------------------------------------------------


async def test_text_streams_in_pieces_and_assembles_exactly(serve: Serve, chat: Chat) -> None:
    text = "Héllo, wörld! 🌍 Streaming works."
    # 5-byte writes cut events, lines and multi-byte characters apart.
    server = serve([Answer(text, input_tokens=31, output_tokens=17)], text_chunk=4, write_size=5)
    events = await collect(chat(server))

    pieces = [e.text for e in events if isinstance(e, TextDelta)]
    assert pieces == [text[i : i + 4] for i in range(0, len(text), 4)]
    assert events[-2:] == [UsageDelta(31, 17), Finish("stop")]
    response = assemble(events)
    assert (response.text, response.tool_calls, response.finish) == (text, [], "stop")
    assert (response.usage.input_tokens, response.usage.output_tokens) == (31, 17)


async def test_parallel_tool_calls_with_split_arguments_assemble(serve: Serve, chat: Chat) -> None:
    calls = [ToolCall("get_weather", {"city": "Paris", "unit": "C"}), ToolCall("get_time", {})]
    server = serve([Answer("Let me check.", calls)], args_chunk=3, write_size=7)
    events = await collect(chat(server))

    fragments = [e for e in events if isinstance(e, ToolCallDelta) and e.index == 0]
    assert len(fragments) > 5  # the arguments really arrived in pieces
    response = assemble(events)
    assert response.text == "Let me check."
    assert response.tool_calls == [
        ToolCallData(
            id="call_0_0",
            function=FunctionCall(name="get_weather", arguments='{"city": "Paris", "unit": "C"}'),
        ),
        ToolCallData(id="call_0_1", function=FunctionCall(name="get_time", arguments="{}")),
    ]
    assert response.finish == "tool_calls"


async def test_interleaved_tool_call_fragments_are_joined_by_index(
    serve: Serve, chat: Chat
) -> None:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return sse({"id": "c", "object": "chat.completion.chunk", "choices": [choice]})

    def call(index: int, **fields: Any) -> dict[str, Any]:
        return {"tool_calls": [{"index": index, **fields}]}

    reply = Reply(
        headers={"content-type": "text/event-stream"},
        chunks=[
            chunk(call(0, id="call_a", type="function", function={"name": "f", "arguments": ""})),
            chunk(call(1, id="call_b", type="function", function={"name": "g", "arguments": '{"'})),
            chunk(call(0, function={"arguments": '{"x": '})),
            chunk(call(1, function={"arguments": 'y": 2}'})),
            chunk(call(0, function={"arguments": "1}"})),
            chunk({}, "tool_calls"),
            sse({"id": "c", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}}),
            sse("[DONE]"),
        ],
    )
    response = assemble(await collect(chat(serve([reply]))))
    assert [(c.id, c.function.name, c.function.arguments) for c in response.tool_calls] == [
        ("call_a", "f", '{"x": 1}'),
        ("call_b", "g", '{"y": 2}'),
    ]
    assert (response.usage.input_tokens, response.usage.output_tokens) == (3, 4)


async def test_stop_after_tool_calls_counts_as_tool_calls(serve: Serve, chat: Chat) -> None:
    # Some OpenAI-compatible servers (older Ollama, vLLM) finish tool calls with "stop".
    call = {"index": 0, "id": "call_x", "function": {"name": "f", "arguments": "{}"}}
    reply = Reply(
        headers={"content-type": "text/event-stream"},
        chunks=[
            sse({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}),
            sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
            sse("[DONE]"),
        ],
    )
    events = await collect(chat(serve([reply])))
    assert events[-1] == Finish("tool_calls")


async def test_running_usage_totals_are_not_double_counted(serve: Serve, chat: Chat) -> None:
    # Some OpenAI-compatible servers put the running usage in every chunk.
    def chunk(delta: dict[str, Any], completion: int, finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        usage = {"prompt_tokens": 12, "completion_tokens": completion}
        return sse({"id": "c", "choices": [choice], "usage": usage})

    reply = Reply(
        headers={"content-type": "text/event-stream"},
        chunks=[chunk({"content": "a"}, 1), chunk({"content": "b"}, 2), chunk({}, 3, "stop")],
        framing="close",  # as some servers do: no [DONE], the body ends at close
    )
    response = assemble(await collect(chat(serve([reply]))))
    assert (response.text, response.finish) == ("ab", "stop")
    assert (response.usage.input_tokens, response.usage.output_tokens) == (12, 3)


@pytest.mark.parametrize(
    ("native", "finish"), [("length", "length"), ("content_filter", "content_filter")]
)
async def test_finish_reasons_map(serve: Serve, chat: Chat, native: str, finish: str) -> None:
    events = await collect(chat(serve([Answer("cut", finish=native)])))
    assert events[-1] == Finish(finish)  # type: ignore[arg-type]


# --- the request -------------------------------------------------------------------------


async def test_request_carries_messages_tools_and_settings(serve: Serve, chat: Chat) -> None:
    server = serve(["ok"])
    model = chat(server, temperature=0.5, top_p=0.9)
    call = ToolCallData(id="call_1", function=FunctionCall(name="add", arguments='{"a": 1}'))
    messages = [
        SystemMessage(content="Be brief."),
        UserMessage(content="Add 1."),
        AssistantMessage(tool_calls=[call]),
        ToolMessage(tool_call_id="call_1", content="1"),
        AssistantMessage(content="It is 1."),
        UserMessage(content="Thanks"),
    ]
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    request = ModelRequest(
        model="openai:gpt-4o-mini",
        messages=messages,
        tools=[ToolSpec("add", "Adds numbers.", schema)],
        settings={"temperature": 0.0, "max_tokens": 50},
    )
    await collect(model, request)

    sent = server.requests[0]
    assert (sent.method, sent.path) == ("POST", "/v1/chat/completions")
    assert sent.json == {
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Add 1."},
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "add", "arguments": '{"a": 1}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "1"},
            {"role": "assistant", "content": "It is 1."},
            {"role": "user", "content": "Thanks"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {"name": "add", "description": "Adds numbers.", "parameters": schema},
            }
        ],
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.0,  # the request's settings win over the model's defaults
        "top_p": 0.9,
        "max_tokens": 50,
    }
    assert sent.headers["authorization"] == f"Bearer {KEY}"
    assert sent.raw().count(KEY.encode()) == 1  # the key travels in that header only


async def test_settings_may_not_replace_what_the_adapter_sends(serve: Serve, chat: Chat) -> None:
    model = chat(serve(["ok"]))
    with pytest.raises(UsageError, match="stream"):
        await collect(model, ModelRequest(model="", messages=[], settings={"stream": False}))


# --- errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after": "7"}, 7.0),
        ({"retry-after-ms": "1500", "retry-after": "9"}, 1.5),
        ({}, None),
    ],
)
async def test_rate_limit_is_retryable_and_says_when(
    serve: Serve, chat: Chat, headers: dict[str, str], expected: float | None
) -> None:
    server = serve(["after the wait"])
    server.fail_next(1, 429, "Rate limit reached for requests", headers=headers)
    model = chat(server)

    events, error = await fails(model)
    assert events == []
    assert type(error) is RetryableModelError
    assert error.retry_after == expected
    assert "OpenAI rate-limited the request (429): Rate limit reached" in str(error)

    # The fault did not use up the turn: the retry gets it.
    assert assemble(await collect(model)).text == "after the wait"


async def test_exhausted_quota_is_final(serve: Serve, chat: Chat) -> None:
    server = serve()
    server.fail_next(1, 429, "You exceeded your current quota.", code="insufficient_quota")
    _, error = await fails(chat(server))
    assert type(error) is ModelError
    assert "(429): You exceeded your current quota." in str(error)


async def test_retry_after_as_an_http_date(serve: Serve, chat: Chat) -> None:
    server = serve()
    server.fail_next(1, 503, "busy", headers={"retry-after": formatdate(time.time() + 30)})
    _, error = await fails(chat(server))
    assert isinstance(error, RetryableModelError)
    assert error.retry_after is not None
    assert 25 <= error.retry_after <= 31


def test_retry_after_parsing() -> None:
    now = 1_700_000_000.0
    assert retry_after({"retry-after": formatdate(now + 12, usegmt=True)}, now=now) == 12.0
    assert retry_after({"retry-after": formatdate(now - 5, usegmt=True)}, now=now) == 0.0
    assert retry_after({"retry-after": "soon"}) is None
    assert retry_after({"retry-after-ms": "250"}) == 0.25
    assert retry_after(None) is None


@pytest.mark.parametrize("status", [408, 409, 500, 502, 503, 504])
async def test_transient_statuses_are_retryable(serve: Serve, chat: Chat, status: int) -> None:
    server = serve()
    server.fail_next(1, status, "flaky", headers={"retry-after": "2"})
    _, error = await fails(chat(server))
    assert type(error) is RetryableModelError
    assert error.retry_after == 2.0
    assert f"({status}): flaky" in str(error)


@pytest.mark.parametrize(
    ("status", "wording"),
    [
        (400, "OpenAI rejected the request (400)"),
        (403, "OpenAI refused access (403)"),
        (404, "OpenAI does not know this model or endpoint (404)"),
        (422, "OpenAI rejected the request (422)"),
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
    # The server echoes the key, as a careless proxy might.
    server.fail_next(1, 401, f"Incorrect API key provided: {KEY}.")
    _, error = await fails(chat(server))
    assert type(error) is ModelError
    assert "OpenAI rejected the API key (401)" in str(error)
    assert "OPENAI_API_KEY" in str(error)
    assert not leaks(error)


async def test_connection_dropped_mid_stream_is_retryable(serve: Serve, chat: Chat) -> None:
    server = serve(["a long answer that will not arrive in full"], text_chunk=4)
    server.drop_next(after=3)
    model = chat(server)

    events, error = await fails(model)
    assert type(error) is RetryableModelError
    assert "broke mid-answer" in str(error)
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["a lo", "ng a"]
    assert assemble(await collect(model)).text == "a long answer that will not arrive in full"


async def test_stream_ending_without_a_finish_is_retryable(serve: Serve, chat: Chat) -> None:
    events = ScriptedOpenAIServer().render(Answer("never finished"), 0, {})
    # The body ends cleanly, but before the finish_reason and [DONE].
    reply = Reply(headers={"content-type": "text/event-stream"}, chunks=events[:3], framing="close")
    _, error = await fails(chat(serve([reply])))
    assert type(error) is RetryableModelError
    assert "ended before the model finished" in str(error)


async def test_unparseable_event_is_malformed_output(serve: Serve, chat: Chat) -> None:
    good = sse({"id": "c", "choices": [{"index": 0, "delta": {"content": "Hi"}}]})
    reply = Reply(
        headers={"content-type": "text/event-stream"},
        chunks=[good, b'data: {"id": "c", "choices": [{"index": 0, "del\n\n', sse("[DONE]")],
    )
    events, error = await fails(chat(serve([reply])))
    assert type(error) is MalformedModelOutput
    assert "not valid JSON" in str(error)
    assert events == [TextDelta("Hi")]


async def test_error_event_inside_the_stream_is_retryable(serve: Serve, chat: Chat) -> None:
    error_event = {"error": {"message": "The server had an error.", "type": "server_error"}}
    reply = Reply(headers={"content-type": "text/event-stream"}, chunks=[sse(error_event)])
    _, error = await fails(chat(serve([reply])))
    assert type(error) is RetryableModelError
    assert "OpenAI failed mid-answer (server_error): The server had an error." in str(error)


async def test_unreachable_server_is_retryable() -> None:
    with socket.socket() as s:  # a port that was free a moment ago, now closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    model = OpenAIChat("m", base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY)
    try:
        _, error = await fails(model)
    finally:
        await model.aclose()
    assert type(error) is RetryableModelError
    assert "could not reach OpenAI" in str(error)


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
    server.stall_next(after=3)
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
    assert first == TextDelta("one ")
    assert assemble(await collect(model)).text == "one two three four five six"


async def test_server_answers_resends_alike_by_history(serve: Serve, chat: Chat) -> None:
    # What a crash-recovery test needs: a resend of the same history gets the same turn.
    server = serve(["first", "second"], answer_by="history")
    model = chat(server)
    answered = AssistantMessage(content="first")
    later = ModelRequest(model="", messages=[*HELLO.messages, answered, UserMessage(content="?")])
    assert assemble(await collect(model)).text == "first"
    assert assemble(await collect(model)).text == "first"
    assert assemble(await collect(model, later)).text == "second"
    assert len(server.wait_for_requests(3)) == 3


# --- construction and credentials -----------------------------------------------------------


def test_missing_key_names_the_environment_variable() -> None:
    with pytest.raises(MissingCredential) as caught:
        OpenAIChat("gpt-4o-mini")
    assert caught.value.env_var == "OPENAI_API_KEY"
    assert "set the OPENAI_API_KEY environment variable" in str(caught.value)


async def test_key_from_the_environment_is_used(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    server = serve(["ok"])
    model = OpenAIChat("gpt-4o-mini", base_url=server.base_url)
    try:
        await collect(model)
    finally:
        await model.aclose()
    assert server.requests[0].headers["authorization"] == f"Bearer {KEY}"


async def test_local_server_needs_no_key(serve: Serve) -> None:
    server = serve(["local answer"])
    model = OpenAIChat("llama3.1:8b", base_url=server.base_url)
    try:
        assert assemble(await collect(model)).text == "local answer"
    finally:
        await model.aclose()
    assert server.requests[0].headers["authorization"] == "Bearer not-needed"
    assert server.requests[0].json["model"] == "llama3.1:8b"


def test_repr_and_name_never_show_the_key() -> None:
    model = OpenAIChat("gpt-4o-mini", api_key=KEY, base_url="http://127.0.0.1:9/v1")
    assert model.name == "openai:gpt-4o-mini"
    assert repr(model) == "OpenAIChat(model='gpt-4o-mini', base_url='http://127.0.0.1:9/v1')"
    assert KEY not in repr(model) + str(model)


async def test_no_log_line_shows_the_key(
    serve: Serve, chat: Chat, caplog: pytest.LogCaptureFixture
) -> None:
    for name in ("", "openai", "httpx", "httpx2", "httpcore", "httpcore2"):
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
        "import sys; sys.modules['openai'] = None\n"
        "from duragent.llm._openai import OpenAIChat\n"
        "from duragent.errors import MissingExtra\n"
        "try:\n"
        "    OpenAIChat('gpt-4o-mini', api_key='k')\n"
        "except MissingExtra as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install 'duragent[openai]'" in out.stdout


async def test_resolve_model_builds_a_working_adapter(serve: Serve) -> None:
    server = serve([Answer("resolved", input_tokens=2, output_tokens=1)])
    model = resolve_model("openai:gpt-4o-mini", base_url=server.base_url, api_key=KEY)
    assert isinstance(model, OpenAIChat)
    assert model.name == "openai:gpt-4o-mini"
    try:
        response = assemble(await collect(model))
    finally:
        await model.aclose()
    assert (response.text, response.finish) == ("resolved", "stop")
    assert json.loads(server.requests[0].body)["model"] == "gpt-4o-mini"
