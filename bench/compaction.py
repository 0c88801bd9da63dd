"""A 1,000-round task through a 16k-token window (issue 41): it completes, and what
compaction costs per round and saves on resume, against the same task unwindowed.

    python -m bench.compaction [--rounds 1000] [--window 16000] [--runs 3] [--postgres]

Each run drives two tasks of `rounds` tool rounds with ScriptedModel (a
zero-latency model; each tool result ~1,500 characters) in one process and
store: `windowed` with `ContextPolicy(window=...)` (compacted as it goes: the
summariser is a second ScriptedModel), `whole` with compaction off and no
window (its view grows to every message). Per round: wall ms over the task.
Then each finished task is resumed as a worker would (`Recovery.start`: the
model view and the last round's entries), the median of 5: the windowed one
reads its view from its last compaction on. Prints median and min-max of runs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from typing import Any

from bench.common import PG_URL, USER_TEXT, postgres_unreachable, throwaway_schema
from duragent import (
    Agent,
    BuiltinTools,
    ContextPolicy,
    Limits,
    Runtime,
    ScriptedModel,
    TaskStatus,
    ToolCall,
    tool,
)
from duragent.runtime._engine import TaskRunner
from duragent.store import open_store
from duragent.types import EntryKind

RESULT = "lorem ipsum dolor sit amet " * 55  # ~1,500 characters


def agent(rounds: int, window: int | None) -> tuple[Agent, list[int]]:
    """The task's agent and its record of the request sizes the model was asked."""
    done = [0]
    sizes: list[int] = []

    def script(messages: list[Any]) -> Any:
        sizes.append(sum(len(getattr(m, "content", None) or "") for m in messages) // 4)
        if done[0] >= rounds:
            return f"All {rounds} steps done."
        done[0] += 1
        return [ToolCall("work", {"n": done[0]})]

    @tool(name="work")
    async def work(n: int) -> str:
        """Process batch n."""
        return f"batch {n}: {RESULT}"

    policy = (
        ContextPolicy(
            window=window, summarizer=ScriptedModel(["Batches processed so far."] * 10**6)
        )
        if window
        else ContextPolicy(enabled=False)
    )
    return (
        Agent(
            name="long",
            model=ScriptedModel(script, chunk_size=10_000),
            tools=[work],
            limits=Limits(max_iterations=rounds + 10),
            builtin_tools=BuiltinTools(plan=False),
            context=policy,
        ),
        sizes,
    )


async def one(url: str, rounds: int, window: int | None) -> dict[str, Any]:
    a, sizes = agent(rounds, window)
    async with Runtime(url, agents=[a], poll_interval=0.05) as rt:
        t0 = time.perf_counter()
        sub = await rt.submit("long", USER_TEXT)
        task = await sub.wait(timeout=1800)
        took = time.perf_counter() - t0
        assert task.status is TaskStatus.COMPLETED, task.error
    store = open_store(url)
    await store.open()
    try:
        entries = await store.entries(task.id)
        resumes, messages = [], 0
        for _ in range(5):
            row = await store.get_task(task.id)
            runner = TaskRunner(store, a, row)
            t1 = time.perf_counter()
            await runner.recovery.start()
            resumes.append((time.perf_counter() - t1) * 1e3)
            messages = len(runner.view)
            await runner.state.close()
    finally:
        await store.close()
    return {
        "ms_per_round": took / rounds * 1e3,
        "resume_ms": statistics.median(resumes),
        "view_messages": messages,
        "entries": len(entries),
        "compactions": sum(1 for e in entries if e.kind is EntryKind.COMPACTION),
        "max_request_tokens": max(sizes),
    }


def fmt(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"


async def main(rounds: int, window: int, runs: int, postgres: bool) -> None:
    results: dict[str, list[dict[str, Any]]] = {"windowed": [], "whole": []}
    for _ in range(runs):
        for label, w in (("windowed", window), ("whole", None)):
            if postgres:
                with throwaway_schema("compaction") as schema:
                    results[label].append(await one(f"{PG_URL}?schema={schema}", rounds, w))
            else:
                with tempfile.TemporaryDirectory() as d:
                    results[label].append(
                        await one(f"sqlite:///{os.path.join(d, 'c.db')}", rounds, w)
                    )
    store = "postgres" if postgres else "sqlite"
    print(f"{rounds:,} rounds, {store}, {runs} runs: median (min–max)")
    print(
        "| task | ms per round | resume ms | view messages | entries | compactions"
        " | largest request (tokens) |"
    )
    print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
    for label, rows in results.items():
        name = f"{window:,}-token window" if label == "windowed" else "no window (compaction off)"
        last = rows[-1]
        per_round = fmt([r["ms_per_round"] for r in rows])
        resume = fmt([r["resume_ms"] for r in rows])
        print(
            f"| {name} | {per_round} | {resume} | {last['view_messages']:,} | {last['entries']:,}"
            f" | {last['compactions']} | {max(r['max_request_tokens'] for r in rows):,} |"
        )


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=1_000)
    ap.add_argument("--window", type=int, default=16_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--postgres", action="store_true")
    a = ap.parse_args()
    if a.postgres and (problem := postgres_unreachable()):
        raise SystemExit(problem)
    asyncio.run(main(a.rounds, a.window, a.runs, a.postgres))
