"""A 200-round task with large tool results through a small context window, with
the real OpenAI and Anthropic SDKs against local servers that refuse a request
longer than the window the way each real API does (HTTP 400: OpenAI's
`context_length_exceeded`, Anthropic's `prompt is too long: N tokens > M maximum`)."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any

import pytest

from duragent import Agent, ContextPolicy, Limits, Runtime, TaskStatus, tool
from duragent.llm._anthropic import AnthropicChat
from duragent.llm._openai import OpenAIChat
from duragent.runtime._context_policy import SUMMARY_PROMPT
from duragent.store import open_store
from duragent.types import EntryKind
from support.llm_servers import (
    Answer,
    RecordedRequest,
    ScriptedAnthropicServer,
    ScriptedOpenAIServer,
    ScriptedServer,
    ToolCall,
)

WINDOW = 4_000  # tokens, counted by the servers as 4 bytes of request body each
ROUNDS = 200
RESULT = 2_500  # characters of each tool result


class WindowedProvider:
    """The script of a long task, answered only for a request inside the window."""

    def __init__(self, provider: str) -> None:
        self.provider = provider
        self.server: ScriptedServer
        self.served: list[int] = []  # the size of every request answered
        self.refused: list[int] = []  # ... and of every one refused as too long
        self.summaries = 0
        self._lock = threading.Lock()

    def __call__(self, request: RecordedRequest) -> Any:
        body = request.json
        tokens = len(request.body) // 4
        if tokens > WINDOW:
            with self._lock:
                self.refused.append(tokens)
            return self.too_long(tokens)
        with self._lock:
            self.served.append(tokens)
        texts, steps = self.read(body)
        if SUMMARY_PROMPT in texts[0]:
            self.summaries += 1
            done = max(
                (
                    int(n)
                    for n in re.findall(r"page (\d+):|last step (\d+)", texts[1])
                    for n in n
                    if n
                ),
                default=0,
            )
            return Answer(text=f"Pages fetched; last step {done}.", input_tokens=tokens)
        for text in texts:
            steps += [int(n) for n in re.findall(r"last step (\d+)", text)]
        done = max(steps, default=0)
        if done >= ROUNDS:
            return Answer(text=f"All {ROUNDS} pages fetched.", input_tokens=tokens)
        return Answer(tool_calls=[ToolCall("fetch", {"n": done + 1})], input_tokens=tokens)

    def too_long(self, tokens: int) -> Any:
        if self.provider == "openai":
            message = (
                f"This model's maximum context length is {WINDOW} tokens. However, your "
                f"messages resulted in {tokens} tokens. Please reduce the length of the messages."
            )
            return self.server.error_reply(400, message, code="context_length_exceeded")
        return self.server.error_reply(
            400, f"prompt is too long: {tokens} tokens > {WINDOW} maximum"
        )

    def read(self, body: dict[str, Any]) -> tuple[list[str], list[int]]:
        """(the system text then every text of the messages, every step a call asked for)."""
        texts: list[str] = [body.get("system") or ""] if self.provider == "anthropic" else []
        steps: list[int] = []
        for m in body["messages"]:
            content = m.get("content")
            if isinstance(content, str):
                texts.append(content)
            for block in content if isinstance(content, list) else ():
                if block.get("type") == "text":
                    texts.append(block["text"])
                elif block.get("type") == "tool_use":
                    steps.append(block["input"]["n"])
            for call in m.get("tool_calls") or ():
                steps.append(json.loads(call["function"]["arguments"])["n"])
        if self.provider == "openai" and not texts[0:1]:
            texts.insert(0, "")
        return texts, steps


@tool(replay="never")
def fetch(n: int) -> str:
    """Fetch page n."""
    return f"page {n}: " + "lorem ipsum " * (RESULT // 12)


@pytest.mark.slow
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
@pytest.mark.parametrize("window", ["told", "learned"])
async def test_a_200_round_task_finishes_through_a_small_window(
    tmp_path: Path, provider: str, window: str
) -> None:
    script = WindowedProvider(provider)
    server_type = ScriptedOpenAIServer if provider == "openai" else ScriptedAnthropicServer
    # "learned": a model the window table does not know; its window comes from the
    # provider's first refusal.
    name = "local-model"
    with server_type(script) as server:
        script.server = server
        chat_type = OpenAIChat if provider == "openai" else AnthropicChat
        model = chat_type(name, base_url=server.base_url, api_key="sk-test")
        policy = ContextPolicy(window=WINDOW) if window == "told" else ContextPolicy()
        agent = Agent(
            name="reader",
            model=model,
            tools=[fetch],
            limits=Limits(max_iterations=1_000),
            context=policy,
        )
        url = f"sqlite:///{tmp_path}/long.db"
        try:
            async with Runtime(url, agents=[agent], poll_interval=0.05) as rt:
                sub = await rt.submit("reader", "Fetch pages 1 to 200, one call each.")
                task = await sub.wait(timeout=300)
        finally:
            await model.aclose()
    assert task.status is TaskStatus.COMPLETED, task.error
    assert task.output == f"All {ROUNDS} pages fetched."
    assert max(script.served) <= WINDOW
    if window == "told":
        assert script.refused == []  # every request inside the window
    else:
        assert 1 <= len(script.refused) <= 3  # learned once; then within it
    assert script.summaries >= 1
    store = open_store(url)
    await store.open()
    try:
        results = await store.entries(task.id, kinds=[EntryKind.TOOL_RESULT])
        compactions = await store.entries(task.id, kinds=[EntryKind.COMPACTION])
    finally:
        await store.close()
    # Every call ran once and every result is stored whole.
    assert [r.payload["content"].split(":")[0] for r in results] == [
        f"page {n}" for n in range(1, ROUNDS + 1)
    ]
    assert all(len(r.payload["content"]) >= RESULT - 12 for r in results)
    assert {c.payload["how"] for c in compactions} >= {"summarised"}
