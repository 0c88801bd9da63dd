"""An agent for `duragent worker --agents pinned_agents:AGENTS`, its model served at
$PINNED_BASE_URL (a local OpenAI-compatible server): the same agent, deployed
with another provider URL, for tests of task pins."""

from __future__ import annotations

import os

from duragent import Agent, BuiltinTools

AGENTS = [
    Agent(
        name="pinned",
        model="openai:gpt-4o-mini",
        model_options={"base_url": os.environ["PINNED_BASE_URL"], "api_key": "sk-pinned"},
        builtin_tools=BuiltinTools(plan=False),
    )
]
