"""`duragent serve` as a real process, and the core package without the `server` extra."""

from __future__ import annotations

import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from duragent.server._auth import TokenStore
from support.server_live import (
    CLI,
    TOKENS,
    child_env,
    duragent_script,
    free_port,
    live_server,
    wait_healthy,
)


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
    code = "import duragent, duragent.cli._tasks, duragent.cli._serve; print(duragent.Runtime)"
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
        assert me.json() == {"user": "carol", "admin": False}
        denied = httpx.get(f"{server.url}/v1/me", headers=server.headers(), timeout=10)
        assert denied.status_code == 401
        page = httpx.get(f"{server.url}/", timeout=10)
        assert page.status_code == 200 and "duragent" in page.text
        spec = httpx.get(f"{server.url}/openapi.json", timeout=10).json()
        assert "/v1/tasks/{task_id}/events" in spec["paths"]
    assert TOKENS["alice"] not in server.log_text()
    assert "carol-env-token-3" not in server.log_text()


ALICE = "alice:alice-token-0123456789"
CHROMIUM = "/usr/bin/chromium"


@pytest.fixture
def agentless_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """`duragent serve` without --agents; its URL and its log (stdout and stderr)."""
    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("w") as out:  # the child writes through its own copy of the descriptor
        proc = subprocess.Popen(
            [duragent_script(), "serve", "--store", "sqlite:///s.db", "--port", str(port)],
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            env=child_env(DURAGENT_TOKENS=ALICE),
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log)
        yield url, log
    finally:
        proc.kill()
        proc.wait(30)


@pytest.mark.slow
def test_serve_without_agents_warns_and_a_submit_says_how_to_fix_it(
    agentless_server: tuple[str, Path],
) -> None:
    url, log = agentless_server
    assert "warning: no --agents" in log.read_text() and "--agents module:attr" in log.read_text()
    auth = {"Authorization": f"Bearer {ALICE.partition(':')[2]}"}
    assert httpx.get(f"{url}/v1/agents", headers=auth, timeout=10).json() == {"agents": []}
    sent = httpx.post(f"{url}/v1/tasks", json={"agent": "helper", "input": "hi"}, headers=auth)
    assert sent.status_code == 400, sent.text
    problem = sent.json()
    assert problem["title"] == "Unknown agent"
    assert "no agents are registered" in problem["detail"]
    assert "--agents module:attr" in problem["detail"]


@pytest.mark.slow
@pytest.mark.browser
def test_the_page_of_a_server_without_agents_says_so_instead_of_an_error(
    agentless_server: tuple[str, Path],
) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing: apt-get install -y chromium")
    url, _ = agentless_server
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, args=["--headless", "--no-sandbox"], headless=True
        )
        try:
            page = browser.new_page()
            page.set_default_timeout(30_000)
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(url + "/")
            page.fill("#token", ALICE.partition(":")[2])
            page.click("#signin-button")
            expect = sync_api.expect
            expect(page.locator("#user")).to_have_text("alice")
            expect(page.locator("#agent-tools")).to_contain_text("This server has no agents")
            expect(page.locator("#agent-tools")).to_contain_text("--agents module:attr")
            expect(page.locator("#start")).to_be_disabled()
            expect(page.locator("#input")).to_be_disabled()
            expect(page.locator(".toast")).to_have_count(0)
            assert errors == []
        finally:
            browser.close()


def test_tokens_are_user_colon_token_in_the_environment_too() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the documented format warns about nothing
        tokens = TokenStore.from_env("alice:tok1-0123456789abc, bob:to=k:2-0123456789ab")
    assert tokens.user_for("tok1-0123456789abc") == "alice"
    assert tokens.user_for("to=k:2-0123456789ab") == "bob"
    with pytest.warns(FutureWarning, match="user:token"):
        old = TokenStore.from_env("carol=tok=3-0123456789abc")
    assert old.user_for("tok=3-0123456789abc") == "carol"
    with pytest.raises(Exception, match="user:token"):
        TokenStore.from_env("just-a-token")
