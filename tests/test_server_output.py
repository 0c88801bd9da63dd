"""The REST API of a task with a structured answer: `output` is its JSON."""

from __future__ import annotations

from pathlib import Path

import httpx
from pydantic import BaseModel

from duragent import Agent, BuiltinTools, GuardrailResult, Runtime, ScriptedModel, Turn
from duragent.server import TokenStore, create_app
from duragent.types import TaskStatus
from support.api import TOKENS, auth, start, wait_for


class City(BaseModel):
    name: str
    population: int


def never_paris(city: City) -> GuardrailResult:
    return GuardrailResult(tripwire=city.name == "Paris", message="not Paris")


async def test_a_structured_answer_is_json_in_the_task_and_a_tripped_guardrail_its_error(
    tmp_path: Path,
) -> None:
    agents = [
        Agent(
            name="cities",
            model=ScriptedModel([Turn(output=City(name="Oslo", population=700_000))]),
            output_type=City,
        ),
        Agent(
            name="guarded",
            model=ScriptedModel([Turn(output=City(name="Paris", population=2_100_000))]),
            output_type=City,
            output_guardrails=[never_paris],
            builtin_tools=BuiltinTools(plan=False),
        ),
    ]
    async with Runtime(f"sqlite:///{tmp_path}/api.db", agents, poll_interval=0.05) as rt:
        app = create_app(rt, TokenStore.from_mapping(TOKENS))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            listed = (await client.get("/v1/agents", headers=auth("alice"))).json()["agents"]
            schemas = {a["name"]: a["output_schema"] for a in listed}
            assert schemas["cities"]["required"] == ["name", "population"]

            ok = await start(client, "cities")
            await wait_for(rt, ok, TaskStatus.COMPLETED)
            body = (await client.get(f"/v1/tasks/{ok}", headers=auth("alice"))).json()
            assert body["output"] == {"name": "Oslo", "population": 700_000}

            bad = await start(client, "guarded")
            await wait_for(rt, bad, TaskStatus.FAILED)
            body = (await client.get(f"/v1/tasks/{bad}", headers=auth("alice"))).json()
            assert body["output"] is None and body["status_reason"] == "guardrail"
            assert body["error"] == "output guardrail never_paris tripped: not Paris"
