"""The README's examples run as written.

A ```python block right under a `<!-- runnable ... -->` line (invisible on the
rendered page) is run as its own script, in an empty directory, in a fresh
interpreter. The blocks a reader copies first, under "In five minutes" and
"Steering a task", must be marked so.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from support.server_live import child_env

README = Path(__file__).resolve().parent.parent / "README.md"
RUNNABLE = re.compile(r"^<!-- runnable\b[^\n]*-->\n```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def heading_before(text: str) -> str:
    """The last heading in `text`, not counting `#` lines inside code blocks."""
    heading, fenced = "", False
    for line in text.splitlines():
        fenced ^= line.startswith("```")
        if not fenced and line.startswith("#"):
            heading = line.lstrip("#").strip()
    return heading


def runnable_blocks() -> dict[str, str]:
    """Each runnable block by the heading it is under."""
    text = README.read_text()
    blocks = {}
    for found in RUNNABLE.finditer(text):
        heading = heading_before(text[: found.start()])
        assert heading not in blocks, f"two runnable blocks under {heading!r}"
        blocks[heading] = found.group(1)
    return blocks


def run(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    script = cwd / "example.py"
    script.write_text(code)
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=120,
    )


def test_the_first_examples_are_marked_runnable() -> None:
    assert {"In five minutes", "Steering a task"} <= set(runnable_blocks())


@pytest.mark.parametrize("heading", sorted(runnable_blocks()))
def test_a_readme_example_runs_as_written(heading: str, tmp_path: Path) -> None:
    done = run(runnable_blocks()[heading], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr


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
