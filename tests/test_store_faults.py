"""A store error ends the runner, never the task (DESIGN §9, issue 11 item 3).

Real faults only: a SQLite store whose process hits its file-size limit (the
writes fail exactly as on a full disk), and a `duragent worker` process whose
PostgreSQL backends another connection terminates every 2-30 ms.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo root holds bench/

from conftest import require_postgres

HERE = Path(__file__).parent


def run_disk_full_child(tmp_path: Path, mode: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(HERE / "disk_full_child.py"), str(tmp_path / "t.db"), mode],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def test_a_write_lost_to_a_full_disk_does_not_fail_the_task(tmp_path: Path) -> None:
    out = run_disk_full_child(tmp_path, "blip")
    assert out["failed_writes"] >= 1  # the fault really happened
    assert out["status"] == "completed", out
    # Every call of the three rounds has exactly one result in the model's view,
    # the never-replay call whose result was lost is reported interrupted, not re-run.
    assert len(out["results"]) == 6, out["results"]
    assert out["ran"].count("write_note:s2") == 1
    assert sum("interrupted" in r for r in out["results"]) <= 1


def test_a_task_waits_out_a_full_disk_and_continues(tmp_path: Path) -> None:
    out = run_disk_full_child(tmp_path, "outage")
    assert out["failed_writes"] > 1  # several writes failed while the disk was full
    assert out["status"] == "completed", out
    assert out["restarts"] == 0  # handed back, not left to a lease and taken over
    assert len(out["results"]) == 6, out["results"]
    assert out["ran"].count("write_note:s2") == 1


@pytest.mark.postgres
def test_killing_the_workers_postgres_connections_fails_no_task() -> None:
    require_postgres()
    from bench.faults import run_faults

    out = run_faults(tasks=12, rounds=3, min_ms=2, max_ms=30, timeout=240)
    assert out.terminated > 20, out.line()  # the connections really were killed, often
    assert out.failed == 0, out.line() + "\n" + "\n".join(out.errors)
    assert out.completed == 12, out.line() + "\n" + "\n".join(out.errors)
    assert out.worker_alive
