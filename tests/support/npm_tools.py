"""Node tools the contract and TypeScript client tests run, installed by npm
at pinned versions into test-artifacts/npm (git-ignored), once per checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
DIR = ROOT / "test-artifacts" / "npm"
# Exact versions: a new release must not change what the build accepts.
PACKAGES = {
    "@redocly/cli": "2.77.0",
    "openapi-typescript": "7.13.0",
    # Building and testing the TypeScript client (tests/test_client_typescript.py).
    "typescript": "5.9.3",
    "@types/node": "20.19.43",
}


def npm_tools() -> Path:
    """The folder of the tools' executables (node_modules/.bin). Without npm the tests
    skip, except in CI (CI=true), where a missing tool fails the build."""
    npm = shutil.which("npm")
    if npm is None:
        if os.environ.get("CI") == "true":
            pytest.fail("npm is not installed: .ci/run installs Node and npm when missing")
        pytest.skip("npm is not installed (CI installs it)")
    bin_dir = DIR / "node_modules" / ".bin"
    stamp = DIR / "installed.txt"
    wanted = " ".join(f"{name}@{version}" for name, version in sorted(PACKAGES.items()))
    if not stamp.exists() or stamp.read_text() != wanted:
        DIR.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--prefix", str(DIR), *wanted.split()],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, f"npm install failed:\n{done.stdout}\n{done.stderr}"
        stamp.write_text(wanted)
    return bin_dir
