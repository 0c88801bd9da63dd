"""Context windows: how many tokens each common model takes, and what a
provider's answer that a request was too long looks like.

The table is a default; `ContextPolicy(window=...)` on an Agent wins. Names are
matched by their longest known prefix, so a dated snapshot ("gpt-4o-2024-08-06")
or a provider prefix ("openai/gpt-4o") finds its family.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# Tokens of context (prompt plus answer) by model name prefix.
WINDOWS: dict[str, int] = {
    # OpenAI (a family's members with another window are listed by their longer prefix)
    "gpt-5": 400_000,
    "gpt-4.5": 128_000,
    "gpt-4.1": 1_047_576,
    "gpt-4o": 128_000,
    "chatgpt-4o": 128_000,
    "gpt-4-turbo": 128_000,
    "gpt-4-1106": 128_000,
    "gpt-4-0125": 128_000,
    "gpt-4-32k": 32_768,
    "gpt-4": 8_192,
    "gpt-3.5-turbo": 16_385,
    "gpt-3.5-turbo-instruct": 4_096,
    "o1": 200_000,
    "o1-mini": 128_000,
    "o1-preview": 128_000,
    "o3": 200_000,
    "o3-mini": 200_000,
    "o4-mini": 200_000,
    # Anthropic
    "claude-": 200_000,
    "claude-2.0": 100_000,
    "claude-instant": 100_000,
    # Others often served through an OpenAI-compatible endpoint
    "gemini-1.0": 32_760,
    "gemini-1.5": 1_048_576,
    "gemini-1.5-pro": 2_097_152,
    "gemini-2": 1_048_576,
    "llama-3": 8_192,
    "llama-3.1": 128_000,
    "llama-3.2": 128_000,
    "llama-3.3": 128_000,
    "llama-4": 128_000,
    "llama3": 8_192,
    "llama3.1": 128_000,
    "llama3.2": 128_000,
    "llama3.3": 128_000,
    "mistral-large": 128_000,
    "mistral-small": 32_000,
    "qwen2.5": 32_768,
    "deepseek-": 64_000,
}


def context_window(model: str, table: Mapping[str, int] = WINDOWS) -> int | None:
    """The context window of `model` by its longest known prefix; None if unknown."""
    name = model.lower().rsplit("/", 1)[-1]
    names = (name, name.split(":", 1)[-1])  # "openai:gpt-4o" as "gpt-4o"; "llama3:8b" as is
    best = max((p for p in table for n in names if n.startswith(p)), key=len, default=None)
    return None if best is None else table[best]


# What providers and OpenAI-compatible servers say when a prompt is too long.
_OVERFLOW = re.compile(
    r"context_length_exceeded|context length|context window|prompt is too long"
    r"|too many (?:input )?tokens|input is too long|maximum (?:context|prompt|input)"
    r"|exceeds? the (?:model'?s? )?(?:max|context|token)|reduce the length",
    re.IGNORECASE,
)
# "prompt is too long: 210012 tokens > 200000 maximum" (Anthropic)
_ANTHROPIC_NUMBERS = re.compile(r"([\d,]+)\s*tokens?\s*>\s*([\d,]+)")
# "maximum context length is 16385 tokens. However, you requested 17000 tokens" (OpenAI)
_LIMIT = re.compile(r"(?:maximum|max)[^\d]{0,40}?([\d,]+)\s*tokens", re.IGNORECASE)
_ASKED = re.compile(
    r"(?:requested|resulted in|you (?:sent|have)|prompt (?:has|contains)|input (?:has|is))"
    r"[^\d]{0,20}([\d,]+)\s*tokens",
    re.IGNORECASE,
)

# "you requested 17000 tokens (16000 in the messages, 1000 in the completion)" (OpenAI)
_PROMPT_PART = re.compile(r"([\d,]+)\s*(?:tokens\s*)?in the messages", re.IGNORECASE)


def is_overflow(status: int, code: object, message: str) -> bool:
    """Whether an error answer says the request was longer than the context window.

    OpenAI: 400 with `code` "context_length_exceeded"; Anthropic: 400
    `invalid_request_error` "prompt is too long: N tokens > M maximum"; other
    servers (vLLM, llama.cpp, gateways) word it their own way, sometimes as 413.
    """
    if status not in (400, 413, 422):
        return False
    return code == "context_length_exceeded" or bool(_OVERFLOW.search(message))


def overflow_numbers(message: str) -> tuple[int | None, int | None]:
    """(tokens asked, limit) when an overflow message says them."""
    m = _ANTHROPIC_NUMBERS.search(message)
    if m:
        return _int(m.group(1)), _int(m.group(2))
    limit = _LIMIT.search(message)
    # "(16000 in the messages, 1000 in the completion)": the prompt is the first part.
    asked = _PROMPT_PART.search(message) or _ASKED.search(message)
    return (_int(asked.group(1)) if asked else None, _int(limit.group(1)) if limit else None)


def _int(text: str) -> int:
    return int(text.replace(",", ""))
