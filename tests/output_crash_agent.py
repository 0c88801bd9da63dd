"""A child process for the structured output and guardrail crash tests: runs one
task, and can block at a named point for the test to SIGKILL it.

    python tests/output_crash_agent.py STORE_URL LEDGER POINT

POINT: "input" (inside the second input guardrail, after the first one's verdict
was committed), "retry" (the round after a wrong answer was sent back, before the model is
asked again), "guardrail" (inside the second output guardrail, after the first
one's verdict was committed) or "none". At the point the process prints
`AT <point>` and blocks. Every model answer and guardrail run is appended to
LEDGER, so the test counts what ran. Exits 0 once the task ends.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from pydantic import BaseModel

from duragent import Agent, BuiltinTools, GuardrailResult, Runtime, ScriptedModel, Turn

URL, LEDGER, POINT = sys.argv[1:4]


def ledger(line: str) -> None:
    fd = os.open(LEDGER, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def ran(line: str) -> bool:
    try:
        with open(LEDGER) as f:
            return line in f.read().splitlines()
    except FileNotFoundError:
        return False


class City(BaseModel):
    name: str
    population: int


def answer(n: int, value: dict[str, Any]) -> Any:
    def turn(messages: list[Any]) -> Turn:
        ledger(f"answer {n}")
        return Turn(output=value)

    return turn


async def screen(text: str) -> GuardrailResult:
    ledger("screen")
    return GuardrailResult()


async def vet(text: str) -> GuardrailResult:
    ledger("vet")
    if POINT == "input":
        print("AT input", flush=True)
        await asyncio.sleep(3600)
    return GuardrailResult()


async def first(city: City) -> GuardrailResult:
    ledger(f"first {city.name}")
    return GuardrailResult()


async def second(city: City) -> GuardrailResult:
    ledger(f"second {city.name}")
    if POINT == "guardrail":
        print("AT guardrail", flush=True)
        await asyncio.sleep(3600)
    return GuardrailResult()


async def trace(point: str, **info: Any) -> None:
    if POINT == "retry" and point == "round_start" and info["round"] == 2:
        print("AT retry", flush=True)
        await asyncio.sleep(3600)


model = ScriptedModel(
    [
        answer(1, {"name": "Paris", "population": "lots"}),
        answer(2, {"name": "Paris", "population": 2_100_000}),
    ]
)
agent = Agent(
    name="cities",
    model=model,
    output_type=City,
    input_guardrails=[screen, vet],
    output_guardrails=[first, second],
    builtin_tools=BuiltinTools(plan=False),
)


async def main() -> None:
    rt = Runtime(URL, agents=[agent], lease_ttl=1.0, poll_interval=0.1, trace=trace)
    async with rt:
        sub = await rt.submit("cities", "The largest city of France?", request_id="crash")
        task = await sub.wait(timeout=60)
        print(f"DONE {task.status.value} {task.id}", flush=True)


asyncio.run(main())
