"""A child process for provider crash tests: runs one agent task against a local
provider server (it runs in the test process) through the real SDK.

    python tests/provider_child.py PROVIDER BASE_URL STORE_URL

PROVIDER is "openai" or "anthropic"; the API key comes from that provider's
environment variable. The child prints `PROGRESS <round>` after each committed
progress batch of a streamed answer (the test kills it after one) and
`DONE <status> <task id>` when the task has ended.
"""

from __future__ import annotations

import asyncio
import sys

from duragent import Agent, BuiltinTools, ChatModel, Runtime, Timing, tool

PROVIDER, BASE_URL, URL = sys.argv[1:4]


@tool(replay="safe")
async def get_weather(city: str) -> str:
    """Get the weather for a city."""
    return f"{city}: 21°C, sunny"


def build_model() -> ChatModel:
    if PROVIDER == "openai":
        from duragent.llm._openai import OpenAIChat

        return OpenAIChat("gpt-4o-mini", base_url=BASE_URL)
    from duragent.llm._anthropic import AnthropicChat

    return AnthropicChat("claude-sonnet-5", base_url=BASE_URL, max_tokens=512)


async def trace(point: str, **info: object) -> None:
    if point == "progress":
        print(f"PROGRESS {info['round']}", flush=True)


async def main() -> None:
    model = build_model()
    agent = Agent(
        name="weather",
        model=model,
        instructions="You report the weather.",
        tools=[get_weather],
        model_settings={"temperature": 0.2},
        timing=Timing(progress_interval=0.01),
        builtin_tools=BuiltinTools(plan=False),
    )
    try:
        rt = Runtime(URL, agents=[agent], lease_ttl=1.0, poll_interval=0.1, trace=trace)
        async with rt:
            sub = await rt.submit(
                "weather", "What is the weather in Paris and Rome?", request_id="provider-crash"
            )
            task = await sub.wait(timeout=60)
            print(f"DONE {task.status.value} {task.id}", flush=True)
    finally:
        aclose = getattr(model, "aclose", None)
        if aclose is not None:
            await aclose()


asyncio.run(main())
