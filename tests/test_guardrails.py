"""Input and output guardrails: each verdict committed, a tripped one fails the task
with its reason or corrects the model, and a verdict in the log is never asked again."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from duragent import (
    Agent,
    BuiltinTools,
    GuardrailResult,
    InvalidOption,
    Runtime,
    ScriptedModel,
    Turn,
)
from duragent.cli._format import describe
from duragent.types import EntryKind, Task, TaskStatus, UserMessage


def agent_of(model: ScriptedModel, **kw: Any) -> Agent:
    return Agent(name="guarded", model=model, builtin_tools=BuiltinTools(plan=False), **kw)


async def run(agent: Agent, text: str = "hello") -> tuple[Task, list[dict[str, Any]]]:
    async with Runtime("memory://", agents=[agent]) as rt:
        task = await (await rt.submit(agent.name, text)).wait(timeout=30)
        entries = await rt.store.entries(task.id, kinds=[EntryKind.CHECKPOINT])
    return task, [e.payload for e in entries if e.payload["type"] == "guardrail"]


async def test_a_tripped_input_guardrail_fails_the_task_before_any_model_call() -> None:
    def no_secrets(text: str) -> GuardrailResult | None:
        if "password" in text:
            return GuardrailResult(tripwire=True, message="the input holds a password")
        return None

    model = ScriptedModel(["never said"])
    task, verdicts = await run(agent_of(model, input_guardrails=[no_secrets]), "my password is x")
    assert task.status is TaskStatus.FAILED and task.status_reason == "guardrail"
    assert task.error == "input guardrail no_secrets tripped: the input holds a password"
    assert model.calls == 0
    (verdict,) = verdicts
    assert verdict["name"] == "no_secrets" and verdict["tripwire"] is True
    assert verdict["stage"] == "input" and verdict["action"] == "fail"


async def test_input_guardrails_that_pass_are_committed_and_the_task_runs() -> None:
    async def polite(text: str) -> GuardrailResult:
        return GuardrailResult(info={"length": len(text)})

    model = ScriptedModel(["Hi!"])
    task, verdicts = await run(agent_of(model, input_guardrails=[polite]))
    assert task.status is TaskStatus.COMPLETED and task.output == "Hi!"
    assert [(v["name"], v["tripwire"], v["info"]) for v in verdicts] == [
        ("polite", False, {"length": 5})
    ]


async def test_a_correcting_input_guardrail_tells_the_model_before_it_answers() -> None:
    def on_topic(text: str) -> GuardrailResult:
        return GuardrailResult(tripwire=True, action="correct", message="Only talk about cities.")

    seen: list[Any] = []

    def answer(messages: list[Any]) -> str:
        seen.extend(messages)
        return "Let us talk about cities."

    model = ScriptedModel([answer])
    task, _ = await run(agent_of(model, input_guardrails=[on_topic]))
    assert task.status is TaskStatus.COMPLETED
    assert isinstance(seen[-1], UserMessage) and seen[-1].content == "Only talk about cities."


async def test_a_tripped_output_guardrail_fails_the_task_with_its_reason() -> None:
    def no_shouting(answer: str) -> GuardrailResult | None:
        if answer.isupper():
            return GuardrailResult(tripwire=True, message="the answer shouts")
        return None

    model = ScriptedModel(["HELLO"])
    task, verdicts = await run(agent_of(model, output_guardrails=[no_shouting]))
    assert task.status is TaskStatus.FAILED
    assert task.error == "output guardrail no_shouting tripped: the answer shouts"
    assert task.output is None
    assert [(v["stage"], v["tripwire"]) for v in verdicts] == [("output", True)]


async def test_a_correcting_output_guardrail_sends_the_model_its_message() -> None:
    def no_shouting(answer: str) -> GuardrailResult | None:
        if answer.isupper():
            return GuardrailResult(tripwire=True, action="correct", message="Do not shout.")
        return None

    seen: list[Any] = []

    def calm(messages: list[Any]) -> str:
        seen.extend(messages)
        return "hello"

    model = ScriptedModel(["HELLO", calm])
    task, verdicts = await run(agent_of(model, output_guardrails=[no_shouting]))
    assert task.status is TaskStatus.COMPLETED and task.output == "hello"
    assert isinstance(seen[-1], UserMessage) and seen[-1].content == "Do not shout."
    # One verdict per answer checked: the shouted one tripped, the calm one passed.
    assert [v["tripwire"] for v in verdicts] == [True, False]
    assert verdicts[0]["checked_seq"] != verdicts[1]["checked_seq"]


async def test_an_output_guardrail_sees_the_typed_answer() -> None:
    class City(BaseModel):
        name: str
        population: int

    got: list[Any] = []

    def big_enough(city: City) -> GuardrailResult:
        got.append(city)
        return GuardrailResult(tripwire=city.population < 1000, message="too small")

    model = ScriptedModel([Turn(output={"name": "Paris", "population": 2_100_000})])
    agent = agent_of(model, output_type=City, output_guardrails=[big_enough])
    task, _ = await run(agent)
    assert task.status is TaskStatus.COMPLETED
    assert got == [City(name="Paris", population=2_100_000)]


async def test_a_guardrail_that_raises_fails_the_task_rather_than_let_the_answer_pass() -> None:
    def broken(answer: str) -> GuardrailResult:
        raise RuntimeError("classifier down")

    task, verdicts = await run(agent_of(ScriptedModel(["ok"]), output_guardrails=[broken]))
    assert task.status is TaskStatus.FAILED
    assert "classifier down" in (task.error or "")
    assert verdicts[0]["tripwire"] is True


def test_guardrails_are_functions_with_distinct_names() -> None:
    def check(x: str) -> None:
        return None

    with pytest.raises(InvalidOption, match="two guardrails named 'check'"):
        Agent(name="a", model="scripted:none", output_guardrails=[check, check])
    with pytest.raises(InvalidOption, match="holds functions"):
        Agent(name="a", model="scripted:none", input_guardrails=["nope"])  # type: ignore[list-item]
    with pytest.raises(InvalidOption, match="needs a message"):
        GuardrailResult(tripwire=True, action="correct")


async def test_duragent_show_says_each_verdict() -> None:
    def screen(text: str) -> GuardrailResult:
        return GuardrailResult()

    def no_shouting(answer: str) -> GuardrailResult:
        return GuardrailResult(tripwire=answer.isupper(), message="the answer shouts")

    agent = agent_of(
        ScriptedModel(["HELLO"]), input_guardrails=[screen], output_guardrails=[no_shouting]
    )
    async with Runtime("memory://", agents=[agent]) as rt:
        task = await (await rt.submit(agent.name, "hi")).wait(timeout=30)
        lines = [describe(e) for e in await rt.store.entries(task.id)]
    assert "input guardrail screen on #1: passed" in lines
    assert any(
        line.startswith("output guardrail no_shouting on #")
        and line.endswith("tripped (fail): the answer shouts")
        for line in lines
    )


async def test_corrections_past_output_retries_fail_the_task_as_a_guardrail() -> None:
    def no_shouting(answer: str) -> GuardrailResult | None:
        if answer.isupper():
            return GuardrailResult(tripwire=True, action="correct", message="Do not\nshout.")
        return None

    model = ScriptedModel(["HELLO", "HELLO!", "HELLO!!", "never asked"])
    agent = agent_of(model, output_guardrails=[no_shouting], output_retries=2)
    async with Runtime("memory://", agents=[agent]) as rt:
        task = await (await rt.submit(agent.name, "hi")).wait(timeout=30)
        notes = [
            e.payload.get("message", "")
            for e in await rt.store.entries(task.id, kinds=[EntryKind.UI_MESSAGE])
        ]
    assert task.status is TaskStatus.FAILED and task.status_reason == "guardrail"
    assert task.error == (
        "output guardrail no_shouting asked for a correction 3 times "
        "(Agent.output_retries=2): Do not shout."
    )
    assert model.calls == 3
    assert "guardrail_corrections" not in task.config
    assert sum("(correction" in str(n) for n in notes) == 2
