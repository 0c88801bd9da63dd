"""Schemathesis against the live server's own /openapi.json: no 5xx, no schema violation."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from server_live import LiveServer, live_server

schemathesis = pytest.importorskip("schemathesis")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server(tmp_path_factory.mktemp("schema"), workers=2) as s:
        yield s


@pytest.fixture(scope="module")
def api_schema(server: LiveServer) -> Any:
    return schemathesis.openapi.from_url(f"{server.url}/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_api_conforms_to_its_openapi(case: Any, server: LiveServer) -> None:
    case.call_and_validate(headers=server.headers(), timeout=20)


def test_schema_documents_problem_responses(api_schema: Any, tmp_path: Path) -> None:
    raw = api_schema.raw_schema
    ops = [op for path in raw["paths"].values() for op in path.values()]
    assert len(ops) >= 15
    for op in ops:
        for status, resp in op["responses"].items():
            if status.startswith(("4", "5")):
                assert list(resp["content"]) == ["application/problem+json"], (op, status)
    assert raw["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
