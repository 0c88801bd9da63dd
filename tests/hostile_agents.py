"""Agents whose every name, argument, answer and error is hostile terminal text
(`--agents hostile_agents:agents`), and an agents module attribute that raises
with such text (`--agents hostile_agents:raising`). For tests/test_cli_escapes.py.
"""

from __future__ import annotations

from typing import Any

from duragent import Agent, BuiltinTools, ScriptedModel, ToolCall, tool

# A window-title change (OSC, ended by BEL and by ST), a screen clear (CSI), an
# 8-bit CSI, a backspace, and Rich markup. No NUL: it cannot be in argv.
EVIL = "x\x1b]2;pwned\x07[bold red]y[/bold red]\x1b]0;t\x1b\\\x1b[2J\x9b31m\x08z"
NAME = "h\x1b]2;pwned\x07[b]"


@tool(name="send_email", requires_approval=True)
def send_email(to: str, body: str) -> str:
    """Send an email (asks for approval first)."""
    return f"sent {body} to {to}"


def fail(messages: list[Any]) -> Any:
    raise RuntimeError(EVIL)


def agents() -> list[Agent]:
    return [
        Agent(name=NAME, model=ScriptedModel([EVIL, EVIL]), builtin_tools=BuiltinTools(plan=False)),
        Agent(
            name=f"{NAME}-fails", model=ScriptedModel(fail), builtin_tools=BuiltinTools(plan=False)
        ),
        Agent(
            name=f"{NAME}-asks",
            model=ScriptedModel([[ToolCall("send_email", {"to": EVIL, "body": EVIL})], EVIL]),
            tools=[send_email],
            builtin_tools=BuiltinTools(plan=False),
        ),
    ]


def raising() -> list[Agent]:
    raise RuntimeError(f"cannot build the agents: {EVIL}")
