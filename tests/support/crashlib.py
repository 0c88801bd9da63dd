"""Helpers for tests that SIGKILL real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

# tests/, where the agent modules and child scripts are
HERE = Path(__file__).resolve().parent.parent


def spawn(script: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(HERE / script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def read_until(stream: IO[str], marker: str, timeout: float) -> str:
    """Read lines until one starts with `marker`; fail on EOF or timeout."""
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            raise AssertionError(f"process ended before {marker!r}; it printed {seen}")
        seen.append(line.strip())
        if line.startswith(marker):
            return line.strip()
    raise AssertionError(f"no {marker!r} within {timeout}s; saw {seen}")


def kill_at(proc: subprocess.Popen[str], marker: str, timeout: float = 60) -> str:
    """SIGKILL `proc` once it printed a line starting with `marker`; returns that line."""
    # readline() blocks: a child that hangs silently is killed at the deadline
    # (its output then ends), so the test fails instead of hanging.
    watchdog = threading.Timer(timeout, proc.kill)
    watchdog.start()
    try:
        assert proc.stdout is not None
        line = read_until(proc.stdout, marker, timeout)
    except AssertionError:
        proc.kill()
        err = proc.stderr.read() if proc.stderr else ""
        close_pipes(proc)
        raise AssertionError(f"child never reached {marker!r}:\n{err}") from None
    finally:
        watchdog.cancel()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    close_pipes(proc)
    assert proc.returncode == -signal.SIGKILL
    return line


def close_pipes(proc: subprocess.Popen[str]) -> None:
    """Close our ends of a finished child's pipes (not left to the collector)."""
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def finish(proc: subprocess.Popen[str], timeout: float = 120) -> str:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()  # a test that gives up on a child leaves no process behind
        out, err = proc.communicate()
        raise AssertionError(f"child still running after {timeout}s:\n{out}\n{err}") from None
    assert proc.returncode == 0, f"child failed ({proc.returncode}):\n{out}\n{err}"
    return out


def ledger_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def dump(obj: object) -> str:
    return json.dumps(obj, sort_keys=True, default=str)
