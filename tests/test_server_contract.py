"""The OpenAPI document as client generators and linters see it: openapi-spec-validator,
`redocly lint`, openapi-typescript and openapi-python-client accept it without an
error or a warning, and what they generate parses real responses. One generation of
each, on one document made once (the session fixture)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, get_args

import httpx
import pytest

from duragent import Agent, Runtime, tool
from duragent.server import TokenStore, create_app
from duragent.server._limits import ServerLimits
from duragent.server._problem_types import PROBLEM_TYPES
from duragent.server._schemas import AgentOut, AgentsOut, StatusReason
from duragent.types import BlockReason, FailReason, WaitReason
from server_agents import agents
from support.npm_tools import npm_tools

ROOT = Path(__file__).resolve().parent.parent
TOKENS = {"alice": "alice-secret-token"}


def make_app() -> Any:
    return create_app(Runtime("memory://", agents()), TokenStore.from_mapping(TOKENS))


@pytest.fixture(scope="session")
def document() -> dict[str, Any]:
    schema: dict[str, Any] = make_app().openapi()
    return schema


@pytest.fixture(scope="session")
def document_file(document: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("contract") / "openapi.json"
    path.write_text(json.dumps(document, indent=1))
    return path


def run(*args: str | Path, cwd: Path | None = None) -> str:
    done = subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, timeout=300, cwd=cwd
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    return out


@pytest.mark.slow
def test_openapi_spec_validator_accepts_it(document_file: Path) -> None:
    out = run(sys.executable, "-m", "openapi_spec_validator", document_file)
    assert "OK" in out


@pytest.mark.slow
def test_redocly_lint_finds_no_error_and_no_warning(document_file: Path) -> None:
    bin_dir = npm_tools()
    done = subprocess.run(
        [str(bin_dir / "redocly"), "lint", str(document_file), "--format=json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = json.loads(done.stdout)
    problems = [(p["ruleId"], p["message"]) for p in report["problems"]]
    assert report["totals"]["errors"] == 0 and report["totals"]["warnings"] == 0, problems


@pytest.mark.slow
def test_openapi_typescript_generates_without_warnings(document_file: Path, tmp_path: Path) -> None:
    out = run(npm_tools() / "openapi-typescript", document_file, "-o", tmp_path / "api.ts")
    assert not re.search(r"warn|⚠|error", out, re.IGNORECASE), out
    types = (tmp_path / "api.ts").read_text()
    assert "createTask: {" in types and "streamEvents: {" in types
    # Fields with a default need not be sent; the server fills them in.
    create = types[types.index("        TaskCreate: {") :]
    create = create[: create.index("\n        };")]
    assert "continue_session?: boolean;" in create and "priority?: number;" in create
    assert '"text/event-stream": components["schemas"]["TaskStreamEvent"]' in types


def conditional_agent() -> Agent:
    @tool(requires_approval=lambda args: args.get("amount", 0) > 100)
    def pay(amount: int) -> str:
        """Pay."""
        return "paid"

    @tool(requires_approval=True)
    def wipe() -> str:
        """Wipe."""
        return "wiped"

    @tool
    def look() -> str:
        """Look."""
        return "seen"

    return Agent("payer", model="openai:gpt-4o-mini", tools=[pay, wipe, look])


@pytest.mark.slow
def test_openapi_python_client_generates_and_parses_every_approval_kind(
    document_file: Path, tmp_path: Path
) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"post_hooks": [], "project_name_override": "gen"}))
    out = run(
        sys.executable,
        "-m",
        "openapi_python_client",
        "generate",
        "--path",
        document_file,
        "--output-path",
        tmp_path / "gen",
        "--meta",
        "none",
        "--config",
        config,
        cwd=tmp_path,
    )
    assert "warning" not in out.lower(), out
    # The response that broke the generated client: a tool whose approval is
    # conditional, beside true and false ones.
    sample = AgentsOut(agents=[AgentOut.of(conditional_agent())]).model_dump(mode="json")
    check = (
        "import json, sys\n"
        "from gen.models.agents_out import AgentsOut\n"
        "got = AgentsOut.from_dict(json.loads(sys.argv[1]))\n"
        "print(json.dumps(got.to_dict()))\n"
    )
    parsed = json.loads(run(sys.executable, "-c", check, json.dumps(sample), cwd=tmp_path))
    tools = {t["name"]: t for t in parsed["agents"][0]["tools"]}
    assert {n: (tools[n]["approval"], tools[n]["requires_approval"]) for n in PAYER} == PAYER


PAYER = {"pay": ("conditional", "conditional"), "wipe": ("always", True), "look": ("never", False)}


def operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method, path, op)
        for path, item in document["paths"].items()
        for method, op in item.items()
        if method in ("get", "put", "post", "delete", "patch")
    ]


def test_operation_ids_read_well(document: dict[str, Any]) -> None:
    ids = {f"{m.upper()} {p}": op["operationId"] for m, p, op in operations(document)}
    assert len(set(ids.values())) == len(ids)
    assert all(re.fullmatch(r"[a-z]+(?:[A-Z][a-z]+)*", i) for i in ids.values()), ids
    assert ids["POST /v1/tasks"] == "createTask" and ids["GET /v1/tasks"] == "listTasks"
    assert ids["GET /v1/tasks/{task_id}"] == "getTask"
    assert ids["GET /v1/tasks/{task_id}/events"] == "streamEvents"
    assert ids["GET /v1/tasks/{task_id}/wait"] == "waitTask"
    assert ids["GET /v1/agents"] == "listAgents"


def test_every_route_documents_the_problems_it_can_answer(document: dict[str, Any]) -> None:
    for method, path, op in operations(document):
        codes = set(op["responses"])
        assert {"422", "429", "503"} <= codes, (method, path)
        if op["security"]:
            assert "401" in codes, (method, path)
        if "requestBody" in op:
            assert "413" in codes, (method, path)
        for code, response in op["responses"].items():
            if code[0] in "45":
                media = response["content"]["application/problem+json"]
                assert media["schema"] == {"$ref": "#/components/schemas/Problem"}
                assert "/problems/" in response["description"], (method, path, code)
    health = document["paths"]["/v1/health"]["get"]
    assert health["security"] == [] and document["servers"]
    stream = document["paths"]["/v1/tasks/{task_id}/events"]["get"]
    assert stream["security"] == [{"HTTPBearer": []}, {"StreamToken": []}]


def test_the_document_is_the_same_with_a_token_and_names_no_agent() -> None:
    async def both() -> tuple[Any, Any]:
        transport = httpx.ASGITransport(app=make_app())
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as c:
            anonymous = (await c.get("/openapi.json")).json()
            auth = {"Authorization": f"Bearer {TOKENS['alice']}"}
            signed_in = (await c.get("/openapi.json", headers=auth)).json()
            return anonymous, signed_in

    import asyncio

    anonymous, signed_in = asyncio.run(both())
    assert anonymous == signed_in
    assert "enum" not in anonymous["components"]["schemas"]["TaskCreate"]["properties"]["agent"]


def test_shapes_generators_need(document: dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    # Tags are required in every member of a tagged union.
    for name in ("UserMessage", "AssistantMessage", "SystemMessage", "ToolMessage"):
        assert "role" in schemas[name]["required"], name
    for name in ("UIText", "UIToolCard", "UIError", "UINotice"):
        assert "type" in schemas[name]["required"], name
    # Request fields with a default are optional, with no default a generator could
    # read as "always present".
    create = schemas["TaskCreate"]
    for field in ("continue_session", "priority"):
        assert (
            field not in create.get("required", []) and "default" not in create["properties"][field]
        )
    # Enums are named once and referenced.
    assert schemas["MultitaskStrategy"]["enum"] == ["enqueue", "reject", "interrupt", "rollback"]
    text = json.dumps(document)
    assert text.count('"interrupt"') == 1
    assert schemas["OpenWait"]["properties"]["wait"]["$ref"].endswith("/WaitKind")
    assert set(schemas["WaitKind"]["enum"]) == {"approval", "input", "timer", "subtask"}
    reason = schemas["TaskSummary"]["properties"]["status_reason"]
    assert {"$ref": "#/components/schemas/StatusReason"} in reason["anyOf"]
    every_reason = {r.value for r in (*WaitReason, *BlockReason, *FailReason)}
    assert set(schemas["StatusReason"]["enum"]) == every_reason == set(get_args(StatusReason))

    # Each server-sent event's data has a schema, the end event's too.
    stream = document["paths"]["/v1/tasks/{task_id}/events"]["get"]
    media = stream["responses"]["200"]["content"]["text/event-stream"]
    assert media["x-sse-events"]["end"] == {"$ref": "#/components/schemas/StreamEnd"}
    assert media["x-sse-events"]["tool_intent"] == {"$ref": "#/components/schemas/Entry"}
    assert schemas["TaskStreamEvent"]["discriminator"]["mapping"]["end"].endswith("/StreamEnd")


def test_every_problem_type_is_documented() -> None:
    page = (ROOT / "docs" / "http-api.md").read_text()
    listed = set(re.findall(r"^\| `/problems/([a-z-]+)` \|", page, re.MULTILINE))
    assert listed == set(PROBLEM_TYPES)
    for slug, (status, _, _) in PROBLEM_TYPES.items():
        assert re.search(rf"^\| `/problems/{slug}` \| {status} \|", page, re.MULTILINE), slug


async def test_problems_carry_the_type_of_their_kind(tmp_path: Path) -> None:
    limits = ServerLimits(max_body=1000, auth_failures_per_minute=1)
    async with Runtime(f"sqlite:///{tmp_path}/p.db", agents(), run_worker=False) as rt:
        app = create_app(rt, TokenStore.from_mapping(TOKENS), limits)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as c:
            h = {"Authorization": f"Bearer {TOKENS['alice']}"}
            seen = {
                "unauthorized": await c.get("/v1/tasks"),
                "task-not-found": await c.get("/v1/tasks/t_none", headers=h),
                "not-found": await c.get("/v1/nothing", headers=h),
                "method-not-allowed": await c.delete("/v1/tasks", headers=h),
                "body-too-large": await c.post("/v1/tasks", content=b"x" * 2000, headers=h),
                "validation-error": await c.get("/v1/tasks?limit=0", headers=h),
                "unknown-agent": await c.post(
                    "/v1/tasks", json={"agent": "nobody", "input": "x"}, headers=h
                ),
            }
            wrong = {"Authorization": "Bearer wrong-token-1234567"}
            await c.get("/v1/tasks", headers=wrong)
            seen["too-many-requests"] = await c.get("/v1/tasks", headers=wrong)
    for kind, r in seen.items():
        assert r.headers["content-type"] == "application/problem+json", (kind, r.text)
        body = r.json()
        assert body["type"] == f"/problems/{kind}", (kind, body)
        assert r.status_code == body["status"] == PROBLEM_TYPES[kind][0], (kind, body)


def test_every_status_reason_the_runtime_writes_is_in_the_contract() -> None:
    """A reason written as a literal anywhere in the code (a guardrail's failure,
    say) must be one the response model accepts: else every read of that task is
    a 500 and one such task breaks the task list."""
    src = Path(__file__).parent.parent / "src" / "duragent"
    written = {
        m.group(1)
        for path in src.rglob("*.py")
        for m in re.finditer(r'"status_reason"\]?\s*[:=]\s*"([a-z_]+)"', path.read_text())
    }
    assert written, "the scan found no reason: its pattern is out of date"
    assert written <= set(get_args(StatusReason)), written - set(get_args(StatusReason))
