"""The built-in table of context windows, looked up by a model name's longest prefix."""

from __future__ import annotations

import pytest

from duragent.llm._windows import context_window


@pytest.mark.parametrize(
    ("model", "window"),
    [
        ("gpt-4.5-preview", 128_000),
        ("gpt-4.5-preview-2025-02-27", 128_000),
        ("o1-mini", 128_000),
        ("o1-mini-2024-09-12", 128_000),
        ("o1-preview", 128_000),
        ("o1", 200_000),
        ("o1-2024-12-17", 200_000),
        ("o3", 200_000),
        ("o3-mini", 200_000),
        ("o4-mini", 200_000),
        ("gpt-4.1", 1_047_576),
        ("gpt-4.1-mini", 1_047_576),
        ("gpt-4.1-nano-2025-04-14", 1_047_576),
        ("gpt-4o", 128_000),
        ("gpt-4o-mini-2024-07-18", 128_000),
        ("openai:gpt-4o", 128_000),
        ("chatgpt-4o-latest", 128_000),
        ("gpt-4-turbo-2024-04-09", 128_000),
        ("gpt-4-0125-preview", 128_000),
        ("gpt-4-32k", 32_768),
        ("gpt-4", 8_192),
        ("gpt-4-0613", 8_192),
        ("gpt-3.5-turbo", 16_385),
        ("gpt-5-mini", 400_000),
        ("claude-sonnet-4-20250514", 200_000),
        ("anthropic:claude-3-5-haiku-latest", 200_000),
        ("claude-2.0", 100_000),
        ("gemini-1.5-pro", 2_097_152),
        ("gemini-2.5-flash", 1_048_576),
        ("meta-llama/llama-3.1-70b-instruct", 128_000),
        ("llama3:8b", 8_192),
        ("unknown-llm", None),
    ],
)
def test_a_model_name_finds_its_window(model: str, window: int | None) -> None:
    assert context_window(model) == window
