"""The OpenAPI document, finished for client generators.

FastAPI writes most of it; this adds what generators need and FastAPI leaves
out: readable operationIds (the route's name in camelCase), every error status
a route can answer as a problem (413, 429 and 503 come from the gate, the
connection limits and the store, so no route declares them), `servers`,
`security: []` where no token is needed, discriminators that are required,
request fields with a default left optional, the enums defined once, and the
schema of each server-sent event.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute

from duragent.server._problem_types import PROBLEM_TYPES, type_uri
from duragent.server._schemas import NAMED_ENUMS, Problem, StreamEnd
from duragent.types import EntryKind

MEDIA_TYPE = "application/problem+json"
_REF = "#/components/schemas/"
_METHODS = ("get", "put", "post", "delete", "patch")


def operation_id(route: APIRoute) -> str:
    """`create_task` -> `createTask`: the route function's name is the operation's."""
    first, *rest = route.name.split("_")
    return first + "".join(word.capitalize() for word in rest)


def complete_openapi(app: FastAPI) -> None:
    """Finish the document once, when it is first asked for."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = finish(build())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def finish(schema: dict[str, Any]) -> dict[str, Any]:
    schema["servers"] = [{"url": "/", "description": "The server this document came from"}]
    schema["info"]["license"] = {"name": "Apache-2.0", "identifier": "Apache-2.0"}
    components = schema.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    schemas["Problem"] = _problem_schema()
    schemas.update(NAMED_ENUMS)
    schemas["StreamEnd"] = StreamEnd.model_json_schema(ref_template=_REF + "{model}")
    schemas["StreamEnd"].pop("$defs", None)  # TaskStatus: a component already
    schemas["TaskStreamEvent"] = _stream_event_union()
    components.setdefault("securitySchemes", {})["StreamToken"] = {
        "type": "apiKey",
        "in": "query",
        "name": "stream_token",
        "description": "A token from POST /v1/tasks/{task_id}/stream-token: that task's "
        "/events only, for a short time.",
    }
    for op in _operations(schema):
        _complete_responses(op)
    _require_discriminators(schemas)
    _optional_request_defaults(schema, schemas)
    _unwrap_refs(schema)
    return schema


def _operations(schema: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for item in schema.get("paths", {}).values():
        for method in _METHODS:
            if method in item:
                yield item[method]


def _problem_schema() -> dict[str, Any]:
    out = Problem.model_json_schema()
    out["properties"]["type"]["examples"] = [type_uri("task-not-found")]
    return out


def problem_response(status: int) -> dict[str, Any]:
    kinds = [slug for slug, (s, _, _) in PROBLEM_TYPES.items() if s == status]
    described = " ".join(f"`{type_uri(k)}`: {PROBLEM_TYPES[k][2]}" for k in kinds)
    return {
        "description": described or "Error",
        "content": {MEDIA_TYPE: {"schema": {"$ref": _REF + "Problem"}}},
    }


def _complete_responses(op: dict[str, Any]) -> None:
    """Every problem a route can answer, described by the types it may carry."""
    responses = op.setdefault("responses", {})
    if "security" not in op:
        op["security"] = []  # no token needed (the health check)
    # A route's own `security` (openapi_extra) comes before its dependencies': once each.
    op["security"] = [r for i, r in enumerate(op["security"]) if r not in op["security"][:i]]
    statuses = [422, 429, 503]  # 422: any route refuses an unknown query parameter
    if op["security"]:
        statuses.append(401)
    if "requestBody" in op:
        statuses.append(413)
    for status in statuses:
        responses.setdefault(str(status), {})
    for status, response in responses.items():
        if status.startswith(("4", "5")):
            response.update(problem_response(int(status)))
    op["responses"] = dict(sorted(responses.items()))


def _stream_event_union() -> dict[str, Any]:
    mapping = {kind.value: _REF + "Entry" for kind in EntryKind}
    mapping["end"] = _REF + "StreamEnd"
    return {
        "title": "TaskStreamEvent",
        "description": "The data of an event of GET /v1/tasks/{task_id}/events: a committed "
        "entry (`event:` is its kind, `id:` its seq), then once the task ended a StreamEnd "
        "(`event: end`).",
        "oneOf": [{"$ref": _REF + "Entry"}, {"$ref": _REF + "StreamEnd"}],
        "discriminator": {"propertyName": "kind", "mapping": mapping},
    }


def stream_responses() -> dict[int | str, dict[str, Any]]:
    """The 200 of the event stream: each event's schema, by its `event:` name."""
    events: dict[str, Any] = {kind.value: {"$ref": _REF + "Entry"} for kind in EntryKind}
    events["end"] = {"$ref": _REF + "StreamEnd"}
    return {
        200: {
            "description": "Server-sent events: `id: <seq>`, `event: <entry kind>`, `data: "
            "<Entry JSON>` for each committed entry, then `event: end` with a StreamEnd once "
            "the task is terminal. Each data is a TaskStreamEvent.",
            "content": {
                "text/event-stream": {
                    # Each event's data; the body is a sequence of them (OpenAPI 3.2 would
                    # say itemSchema).
                    "schema": {"$ref": _REF + "TaskStreamEvent"},
                    "x-sse-events": events,
                }
            },
        }
    }


def _require_discriminators(schemas: dict[str, Any]) -> None:
    """A tagged union's tag is in every member: say so (pydantic leaves a tag with a
    default optional, and generators then cannot tell the members apart)."""
    for schema in list(_walk(schemas)):
        disc = schema.get("discriminator")
        if not isinstance(disc, dict):
            continue
        name = disc["propertyName"]
        for ref in {*disc.get("mapping", {}).values()}:
            member = schemas.get(ref.removeprefix(_REF))
            props = member.get("properties", {}) if member is not None else {}
            if member is not None and name in props and name not in member.get("required", []):
                member.setdefault("required", []).insert(0, name)


def _unwrap_refs(schema: dict[str, Any]) -> None:
    """`allOf: [one $ref]` (how server/_schemas.py names an enum) -> the $ref itself:
    OpenAPI 3.1 lets a $ref have siblings (title, description)."""
    for node in list(_walk(schema)):
        one = node.get("allOf")
        if isinstance(one, list) and len(one) == 1 and set(one[0]) == {"$ref"}:
            node["$ref"] = node.pop("allOf")[0]["$ref"]


def _walk(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def _refs(node: Any) -> Iterator[str]:
    for d in _walk(node):
        ref = d.get("$ref")
        if isinstance(ref, str) and ref.startswith(_REF):
            yield ref.removeprefix(_REF)


def _optional_request_defaults(schema: dict[str, Any], schemas: dict[str, Any]) -> None:
    """A request field with a default need not be sent. openapi-typescript reads a
    `default` as "always present", so in request bodies the default is said in words."""
    names: set[str] = set()
    todo = [r for op in _operations(schema) for r in _refs(op.get("requestBody", {}))]
    while todo:
        name = todo.pop()
        if name in names or name not in schemas:
            continue
        names.add(name)
        todo.extend(_refs(schemas[name]))
    for name in names:
        for field, prop in schemas[name].get("properties", {}).items():
            if "default" not in prop or field in schemas[name].get("required", ()):
                continue
            default = prop.pop("default")
            if default is not None:
                said = f"Default: {default!r}." if not isinstance(default, bool) else ""
                said = said or f"Default: {str(default).lower()}."
                prop["description"] = f"{prop.get('description', '')} {said}".strip()
