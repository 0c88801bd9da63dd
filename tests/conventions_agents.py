"""Agents for tests/test_cli_conventions.py: one served by a local OpenAI-compatible
server (its URL in CONVENTIONS_BASE_URL), and two agents under one name."""

from __future__ import annotations

import os

from duragent import Agent, BuiltinTools


def agents() -> list[Agent]:
    from duragent.llm._openai import OpenAIChat

    model = OpenAIChat(
        "gpt-4o-mini", base_url=os.environ["CONVENTIONS_BASE_URL"], api_key="sk-unused"
    )
    return [Agent(name="remote", model=model, builtin_tools=BuiltinTools(plan=False))]


def twins() -> list[Agent]:
    return [
        Agent(name="twin", model="scripted:demo", builtin_tools=BuiltinTools(plan=False)),
        Agent(name="twin", model="scripted:demo", builtin_tools=BuiltinTools(plan=False)),
    ]
