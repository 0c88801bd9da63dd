"""The README's examples run as written.

A ```python block right under a `<!-- runnable ... -->` line (invisible on the
rendered page) is run as its own script, in an empty directory, in a fresh
interpreter. The blocks a reader copies first, under "In five minutes" and
"Steering a task", must be marked so.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from support.readme import README, run, runnable_blocks, stated_outputs


def test_the_first_examples_are_marked_runnable() -> None:
    assert {"In five minutes", "Steering a task"} <= set(runnable_blocks())


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
