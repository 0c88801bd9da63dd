"""What the seed-row tests (test_seed_rows.py, test_seed_rows_api.py) share."""

from __future__ import annotations

import asyncio
from enum import StrEnum
from typing import Any

from duragent import Agent, BuiltinTools, ScriptedModel, Timing


class FutureKind(StrEnum):
    """An entry kind a later version of duragent writes."""

    HOLOGRAM = "hologram"


def streaming(trace_hold: int) -> tuple[Agent, asyncio.Event, asyncio.Event, Any]:
    """An agent streaming "abcdefghijkl" in 4-character pieces, each committed, and a
    trace hook that holds the round after its `trace_hold`-th progress commit."""
    held, release = asyncio.Event(), asyncio.Event()
    seen: list[int] = []

    async def trace(point: str, **info: Any) -> None:
        if point == "progress":
            seen.append(info["seq"])
            if len(seen) == trace_hold:
                held.set()
                await release.wait()

    model = ScriptedModel(["abcdefghijkl"], chunk_size=4)
    agent = Agent(
        name="s",
        model=model,
        timing=Timing(progress_interval=0),
        builtin_tools=BuiltinTools(plan=False),
    )
    return agent, held, release, trace
