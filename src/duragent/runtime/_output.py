"""Structured output: an agent's `output_type` as a JSON schema pinned on its tasks,
and a final answer checked against it.

A task records the schema its final answer must meet when it is created
(`config["request"]["output"]`, next to the pinned model: runtime/_pins.py), so
every model call of the task, a resend after a crash included, asks for the same
shape. The answer is validated by pydantic (a model class) or by `jsonschema` (a
schema given as a dict, extra `schema`); one that does not validate goes back to
the model with the errors (runtime/_final.py).
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from pydantic import BaseModel, ValidationError

from duragent.errors import InvalidOption, MissingExtra
from duragent.llm._base import OutputSpec

# A pydantic model class, or a JSON schema (of an object) as a dict.
OutputType = type[BaseModel] | dict[str, Any]


class OutputInvalid(Exception):
    """A final answer that does not meet the output schema; `errors` says why."""

    def __init__(self, errors: str) -> None:
        super().__init__(errors)
        self.errors = errors


def check_output_type(output_type: Any) -> None:
    """Refuse what cannot be an output type, with what to give instead."""
    if output_type is None:
        return
    if isinstance(output_type, type) and issubclass(output_type, BaseModel):
        try:
            schema = output_type.model_json_schema()
        except Exception as exc:  # a type pydantic cannot describe
            text = " ".join(str(exc).split())
            raise InvalidOption(f"Agent.output_type {output_type.__name__}: {text}") from None
        if schema.get("type") != "object":
            raise InvalidOption(
                f"Agent.output_type {output_type.__name__} must describe an object, not "
                f"{schema.get('type') or 'a reference'} (a RootModel of a list or a scalar "
                "cannot be a tool's input): wrap it in a model with one field"
            )
        return
    if isinstance(output_type, dict):
        if output_type.get("type") != "object":
            raise InvalidOption(
                'Agent.output_type as a JSON schema must describe an object ("type": "object")'
            )
        _json_validator(output_type)  # the extra is there, and the schema is one
        return
    raise InvalidOption(
        f"Agent.output_type is a pydantic model class or a JSON schema dict, not {output_type!r}"
    )


def output_pin(output_type: OutputType) -> dict[str, Any]:
    """The output schema as the task pins it (and the model request carries it)."""
    if isinstance(output_type, dict):
        schema, name = copy.deepcopy(output_type), str(output_type.get("title") or "output")
    else:
        schema, name = output_type.model_json_schema(), output_type.__name__
    name = re.sub(r"[^a-zA-Z0-9_-]", "_", name)[:64] or "output"
    strict = strict_schema(schema)
    pin = {"name": name, "schema": strict or schema, "strict": strict is not None}
    if strict is not None and strict != schema:
        pin["given"] = schema  # what an answer is validated against (`given_schema`)
    return pin


def given_schema(pin: Any) -> dict[str, Any] | None:
    """The schema a pinned output was given as, before its strict form for the
    provider: what rebuilds the agent (`duragent continue`), so an answer is
    validated the same before and after."""
    if not isinstance(pin, dict):
        return None
    schema = pin.get("given", pin.get("schema"))
    return schema if isinstance(schema, dict) else None


def same_output(a: Any, b: Any) -> bool:
    """Whether two output pins ask for the same answer (a pin of an older version
    has no `given`)."""
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return bool(a == b)
    return {k: v for k, v in a.items() if k != "given"} == {
        k: v for k, v in b.items() if k != "given"
    }


def spec_of(pin: Any) -> OutputSpec | None:
    """The pinned output schema of a model request, if it has one."""
    if not isinstance(pin, dict):
        return None
    return OutputSpec(name=pin["name"], schema=pin["schema"], strict=bool(pin.get("strict")))


def strict_schema(schema: dict[str, Any]) -> dict[str, Any] | None:
    """`schema` in OpenAI's strict subset (every property required, no other
    properties, no defaults), or None if it allows other properties (a mapping)."""
    out = copy.deepcopy(schema)
    return out if _make_strict(out) else None


def _make_strict(node: Any) -> bool:
    if isinstance(node, list):
        return all(_make_strict(n) for n in node)
    if not isinstance(node, dict):
        return True
    if node.get("type") == "object" or "properties" in node:
        if node.get("additionalProperties") not in (None, False):
            return False
        node["additionalProperties"] = False
        node["required"] = list(node.get("properties", {}))
    node.pop("default", None)
    for key in ("properties", "$defs", "definitions"):
        if isinstance(node.get(key), dict) and not all(_make_strict(v) for v in node[key].values()):
            return False
    return all(_make_strict(node[k]) for k in ("items", "anyOf", "allOf", "oneOf") if k in node)


def parse_output(output_type: OutputType, text: str) -> tuple[Any, Any]:
    """(the answer as JSON, as the caller's type) from the model's text; raises
    OutputInvalid with errors the model can act on. A model without native
    structured output often fences its JSON in Markdown: one fence is taken off."""
    text = _unfenced(text)
    if isinstance(output_type, dict):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise OutputInvalid(f"the answer is not valid JSON ({exc.msg} at {exc.pos})") from None
        problems = sorted(_json_validator(output_type).iter_errors(value), key=str)
        if problems:
            lines = [
                f"{'/'.join(map(str, p.absolute_path)) or '(root)'}: {p.message}" for p in problems
            ]
            raise OutputInvalid("\n".join(lines[:20]))
        return value, value
    try:
        typed = output_type.model_validate_json(text)
    except ValidationError as exc:
        raise OutputInvalid(_errors_text(exc)) from None
    return typed.model_dump(mode="json"), typed


def _unfenced(text: str) -> str:
    body = text.strip()
    if not (body.startswith("```") and body.endswith("```") and len(body) >= 6):
        return text
    head, _, rest = body[3:-3].partition("\n")
    return rest if head.strip().isalnum() or not head.strip() else body[3:-3]


def typed_output(output_type: OutputType, value: Any) -> Any:
    """A completed task's output (JSON) as the caller's type."""
    if isinstance(output_type, dict):
        return value
    return output_type.model_validate(value)


def correction_text(errors: str) -> str:
    """What the model is told when its answer does not meet the schema."""
    return (
        "Your answer does not match the required output schema:\n"
        f"{errors}\n"
        "Answer again with only the corrected JSON object."
    )


def _errors_text(exc: ValidationError) -> str:
    lines = []
    for e in exc.errors(include_url=False)[:20]:
        where = ".".join(str(p) for p in e["loc"]) or "(root)"
        lines.append(f"{where}: {e['msg']}")
    return "\n".join(lines)


def _json_validator(schema: dict[str, Any]) -> Any:
    try:
        import jsonschema
    except ImportError:
        raise MissingExtra("an output_type given as a JSON schema", "schema") from None
    try:
        cls = jsonschema.validators.validator_for(schema)
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise InvalidOption(
            f"Agent.output_type is not a valid JSON schema: {exc.message}"
        ) from None
    return cls(schema)
