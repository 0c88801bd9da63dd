"""A long task through a small window, shared by the compaction tests: a script
that fetches page after page (and answers the summariser), and a model that
refuses a request longer than its window as a provider would."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Sequence
from typing import Any

from duragent import (
    Agent,
    ContextOverflow,
    ContextPolicy,
    Limits,
    ScriptedModel,
    ToolCall,
    tool,
)
from duragent.llm._base import ModelRequest, StreamEvent, UsageDelta
from duragent.runtime._context_policy import SUMMARY_PROMPT

SIZE = 3_000  # characters of each tool result


def last_step(messages: Sequence[Any]) -> int:
    """The last step the view shows done: a call's argument or a summary's note."""
    done = 0
    for m in messages:
        content = getattr(m, "content", None) or ""
        if m.role == "user":
            done = max([done, *(int(n) for n in re.findall(r"last step (\d+)", content))])
        for c in getattr(m, "tool_calls", None) or ():
            done = max(done, json.loads(c.function.arguments)["n"])
    return done


def long_task_script(rounds: int) -> Any:
    """Step 1..rounds, one call a round, then an answer; also the summariser."""

    def answer(messages: list[Any]) -> Any:
        if messages and messages[0].role == "system" and messages[0].content == SUMMARY_PROMPT:
            return f"Fetched pages; last step {last_step_in(messages[1].content)}."
        done = last_step(messages)
        if done >= rounds:
            return f"All {rounds} steps done."
        return [ToolCall("fetch", {"n": done + 1})]

    return answer


def last_step_in(transcript: str) -> int:
    steps = [int(n) for n in re.findall(r'"n": ?(\d+)|last step (\d+)', transcript) for n in n if n]
    return max(steps, default=0)


@tool(replay="never")
def fetch(n: int) -> str:
    """Fetch page n."""
    return f"page {n}: " + "x" * SIZE


class WindowedModel:
    """A ScriptedModel behind a window: a request longer than `window` tokens (4
    characters each) is refused as the provider would, never answered."""

    def __init__(self, inner: ScriptedModel, window: int, name: str = "small-model") -> None:
        self.inner, self.window, self.name = inner, window, name
        self.sizes: list[int] = []
        self.refused = 0

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        chars = sum(len(json.dumps(m.model_dump())) for m in request.messages)
        tokens = chars // 4
        if tokens > self.window:
            self.refused += 1
            raise ContextOverflow(
                f"prompt is too long: {tokens} tokens > {self.window} maximum",
                tokens=tokens,
                limit=self.window,
            )
        self.sizes.append(tokens)
        return self._answer(request, tokens)

    async def _answer(self, request: ModelRequest, tokens: int) -> AsyncIterator[StreamEvent]:
        async for event in self.inner.stream(request):
            if isinstance(event, UsageDelta):  # the provider counts the prompt its own way
                event = UsageDelta(input_tokens=tokens, output_tokens=event.output_tokens)
            yield event


def agent_with(model: Any, **policy: Any) -> Agent:
    return Agent(
        name="long",
        model=model,
        tools=[fetch],
        limits=Limits(max_iterations=1_000),
        context=ContextPolicy(**policy),
    )
