"""Local HTTP servers that speak the OpenAI and Anthropic streaming wire formats.

The real SDKs talk to these over real sockets, so the adapters are tested
against the bytes a provider sends, not against mocks:

    with ScriptedOpenAIServer(["Hello!", [ToolCall("add", {"a": 1})]]) as server:
        model = OpenAIChat("gpt-4o-mini", base_url=server.base_url, api_key="sk-test")
        ...
        server.requests[0].json["messages"]

Turn *i* answers the *i*-th request (or, with `answer_by="history"`, the
request holding *i* assistant messages, so a resend after a restart gets the
same answer). A turn is a `str`, a list of `ToolCall`, a scripted `Turn`, an
`Answer` (adds usage and a native finish reason) or a `Reply` (exact bytes).
`turns` may also be a function of the `RecordedRequest`.

Faults injected with `fail_next`, `drop_next` and `stall_next` answer the next
requests instead of the script and never use up a turn: the request after a
fault gets the turn the faulted one would have got.

Each server runs its own event loop in a thread, so it serves async tests,
sync tests and other processes alike.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Literal

from duragent.llm._scripted import ToolCall, Turn

__all__ = [
    "Answer",
    "RecordedRequest",
    "Reply",
    "ScriptedAnthropicServer",
    "ScriptedOpenAIServer",
    "ScriptedServer",
    "ToolCall",
    "Turn",
    "sse",
]


@dataclass
class RecordedRequest:
    """One request exactly as the server read it."""

    method: str
    path: str
    headers: dict[str, str]  # names lower-cased
    raw_headers: list[tuple[str, str]]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    def raw(self) -> bytes:
        """Everything the client sent, head and body, for checks like 'the key is nowhere else'."""
        head = "".join(f"{k}: {v}\r\n" for k, v in self.raw_headers)
        return f"{self.method} {self.path}\r\n{head}\r\n".encode("latin-1") + self.body


@dataclass
class Answer:
    """What the model says in one turn, with the usage it reports."""

    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    input_tokens: int = 10
    output_tokens: int = 5
    finish: str | None = None  # the provider's own word ("length", "max_tokens"...)


@dataclass
class Reply:
    """One HTTP answer exactly as sent.

    Each item of `chunks` is one network write. `framing` is "chunked"
    (Transfer-Encoding: chunked, as the providers stream), "length"
    (Content-Length) or "close" (the body ends when the connection closes).
    `drop` closes the connection after the chunks without ending the body.
    """

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    chunks: list[bytes] = field(default_factory=list)
    framing: Literal["chunked", "length", "close"] = "chunked"
    drop: bool = False
    stall_after: int | None = None  # hold after this many chunks until release()


TurnLike = str | Sequence[ToolCall] | Turn | Answer | Reply
Script = Sequence[TurnLike] | Callable[[RecordedRequest], TurnLike]


def sse(data: Any, event: str | None = None) -> bytes:
    """One server-sent event; `data` is JSON-encoded unless it is str or bytes."""
    if isinstance(data, bytes):
        payload = data
    elif isinstance(data, str):
        payload = data.encode()
    else:
        payload = json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + payload + b"\n\n"


def _pieces(text: str, size: int) -> list[str]:
    size = max(1, size)
    return [text[i : i + size] for i in range(0, len(text), size)]


def _as_answer(turn: TurnLike) -> Answer | Reply:
    if isinstance(turn, Answer | Reply):
        return turn
    if isinstance(turn, str):
        return Answer(text=turn)
    if isinstance(turn, Turn):
        return Answer(text=turn.text, tool_calls=list(turn.tool_calls))
    return Answer(tool_calls=list(turn))


def _arguments(call: ToolCall) -> str:
    if call.raw_arguments is not None:
        return call.raw_arguments
    return json.dumps(call.arguments)


@dataclass
class _Fault:
    kind: Literal["fail", "drop", "stall"]
    status: int = 503
    message: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    after: int = 0
    code: str | None = None


class ScriptedServer:
    """The HTTP server both providers share; subclasses speak the wire format."""

    path = "/"
    provider = "server"

    def __init__(
        self,
        turns: Script = (),
        *,
        answer_by: Literal["request", "history"] = "request",
        chunk_delay: float = 0.0,
        text_chunk: int = 5,
        args_chunk: int = 4,
        write_size: int | None = None,
    ) -> None:
        """`chunk_delay` pauses between network writes (seconds) to make a stream
        slow; `text_chunk`/`args_chunk` are the characters of text / tool
        arguments per event; `write_size` re-cuts the body into writes of that
        many bytes, splitting events, lines and UTF-8 characters."""
        self._fn = turns if callable(turns) else None
        self._turns: list[TurnLike] = [] if callable(turns) else list(turns)
        self.answer_by = answer_by
        self.chunk_delay = chunk_delay
        self.text_chunk = text_chunk
        self.args_chunk = args_chunk
        self.write_size = write_size
        self.host = "127.0.0.1"
        self.port = 0
        self._requests: list[RecordedRequest] = []
        self._faults: list[_Fault] = []
        self._turn_stalls: dict[int, int] = {}  # turn -> stall after this many writes
        self._hangups = 0
        self._next_turn = 0
        self._cond = threading.Condition()
        self._stalled = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._release = asyncio.Event()
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    # --- the test's handle ---------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """What to pass as the SDK's `base_url`."""
        return self.url

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._cond:
            return list(self._requests)

    def fail_next(
        self,
        n: int = 1,
        status: int = 503,
        message: str = "try again later",
        *,
        headers: dict[str, str] | None = None,
        code: str | None = None,
    ) -> None:
        """Answer the next `n` requests with an HTTP error in the provider's format;
        `code` replaces the error code (OpenAI) or error type (Anthropic) in the body."""
        fault = _Fault("fail", status, message, dict(headers or {}), code=code)
        with self._cond:
            self._faults += [fault] * n

    def drop_next(self, n: int = 1, *, after: int = 2) -> None:
        """Stream the next `n` answers but cut the connection after `after` writes."""
        with self._cond:
            self._faults += [_Fault("drop", after=after) for _ in range(n)]

    def stall_next(self, *, after: int = 2) -> None:
        """Stream the next answer but hold it after `after` writes until `release()`
        (`wait_stalled()` returns once it holds; `wait_hangups()` once the client
        gave up on it, e.g. was killed)."""
        with self._cond:
            self._faults.append(_Fault("stall", after=after))
            self._stalled.clear()
            self._release = asyncio.Event()

    def stall_turn(self, turn: int, *, after: int = 2) -> None:
        """Like `stall_next`, for the first answer to turn `turn` (with
        `answer_by="history"`, the request holding `turn` assistant messages):
        to hold a later round of a task mid-stream. A resend of that turn after
        the stall is answered in full."""
        with self._cond:
            self._turn_stalls[turn] = after
            self._stalled.clear()
            self._release = asyncio.Event()

    def wait_stalled(self, timeout: float = 60.0) -> None:
        if not self._stalled.wait(timeout):
            raise TimeoutError(f"no stream stalled within {timeout}s")

    def release(self) -> None:
        """Let a stalled stream go on."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._release.set)

    def wait_hangups(self, n: int = 1, timeout: float = 60.0) -> None:
        """Wait until clients have hung up on `n` answers before their end."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._hangups >= n, timeout):
                raise TimeoutError(f"{self._hangups} clients hung up, expected {n}")

    def wait_for_requests(self, n: int, timeout: float = 60.0) -> list[RecordedRequest]:
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._requests) >= n, timeout):
                raise TimeoutError(f"{len(self._requests)} requests arrived, expected {n}")
            return list(self._requests)

    def start(self) -> ScriptedServer:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def close(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        self._loop = self._thread = None
        asyncio.run_coroutine_threadsafe(self._stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()

    def __enter__(self) -> ScriptedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the wire format, per provider ----------------------------------------------

    def render(self, answer: Answer, turn: int, request: Any) -> list[bytes]:
        """The server-sent events (one per item) that stream `answer`."""
        raise NotImplementedError

    def error_reply(
        self,
        status: int,
        message: str,
        headers: dict[str, str] | None = None,
        code: str | None = None,
    ) -> Reply:
        """An HTTP error response in the provider's format."""
        raise NotImplementedError

    def stream_headers(self) -> dict[str, str]:
        return {"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache"}

    def answer_reply(self, answer: Answer, turn: int, request: Any) -> Reply:
        """The HTTP answer that says `answer` (streamed, unless a subclass says otherwise)."""
        return Reply(headers=self.stream_headers(), chunks=self.render(answer, turn, request))

    # --- choosing the answer ----------------------------------------------------------

    def _reply_for(self, request: RecordedRequest) -> Reply:
        with self._cond:
            self._requests.append(request)
            self._cond.notify_all()
            if request.method != "POST" or request.path != self.path:
                return self.error_reply(404, f"no route for {request.method} {request.path}")
            try:
                body = request.json
            except ValueError:
                return self.error_reply(400, "the request body is not JSON")
            fault = self._faults.pop(0) if self._faults else None
            if fault is not None and fault.kind == "fail":
                return self.error_reply(fault.status, fault.message, fault.headers, fault.code)
            index, turn = self._turn(request, body, consume=fault is None)
            stall = self._turn_stalls.pop(index, None) if fault is None else None
        if turn is None:
            # Not retryable, so a test that runs off its script fails at once.
            return self.error_reply(400, f"the scripted server has no turn {index}")
        answer = _as_answer(turn)
        if isinstance(answer, Reply):
            reply = answer
        else:
            reply = self.answer_reply(answer, index, body)
            if self.write_size:
                data = b"".join(reply.chunks)
                reply.chunks = [
                    data[i : i + self.write_size] for i in range(0, len(data), self.write_size)
                ]
        if fault is not None and fault.kind == "drop":
            reply = Reply(reply.status, reply.headers, reply.chunks[: fault.after], drop=True)
        elif fault is not None and fault.kind == "stall":
            reply = Reply(reply.status, reply.headers, reply.chunks, stall_after=fault.after)
        elif stall is not None:
            reply = Reply(reply.status, reply.headers, reply.chunks, stall_after=stall)
        return reply

    def _turn(self, request: RecordedRequest, body: Any, consume: bool) -> tuple[int, Any]:
        if self.answer_by == "history":
            messages = body.get("messages", []) if isinstance(body, dict) else []
            index = sum(1 for m in messages if m.get("role") == "assistant")
        else:
            index = self._next_turn
            if consume:
                self._next_turn += 1
        if self._fn is not None:
            return index, self._fn(request)
        return index, self._turns[index] if index < len(self._turns) else None

    # --- HTTP/1.1 ------------------------------------------------------------------

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._connection, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        self._release.set()
        if self._server is not None:
            self._server.close()
        # Aborting the sockets ends every handler (a read or write fails), so
        # none is left pending when the loop stops.
        for writer in list(self._writers):
            writer.transport.abort()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        try:
            while True:
                request = await self._read_request(reader)
                if request is None:
                    return
                reply = self._reply_for(request)
                if not await self._send(reader, writer, reply):
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            self._writers.discard(writer)
            self._tasks.discard(task)
            writer.close()

    async def _read_request(self, reader: asyncio.StreamReader) -> RecordedRequest | None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return None  # the client closed a kept-alive connection
        lines = head.decode("latin-1").split("\r\n")
        method, target, _version = lines[0].split(" ", 2)
        raw_headers = []
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                raw_headers.append((name.strip(), value.strip()))
        headers = {k.lower(): v for k, v in raw_headers}
        length = int(headers.get("content-length", "0"))
        body = await reader.readexactly(length) if length else b""
        return RecordedRequest(method, target, headers, raw_headers, body)

    async def _hold(self, reader: asyncio.StreamReader) -> bool:
        """Wait for release(); False if the client hung up first."""
        released = asyncio.ensure_future(self._release.wait())
        hangup = asyncio.ensure_future(reader.read(1))
        await asyncio.wait({released, hangup}, return_when=asyncio.FIRST_COMPLETED)
        for task in (released, hangup):
            task.cancel()
        if hangup.done() and not hangup.cancelled():
            self._hung_up()
            return False
        return True

    def _hung_up(self) -> None:
        with self._cond:
            self._hangups += 1
            self._cond.notify_all()

    async def _send(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, reply: Reply
    ) -> bool:
        """Write `reply`; False when the connection cannot be reused."""
        try:
            return await self._write(reader, writer, reply)
        except ConnectionError:
            self._hung_up()
            return False

    async def _write(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, reply: Reply
    ) -> bool:
        headers = dict(reply.headers)
        if reply.framing == "chunked":
            headers["transfer-encoding"] = "chunked"
        elif reply.framing == "length":
            headers["content-length"] = str(sum(len(c) for c in reply.chunks))
        else:
            headers["connection"] = "close"
        try:
            reason = HTTPStatus(reply.status).phrase
        except ValueError:  # 529 and other provider-specific codes
            reason = "Overloaded" if reply.status == 529 else ""
        head = f"HTTP/1.1 {reply.status} {reason}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        writer.write(head.encode("latin-1"))
        await writer.drain()
        for i, chunk in enumerate(reply.chunks):
            if reply.stall_after is not None and i == reply.stall_after:
                self._stalled.set()
                if not await self._hold(reader):
                    return False
            if self.chunk_delay and i:
                await asyncio.sleep(self.chunk_delay)
            if reply.framing == "chunked":
                chunk = b"%x\r\n%s\r\n" % (len(chunk), chunk)
            writer.write(chunk)
            await writer.drain()
        if reply.drop:
            return False
        if reply.framing == "chunked":
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        return reply.framing != "close"


class ScriptedOpenAIServer(ScriptedServer):
    """Speaks `POST /v1/chat/completions` with `stream: true`, as api.openai.com does."""

    path = "/v1/chat/completions"
    provider = "openai"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def stream_headers(self) -> dict[str, str]:
        return {**super().stream_headers(), "x-request-id": "req_scripted"}

    def answer_reply(self, answer: Answer, turn: int, request: Any) -> Reply:
        if isinstance(request, dict) and request.get("stream"):
            return super().answer_reply(answer, turn, request)
        # Without `stream: true` the API answers one `chat.completion` object.
        model = request.get("model", "gpt-test") if isinstance(request, dict) else "gpt-test"
        calls = [
            {
                "id": f"call_{turn}_{j}",
                "type": "function",
                "function": {"name": call.name, "arguments": _arguments(call)},
            }
            for j, call in enumerate(answer.tool_calls)
        ]
        message: dict[str, Any] = {"role": "assistant", "content": answer.text or None}
        message["refusal"] = None
        if calls:
            message["tool_calls"] = calls
        completion = {
            "id": f"chatcmpl-{turn}",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": model,
            "system_fingerprint": "fp_scripted",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": answer.finish or ("tool_calls" if calls else "stop"),
                }
            ],
            "usage": {
                "prompt_tokens": answer.input_tokens,
                "completion_tokens": answer.output_tokens,
                "total_tokens": answer.input_tokens + answer.output_tokens,
            },
        }
        headers = {"content-type": "application/json", "x-request-id": "req_scripted"}
        return Reply(headers=headers, chunks=[json.dumps(completion).encode()], framing="length")

    def render(self, answer: Answer, turn: int, request: Any) -> list[bytes]:
        model = request.get("model", "gpt-test") if isinstance(request, dict) else "gpt-test"
        options = request.get("stream_options") if isinstance(request, dict) else None
        include_usage = bool(options and options.get("include_usage"))

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            data: dict[str, Any] = {
                "id": f"chatcmpl-{turn}",
                "object": "chat.completion.chunk",
                "created": 1_700_000_000,
                "model": model,
                "system_fingerprint": "fp_scripted",
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                ],
            }
            if include_usage:
                data["usage"] = None
            return sse(data)

        events = [chunk({"role": "assistant", "content": "", "refusal": None})]
        events += [chunk({"content": piece}) for piece in _pieces(answer.text, self.text_chunk)]
        for j, call in enumerate(answer.tool_calls):
            first = {
                "index": j,
                "id": f"call_{turn}_{j}",
                "type": "function",
                "function": {"name": call.name, "arguments": ""},
            }
            events.append(chunk({"tool_calls": [first]}))
            for piece in _pieces(_arguments(call), self.args_chunk):
                events.append(
                    chunk({"tool_calls": [{"index": j, "function": {"arguments": piece}}]})
                )
        finish = answer.finish or ("tool_calls" if answer.tool_calls else "stop")
        events.append(chunk({}, finish))
        if include_usage:
            usage = {
                "prompt_tokens": answer.input_tokens,
                "completion_tokens": answer.output_tokens,
                "total_tokens": answer.input_tokens + answer.output_tokens,
                "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
                "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
            }
            events.append(
                sse(
                    {
                        "id": f"chatcmpl-{turn}",
                        "object": "chat.completion.chunk",
                        "created": 1_700_000_000,
                        "model": model,
                        "system_fingerprint": "fp_scripted",
                        "choices": [],
                        "usage": usage,
                    }
                )
            )
        events.append(sse("[DONE]"))
        return events

    def error_reply(
        self,
        status: int,
        message: str,
        headers: dict[str, str] | None = None,
        code: str | None = None,
    ) -> Reply:
        kind = {
            401: "invalid_request_error",
            403: "permission_denied",
            429: "requests",
        }.get(status, "server_error" if status >= 500 else "invalid_request_error")
        codes = {401: "invalid_api_key", 404: "model_not_found", 429: "rate_limit_exceeded"}
        error = {"message": message, "type": kind, "param": None, "code": code or codes.get(status)}
        body = {"error": error}
        return Reply(
            status,
            {"content-type": "application/json", "x-request-id": "req_scripted", **(headers or {})},
            [json.dumps(body).encode()],
            framing="length",
        )


class ScriptedAnthropicServer(ScriptedServer):
    """Speaks `POST /v1/messages` with `stream: true`, as api.anthropic.com does."""

    path = "/v1/messages"
    provider = "anthropic"

    def stream_headers(self) -> dict[str, str]:
        return {**super().stream_headers(), "request-id": "req_scripted"}

    def render(self, answer: Answer, turn: int, request: Any) -> list[bytes]:
        model = request.get("model", "claude-test") if isinstance(request, dict) else "claude-test"
        message: dict[str, Any] = {
            "id": f"msg_{turn}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": answer.input_tokens,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
                "output_tokens": 1,
            },
        }
        events = [
            sse({"type": "message_start", "message": message}, "message_start"),
            sse({"type": "ping"}, "ping"),
        ]
        index = 0
        if answer.text:
            events.append(_block_start(index, {"type": "text", "text": ""}))
            for piece in _pieces(answer.text, self.text_chunk):
                events.append(_block_delta(index, {"type": "text_delta", "text": piece}))
            events.append(_block_stop(index))
            index += 1
        for j, call in enumerate(answer.tool_calls):
            block = {"type": "tool_use", "id": f"toolu_{turn}_{j}", "name": call.name, "input": {}}
            events.append(_block_start(index, block))
            events.append(_block_delta(index, {"type": "input_json_delta", "partial_json": ""}))
            for piece in _pieces(_arguments(call), self.args_chunk):
                events.append(
                    _block_delta(index, {"type": "input_json_delta", "partial_json": piece})
                )
            events.append(_block_stop(index))
            index += 1
        stop = answer.finish or ("tool_use" if answer.tool_calls else "end_turn")
        events.append(
            sse(
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop, "stop_sequence": None},
                    "usage": {"output_tokens": answer.output_tokens},
                },
                "message_delta",
            )
        )
        events.append(sse({"type": "message_stop"}, "message_stop"))
        return events

    def error_reply(
        self,
        status: int,
        message: str,
        headers: dict[str, str] | None = None,
        code: str | None = None,
    ) -> Reply:
        kind = {
            400: "invalid_request_error",
            401: "authentication_error",
            403: "permission_error",
            404: "not_found_error",
            413: "request_too_large",
            429: "rate_limit_error",
            529: "overloaded_error",
        }.get(status, "api_error" if status >= 500 else "invalid_request_error")
        body = {"type": "error", "error": {"type": code or kind, "message": message}}
        return Reply(
            status,
            {"content-type": "application/json", "request-id": "req_scripted", **(headers or {})},
            [json.dumps(body).encode()],
            framing="length",
        )


def _block_start(index: int, block: dict[str, Any]) -> bytes:
    return sse(
        {"type": "content_block_start", "index": index, "content_block": block},
        "content_block_start",
    )


def _block_delta(index: int, delta: dict[str, Any]) -> bytes:
    return sse(
        {"type": "content_block_delta", "index": index, "delta": delta}, "content_block_delta"
    )


def _block_stop(index: int) -> bytes:
    return sse({"type": "content_block_stop", "index": index}, "content_block_stop")
