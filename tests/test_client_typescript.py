"""The TypeScript client (clients/typescript): its committed schema and types are what
the app and openapi-typescript make now, it compiles under `tsc --strict`, and its
own tests (`node --test`) pass against a live `duragent serve` started here."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from support.npm_tools import DIR as NPM, PACKAGES, npm_tools
from support.server_live import TOKENS, LiveServer, child_env, live_server

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "clients" / "typescript"
BUILD = ROOT / "test-artifacts" / "typescript"
TS_BLOCK = re.compile(r"^```ts\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def client_schema() -> ModuleType:
    """scripts/client-schema, the script that writes the committed files."""
    path = ROOT / "scripts" / "client-schema"
    loader = importlib.machinery.SourceFileLoader("client_schema", str(path))
    spec = importlib.util.spec_from_loader("client_schema", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def run(*args: str | Path, env: dict[str, str] | None = None, timeout: float = 300) -> str:
    done = subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, timeout=timeout, env=env
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    return out


def test_the_committed_schema_and_types_are_current(tmp_path: Path) -> None:
    tool = npm_tools() / "openapi-typescript"
    script = client_schema()
    committed = (ROOT / "clients" / "openapi.json").read_text()
    assert script.document() == committed, (
        "clients/openapi.json is stale: run scripts/client-schema"
    )
    document = tmp_path / "openapi.json"
    document.write_text(committed)
    types = (PACKAGE / "src" / "schema.ts").read_text()
    assert script.types(document, tool) == types, (
        "clients/typescript/src/schema.ts is stale: run scripts/client-schema"
    )
    assert json.loads(committed)["components"]["schemas"]["TaskStreamEvent"]


def test_the_package_pins_the_tools_the_tests_use() -> None:
    package = json.loads((PACKAGE / "package.json").read_text())
    assert package["devDependencies"] == {n: PACKAGES[n] for n in ("typescript", "@types/node")}
    assert "dependencies" not in package  # fetch is all it needs


@pytest.fixture(scope="module")
def built() -> Path:
    """The package and its tests compiled by the pinned tsc (strict), outside the tree."""
    bin_dir = npm_tools()
    shutil.rmtree(BUILD, ignore_errors=True)
    out = BUILD / "dist"
    run(
        bin_dir / "tsc",
        "-p",
        PACKAGE,
        "--outDir",
        out,
        "--typeRoots",
        NPM / "node_modules" / "@types",
    )
    (out / "package.json").write_text('{"type": "module"}\n')
    return out


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, Path]]:
    gates = tmp_path_factory.mktemp("gates")
    env = child_env(DURAGENT_TEST_GATES=str(gates))
    with live_server(tmp_path_factory.mktemp("serve"), env=env) as live:
        yield live, gates


def test_the_typescript_client_passes_its_tests_against_a_live_server(
    built: Path, server: tuple[LiveServer, Path]
) -> None:
    live, gates = server
    node = shutil.which("node")
    assert node, "node is not installed (.ci/run installs it with npm)"
    env = {
        **os.environ,
        "DURAGENT_URL": live.url,
        "DURAGENT_TOKEN": TOKENS["alice"],
        "DURAGENT_OTHER_TOKEN": TOKENS["bob"],
        "DURAGENT_TEST_GATES": str(gates),
    }
    tests = sorted(str(p) for p in (built / "test").glob("*.test.js"))
    assert tests, "no compiled tests"
    out = run(node, "--test", "--test-reporter=tap", *tests, env=env)
    assert "# fail 0" in out, out
    passed = int(out.split("# pass ")[1].split()[0])
    assert passed >= 8, out


def test_the_readmes_typescript_examples_type_check() -> None:
    """Each ```ts block of README.md and the package's README compiles against the
    package (strict), as a module of its own."""
    examples = BUILD / "examples"
    shutil.rmtree(examples, ignore_errors=True)
    examples.mkdir(parents=True)
    (examples / "package.json").write_text('{"type": "module"}\n')
    package = os.path.relpath(PACKAGE / "src" / "index.js", examples)
    files: list[Path] = []
    for readme in (ROOT / "README.md", PACKAGE / "README.md"):
        for block in TS_BLOCK.findall(readme.read_text()):
            assert '"duragent-client"' in block, f"a {readme.name} example imports no client"
            path = examples / f"example_{len(files)}.ts"
            path.write_text(block.replace('"duragent-client"', json.dumps(package)))
            files.append(path)
    assert len(files) >= 2
    run(
        npm_tools() / "tsc",
        "--noEmit",
        "--strict",
        "--target",
        "ES2022",
        "--module",
        "NodeNext",
        "--moduleResolution",
        "NodeNext",
        "--lib",
        "ES2022,DOM",
        "--types",
        "node",
        "--typeRoots",
        NPM / "node_modules" / "@types",
        *files,
    )
