"""Runs a README example that SIGKILL can stop at a named point of its `send_email` call.

    python tests/readme_kill_child.py EXAMPLE POINT

`duragent.Runtime` is replaced, before the example imports it, by one whose trace
hook stops at POINT of the send_email call: "tool_start" (its intent is committed,
the tool has not run) or "result" (the tool ran and its result is durable). There
it prints `AT <point> emails=<n>`, n being what the example's outbox then holds
(the outbox dies with the process), and blocks until the test kills it.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import duragent

EXAMPLE, POINT = sys.argv[1:3]
example: dict[str, Any] = {"__name__": "__main__", "__file__": EXAMPLE}
send_calls: set[str] = set()


async def trace(point: str, **info: Any) -> None:
    if point == "tool_start" and info.get("tool") == "send_email":
        send_calls.add(info["call_id"])
    if point != POINT or info.get("call_id") not in send_calls:
        return
    if "landed" in info:
        await info["landed"]
    print(f"AT {point} emails={len(example['outbox'])}", flush=True)
    await asyncio.sleep(3600)


class KillableRuntime(duragent.Runtime):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, trace=trace, **kwargs)


duragent.Runtime = KillableRuntime  # type: ignore[misc]
with open(EXAMPLE) as f:
    exec(compile(f.read(), EXAMPLE, "exec"), example)
