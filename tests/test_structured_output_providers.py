"""Structured output through the real OpenAI and Anthropic SDKs, against local
servers that speak each provider's wire format: OpenAI gets `response_format`
(json_schema, strict), Anthropic a tool the model must call to give its answer;
a wrong answer is sent back with the errors, and the task completes typed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from duragent import Agent, BuiltinTools, ChatModel, Runtime, tool
from duragent.errors import UsageError
from duragent.llm._anthropic import AnthropicChat
from duragent.llm._base import ModelRequest, OutputSpec, ToolSpec
from duragent.llm._openai import OpenAIChat
from duragent.types import TaskStatus, UserMessage
from support.llm_servers import (
    RecordedRequest,
    ScriptedAnthropicServer,
    ScriptedOpenAIServer,
    ScriptedServer,
    ToolCall,
)
from support.providers import provider_fixtures

Serve = Callable[..., ScriptedServer]
Chat = Callable[..., ChatModel]


class City(BaseModel):
    name: str
    population: int


@dataclass(frozen=True)
class Provider:
    name: str
    server_type: type[ScriptedServer]
    env: tuple[str, ...]

    def model(self, server: ScriptedServer, **options: Any) -> OpenAIChat | AnthropicChat:
        if self.name == "openai":
            return OpenAIChat("gpt-4o-mini", base_url=server.base_url, api_key="sk-test")
        return AnthropicChat("claude-test", base_url=server.base_url, api_key="sk-test")

    def answer(self, value: dict[str, Any]) -> Any:
        """How this provider's model gives a structured answer."""
        if self.name == "openai":
            import json

            return json.dumps(value)  # the message's content, in the response format
        return [ToolCall("final_result", value)]  # the input of the forced tool

    def last_user_text(self, request: RecordedRequest) -> str:
        last = request.json["messages"][-1]
        assert last["role"] == "user"
        content = last["content"]
        if isinstance(content, str):
            return content
        return " ".join(b.get("text", "") for b in content)


provider, serve, chat, _no_provider_env = provider_fixtures(
    Provider("openai", ScriptedOpenAIServer, ("OPENAI_API_KEY", "OPENAI_BASE_URL")),
    Provider("anthropic", ScriptedAnthropicServer, ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL")),
)


async def test_the_request_asks_for_the_schema_and_a_wrong_answer_is_asked_again(
    provider: Provider, serve: Serve, chat: Chat, tmp_path: Path
) -> None:
    server = serve(
        [
            provider.answer({"name": "Paris", "population": "lots"}),
            provider.answer({"name": "Paris", "population": 2_100_000}),
        ]
    )
    agent = Agent(
        name="cities",
        model=chat(server),
        output_type=City,
        builtin_tools=BuiltinTools(plan=False),
    )
    async with Runtime(f"sqlite:///{tmp_path}/s.db", agents=[agent], poll_interval=0.05) as rt:
        sub = await rt.submit("cities", "The largest city of France?")
        city = await sub.result(timeout=30)
        task = await rt.get(sub.task_id)
    assert city == City(name="Paris", population=2_100_000)
    assert task.status is TaskStatus.COMPLETED
    assert task.output == {"name": "Paris", "population": 2_100_000}

    first, second = server.requests
    body = first.json
    if provider.name == "openai":
        fmt = body["response_format"]
        assert fmt["type"] == "json_schema"
        assert fmt["json_schema"]["name"] == "City" and fmt["json_schema"]["strict"] is True
        assert fmt["json_schema"]["schema"]["required"] == ["name", "population"]
        assert fmt["json_schema"]["schema"]["additionalProperties"] is False
    else:
        assert body["tool_choice"] == {"type": "tool", "name": "final_result"}
        (final,) = [t for t in body["tools"] if t["name"] == "final_result"]
        assert final["input_schema"]["required"] == ["name", "population"]
    # The second request carries the wrong answer's errors, and the same schema.
    assert "population" in provider.last_user_text(second)
    assert "integer" in provider.last_user_text(second)
    for key in ("response_format", "tool_choice", "tools"):
        assert second.json.get(key) == body.get(key)


async def test_anthropic_with_tools_must_call_one_of_them_or_the_answer_tool(
    serve: Serve, chat: Chat, provider: Provider, tmp_path: Path
) -> None:
    @tool
    def population(city: str) -> int:
        """The population of a city."""
        return 2_100_000

    server = serve(
        [
            [ToolCall("population", {"city": "Paris"})],
            provider.answer({"name": "Paris", "population": 2_100_000}),
        ]
    )
    agent = Agent(
        name="cities",
        model=chat(server),
        output_type=City,
        tools=[population],
        builtin_tools=BuiltinTools(plan=False),
    )
    async with Runtime(f"sqlite:///{tmp_path}/s.db", agents=[agent], poll_interval=0.05) as rt:
        city = await (await rt.submit("cities", "?")).result(timeout=30)
    assert city.population == 2_100_000
    body = server.requests[0].json
    if provider.name == "anthropic":
        assert body["tool_choice"] == {"type": "any"}
        assert [t["name"] for t in body["tools"]] == ["population", "final_result"]
    else:
        assert body["response_format"]["type"] == "json_schema"
        assert [t["function"]["name"] for t in body["tools"]] == ["population"]


async def test_settings_may_not_ask_for_another_format_or_tool_choice() -> None:
    spec = OutputSpec(name="City", schema=City.model_json_schema(), strict=False)
    request = ModelRequest(model="", messages=[UserMessage(content="?")], output=spec)
    openai_chat = OpenAIChat("gpt-4o-mini", base_url="http://127.0.0.1:9/v1", api_key="k")
    anthropic_chat = AnthropicChat("claude-test", base_url="http://127.0.0.1:9", api_key="k")
    try:
        assert (
            openai_chat.request_body(request)["response_format"]["json_schema"]["strict"] is False
        )
        request.settings = {"response_format": {"type": "json_object"}}
        with pytest.raises(UsageError, match="may not set response_format"):
            openai_chat.request_body(request)
        request.settings = {"tool_choice": {"type": "auto"}}
        with pytest.raises(UsageError, match="may not set tool_choice"):
            anthropic_chat.request_body(request)
        request.settings = {}
        request.tools = [ToolSpec("final_result", "mine", {"type": "object"})]
        with pytest.raises(UsageError, match="rename the tool"):
            anthropic_chat.request_body(request)
    finally:
        await openai_chat.aclose()
        await anthropic_chat.aclose()


async def test_a_request_without_an_output_type_asks_for_no_format(
    provider: Provider, serve: Serve, chat: Chat, tmp_path: Path
) -> None:
    server = serve(["plain text"])
    agent = Agent(name="plain", model=chat(server), builtin_tools=BuiltinTools(plan=False))
    async with Runtime(f"sqlite:///{tmp_path}/s.db", agents=[agent], poll_interval=0.05) as rt:
        assert await (await rt.submit("plain", "?")).result(timeout=30) == "plain text"
    body = server.requests[0].json
    assert "response_format" not in body and "tool_choice" not in body and "tools" not in body
