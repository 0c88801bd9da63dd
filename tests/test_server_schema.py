"""Schemathesis against the live server's own /openapi.json: no 5xx, no schema violation,
and invalid requests (the negative phase) refused with a 4xx problem, never a 5xx."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, settings

from support.server_live import LiveServer, live_server

schemathesis = pytest.importorskip("schemathesis")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    # Negative cases may carry broken Authorization headers: those must not lock the
    # test client's address out (the throttle has its own test). Alice is an admin,
    # so the queue limits' PUT and DELETE are tried for real, not only refused.
    args = ["--auth-failures-per-minute", "100000", "--admin", "alice"]
    with live_server(tmp_path_factory.mktemp("schema"), workers=2, args=args) as s:
        yield s


def with_agent_names(server: LiveServer) -> Any:
    """The served schema, its agent fields narrowed to the agents GET /v1/agents lists
    (the schema names none, so that a new agent needs no new client): valid tasks
    then get created."""
    raw = httpx.get(f"{server.url}/openapi.json", timeout=30).json()
    found = httpx.get(f"{server.url}/v1/agents", headers=server.headers(), timeout=30).json()
    names = sorted(a["name"] for a in found["agents"])
    for body in ("TaskCreate", "ScheduleCreate"):
        raw["components"]["schemas"][body]["properties"]["agent"]["enum"] = names
    loaded = schemathesis.openapi.from_dict(raw)
    loaded.config.update(base_url=server.url, headers=server.headers())
    return loaded


@pytest.fixture(scope="module")
def api_schema(server: LiveServer) -> Any:
    loaded = with_agent_names(server)
    # Valid requests only: invalid ones are the next test's (a "negative" query here
    # can serialize to a valid URL and the dropped Authorization header is sent).
    # Text is UTF-8 without NUL: what every store keeps (the others get a 422, tested).
    loaded.config.generation.update(
        modes=[schemathesis.GenerationMode.POSITIVE], codec="utf-8", allow_x00=False
    )
    return loaded


@pytest.fixture(scope="module")
def negative_schema(server: LiveServer) -> Any:
    loaded = schemathesis.openapi.from_url(f"{server.url}/openapi.json", headers=server.headers())
    loaded.config.generation.update(modes=[schemathesis.GenerationMode.NEGATIVE])
    return loaded


schema = schemathesis.pytest.from_fixture("api_schema")
# Operations with nothing to get wrong (no parameters, no body) have no negative cases.
negative = schemathesis.pytest.from_fixture("negative_schema").exclude(
    path=["/v1/health", "/v1/me", "/v1/agents"]
)


@pytest.mark.slow
@schema.parametrize()
@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_api_conforms_to_its_openapi(case: Any, server: LiveServer) -> None:
    excluded = []
    if (case.method, case.path) == ("POST", "/v1/schedules"):
        # A cron expression's syntax is not expressible in JSON Schema: a schema-valid
        # "0 0 0 0 0" is rightly refused (400). Every other check still applies.
        excluded.append(schemathesis.checks.positive_data_acceptance)
    case.call_and_validate(headers=server.headers(), timeout=20, excluded_checks=excluded)


@pytest.mark.slow
@negative.parametrize()
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_invalid_requests_get_a_4xx_problem_never_a_5xx(case: Any, server: LiveServer) -> None:
    response = case.call(headers=server.headers(), timeout=20)
    assert response.status_code < 500, (case.method, case.path, response.text)
    if response.status_code >= 400:
        content_type = response.headers.get("content-type")  # schemathesis: a list of values
        assert content_type == ["application/problem+json"], (content_type, response.text)
    # Not `negative_data_rejection`: a "negative" query value often serializes to a valid
    # string (and the Authorization header it drops is sent above), so 200 can be right.
    case.validate_response(
        response,
        checks=[
            schemathesis.checks.not_a_server_error,
            schemathesis.checks.content_type_conformance,
        ],
    )


@pytest.mark.slow
def test_schema_documents_problem_responses(api_schema: Any, tmp_path: Path) -> None:
    raw = api_schema.raw_schema
    ops = [op for path in raw["paths"].values() for op in path.values()]
    assert len(ops) >= 15
    for op in ops:
        for status, resp in op["responses"].items():
            if status.startswith(("4", "5")):
                assert list(resp["content"]) == ["application/problem+json"], (op, status)
    assert raw["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
