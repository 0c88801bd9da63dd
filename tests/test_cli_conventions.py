"""What a new user meets at the terminal (issue 37, items 15, 17 and 18): one-line
errors that say what to do, waits that say what they wait for, --json and --version.

Every command runs as a real process on a real SQLite file.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from conventions_agents import twins
from duragent import (
    Agent,
    BuiltinTools,
    Runtime,
    ScriptedModel,
    UsageError,
    WaitTimedOut,
    __version__,
)
from duragent.llm import resolve_model
from duragent.runtime._presence import announce
from duragent.store import open_store
from duragent.types import Task, TaskStatus
from server_agents import agents
from support.llm_servers import ScriptedOpenAIServer
from support.server_live import (
    CLI,
    child_env,
    duragent,
    duragent_script,
    free_port,
    run_script,
    stop,
    wait_healthy,
)


def run(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CLI, *args],
        capture_output=True,
        text=True,
        env=child_env(**{"COLUMNS": "200", **(env or {})}),
        cwd=cwd,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def one_line_error(result: subprocess.CompletedProcess[str], notes: int = 0) -> str:
    """The error a failed command printed: one line on stderr (after `notes` lines
    saying what it waited for), no traceback."""
    assert result.returncode != 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 + notes, result.stderr
    assert lines[-1].startswith("error: "), result.stderr
    return lines[-1]


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/conv.db"


async def _held_by_a_dead_worker(url: str, ttl: float) -> str:
    """A running task whose worker is gone: its lease runs `ttl` s, nobody renews it."""
    async with Runtime(url, agents(), run_worker=False) as rt:
        task_id = (await rt.submit("slow", "go")).task_id
    store = open_store(url)
    await store.open()
    try:
        claimed = await store.claim_task("dead-host:4242", task_id=task_id, ttl=ttl)
        assert claimed is not None and claimed.status is TaskStatus.RUNNING
    finally:
        await store.close()
    return task_id


async def _status(url: str, task_id: str) -> TaskStatus:
    store = open_store(url)
    await store.open()
    try:
        return (await store.get_task(task_id)).status
    finally:
        await store.close()


# --- item 15: controls of a task whose worker died ------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("action", "status"), [("pause", "paused"), ("abort", "aborted")])
def test_a_control_of_a_task_whose_worker_died_says_what_it_waits_for_and_applies(
    url: str, action: str, status: str
) -> None:
    task_id = asyncio.run(_held_by_a_dead_worker(url, ttl=2.0))
    result = run(action, task_id, "--store", url)
    assert result.returncode == 0, result.stderr
    assert "waiting up to 60 s for the task's worker to reach a safe point" in result.stderr
    assert "dead-host:4242" in result.stderr  # whose lease it waits for
    assert f"is {status}" in result.stdout
    assert asyncio.run(_status(url, task_id)).value == status


@pytest.mark.slow
@pytest.mark.parametrize("action", ["pause", "abort"])
def test_a_control_that_times_out_is_one_line_saying_it_is_recorded(url: str, action: str) -> None:
    task_id = asyncio.run(_held_by_a_dead_worker(url, ttl=600.0))
    result = run(action, task_id, "--store", url, "--timeout", "0.5")
    error = one_line_error(result, notes=1)
    assert f"the {action} of task '{task_id}' is recorded" in error
    assert "when a worker next takes the task" in error
    # The request stays on the row: the next worker to take the task acts on it.
    assert asyncio.run(_status(url, task_id)) is TaskStatus.RUNNING


# --- item 17: one line, not a traceback ------------------------------------------


def test_a_failed_task_is_logged_in_one_line_with_the_traceback_at_debug(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    def boom(messages: object) -> str:
        raise RuntimeError("the model's tool broke")

    async def go() -> None:
        agent = Agent(
            name="boom", model=ScriptedModel(boom), builtin_tools=BuiltinTools(plan=False)
        )
        async with Runtime(url, [agent], poll_interval=0.05) as rt:
            task = await (await rt.submit("boom", "go")).wait(timeout=30)
            assert task.status is TaskStatus.FAILED

    with caplog.at_level(logging.DEBUG, logger="duragent"):
        asyncio.run(go())
    [error] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert error.exc_info is None
    assert "failed: RuntimeError: the model's tool broke" in error.getMessage()
    assert "\n" not in error.getMessage()
    debug = [r for r in caplog.records if r.levelno == logging.DEBUG and r.exc_info]
    assert debug, "the traceback is kept for DEBUG"


def test_wait_with_a_timeout_says_what_it_waited_for(url: str) -> None:
    async def go() -> None:
        async with Runtime(url, agents(), run_worker=False) as rt:
            sub = await rt.submit("quick", "go")
            with pytest.raises(TimeoutError) as caught:  # still a TimeoutError
                await sub.wait(timeout=0.2)
            assert isinstance(caught.value, WaitTimedOut)
            assert str(caught.value) == (
                f"task {sub.task_id!r} is still pending after 0.2 s of waiting for it to end; "
                "waiting did not stop it"
            )

    asyncio.run(go())


@pytest.mark.slow
def test_an_agents_module_that_raises_is_one_line_naming_it(url: str, tmp_path: Path) -> None:
    (tmp_path / "broken_agents.py").write_text("AGENTS = []\n1 / 0\n")
    result = run("worker", "--store", url, "--agents", "broken_agents:AGENTS", cwd=tmp_path)
    error = one_line_error(result)
    assert "importing module 'broken_agents' raised ZeroDivisionError: division by zero" in error
    result = run("worker", "--store", url, "--agents", "hostile_agents:raising")
    assert "calling hostile_agents.raising() raised RuntimeError" in one_line_error(result)
    # Asked for: the traceback.
    debug = run(
        "--debug", "worker", "--store", url, "--agents", "broken_agents:AGENTS", cwd=tmp_path
    )
    assert debug.returncode != 0 and "Traceback" in debug.stderr
    assert "ZeroDivisionError" in debug.stderr


@pytest.mark.slow
def test_a_library_warning_is_one_line(url: str) -> None:
    result = run(
        "schedule", "add", "s", "--agent", "nosuch", "--input", "go", "--every", "60",
        "--store", url, "--agents", "warning_agents:AGENTS",
    )  # fmt: skip
    warning, error = result.stderr.strip().splitlines()
    assert warning == (
        "warning: FutureWarning: the old way of doing this goes away in the next release"
    )
    assert "warnings.warn(" not in result.stderr  # no source line
    assert error.startswith("error: no agent named 'nosuch'; known agents: warned")


@pytest.mark.slow
def test_two_agents_with_one_name_are_refused(url: str) -> None:
    with pytest.raises(UsageError, match="two agents are named 'twin'"):
        Runtime(url, twins())
    result = run("worker", "--store", url, "--agents", "conventions_agents:twins")
    assert "two agents are named 'twin'" in one_line_error(result)


@pytest.mark.slow
def test_a_schedule_for_an_agent_nobody_serves_is_refused(url: str) -> None:
    add = ("schedule", "add", "nightly", "--input", "go", "--every", "3600", "--store", url)
    error = one_line_error(run(*add, "--agent", "nosuchagent"))
    assert "no running worker serves agent 'nosuchagent' (no worker is running)" in error
    error = one_line_error(run(*add, "--agent", "nosuchagent", "--agents", "server_agents:agents"))
    assert "no agent named 'nosuchagent'; known agents:" in error
    assert run(*add, "--agent", "quick", "--agents", "server_agents:agents").returncode == 0

    async def a_worker_serves_quick() -> None:
        store = open_store(url)
        await store.open()
        try:
            await announce(store, "other-host:1", ["quick"], ttl=600)
        finally:
            await store.close()

    asyncio.run(a_worker_serves_quick())
    error = one_line_error(run(*add, "--agent", "nosuchagent"))
    assert "(they serve quick)" in error
    assert run(*add, "--agent", "quick").returncode == 0
    listed = json.loads(run("schedule", "ls", "--json", "--store", url).stdout)
    assert [s["agent"] for s in listed] == ["quick"]


@pytest.mark.slow
def test_an_unknown_scripted_model_is_refused_with_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="the scripted models are scripted:demo, scripted:none"):
        resolve_model("scripted:nope")
    result = run(
        "run", "hi", "--model", "scripted:nope", "--store", f"sqlite:///{tmp_path}/r.db",
        "--workdir", str(tmp_path),
    )  # fmt: skip
    error = one_line_error(result)
    assert "unknown scripted model 'scripted:nope'" in error and "scripted:demo" in error


# --- item 18: conventions -----------------------------------------------------------


@pytest.mark.slow
def test_version_flag() -> None:
    result = run("--version")
    assert result.returncode == 0 and result.stdout.strip() == __version__


@pytest.fixture
def busy_store(url: str) -> dict[str, str]:
    """A completed task, a task waiting for an approval, a queue and a schedule."""

    async def go() -> dict[str, str]:
        async with Runtime(url, agents(), poll_interval=0.05) as rt:
            done = await (await rt.submit("quick", "go", owner="alice")).wait(timeout=30)
            asks = await rt.submit("approver", "go", owner="alice")
            await rt.wait(asks.task_id, timeout=30, until=lambda t: t.status.value == "waiting")
            await rt.queue("emails-to-every-customer", concurrency=3, per_owner=1, rate=(10, 60))
            await rt.schedule(
                "nightly-report-for-the-whole-team", "quick", "go", every=3600, owner="alice"
            )
            return {"done": done.id, "waiting": asks.task_id}

    return asyncio.run(go())


@pytest.mark.slow
def test_every_listing_and_show_prints_json(url: str, busy_store: dict[str, str]) -> None:
    def as_json(*args: str) -> Any:
        result = run(*args, "--json", "--store", url)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    done, waiting = busy_store["done"], busy_store["waiting"]
    assert {t["id"] for t in as_json("ls")} == {done, waiting}
    assert as_json("counts") == {"quick": {"completed": 1}, "approver": {"waiting": 1}}
    queues = {q["name"]: q for q in as_json("queue", "ls")}
    assert queues["emails-to-every-customer"]["concurrency"] == 3
    assert queues["quick"]["tasks"] == {"completed": 1}
    [sched] = as_json("schedule", "ls")
    assert sched["name"] == "nightly-report-for-the-whole-team" and sched["every"] == 3600
    shown = as_json("show", done)
    assert shown["task"]["id"] == done and shown["entries"][0]["seq"] == 1
    assert as_json("history", done)["rounds"][0]["assistant"] == "Hello from quick."
    assert list(as_json("approvals", waiting)) != []
    assert as_json("steps", done)["completed"][0]["thought"] == "Hello from quick."
    assert as_json("tree", waiting)["task"]["id"] == waiting


@pytest.mark.slow
def test_listings_and_show_are_readable_at_80_columns(url: str, busy_store: dict[str, str]) -> None:
    def at_80(*args: str) -> str:
        result = run(*args, "--store", url, env={"COLUMNS": "80"})
        assert result.returncode == 0, result.stderr
        assert max(len(line) for line in result.stdout.splitlines()) <= 80, result.stdout
        return result.stdout

    listed = at_80("schedule", "ls")
    for header in ("name", "owner", "agent", "when", "state", "next tick"):
        assert f" {header} " in f" {listed} ", listed  # whole, not cut to "o…"
    assert "every 1h" in listed and "…" not in listed
    queues = at_80("queue", "ls")
    assert "10/60s" in queues and "…" not in queues
    shown = at_80("show", busy_store["done"])
    assert "Hello from quick." in shown


LONG_AGENT = "a-rather-long-agent-name-for-the-weekly-reports"


async def tasks_to_list(url: str) -> list[str]:
    """A completed task with a long answer, and an aborted one with a long reason."""
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
    listed = run_script(
        "ls", "--store", "sqlite:///s.db", cwd=tmp_path, env=child_env(COLUMNS="80")
    )
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), listed.stdout
    words = [line.split() for line in lines]
    for task_id in ids:
        # The whole id, as one word to copy, on the first line of its task.
        (line,) = [w for w in words if w and w[0] == task_id]
        shown = run_script("show", line[0], "--store", "sqlite:///s.db", cwd=tmp_path)
        assert shown.returncode == 0 and task_id in shown.stdout, shown.stderr
    assert "completed" in listed.stdout and "aborted" in listed.stdout
    assert "A long answer" in listed.stdout and "the operator stopped it" in listed.stdout
    assert LONG_AGENT[:20] in listed.stdout  # cut short, so the output has room


@pytest.mark.slow
def test_run_says_one_round_and_send_to_a_finished_task_names_the_fork_command(
    tmp_path: Path,
) -> None:
    store = f"sqlite:///{tmp_path}/r.db"
    done = run(
        "run", "hi", "--model", "scripted:demo", "--agent-tools", "none", "--store", store,
        "--workdir", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "(1 round;" in done.stdout
    task_id = done.stdout.split()[1]
    error = one_line_error(run("send", task_id, "and then?", "--store", store))
    assert f"duragent fork {task_id} --at 1 --append-user 'and then?'" in error
    assert "submit(" not in error


@pytest.mark.slow
def test_a_failed_run_says_its_error_once(tmp_path: Path) -> None:
    server = ScriptedOpenAIServer(["never sent"]).start()
    server.fail_next(1, status=400, message="the request is malformed")
    try:
        result = run(
            "run", "hi", "--model", "openai:gpt-4o-mini", "--base-url", server.base_url,
            "--api-key-env", "CONVENTIONS_KEY", "--agent-tools", "none",
            "--store", f"sqlite:///{tmp_path}/r.db", "--workdir", str(tmp_path),
            env={"CONVENTIONS_KEY": "sk-unused"},
        )  # fmt: skip
    finally:
        server.close()
    assert result.returncode == 1
    assert result.stdout.count("the request is malformed") == 1, result.stdout
    assert "failed.:" not in result.stdout


@pytest.mark.slow
def test_worker_says_where_it_runs_and_keeps_http_requests_out_of_its_log(
    url: str, tmp_path: Path
) -> None:
    server = ScriptedOpenAIServer(["Hello over HTTP."]).start()
    log = tmp_path / "worker.log"
    worker = duragent(
        "worker", "--store", url, "--agents", "conventions_agents:agents",
        "--worker-id", "w-conventions", "--poll-interval", "0.1",
        log=log, env=child_env(CONVENTIONS_BASE_URL=server.base_url),
    )  # fmt: skip
    try:

        async def go() -> TaskStatus:
            # The worker runs it; this process only submits.
            remote = Agent(
                name="remote", model="scripted:none", builtin_tools=BuiltinTools(plan=False)
            )
            async with Runtime(url, [remote], run_worker=False) as rt:
                sub = await rt.submit("remote", "hi")
                return (await rt.wait(sub.task_id, timeout=60)).status

        assert asyncio.run(go()) is TaskStatus.COMPLETED
    finally:
        stop(worker)
        server.close()
    text = log.read_text()
    assert (
        f"worker w-conventions started: store {url}, agents duragent.bulk, remote, "
        "32 at once, queues all" in text
    ), text
    assert server.requests, "the model was called over HTTP"
    assert "HTTP Request" not in text, text


@pytest.mark.slow
def test_serve_on_a_port_in_use_fails_in_one_line_before_starting(url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run("serve", "--store", url, "--port", str(port), "--workers", "0")
    error = one_line_error(result)
    assert error == (
        f"error: cannot listen on 127.0.0.1:{port}: address already in use; stop what "
        "uses it or pick another --port"
    )
    assert "startup complete" not in result.stdout + result.stderr


# --- a store URL whose extra is not installed, and --help ----------------------------


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
    listed = run_script("ls", "--store", PG_URL, cwd=tmp_path, env=env)
    assert listed.returncode == 2
    assert PIP in one_line_error(listed)
    # A command without its own error handling gets the same one line from the entry.
    worker = run_script(
        "worker", "--store", PG_URL, "--agents", "worker_agents:AGENTS", cwd=tmp_path, env=env
    )
    assert worker.returncode == 2
    assert PIP in one_line_error(worker)


@pytest.mark.slow
def test_help_shows_flags_as_flags(tmp_path: Path) -> None:
    for command in ([], ["demo"], ["show"], ["pause"], ["run"], ["schedule", "add"], ["queue"]):
        shown = run_script(*command, "--help", cwd=tmp_path)
        assert shown.returncode == 0, shown.stderr
        assert "<bool>" not in shown.stdout, shown.stdout
    demo = run_script("demo", "--help", cwd=tmp_path).stdout
    assert "--crash" in demo and "--no-crash" in demo and "--keep" in demo


# --- --agents from the current directory ------------------------------------------

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
        if proc.stdout is not None:
            proc.stdout.close()


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
    with log.open("w") as out:  # the child writes through its own copy of the descriptor
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
