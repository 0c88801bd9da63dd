"""A worker for the approval crash tests (test_approval_crash.py).

    python approval_child.py STORE_URL TASK_ID LEDGER MODE

MODE `park`: run the task until it waits for an approval, print `parked`, keep
working (a decision arriving later is picked up). MODE `finish`: run it to its
end, print `done <status>`. The `send` tool appends its arguments to LEDGER
(fsynced) before it answers; with DURAGENT_TEST_HOLD=1 it then prints
`running` and never returns, so the test can SIGKILL it mid-call.
DURAGENT_TEST_REPLAY sets its replay policy; DURAGENT_TEST_APPROVAL_TIMEOUT
its approval time limit in seconds.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from duragent import Agent, BuiltinTools, Runtime, ScriptedModel, ToolCall, ToolMessage, tool


def mailer(ledger: Path) -> Agent:
    timeout = os.environ.get("DURAGENT_TEST_APPROVAL_TIMEOUT")
    replay: Any = os.environ.get("DURAGENT_TEST_REPLAY", "never")

    @tool(
        requires_approval=True,
        replay=replay,
        approval_timeout=float(timeout) if timeout else None,
    )
    async def send(to: str, body: str) -> str:
        """Send a message."""
        with ledger.open("a") as f:
            f.write(json.dumps({"to": to, "body": body}, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if os.environ.get("DURAGENT_TEST_HOLD") == "1":
            print("running", flush=True)
            await asyncio.Event().wait()
        return f"sent to {to}"

    def script(messages: list[Any]) -> Any:
        results = [m.content for m in messages if isinstance(m, ToolMessage)]
        if not results:
            return [ToolCall("send", {"to": "bob", "body": "hi"})]
        return " | ".join(results)

    return Agent(
        name="mailer",
        model=ScriptedModel(script),
        tools=[send],
        builtin_tools=BuiltinTools(plan=False),
    )


async def main(url: str, task_id: str, ledger: str, mode: str) -> None:
    agent = mailer(Path(ledger))
    async with Runtime(url, agents=[agent], poll_interval=0.05, lease_ttl=1.0) as rt:
        rt.start_worker()
        if mode == "park":
            await rt.wait(task_id, timeout=60, until=lambda t: t.status.value == "waiting")
            print("parked", flush=True)
            await asyncio.Event().wait()  # keep working until killed
        task = await rt.wait(task_id, timeout=60)
        print(f"done {task.status.value}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
