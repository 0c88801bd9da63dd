"""`duragent run --deadline`, `duragent retry --deadline` and `duragent show`, as real processes."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import typer

from duragent.cli._common import parse_duration
from duragent.types import TaskStatus, utcnow
from support.cli_run import Cli, Serve, run_args, serve, stored, task_id_in, workdir

__all__ = ["serve", "workdir"]  # the fixtures this module uses from test_cli_run


@pytest.mark.slow
async def test_run_with_a_deadline_fails_the_task_then_retry_sets_a_new_one(
    serve: Serve, workdir: Path, tmp_path: Path
) -> None:
    # A model that talks for minutes: the deadline cuts its stream.
    server = serve(["word " * 2000], chunk_delay=0.05)
    store = f"sqlite:///{tmp_path}/cli.db"

    code, out, err = Cli(*run_args(server, store, workdir, "Talk."), "--deadline", "1s").finish()

    assert code == 1, out + err
    task_id = task_id_in(out)
    assert f"✗ failed (deadline) task {task_id}: deadline exceeded:" in out
    assert "(1 s after submit)" in out
    task, _ = await stored(store, task_id)
    assert task.status is TaskStatus.FAILED and task.status_reason == "deadline"

    code, out, err = Cli("retry", task_id, "--store", store, "--deadline", "2h").finish()
    assert code == 0, out + err
    assert f"task {task_id} is pending" in out
    task, _ = await stored(store, task_id)
    assert task.deadline is not None
    assert timedelta(hours=1) < task.deadline - utcnow() <= timedelta(hours=2)
    code, out, err = Cli("show", task_id, "--store", store).finish()
    assert code == 0 and "deadline" in out and task.deadline.strftime("%Y-%m-%d %H:%M") in out


@pytest.mark.slow
def test_a_malformed_deadline_is_a_usage_error(workdir: Path, tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/cli.db"
    args = ["run", "x", "--model", "scripted:demo", "--store", store, "--deadline", "soon"]
    code, _, err = Cli(*args, "--workdir", str(workdir)).finish()
    assert code == 2 and "'soon' is not a deadline like 90s, 15m, 12h or 30d" in err


def test_durations_are_read_with_their_unit() -> None:
    assert parse_duration("90s") == timedelta(seconds=90)
    assert parse_duration("1.5h") == timedelta(minutes=90)
    assert parse_duration("2d") == timedelta(days=2)
    for bad in ("", "30", "s", "1e400s", "3w"):
        with pytest.raises(typer.BadParameter):
            parse_duration(bad)
