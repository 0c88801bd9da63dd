"""A worker for the wait crash tests (test_wait_crash.py): SIGKILLed on its way to a wait.

    python wait_child.py STORE_URL TASK_ID KIND KILL_POINT

Runs the task (submitted by the test with `waiter(KIND)`) and, when the runner
reaches the trace point KILL_POINT of the round that asks for the wait, prints
`AT <point>` and blocks there so the test can SIGKILL it. KIND is the wait the
task's first round asks for: "timer" (a tool returning `ctx.sleep`), "input"
(the built-in `ask_user`), "approval" (a tool that needs one) or "subtask" (a
tool returning `ctx.spawn`). DURAGENT_TEST_SLEEP sets the timer's seconds.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from duragent import (
    Agent,
    BuiltinTools,
    Runtime,
    ScriptedModel,
    ToolCall,
    ToolContext,
    ToolMessage,
    tool,
)

QUESTION = "Which city should the trip start from?"
MONTH = 30 * 24 * 3600.0


def _answers(messages: list[Any]) -> list[str]:
    return [m.content for m in messages if isinstance(m, ToolMessage)]


def waiter(kind: str, replay: Any = "safe") -> list[Agent]:
    """The parent agent whose first round asks for a `kind` wait, and its helper;
    `replay` is the policy of its tools that return a timer or a sub-task."""
    seconds = float(os.environ.get("DURAGENT_TEST_SLEEP", MONTH))

    @tool(replay=replay)
    async def nap(ctx: ToolContext) -> Any:
        """Wait durably."""
        return ctx.sleep(seconds)

    @tool(replay=replay)
    async def delegate(question: str, ctx: ToolContext) -> Any:
        """Hand the question to the helper and wait for its answer."""
        return ctx.spawn("helper", question)

    @tool(requires_approval=True, approval_timeout=MONTH)
    async def pay(amount: int) -> str:
        """Pay (a person approves first)."""
        return f"paid {amount}"

    first = {
        "timer": ToolCall("nap", {}),
        "input": ToolCall("ask_user", {"question": QUESTION}),
        "approval": ToolCall("pay", {"amount": 500}),
        "subtask": ToolCall("delegate", {"question": "what is 6*7?"}),
    }[kind]

    def script(messages: list[Any]) -> Any:
        answers = _answers(messages)
        return [first] if not answers else f"done: {answers[-1]}"

    parent = Agent(
        name="waiter",
        model=ScriptedModel(script),
        tools=[nap, delegate, pay],
        builtin_tools=BuiltinTools(ask_user=True, plan=False),
    )
    helper = Agent(
        name="helper", model=ScriptedModel(["42"]), builtin_tools=BuiltinTools(plan=False)
    )
    return [parent, helper]


async def main(url: str, task_id: str, kind: str, point: str) -> None:
    async def trace(at: str, **info: Any) -> None:
        if at == point and info["task_id"] == task_id:
            print(f"AT {at}", flush=True)
            await asyncio.Event().wait()  # held here until killed

    async with Runtime(
        url, agents=waiter(kind), poll_interval=0.05, lease_ttl=1.0, trace=trace
    ) as rt:
        rt.start_worker()
        await rt.wait(task_id, timeout=60)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
