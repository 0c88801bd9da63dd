"""A new user's first hour with the `duragent` command, each step as a real process.

The installed `duragent` script is run (not `python -m duragent`, which would
put the current directory on sys.path by itself).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import warnings
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from duragent.server.auth import TokenStore
from duragent.types import Task, TaskStatus
from support.server_live import child_env, free_port, wait_healthy


def duragent_script() -> str:
    beside = Path(sys.executable).parent / "duragent"
    found = str(beside) if beside.exists() else shutil.which("duragent")
    assert found, "the duragent script is not installed (pip install -e .)"
    return found


def cli(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [duragent_script(), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={"COLUMNS": "200", **(env or child_env())},
        timeout=timeout,
    )


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """stderr is exactly one line starting with `error: `; that line."""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


# --- store URLs -----------------------------------------------------------------------


def without_psycopg(tmp_path: Path) -> dict[str, str]:
    """An environment where `import psycopg` fails, like an install without the extra."""
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "psycopg.py").write_text("raise ImportError(\"No module named 'psycopg'\")\n")
    env = child_env()
    env["PYTHONPATH"] = f"{shadow}:{env['PYTHONPATH']}"
    return env


PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
PIP = "pip install 'duragent[postgres]'"


@pytest.mark.slow
def test_postgres_without_the_extra_is_one_line_naming_the_pip_command(tmp_path: Path) -> None:
    env = without_psycopg(tmp_path)
    code = (
        "from duragent.errors import MissingExtra\n"
        "from duragent.store import open_store\n"
        "try:\n"
        f"    open_store({PG_URL!r})\n"
        "except MissingExtra as exc:\n"
        "    print(exc)\n"
    )
    library = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert library.returncode == 0, library.stderr
    assert PIP in library.stdout and "postgresql:// store" in library.stdout
    listed = cli("ls", "--store", PG_URL, cwd=tmp_path, env=env)
    assert listed.returncode == 2
    assert PIP in one_error_line(listed)
    # A command without its own error handling gets the same one line from the entry.
    worker = cli(
        "worker", "--store", PG_URL, "--agents", "worker_agents:AGENTS", cwd=tmp_path, env=env
    )
    assert worker.returncode == 2
    assert PIP in one_error_line(worker)


@pytest.mark.slow
def test_a_missing_directory_is_one_line_not_a_corrupt_store(tmp_path: Path) -> None:
    listed = cli("ls", "--store", "sqlite:///nodir/x.db", cwd=tmp_path)
    assert listed.returncode == 1
    line = one_error_line(listed)
    assert f"directory does not exist: {tmp_path}/nodir" in line and "sqlite:////nodir" in line
    assert "corrupt" not in line.lower() and not (tmp_path / "nodir").exists()


@pytest.mark.slow
def test_run_against_an_unreachable_model_prints_only_the_clean_message(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = child_env(OPENAI_API_KEY="sk-test-not-used")
    result = cli(
        "run",
        "say hi",
        "--model",
        "openai:gpt-4o-mini",
        "--base-url",
        f"http://127.0.0.1:{port}/v1",
        "--store",
        "sqlite:///run.db",
        "--agent-tools",
        "none",
        cwd=tmp_path,
        env=env,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "could not reach OpenAI" in result.stdout
    assert "Traceback" not in result.stderr + result.stdout
    assert result.stderr.strip() == "", result.stderr
    # With DURAGENT_DEBUG=1 the library's log comes back, traceback and all.
    debug = cli(*result.args[1:], cwd=tmp_path, env={**env, "DURAGENT_DEBUG": "1"})
    assert debug.returncode == 1 and "Traceback" in debug.stderr


# --- --agents from the current directory ----------------------------------------------

MY_AGENTS = """
print("myagents imported", flush=True)
from duragent import Agent, ScriptedModel
AGENTS = [Agent(name="here", model=ScriptedModel(["done"]))]
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A user's project directory holding myagents.py; not on PYTHONPATH."""
    (tmp_path / "myagents.py").write_text(MY_AGENTS)
    assert str(tmp_path) not in child_env()["PYTHONPATH"].split(os.pathsep)
    return tmp_path


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)


def spawn(
    started: list[subprocess.Popen[str]], *args: str, cwd: Path, env: dict[str, str]
) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [duragent_script(), *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    started.append(proc)
    return proc


def first_line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    return proc.stdout.readline().strip()


@pytest.mark.slow
def test_worker_imports_agents_from_the_current_directory(
    project: Path, started: list[subprocess.Popen[str]]
) -> None:
    worker = spawn(
        started,
        "worker",
        "--store",
        "sqlite:///s.db",
        "--agents",
        "myagents:AGENTS",
        cwd=project,
        env=child_env(),
    )
    line = first_line(worker)
    assert line == "myagents imported", line + (worker.stdout.read() if worker.stdout else "")
    task = asyncio.run(submit_and_wait(f"sqlite:///{project}/s.db"))
    assert task.status is TaskStatus.COMPLETED and task.output == "done"
    worker.send_signal(signal.SIGTERM)  # its handlers are in place: it ran a task
    assert worker.wait(60) == 0


async def submit_and_wait(url: str) -> Task:
    from duragent import Agent, Runtime, ScriptedModel

    agent = Agent(name="here", model=ScriptedModel(["done"]))
    async with Runtime(url, agents=[agent], run_worker=False) as rt:
        sub = await rt.submit("here", "hi")
        async with asyncio.timeout(60):
            while not (task := await rt.get(sub.task_id)).status.terminal:
                await rt.store.wait_for_change(1.0)
    return task


@pytest.mark.slow
def test_serve_imports_agents_from_the_current_directory(
    project: Path, started: list[subprocess.Popen[str]]
) -> None:
    port = free_port()
    log = project / "serve.log"
    out = log.open("w")
    proc = subprocess.Popen(
        [
            duragent_script(),
            *("serve", "--store", "sqlite:///s.db", "--agents", "myagents:AGENTS"),
            *("--port", str(port), "--workers", "1"),
        ],
        cwd=project,
        stdout=out,
        stderr=subprocess.STDOUT,
        text=True,
        env=child_env(DURAGENT_TOKENS="alice:alice-token-0123456789"),
    )
    started.append(proc)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc, log)
    agents = httpx.get(
        f"{url}/v1/agents", headers={"Authorization": "Bearer alice-token-0123456789"}, timeout=10
    )
    assert agents.status_code == 200, agents.text
    assert "here" in agents.text
    assert log.read_text().startswith("myagents imported")


# --- ls at 80 columns ---------------------------------------------------------------------

LONG_AGENT = "a-rather-long-agent-name-for-the-weekly-reports"


async def tasks_to_list(url: str) -> list[str]:
    """A completed task with a long answer, and an aborted one with a long reason."""
    from duragent import Agent, Runtime, ScriptedModel

    agent = Agent(name=LONG_AGENT, model=ScriptedModel(["A long answer, word after word. " * 20]))
    async with Runtime(url, agents=[agent], poll_interval=0.05) as rt:
        done = await rt.submit(LONG_AGENT, "go", owner="someone-with-a-long-name@example.com")
        assert (await done.wait(timeout=60)).status is TaskStatus.COMPLETED
        stopped = await rt.submit(LONG_AGENT, "go", start_at=timedelta(hours=1))
        await rt.abort(stopped.task_id, reason="the operator stopped it, because " * 5)
    return [done.task_id, stopped.task_id]


@pytest.mark.slow
def test_ls_fits_80_columns_with_each_id_whole(tmp_path: Path) -> None:
    ids = asyncio.run(tasks_to_list(f"sqlite:///{tmp_path}/s.db"))
    listed = cli("ls", "--store", "sqlite:///s.db", cwd=tmp_path, env=child_env(COLUMNS="80"))
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), listed.stdout
    words = [line.split() for line in lines]
    for task_id in ids:
        # The whole id, as one word to copy, on the first line of its task.
        (line,) = [w for w in words if w and w[0] == task_id]
        shown = cli("show", line[0], "--store", "sqlite:///s.db", cwd=tmp_path)
        assert shown.returncode == 0 and task_id in shown.stdout, shown.stderr
    assert "completed" in listed.stdout and "aborted" in listed.stdout
    assert "A long answer" in listed.stdout and "the operator stopped it" in listed.stdout
    assert LONG_AGENT[:20] in listed.stdout  # cut short, so the output has room


# --- serve without --agents ---------------------------------------------------------------

ALICE = "alice:alice-token-0123456789"
CHROMIUM = "/usr/bin/chromium"


@pytest.fixture
def agentless_server(tmp_path: Path, started: list[subprocess.Popen[str]]) -> tuple[str, Path]:
    """`duragent serve` without --agents; its URL and its log (stdout and stderr)."""
    port = free_port()
    log = tmp_path / "serve.log"
    proc = subprocess.Popen(
        [duragent_script(), "serve", "--store", "sqlite:///s.db", "--port", str(port)],
        cwd=tmp_path,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        text=True,
        env=child_env(DURAGENT_TOKENS=ALICE),
    )
    started.append(proc)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc, log)
    return url, log


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


# --- tokens: one format -----------------------------------------------------------------


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


# --- demo and help ------------------------------------------------------------------------


@pytest.mark.slow
def test_demo_never_deletes_a_store_it_did_not_make(tmp_path: Path) -> None:
    precious = tmp_path / "precious.db"
    precious.write_bytes(b"my own data")
    refused = cli("demo", "--no-crash", "--store", "precious.db", cwd=tmp_path)
    assert refused.returncode == 2
    assert "not a store this demo made" in refused.stdout and "--fresh" in refused.stdout
    assert precious.read_bytes() == b"my own data"

    kept = cli("demo", "--no-crash", "--keep", "--store", "demo.db", cwd=tmp_path)
    assert kept.returncode == 0, kept.stdout + kept.stderr
    again = cli("demo", "--no-crash", "--store", "demo.db", cwd=tmp_path)  # its own: fine
    assert again.returncode == 0, again.stdout + again.stderr
    assert not (tmp_path / "demo.db").exists()

    fresh = cli("demo", "--no-crash", "--fresh", "--store", "precious.db", cwd=tmp_path)
    assert fresh.returncode == 0, fresh.stdout + fresh.stderr
    assert not precious.exists()


@pytest.mark.slow
def test_help_shows_flags_as_flags(tmp_path: Path) -> None:
    for command in ([], ["demo"], ["show"], ["pause"], ["run"], ["schedule", "add"], ["queue"]):
        shown = cli(*command, "--help", cwd=tmp_path)
        assert shown.returncode == 0, shown.stderr
        assert "<bool>" not in shown.stdout, shown.stdout
    demo = cli("demo", "--help", cwd=tmp_path).stdout
    assert "--crash" in demo and "--no-crash" in demo and "--keep" in demo
