"""Structured output (`Agent(output_type=...)`): the schema pinned on the task and
sent with every model call, the answer validated, a wrong one sent back with the
errors (each attempt committed), and the typed object handed back."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, RootModel

from duragent import (
    Agent,
    BuiltinTools,
    InvalidOption,
    Runtime,
    ScriptedModel,
    TaskFailed,
    ToolCall,
    Turn,
    tool,
)
from duragent.runtime._output import OutputInvalid, given_schema, parse_output
from duragent.runtime._pins import conflict, with_pins
from duragent.types import AssistantMessage, EntryKind, Task, TaskStatus, UserMessage


class City(BaseModel):
    name: str
    population: int


def agent_of(model: ScriptedModel, **kw: Any) -> Agent:
    return Agent(
        name="cities",
        model=model,
        output_type=City,
        builtin_tools=BuiltinTools(plan=False),
        **kw,
    )


async def test_a_valid_answer_is_the_typed_result_and_the_json_output() -> None:
    model = ScriptedModel([Turn(output=City(name="Paris", population=2_100_000))])
    async with Runtime("memory://", agents=[agent_of(model)]) as rt:
        sub = await rt.submit("cities", "The largest city of France?")
        city = await sub.result(timeout=30)
        task = await rt.get(sub.task_id)
    assert city == City(name="Paris", population=2_100_000)
    assert task.output == {"name": "Paris", "population": 2_100_000}
    # The request carried the schema, in OpenAI's strict form, pinned on the task.
    assert model.last_request is not None and model.last_request.output is not None
    spec = model.last_request.output
    assert spec.name == "City" and spec.strict
    assert spec.schema["required"] == ["name", "population"]
    assert spec.schema["additionalProperties"] is False
    assert task.config["request"]["output"]["schema"] == spec.schema


async def test_a_wrong_answer_goes_back_with_the_errors_and_each_attempt_is_committed() -> None:
    seen: list[list[Any]] = []

    def second(messages: list[Any]) -> Turn:
        seen.append(messages)
        return Turn(output={"name": "Paris", "population": 2_100_000})

    model = ScriptedModel(['{"name": "Paris", "population": "many"}', second])
    async with Runtime("memory://", agents=[agent_of(model)]) as rt:
        sub = await rt.submit("cities", "The largest city of France?")
        city = await sub.result(timeout=30)
        entries = await rt.store.entries(sub.task_id)
        task = await rt.get(sub.task_id)
    assert city.population == 2_100_000
    # The model saw its wrong answer, then the errors naming the field.
    wrong, correction = seen[0][-2], seen[0][-1]
    assert isinstance(wrong, AssistantMessage) and "many" in (wrong.content or "")
    assert isinstance(correction, UserMessage)
    assert "population" in correction.content and "integer" in correction.content
    answers = [
        e for e in entries if e.kind is EntryKind.API_MESSAGE and e.payload["role"] == "assistant"
    ]
    assert len(answers) == 2  # both attempts are in the log
    assert task.iterations == 2 and "output_failures" in task.config


async def test_retries_spent_fail_the_task_with_the_errors() -> None:
    model = ScriptedModel(["not json", '{"name": 3}', '{"name": "x"}'])
    agent = agent_of(model, output_retries=2)
    async with Runtime("memory://", agents=[agent]) as rt:
        sub = await rt.submit("cities", "?")
        with pytest.raises(TaskFailed, match="did not match the output schema after 3 attempts"):
            await sub.result(timeout=30)
        task = await rt.get(sub.task_id)
    assert model.calls == 3
    assert task.status is TaskStatus.FAILED and task.status_reason == "output_invalid"
    assert "population" in (task.error or "")
    assert "output_failures" not in task.config  # a retry starts counting again


async def test_a_json_schema_output_type_validates_with_jsonschema() -> None:
    schema = {
        "title": "Verdict",
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "score": {"type": "number", "minimum": 0}},
        "required": ["ok", "score"],
    }
    model = ScriptedModel(['{"ok": true, "score": -1}', '{"ok": true, "score": 0.5}'])
    agent = Agent(name="judge", model=model, output_type=schema)
    async with Runtime("memory://", agents=[agent]) as rt:
        sub = await rt.submit("judge", "judge this")
        verdict = await sub.result(timeout=30)
    assert verdict == {"ok": True, "score": 0.5}
    assert model.calls == 2
    assert model.last_request is not None and model.last_request.output is not None
    assert model.last_request.output.name == "Verdict"


async def test_tools_run_before_the_structured_answer() -> None:
    @tool
    def population(city: str) -> int:
        """The population of a city."""
        return 2_100_000

    model = ScriptedModel(
        [
            [ToolCall("population", {"city": "Paris"})],
            Turn(output=City(name="Paris", population=2_100_000)),
        ]
    )
    async with Runtime("memory://", agents=[agent_of(model, tools=[population])]) as rt:
        city = await (await rt.submit("cities", "?")).result(timeout=30)
    assert city.population == 2_100_000


async def test_a_task_keeps_the_schema_it_was_created_with(tmp_path: Path) -> None:
    """The schema is part of the task's pin: a worker whose agent asks for another
    shape blocks the task rather than answer it in a shape its caller did not ask for.
    (Undeclared, the schema changes the agent's version, and such a worker never
    claims the task; declared the same, the pin is what stops it.)"""

    class Other(BaseModel):
        title: str

    store = f"sqlite:///{tmp_path}/pin.db"
    model = ScriptedModel([Turn(output={"title": "x"})])
    first = dataclasses.replace(agent_of(model), version="1")
    async with Runtime(store, agents=[first], run_worker=False) as rt:
        task_id = (await rt.submit("cities", "?")).task_id
    changed = Agent(name="cities", model=model, output_type=Other, version="1")
    assert agent_of(model).version != Agent(name="cities", model=model, output_type=Other).version
    async with Runtime(store, agents=[changed], poll_interval=0.05) as rt:
        task = await rt.wait(task_id, timeout=30, until=lambda t: t.status is TaskStatus.BLOCKED)
        assert "output schema 'City'" in (task.error or "")
        assert model.calls == 0
        await rt.repin(task_id)
        await rt.resume(task_id)
        assert await rt.result(task_id, timeout=30) == Other(title="x")


async def test_a_caller_without_the_agent_gets_the_json_or_names_the_type() -> None:
    model = ScriptedModel([Turn(output=City(name="Oslo", population=700_000))])
    async with Runtime("memory://", agents=[agent_of(model)]) as rt:
        task_id = (await rt.submit("cities", "?")).task_id
        await rt.wait(task_id, timeout=30)
        rt.agents.pop("cities")
        assert await rt.result(task_id) == {"name": "Oslo", "population": 700_000}
        assert await rt.result(task_id, output_type=City) == City(name="Oslo", population=700_000)


@pytest.mark.parametrize(
    ("output_type", "says"),
    [
        (int, "pydantic model class or a JSON schema"),
        ({"type": "array"}, '"type": "object"'),
        ({"type": "object", "properties": 3}, "not a valid JSON schema"),
        (RootModel[list[int]], "must describe an object, not array"),
        (RootModel[str], "must describe an object, not string"),
    ],
)
def test_an_output_type_that_cannot_be_is_refused(output_type: Any, says: str) -> None:
    with pytest.raises(InvalidOption, match=re.escape(says)) as refused:
        Agent(name="a", model="scripted:none", output_type=output_type)
    assert "\n" not in str(refused.value)


def test_a_schema_with_free_form_objects_is_sent_without_strict() -> None:
    class Tags(BaseModel):
        tags: dict[str, str]
        note: str = ""

    agent = Agent(name="a", model="scripted:none", output_type=Tags)
    assert agent.output_pin is not None
    assert agent.output_pin["strict"] is False
    assert "required" not in agent.output_pin["schema"] or agent.output_pin["schema"][
        "required"
    ] == ["tags"]


@pytest.mark.parametrize(
    "text",
    [
        '```json\n{"name": "Oslo", "population": 700000}\n```',
        '```\n{"name": "Oslo", "population": 700000}\n```',
        '  {"name": "Oslo", "population": 700000}\n',
    ],
)
def test_an_answer_fenced_in_markdown_is_read(text: str) -> None:
    value, typed = parse_output(City, text)
    assert value == {"name": "Oslo", "population": 700_000}
    assert typed == City(name="Oslo", population=700_000)
    with pytest.raises(OutputInvalid):
        parse_output(City, "```json\nnot json\n```")


def test_an_agent_rebuilt_from_its_pin_validates_as_before() -> None:
    """`duragent continue` rebuilds a `run --output-schema` agent from the task's pin:
    an optional property stays optional (the strict form, all required, is only what
    the provider is sent), and the pin is the same, so the task is not refused."""
    given = {
        "title": "Summary",
        "type": "object",
        "properties": {"files": {"type": "integer"}, "topic": {"type": "string"}},
        "required": ["files"],
    }
    before = Agent(name="a", model="scripted:none", output_type=given)
    pin = before.output_pin
    assert pin is not None and pin["strict"] and pin["schema"]["required"] == ["files", "topic"]
    with pytest.raises(OutputInvalid, match="topic"):  # the strict form would refuse it
        parse_output(pin["schema"], '{"files": 2}')
    after = Agent(name="a", model="scripted:none", output_type=given_schema(pin))
    assert before.output_type is not None and after.output_type is not None
    assert parse_output(before.output_type, '{"files": 2}')[0] == {"files": 2}
    assert parse_output(after.output_type, '{"files": 2}')[0] == {"files": 2}
    task = Task(id="t", agent="a", config=with_pins(before, {}))
    assert conflict(task, after) is None
    # A task pinned before pins kept the given schema is still the same shape.
    old = {k: v for k, v in pin.items() if k != "given"}
    assert conflict(Task(id="t", agent="a", config={"request": {"output": old}}), after) is None
