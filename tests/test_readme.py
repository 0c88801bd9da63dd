"""The examples of the README and of the guides in docs/ run as written.

A ```python block right under a `<!-- runnable ... -->` line (invisible on the
rendered page) is run as its own script, in an empty directory, in a fresh
interpreter. The blocks a reader copies first, under "In five minutes" and
"Steering a task", must be marked so.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from support.crashlib import HERE, kill_at
from support.readme import README, run, runnable_blocks, runnable_markers, stated_outputs
from support.server_live import child_env

# The runnable blocks the README held before its guides moved to docs/: each is
# still run, wherever it now is.
RUNNABLE_BEFORE_THE_MOVE = {
    "In five minutes",
    "Steering a task",
    "Deadlines",
    "Durable steps inside a tool",
    "Webhooks",
    "MCP tool servers",
    "OpenTelemetry traces",
    "Prometheus metrics",
}


def test_the_first_examples_are_marked_runnable() -> None:
    assert {"In five minutes", "Steering a task"} <= set(runnable_blocks())


def test_no_runnable_example_was_lost() -> None:
    assert set(runnable_blocks()) >= RUNNABLE_BEFORE_THE_MOVE
    # A marker whose next line is not a ```python block would be skipped silently.
    assert runnable_markers() == len(runnable_blocks()) >= len(RUNNABLE_BEFORE_THE_MOVE)


@pytest.mark.slow
@pytest.mark.parametrize("heading", sorted(runnable_blocks()))
def test_a_readme_example_runs_as_written(heading: str, tmp_path: Path) -> None:
    done = run(runnable_blocks()[heading], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    if heading in stated_outputs():  # "It prints `…`." right after the block
        assert done.stdout.splitlines()[-1:] == [stated_outputs()[heading]], done.stdout


def test_the_fitting_your_stack_examples_are_runnable_and_say_what_they_print() -> None:
    parts = {"Durable steps inside a tool", "Webhooks", "MCP tool servers"}
    parts |= {"OpenTelemetry traces", "Prometheus metrics"}
    assert parts <= set(runnable_blocks())
    assert parts - {"Durable steps inside a tool"} <= set(stated_outputs())


@pytest.mark.slow
def test_the_five_minute_example_says_what_the_readme_says_and_reruns(tmp_path: Path) -> None:
    code = runnable_blocks()["In five minutes"]
    first = run(code, tmp_path)
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines() == [
        "completed I emailed Bob the report: all green.",
        "emails sent by this run: 1",
    ]
    again = run(code, tmp_path)  # the same request id: the same task, nothing sent again
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == [
        "completed I emailed Bob the report: all green.",
        "emails sent by this run: 0",
    ]
    said = " ".join(README.read_text().split())  # the prose after the block says it too
    for line in first.stdout.splitlines():
        assert f"`{line}`" in said


INTERRUPTED_SEND = (
    "completed I could not confirm that the email to Bob went out. Tool call interrupted: "
    "the process running it stopped before its result was saved. It may or may not have "
    "taken effect; it was not re-run because it is not marked replay-safe."
)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("point", "killed_run_sent", "rerun_says"),
    [
        ("tool_start", 0, INTERRUPTED_SEND),  # killed with send_email committed, not yet run
        ("result", 1, "completed I emailed Bob the report: all green."),  # its result durable
    ],
)
def test_the_five_minute_example_killed_mid_run_reruns_honestly(
    point: str, killed_run_sent: int, rerun_says: str, tmp_path: Path
) -> None:
    code = runnable_blocks()["In five minutes"]
    (tmp_path / "example.py").write_text(code)
    child = subprocess.Popen(
        [sys.executable, str(HERE / "readme_kill_child.py"), "example.py", point],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    stopped_at = kill_at(child, f"AT {point}")
    assert stopped_at == f"AT {point} emails={killed_run_sent}"

    again = run(code, tmp_path)  # the killed process's lease still holds the task...
    assert again.returncode == 0, again.stderr
    assert "Traceback" not in again.stderr
    assert again.stdout.splitlines() == [rerun_says, "emails sent by this run: 0"]
    # ...but that process is gone from this host: the rerun says so and takes the
    # task over at once, without waiting out the lease.
    took = [line for line in again.stderr.splitlines() if "has exited" in line]
    assert len(took) == 1, again.stderr
    assert f"pid {child.pid} on this host" in took[0]
    assert "this runtime takes the task over now" in took[0]
    assert "waiting for task" not in again.stderr


# The README's agent (the same instructions and tools: the same version), with
# a provider that refuses the key.
FAILING_FIRST_RUN = """
import asyncio
from duragent import Agent, Runtime, ScriptedModel, ToolContext, tool
from duragent.errors import ModelError


@tool
async def send_email(to: str, body: str, ctx: ToolContext) -> str:
    \"\"\"Send an email.\"\"\"
    raise AssertionError("never called: the model refuses first")


@tool(replay="safe")
def read_file(path: str) -> str:
    \"\"\"Read a text file.\"\"\"
    raise AssertionError("never called: the model refuses first")


def refuse(messages):
    raise ModelError("401 Unauthorized: invalid API key")


agent = Agent(
    name="assistant",
    model=ScriptedModel([refuse]),
    instructions="You are a careful assistant.",
    tools=[send_email, read_file],
)


async def main():
    async with Runtime("sqlite:///agent.db", agents=[agent]) as rt:
        sub = await rt.submit(
            "assistant", "Email Bob the report", request_id="req-1", owner="alice"
        )
        print((await sub.wait(timeout=60)).status)


asyncio.run(main())
"""


@pytest.mark.slow
def test_the_five_minute_example_on_a_failed_task_says_why_and_how_to_retry(
    tmp_path: Path,
) -> None:
    # The provider refused the first run (a real model, a wrong key): the task failed.
    assert run(FAILING_FIRST_RUN, tmp_path).stdout.split() == ["failed"]
    code = runnable_blocks()["In five minutes"]
    failed = run(code, tmp_path)
    assert failed.returncode == 0, failed.stderr
    said = failed.stdout.splitlines()
    assert said[0].startswith("failed: ") and "401 Unauthorized: invalid API key" in said[0]
    assert said[1].startswith("to continue it: duragent retry ")
    assert said[2:] == [
        "and run this again (or call rt.retry(task.id) here)",
        "emails sent by this run: 0",
    ]
    # What it says to do works: the CLI's retry, then the example again.
    command = said[1].removeprefix("to continue it: duragent ").split()
    retry = subprocess.run(
        [sys.executable, "-m", "duragent", *command],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
    )
    assert retry.returncode == 0, retry.stderr
    done = run(code, tmp_path)
    assert done.stdout.splitlines() == [
        "completed I emailed Bob the report: all green.",
        "emails sent by this run: 1",
    ], done.stderr
