"""`duragent serve` as a real process, and the core package without the `server` extra."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from support.server_live import CLI, TOKENS, child_env, live_server


def run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CLI, *args], capture_output=True, text=True, env=env, timeout=60
    )


def without_fastapi(tmp_path: Path) -> dict[str, str]:
    """An environment where `import fastapi` fails, like an install without the extra."""
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "fastapi.py").write_text("raise ImportError(\"No module named 'fastapi'\")\n")
    env = child_env()
    env["PYTHONPATH"] = f"{shadow}:{env['PYTHONPATH']}"
    return env


@pytest.mark.slow
def test_serve_without_the_extra_says_how_to_install_it(tmp_path: Path) -> None:
    env = without_fastapi(tmp_path)
    env["DURAGENT_TOKENS"] = "alice=x"
    result = run("serve", "--store", f"sqlite:///{tmp_path}/s.db", env=env)
    assert result.returncode == 2
    assert "pip install 'duragent[server]'" in result.stderr
    # The core package and the other commands don't need it.
    code = "import duragent, duragent.cli.tasks, duragent.cli.serve; print(duragent.Runtime)"
    ok = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert ok.returncode == 0, ok.stderr
    made = run(
        "queue", "set", "q", "--concurrency", "1", "--store", f"sqlite:///{tmp_path}/s.db", env=env
    )
    assert made.returncode == 0, made.stderr  # a command that records something makes the store
    listed = run("ls", "--store", f"sqlite:///{tmp_path}/s.db", env=env)
    assert listed.returncode == 0 and "no tasks" in listed.stdout


@pytest.mark.slow
def test_serve_refuses_to_start_without_tokens(tmp_path: Path) -> None:
    env = child_env()
    env.pop("DURAGENT_TOKENS", None)
    result = run("serve", "--store", f"sqlite:///{tmp_path}/s.db", env=env)
    assert result.returncode == 2
    assert "no API tokens configured" in result.stderr and "DURAGENT_TOKENS" in result.stderr


@pytest.mark.slow
def test_serve_with_tokens_from_the_environment(tmp_path: Path) -> None:
    env = child_env(DURAGENT_TOKENS="carol=carol-env-token-3")
    with live_server(tmp_path, workers=1, env=env, tokens_file=False) as server:
        me = httpx.get(
            f"{server.url}/v1/me", headers={"Authorization": "Bearer carol-env-token-3"}, timeout=10
        )
        assert me.json() == {"user": "carol"}
        denied = httpx.get(f"{server.url}/v1/me", headers=server.headers(), timeout=10)
        assert denied.status_code == 401
        page = httpx.get(f"{server.url}/", timeout=10)
        assert page.status_code == 200 and "duragent" in page.text
        spec = httpx.get(f"{server.url}/openapi.json", timeout=10).json()
        assert "/v1/tasks/{task_id}/events" in spec["paths"]
    assert TOKENS["alice"] not in server.log_text()
    assert "carol-env-token-3" not in server.log_text()
