"""`duragent demo`, the README's first command, run as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def _checkout() -> dict[str, str]:
    src = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p.endswith("src")]
    return {"PYTHONPATH": src[0]} if src else {}


@pytest.mark.slow
@pytest.mark.parametrize("crash", [True, False])
def test_demo_finishes_and_the_side_effect_ran_once(tmp_path: Path, crash: bool) -> None:
    args = [sys.executable, "-m", "duragent", "demo", "--keep"] + ([] if crash else ["--no-crash"])
    done = subprocess.run(
        args,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        # No PYTHONPATH of ours: the demo's child process finds duragent by itself
        # (a checkout's own tree when the tests run with one).
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", **_checkout()},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = " ".join(done.stdout.split())
    assert "book_hotel ran 1 time(s)" in out and "Task completed in 3 rounds" in out
    assert ("SIGKILL" in out) is crash
    if crash:
        assert "took over from a dead worker" in out and "after restart" in out
    bookings = (tmp_path / "duragent-demo.db.bookings").read_text().splitlines()
    assert len(bookings) == 1
    assert (tmp_path / "duragent-demo.db").exists()  # --keep
