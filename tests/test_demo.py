"""`duragent demo`, the README's first command, run as a user would."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support.server_live import run_script

FINAL = (
    "Your trip is set: flight DA 101 Berlin→Lisbon (€420), 3 nights at Hotel Durable, "
    "and the forecast is sunny, 24°C."
)


def _checkout() -> dict[str, str]:
    src = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p.endswith("src")]
    return {"PYTHONPATH": src[0]} if src else {}


def demo_env(columns: int = 80) -> dict[str, str]:
    # No PYTHONPATH of ours: the demo's child process finds duragent by itself
    # (a checkout's own tree when the tests run with one).
    return {"COLUMNS": str(columns), "PATH": "/usr/bin:/bin", **_checkout()}


def demo(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "duragent", "demo", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env=demo_env(),
    )


def start_demo(cwd: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "duragent", "demo", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=demo_env(),
    )


def assert_told_right(out: str, crash: bool) -> None:
    """What every demo run must say, whole and within 80 columns."""
    # A command to copy is one line (the terminal wraps it); the rest fits 80 columns.
    lines = [line for line in out.splitlines() if not line.startswith("duragent show ")]
    assert all(len(line) <= 80 for line in lines), out
    flat = " ".join(out.split())
    assert "book_hotel ran once" in flat and "Task completed in 3 rounds." in flat, out
    assert " ".join(FINAL.split()) in flat  # the final answer, whole
    assert "interrupted" not in flat
    assert ("SIGKILL" in flat) is crash
    # book_hotel's result is committed before get_weather's, crash or not.
    assert flat.index("result call_1_0 [ok]: Booked") < flat.index("result call_1_1 [ok]: Lisbon")
    if crash:
        assert "kills it with SIGKILL in round 2, while get_weather runs" in flat
        assert "12 entries committed before it" in flat
        # book_hotel's result is in the log before the kill, get_weather's after it.
        booked = flat.index("result call_1_0 [ok]: Booked")
        kill = flat.index("SIGKILL here; a new process took over")
        weather = flat.index("result call_1_1 [ok]: Lisbon: sunny")
        assert booked < kill < weather, out
        assert "took over from a dead worker" in flat


@pytest.mark.slow
@pytest.mark.parametrize("crash", [True, False])
def test_demo_finishes_and_the_side_effect_ran_once(tmp_path: Path, crash: bool) -> None:
    done = demo(tmp_path, "--keep", *([] if crash else ["--no-crash"]))
    assert done.returncode == 0, done.stdout + done.stderr
    assert_told_right(done.stdout, crash)
    bookings = (tmp_path / "duragent-demo.db.bookings").read_text().splitlines()
    assert len(bookings) == 1
    assert (tmp_path / "duragent-demo.db").exists()  # --keep
    # --keep names the task to look at, not `...`.
    shown = re.search(r"^duragent show (t_\w+) --store (\S+)$", done.stdout, re.MULTILINE)
    assert shown, done.stdout
    looked = subprocess.run(
        [sys.executable, "-m", "duragent", "show", shown.group(1), "--store", shown.group(2)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env=demo_env(),
    )
    assert looked.returncode == 0 and "completed" in looked.stdout, looked.stdout + looked.stderr


@pytest.mark.slow
def test_the_demo_tells_the_same_story_every_time(tmp_path: Path) -> None:
    """The kill lands at its announced point every run: the same entries, the same rows."""
    told = []
    for _ in range(3):
        done = demo(tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        assert_told_right(done.stdout, crash=True)
        out = re.sub(r"pid \d+", "pid N", done.stdout)
        told.append(re.sub(r"^store: .*$", "store: X", out, flags=re.MULTILINE))
    assert told[0] == told[1] == told[2], told
    assert list(tmp_path.iterdir()) == []  # each run's files were its own, and are gone


def rest(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """The rest of its output, from the same buffered stream `started` read."""
    assert proc.stdout is not None and proc.stderr is not None
    with proc.stdout, proc.stderr:  # closed here, not left to the collector
        out = proc.stdout.read()
        proc.wait(timeout=120)
        return out, proc.stderr.read()


def started(proc: subprocess.Popen[str]) -> str:
    """The demo's first lines, up to its first step (its store and lock are taken)."""
    assert proc.stdout is not None
    seen = ""
    for line in proc.stdout:
        seen += line
        if line.startswith("1. "):
            return seen
    raise AssertionError(f"the demo never started: {seen}")


@pytest.mark.slow
def test_two_demos_in_one_folder_each_have_their_own_files(tmp_path: Path) -> None:
    first = start_demo(tmp_path)
    head = started(first)  # the first one runs now...
    second = demo(tmp_path)  # ...and the second runs to its end meanwhile
    out, err = rest(first)
    assert first.returncode == 0, head + out + err
    assert second.returncode == 0, second.stdout + second.stderr
    assert_told_right(head + out, crash=True)
    assert_told_right(second.stdout, crash=True)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_second_demo_on_a_kept_store_refuses_in_one_line(tmp_path: Path) -> None:
    first = start_demo(tmp_path, "--keep")
    head = started(first)
    second = demo(tmp_path, "--keep")
    assert second.returncode == 1, second.stdout + second.stderr
    assert second.stdout == ""
    assert len(second.stderr.strip().splitlines()) == 1, second.stderr
    assert "another duragent demo is using duragent-demo.db" in second.stderr
    out, err = rest(first)
    assert first.returncode == 0, head + out + err
    assert_told_right(head + out, crash=True)
    assert len((tmp_path / "duragent-demo.db.bookings").read_text().splitlines()) == 1
    assert not (tmp_path / "duragent-demo.db.lock").exists()
    # Once the first is done, the store is free again.
    again = demo(tmp_path, "--keep", "--no-crash")
    assert again.returncode == 0, again.stdout + again.stderr


@pytest.mark.slow
def test_demo_never_deletes_a_store_it_did_not_make(tmp_path: Path) -> None:
    precious = tmp_path / "precious.db"
    precious.write_bytes(b"my own data")
    refused = run_script("demo", "--no-crash", "--store", "precious.db", cwd=tmp_path)
    assert refused.returncode == 2
    assert "not a store this demo made" in refused.stdout and "--fresh" in refused.stdout
    assert precious.read_bytes() == b"my own data"

    kept = run_script("demo", "--no-crash", "--keep", "--store", "demo.db", cwd=tmp_path)
    assert kept.returncode == 0, kept.stdout + kept.stderr
    again = run_script("demo", "--no-crash", "--store", "demo.db", cwd=tmp_path)  # its own: fine
    assert again.returncode == 0, again.stdout + again.stderr
    assert not (tmp_path / "demo.db").exists()

    fresh = run_script("demo", "--no-crash", "--fresh", "--store", "precious.db", cwd=tmp_path)
    assert fresh.returncode == 0, fresh.stdout + fresh.stderr
    assert not precious.exists()
