"""DBOS under the shared workloads: the agent loop as one workflow, one step per model
call and one step per tool call (each step's output is committed before the next runs)."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from typing import Any

from dbos import DBOS

from bench.common import (
    PG_URL,
    TOOL_NAME,
    USER_TEXT,
    RoundClock,
    assistant_text,
    call_id,
    drop_schema,
    new_schema,
    repeated,
    schema_bytes,
    sqlite_bytes,
    tool_args,
    tool_output,
)

CONFIGS = ("sqlite", "postgres")

_clock = RoundClock()
_rounds = 0


@DBOS.step()
async def call_model(messages: list[dict[str, Any]]) -> dict[str, Any]:
    done = _clock.tick()
    if done < _rounds:
        r = done + 1
        return {
            "role": "assistant",
            "content": assistant_text(r),
            "tool_calls": [
                {
                    "id": call_id(r),
                    "type": "function",
                    "function": {"name": TOOL_NAME, "arguments": tool_args(r)},
                }
            ],
        }
    return {"role": "assistant", "content": f"All {_rounds} steps are done."}


@DBOS.step()
async def call_tool(n: int) -> str:
    return tool_output(n)


@DBOS.workflow()
async def agent_loop(user_text: str) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": user_text}]
    while True:
        message = await call_model(messages)
        messages.append(message)
        if not message.get("tool_calls"):
            return messages
        for call in message["tool_calls"]:
            result = await call_tool(call["function"]["arguments"]["n"])
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})


def _launch(config: str, workdir: str) -> tuple[str | None, str]:
    schema = None
    if config == "sqlite":
        url = f"sqlite:///{workdir}/dbos.sqlite"
    elif config == "postgres":
        schema = new_schema("bench_dbos")
        url = PG_URL
    else:
        raise ValueError(f"unknown dbos config {config!r}")
    cfg: dict[str, Any] = {"name": "bench", "system_database_url": url, "log_level": "WARNING"}
    if schema:
        cfg["dbos_system_schema"] = schema
    DBOS(config=cfg)  # type: ignore[arg-type]
    DBOS.launch()
    logging.getLogger("dbos").setLevel(logging.WARNING)
    return schema, url


def _size(config: str, workdir: str, schema: str | None) -> int:
    if config == "sqlite":
        return sqlite_bytes(f"{workdir}/dbos.sqlite")
    assert schema is not None
    return schema_bytes(schema)


def _measure(
    measured: dict[str, int], n: int, config: str, workdir: str, schema: str | None
) -> None:
    measured[str(n)] = _size(config, workdir, schema)


async def rounds(
    config: str, workdir: str, rounds: int, sizes: list[int] | None = None, repeats: int = 1
) -> Any:
    """`repeats` workflows of `rounds` rounds, one after another on one launched DBOS."""
    global _clock, _rounds
    _rounds = rounds
    schema, _ = _launch(config, workdir)
    try:
        results = []
        for _ in range(repeats):
            _clock = RoundClock()
            measured: dict[str, int] = {}
            for n in sizes or ():
                _clock.hooks[n] = functools.partial(_measure, measured, n, config, workdir, schema)
            t0 = time.perf_counter()
            handle = await DBOS.start_workflow_async(agent_loop, USER_TEXT)
            messages = await handle.get_result()
            total = time.perf_counter() - t0
            assert len(messages) == 2 * rounds + 2, len(messages)
            results.append({**_clock.summary(), "total_s": total, "sizes": measured})
        return repeated(lambda i: results[i], repeats)
    finally:
        DBOS.destroy()
        if schema:
            drop_schema(schema)


def run(workload: str, params: dict[str, Any]) -> Any:
    fn = {"rounds": rounds}[workload]
    os.makedirs(params["workdir"], exist_ok=True)
    return asyncio.run(fn(**params))
