"""Agent tasks through the Runtime with the real OpenAI and Anthropic SDKs, against
local servers that speak each provider's streaming wire format over real sockets:
several rounds with parallel tool calls, token usage, retries, a rejected key,
malformed tool arguments, a SIGKILL mid-stream, and the API key never written."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from duragent import Agent, BuiltinTools, ChatModel, Runtime, Task, tool
from duragent.cli._tasks import export_task
from duragent.llm._anthropic import AnthropicChat
from duragent.llm._openai import OpenAIChat
from duragent.store import open_store
from duragent.types import EntryKind, TaskStatus, UIError, UINotice
from support.crashlib import close_pipes, dump, finish, read_until
from support.llm_servers import (
    Answer,
    RecordedRequest,
    ScriptedAnthropicServer,
    ScriptedOpenAIServer,
    ScriptedServer,
    ToolCall,
)
from support.providers import provider_fixtures

SECRET = "sk-test-SECRET-123"
HERE = Path(__file__).parent
Serve = Callable[..., ScriptedServer]
Chat = Callable[..., ChatModel]


@dataclass(frozen=True)
class Provider:
    name: str
    label: str  # as the adapter's errors name it
    server_type: type[ScriptedServer]
    env_key: str
    env_base_url: str
    model_name: str
    call_prefix: str  # how the server names tool calls: <prefix>_<turn>_<index>

    @property
    def env(self) -> tuple[str, ...]:
        return (self.env_key, self.env_base_url)

    @property
    def spec(self) -> str:
        return f"{self.name}:{self.model_name}"

    def model(self, server: ScriptedServer, **options: Any) -> OpenAIChat | AnthropicChat:
        options.setdefault("api_key", SECRET)
        if self.name == "openai":
            return OpenAIChat(self.model_name, base_url=server.base_url, **options)
        return AnthropicChat(self.model_name, base_url=server.base_url, **options)

    def key_sent(self, request: RecordedRequest) -> str:
        """The key the SDK authenticated with (Anthropic's SDK may use either header)."""
        if "x-api-key" in request.headers:
            return request.headers["x-api-key"]
        return request.headers["authorization"].removeprefix("Bearer ")

    def tool_results(self, request: RecordedRequest) -> list[tuple[str, str]]:
        """(call id, content) of every tool result the request sends, in order."""
        out = []
        for m in request.json["messages"]:
            if self.name == "openai" and m["role"] == "tool":
                out.append((m["tool_call_id"], m["content"]))
            elif self.name == "anthropic" and isinstance(m["content"], list):
                out += [
                    (b["tool_use_id"], b["content"])
                    for b in m["content"]
                    if b["type"] == "tool_result"
                ]
        return out


PROVIDERS = [
    Provider(
        "openai",
        "OpenAI",
        ScriptedOpenAIServer,
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
        "gpt-4o-mini",
        "call",
    ),
    Provider(
        "anthropic",
        "Anthropic",
        ScriptedAnthropicServer,
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_BASE_URL",
        "claude-sonnet-5",
        "toolu",
    ),
]


def assistant_count(request: RecordedRequest) -> int:
    return sum(1 for m in request.json["messages"] if m["role"] == "assistant")


provider, serve, chat, _no_provider_env = provider_fixtures(*PROVIDERS)


async def run_task(tmp_path: Path, agent: Agent, text: str, timeout: float = 30) -> Task:
    async with Runtime(f"sqlite:///{tmp_path}/e2e.db", agents=[agent], poll_interval=0.05) as rt:
        sub = await rt.submit(agent.name, text)
        return await sub.wait(timeout=timeout)


async def ui_of(tmp_path: Path, task_id: str) -> list[Any]:
    async with Runtime(f"sqlite:///{tmp_path}/e2e.db", run_worker=False) as rt:
        return await rt.ui_messages(task_id)


async def results_of(tmp_path: Path, task_id: str) -> list[dict[str, Any]]:
    store = open_store(f"sqlite:///{tmp_path}/e2e.db")
    await store.open()
    try:
        entries = await store.entries(task_id, kinds=[EntryKind.TOOL_RESULT])
        return [e.payload for e in entries]
    finally:
        await store.close()


# --- a whole task ----------------------------------------------------------------------


async def test_rounds_with_parallel_tool_calls_complete_and_count_tokens(
    provider: Provider, serve: Serve, chat: Chat, tmp_path: Path
) -> None:
    together = asyncio.Barrier(3)

    async def meet() -> None:
        # Each of the three calls of round 1 waits for the other two: run one at a
        # time, the first would wait alone and fail.
        await asyncio.wait_for(together.wait(), 30)

    @tool(replay="safe")
    async def get_weather(city: str) -> str:
        """Get the weather for a city."""
        await meet()
        return f"{city}: {21 if city == 'Paris' else 24}°C"

    @tool(replay="safe")
    async def get_time(city: str) -> str:
        """Get the local time in a city."""
        await meet()
        return f"{city}: 14:05"

    @tool
    def to_fahrenheit(celsius: float) -> str:
        """Convert Celsius to Fahrenheit."""
        return f"{celsius * 9 / 5 + 32:.1f}°F"

    final = "Paris is 21°C (69.8°F); Rome is 24°C and it is 14:05 there."
    server = serve(
        [
            Answer(
                "Let me check both cities.",
                [
                    ToolCall("get_weather", {"city": "Paris"}),
                    ToolCall("get_weather", {"city": "Rome"}),
                    ToolCall("get_time", {"city": "Rome"}),
                ],
                input_tokens=100,
                output_tokens=20,
            ),
            Answer("Converting.", [ToolCall("to_fahrenheit", {"celsius": 21})], 150, 10),
            Answer(final, input_tokens=200, output_tokens=30),
        ],
        answer_by="history",
        text_chunk=3,
        args_chunk=5,
    )
    agent = Agent(
        name="weather",
        model=chat(server),
        instructions="You report the weather.",
        tools=[get_weather, get_time, to_fahrenheit],
        model_settings={"temperature": 0.1},
        builtin_tools=BuiltinTools(plan=False),
    )
    task = await run_task(tmp_path, agent, "Weather in Paris and Rome, please.")

    assert task.status is TaskStatus.COMPLETED, task.error
    assert (task.output, task.iterations) == (final, 3)
    # The usage the server reported for each answer, summed on the task.
    assert (task.usage.input_tokens, task.usage.output_tokens) == (450, 60)

    first, second, third = server.wait_for_requests(3)
    assert len(server.requests) == 3
    p = provider.call_prefix
    assert provider.tool_results(first) == []
    # Results go back in the order they finished; each answers its call by id.
    assert sorted(provider.tool_results(second)) == [
        (f"{p}_0_0", "Paris: 21°C"),
        (f"{p}_0_1", "Rome: 24°C"),
        (f"{p}_0_2", "Rome: 14:05"),
    ]
    assert provider.tool_results(third)[3:] == [(f"{p}_1_0", "69.8°F")]
    for request in (first, second, third):
        body = request.json
        assert body["model"] == provider.model_name and body["stream"] is True
        assert body["temperature"] == 0.1
        assert [t.get("name") or t["function"]["name"] for t in body["tools"]] == [
            "get_weather",
            "get_time",
            "to_fahrenheit",
        ]
        assert provider.key_sent(request) == SECRET
    outcomes = [r["outcome"] for r in await results_of(tmp_path, task.id)]
    assert outcomes == ["ok"] * 4


@pytest.mark.slow
async def test_rate_limit_is_retried_after_the_servers_wait_with_a_notice_each(
    provider: Provider, serve: Serve, chat: Chat, tmp_path: Path
) -> None:
    server = serve([Answer("Fine now.", input_tokens=7, output_tokens=3)], answer_by="history")
    server.fail_next(2, 429, "Rate limit reached for requests", headers={"retry-after": "1"})
    agent = Agent(name="a", model=chat(server), builtin_tools=BuiltinTools(plan=False))

    started = time.monotonic()
    task = await run_task(tmp_path, agent, "Hello")
    elapsed = time.monotonic() - started

    assert task.status is TaskStatus.COMPLETED, task.error
    assert task.output == "Fine now."
    assert (task.usage.input_tokens, task.usage.output_tokens) == (7, 3)
    assert elapsed >= 1.9  # two waits of the server's Retry-After: 1
    notices = [m.message for m in await ui_of(tmp_path, task.id) if isinstance(m, UINotice)]
    assert len(notices) == 2
    for attempt, text in enumerate(notices, 1):
        assert "rate-limited the request (429): Rate limit reached" in text
        # 1.0 s is the server's Retry-After; the runtime's own backoff would be jittered.
        assert f"retry {attempt} of 4 in 1.0 s" in text
    bodies = [r.body for r in server.wait_for_requests(3)]
    assert len(bodies) == 3 and bodies[0] == bodies[1] == bodies[2]


async def test_rejected_key_fails_the_task_naming_the_variable(
    provider: Provider, serve: Serve, chat: Chat, tmp_path: Path
) -> None:
    server = serve(["never sent"])
    server.fail_next(1, 401, f"Incorrect API key provided: {SECRET}.")
    agent = Agent(name="a", model=chat(server), builtin_tools=BuiltinTools(plan=False))

    task = await run_task(tmp_path, agent, "Hello")

    assert task.status is TaskStatus.FAILED
    assert task.error is not None
    assert f"{provider.label} rejected the API key (401)" in task.error
    assert f"check {provider.env_key}" in task.error
    assert SECRET not in task.error and "***" in task.error
    assert len(server.requests) == 1  # a rejected key is not retried
    errors = [m for m in await ui_of(tmp_path, task.id) if isinstance(m, UIError)]
    assert [e.detail for e in errors] == [task.error]


async def test_truncated_tool_arguments_become_an_error_result_and_the_task_goes_on(
    provider: Provider, serve: Serve, chat: Chat, tmp_path: Path
) -> None:
    ran: list[str] = []

    @tool(replay="safe")
    def get_weather(city: str) -> str:
        """Get the weather for a city."""
        ran.append(city)
        return "sunny"

    truncated = '{"city": "Par'  # the stream's argument fragments end mid-string
    server = serve(
        [
            Answer(tool_calls=[ToolCall("get_weather", raw_arguments=truncated)]),
            "My tool call was garbled; I cannot tell the weather.",
        ],
        answer_by="history",
        args_chunk=3,
    )
    agent = Agent(
        name="a", model=chat(server), tools=[get_weather], builtin_tools=BuiltinTools(plan=False)
    )

    task = await run_task(tmp_path, agent, "Weather in Paris?")

    assert task.status is TaskStatus.COMPLETED, task.error
    assert task.output == "My tool call was garbled; I cannot tell the weather."
    assert ran == []  # the tool never saw the broken arguments
    (result,) = await results_of(tmp_path, task.id)
    assert result["outcome"] == "error"
    assert result["content"].startswith("Error: the arguments are not valid JSON")
    second = server.wait_for_requests(2)[1]
    assert provider.tool_results(second) == [(f"{provider.call_prefix}_0_0", result["content"])]
    if provider.name == "anthropic":
        # Anthropic wants an object as the call's input; it is shown what was sent.
        (call,) = [
            b
            for m in second.json["messages"]
            if m["role"] == "assistant"
            for b in m["content"]
            if b["type"] == "tool_use"
        ]
        assert call["input"] == {"_unparsed_arguments": truncated}
    else:
        (sent,) = [m for m in second.json["messages"] if m["role"] == "assistant"]
        assert sent["tool_calls"][0]["function"]["arguments"] == truncated


# --- SIGKILL while the model streams -----------------------------------------------------


def spawn_child(provider: Provider, server: ScriptedServer, url: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", provider.env_key: SECRET}
    return subprocess.Popen(
        [sys.executable, str(HERE / "provider_child.py"), provider.name, server.base_url, url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


@pytest.mark.slow
async def test_sigkill_mid_stream_then_restart_resends_the_same_request(
    provider: Provider, serve: Serve, tmp_path: Path
) -> None:
    interrupted_text = "Paris looks fine; now let me double-check Rome as well. "
    final = "Paris: 21°C and sunny. Rome: 21°C and sunny."
    server = serve(
        [
            Answer(
                "Checking Paris first.",
                [ToolCall("get_weather", {"city": "Paris"})],
                input_tokens=50,
                output_tokens=10,
            ),
            Answer(
                interrupted_text,
                [ToolCall("get_weather", {"city": "Rome"})],
                input_tokens=80,
                output_tokens=15,
            ),
            Answer(final, input_tokens=120, output_tokens=20),
        ],
        answer_by="history",
        chunk_delay=0.02,
        text_chunk=4,
    )
    server.stall_turn(1, after=8)  # round 2's answer stops half-way until the client goes
    url = f"sqlite:///{tmp_path}/crash.db"

    child = spawn_child(provider, server, url)
    try:
        assert child.stdout is not None
        read_until(child.stdout, "PROGRESS 2", 60)  # round 2's stream is being committed
        server.wait_stalled()
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        close_pipes(child)
    assert child.returncode == -signal.SIGKILL
    server.wait_hangups(1)

    store = open_store(url)
    await store.open()
    try:
        (task,) = (await store.list_tasks()).tasks
        before = {e.seq: dump([e.kind, e.round, e.payload]) for e in await store.entries(task.id)}
        assert task.status is TaskStatus.RUNNING and task.iterations == 1
    finally:
        await store.close()
    assert any('"progress", 2' in v for v in before.values())

    out = finish(spawn_child(provider, server, url))
    assert f"DONE completed {task.id}" in out

    requests = server.requests
    assert [assistant_count(r) for r in requests] == [0, 1, 1, 2]
    interrupted, resent = requests[1], requests[2]
    # The same question again: messages, tools, model and settings, byte for byte.
    assert resent.json == interrupted.json
    assert resent.body == interrupted.body
    assert interrupted.json["temperature"] == 0.2
    assert provider.key_sent(resent) == SECRET

    store = open_store(url)
    await store.open()
    try:
        done = await store.get_task(task.id)
        entries = await store.entries(task.id)
        after = {e.seq: dump([e.kind, e.round, e.payload]) for e in entries}
        assert {s: after.get(s) for s in before} == before  # nothing committed was lost
        assert done.status is TaskStatus.COMPLETED and done.output == final
        assert done.restarts == 1 and done.iterations == 3
        # Only answers that finished count; the cut-off stream reported no usage yet.
        assert (done.usage.input_tokens, done.usage.output_tokens) == (250, 45)
        markers = [e.payload for e in entries if e.kind is EntryKind.ROLLBACK]
        assert [(m["scope"], m["reason"]) for m in markers] == [("progress", "interrupted stream")]
        view = await store.model_view(task.id)
        said = [m.content for m in view if m.role == "assistant"]
        assert said == ["Checking Paris first.", interrupted_text, final]
        raw = store_bytes(tmp_path, "crash.db")
        assert interrupted_text.encode() in raw and SECRET.encode() not in raw
    finally:
        await store.close()


# --- the API key is never written --------------------------------------------------------


@tool(replay="safe")
def get_weather(city: str) -> str:
    """Get the weather for a city."""
    return f"{city}: sunny"


def store_bytes(tmp_path: Path, name: str = "secret.db") -> bytes:
    """The raw bytes of the SQLite database and its -wal and -shm files (regular
    files only: the store's wake-up sockets live in a directory beside it)."""
    files = sorted(p for p in tmp_path.iterdir() if p.name.startswith(name) and p.is_file())
    assert files
    return b"".join(p.read_bytes() for p in files)


@pytest.mark.parametrize("key_from", ["argument", "environment"])
async def test_the_api_key_is_never_written(
    provider: Provider,
    serve: Serve,
    chat: Chat,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
    key_from: str,
) -> None:
    for name in ("", "duragent", provider.name, "httpx", "httpcore", "httpx2", "httpcore2"):
        caplog.set_level(logging.DEBUG, logger=name)
    formatted = io.StringIO()
    handler = logging.StreamHandler(formatted)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    handler.setLevel(logging.DEBUG)
    logging.getLogger().addHandler(handler)

    server = serve(
        [Answer("Checking.", [ToolCall("get_weather", {"city": "Paris"})]), "Paris is sunny."],
        answer_by="history",
    )
    model: str | ChatModel
    if key_from == "environment":
        monkeypatch.setenv(provider.env_key, SECRET)
        monkeypatch.setenv(provider.env_base_url, server.base_url)
        model = provider.spec  # the Runtime builds the adapter, and closes it
    else:
        model = chat(server)
    agent = Agent(
        name="weather", model=model, tools=[get_weather], builtin_tools=BuiltinTools(plan=False)
    )
    try:
        async with Runtime(
            f"sqlite:///{tmp_path}/secret.db", agents=[agent], poll_interval=0.05
        ) as rt:
            ok = await (await rt.submit("weather", "Weather in Paris?")).wait(30)
            # A careless proxy echoes the key in its error; it becomes the task's error.
            server.fail_next(1, 401, f"Incorrect API key provided: {SECRET}.")
            bad = await (await rt.submit("weather", "Weather in Rome?")).wait(30)
            tasks = (await rt.list_tasks()).tasks
            exported = json.dumps([await export_task(rt.store, t.id) for t in tasks])
            ui = [m.model_dump_json() for t in tasks for m in await rt.ui_messages(t.id)]
            raw_open = store_bytes(tmp_path)
        raw_closed = store_bytes(tmp_path)
    finally:
        logging.getLogger().removeHandler(handler)
    out, err = capfd.readouterr()

    # The key was really in use, and really in the error the server sent back...
    assert ok.status is TaskStatus.COMPLETED and ok.output == "Paris is sunny."
    assert [provider.key_sent(r) for r in server.requests] == [SECRET] * 3
    assert SECRET in server.requests[2].raw().decode("latin-1")
    assert bad.status is TaskStatus.FAILED and bad.error is not None
    assert "rejected the API key (401)" in bad.error and provider.env_key in bad.error
    # ...and what we search is really there: SDK debug logs, the failure's traceback,
    # the tasks' own text in the store's files.
    loggers = {r.name.split(".")[0] for r in caplog.records}
    assert {provider.name, "duragent"} <= loggers and loggers & {"httpx", "httpx2"}
    assert "Traceback" in formatted.getvalue() and "rejected the API key" in formatted.getvalue()
    assert b"Weather in Rome?" in raw_open and b"Paris is sunny." in raw_open + raw_closed
    assert len(tasks) == 2 and "Weather in Rome?" in exported

    logs = formatted.getvalue() + caplog.text
    logs += "".join(r.getMessage() + repr(r.args) + repr(r.__dict__) for r in caplog.records)
    for where, text in {
        "log": logs,
        "stdout": out,
        "stderr": err,
        "export": exported,
        "ui": "".join(ui),
        "task error": bad.error,
    }.items():
        assert SECRET not in text, f"the key is in the {where}"
    assert SECRET.encode() not in raw_open
    assert SECRET.encode() not in raw_closed
