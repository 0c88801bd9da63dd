"""A Pydantic AI agent's run SIGKILLed at random points: nothing recorded is
lost or done again, no never-replay tool runs twice, the output is unchanged."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from duragent import Runtime, TaskStatus
from duragent.types import EntryKind
from support.crashlib import HERE, close_pipes, finish, kill_at, spawn

pytest.importorskip("pydantic_ai")

KILLS = 6


def run_until_at_or_done(
    url: str,
    ledger: Path,
    kill_at: int,
    texts: list[str] | None = None,
    script: str = "pydantic_ai_agent.py",
) -> str | None:
    """Run the child; SIGKILL it at its `AT` line (None), or return its output.
    With `texts`, the run streams, and the text it was given is appended there."""
    mode = () if texts is None else ("stream",)
    proc = spawn(script, url, str(ledger), str(kill_at), *mode)
    watchdog = threading.Timer(120, proc.kill)
    watchdog.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("AT "):
                proc.kill()
                proc.wait(10)
                close_pipes(proc)
                return None
            if line.startswith("TEXT ") and texts is not None:
                texts.append(json.loads(line.removeprefix("TEXT ")))
            if line.startswith("DONE "):
                finish(proc)
                return line.removeprefix("DONE ").strip()
        err = proc.stderr.read() if proc.stderr else ""
        proc.wait(10)
        close_pipes(proc)
        raise AssertionError(f"child ended without AT or DONE ({proc.returncode}):\n{err}")
    finally:
        watchdog.cancel()


def ledger_lines(ledger: Path) -> list[str]:
    return ledger.read_text().splitlines()


async def recorded_steps(url: str) -> tuple[TaskStatus, int, dict[str, dict[str, object]], str]:
    async with Runtime(url, run_worker=False) as rt:
        (task,) = (await rt.store.list_tasks()).tasks
        task = await rt.get(task.id)
        entries = await rt.store.entries(task.id, kinds=[EntryKind.CHECKPOINT])
        steps = {e.payload["step"]: dict(e.payload) for e in entries if e.payload["type"] == "step"}
        (result,) = await rt.store.entries(task.id, kinds=[EntryKind.TOOL_RESULT])
        return task.status, task.restarts, steps, result.payload["content"]


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sigkill_at_random_points_loses_no_step_and_repeats_no_charge(
    tmp_path: Path, seed: int
) -> None:
    reference = run_until_at_or_done(f"sqlite:///{tmp_path}/ref.db", tmp_path / "ref.txt", 0)
    assert reference == '{"rounds":3,"lookups":["p-0","p-1","p-2"]}'

    url, ledger = f"sqlite:///{tmp_path}/crash.db", tmp_path / "ledger.txt"
    rng, kills, output = random.Random(seed), 0, None
    while output is None:
        # The k-th ledger line this process writes (a live model request, a tool's
        # effect, a recorded step) is where it is killed; after KILLS kills, none.
        kill_at = rng.randint(1, 6) if kills < KILLS else 0
        output = run_until_at_or_done(url, ledger, kill_at)
        kills += output is None
    assert kills >= 1
    assert output == reference

    lines = ledger_lines(ledger)
    # 0 lost steps: nothing recorded was run again.
    for i, line in enumerate(lines):
        if line.startswith("recorded "):
            step = line.removeprefix("recorded ")
            assert f"run {step}" not in lines[i + 1 :], f"{step} ran again after it was recorded"
    # 0 duplicate never-replay runs.
    for i in range(3):
        assert lines.count(f"run tool:{i + 1}:charge-{i}") <= 1

    status, restarts, steps, content = asyncio.run(recorded_steps(url))
    assert status is TaskStatus.COMPLETED and restarts == kills
    assert {f"model:{n}" for n in range(1, 5)} <= set(steps)
    assert {f"tool:{i + 1}:lookup-{i}" for i in range(3)} <= set(steps)
    envelope = json.loads(content)
    returns = {
        p["tool_call_id"]: p["content"]
        for m in envelope["messages"]
        for p in m["parts"]
        if p["part_kind"] == "tool-return"
    }
    for i in range(3):
        step = f"tool:{i + 1}:charge-{i}"
        if step in steps:  # recorded: its result reached the model
            assert returns[f"charge-{i}"] == f"charged {i}"
        else:  # cut off: the model was told, the charge was not made again
            assert "interrupted" in returns[f"charge-{i}"]


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_sigkill_while_streaming_gives_each_piece_of_text_once_and_replays_recorded_responses(
    tmp_path: Path, seed: int
) -> None:
    reference = run_until_at_or_done(f"sqlite:///{tmp_path}/ref.db", tmp_path / "ref.txt", 0, [])
    url, ledger = f"sqlite:///{tmp_path}/crash.db", tmp_path / "ledger.txt"
    rng, kills, output = random.Random(seed), 0, None
    texts: list[str] = []
    while output is None:
        # Kill points now include each streamed piece (`chunk model:N`).
        kill_at = rng.randint(1, 8) if kills < KILLS else 0
        output = run_until_at_or_done(url, ledger, kill_at, texts)
        kills += output is None
    assert kills >= 1 and output == reference
    # The last process read the task's stream from its start: each response's text
    # once, also those streamed again after a kill cut them off.
    assert texts == ["".join(f"round {n} says hi. " for n in range(1, 5))]
    lines = ledger_lines(ledger)
    for i, line in enumerate(lines):
        if line.startswith("recorded model:"):  # a recorded response is never streamed again
            step = line.removeprefix("recorded ")
            assert f"run {step}" not in lines[i + 1 :] and f"chunk {step}" not in lines[i + 1 :]
    for i in range(3):
        assert lines.count(f"run tool:{i + 1}:charge-{i}") <= 1
    status, restarts, steps, _ = asyncio.run(recorded_steps(url))
    assert status is TaskStatus.COMPLETED and restarts == kills
    assert {f"model:{n}" for n in range(1, 5)} <= set(steps)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sigkill_around_approvals_asks_each_once_and_pays_once(tmp_path: Path, seed: int) -> None:
    script = "pydantic_ai_approval_agent.py"
    ref = run_until_at_or_done(f"sqlite:///{tmp_path}/r.db", tmp_path / "r.txt", 0, script=script)
    assert ref == "completed paid 20 | The tool call was denied. Reason: over budget"
    url, ledger = f"sqlite:///{tmp_path}/crash.db", tmp_path / "ledger.txt"
    rng, kills, output = random.Random(seed), 0, None
    while output is None:
        # Kill points: live requests, the payment, each recorded step (the question
        # `ask:`, the decision `approval:`), and just before a person's answer.
        kill_at = rng.randint(1, 7) if kills < KILLS else 0
        output = run_until_at_or_done(url, ledger, kill_at, script=script)
        kills += output is None
    assert kills >= 1 and output == ref
    lines = ledger_lines(ledger)
    assert lines.count("run pay 20") <= 1 and "run pay 30" not in lines
    for i, line in enumerate(lines):
        if line.startswith("recorded model:"):
            assert f"run {line.removeprefix('recorded ')}" not in lines[i + 1 :]

    async def asked() -> tuple[TaskStatus, list[int], list[str]]:
        async with Runtime(url, run_worker=False) as rt:
            (task,) = (await rt.store.list_tasks()).tasks
            entries = await rt.store.entries(task.id, kinds=[EntryKind.CHECKPOINT])
            waits = [
                e.payload["arguments"]["amount"] for e in entries if e.payload["type"] == "wait"
            ]
            decided = [e.payload["step"] for e in entries if e.payload["type"] == "step"]
            return task.status, waits, decided

    status, waits, decided = asyncio.run(asked())
    # Nothing asked twice: one wait per approval, whatever the kills.
    assert status is TaskStatus.COMPLETED and waits == [20, 30]
    assert {"approval:1:p1", "approval:2:p2", "tool:1:p1"} <= set(decided)


def worker(url: str, ledger: Path, kill_on: str = "") -> subprocess.Popen[str]:
    """A `duragent worker` process serving the child module's agent."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYD_LEDGER": str(ledger), "PYD_KILL_ON": kill_on}
    return subprocess.Popen(
        [sys.executable, "-m", "duragent", "worker", "--store", url, "--lease-ttl", "1",
         "--poll-interval", "0.1", "--agents", "pydantic_ai_agent:agents"],
        cwd=HERE, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


@pytest.mark.slow
def test_duragent_workers_run_it_and_one_killed_in_a_charge_hands_it_on(tmp_path: Path) -> None:
    url, ledger = f"sqlite:///{tmp_path}/workers.db", tmp_path / "ledger.txt"
    sys.path.insert(0, str(HERE))
    try:
        from pydantic_ai_agent import Shop, durable
    finally:
        sys.path.remove(str(HERE))

    async def submit() -> str:
        async with Runtime(url, agents=[durable.agent], run_worker=False) as rt:
            sub = await rt.submit("shop", "buy things", context=durable.context_for(Shop("p")))
            return sub.task_id

    task_id = asyncio.run(submit())
    kill_at(worker(url, ledger, "run tool:2:charge-1"), "AT ")
    second = worker(url, ledger)
    try:

        async def result() -> Any:
            async with Runtime(url, agents=[durable.agent], run_worker=False) as rt:
                task = await rt.wait(task_id, timeout=60)
                return task, await durable.result(rt, task)

        task, run = asyncio.run(result())
    finally:
        second.terminate()
        finish(second)
    assert task.restarts == 1
    assert run.output.model_dump_json() == '{"rounds":3,"lookups":["p-0","p-1","p-2"]}'
    lines = ledger_lines(ledger)
    assert lines.count("run tool:2:charge-1") == 1  # cut off in the first worker, not run again
    assert [line for line in lines if line.startswith("run model")] == [
        f"run model:{n}" for n in (1, 2, 3, 4)
    ]  # the second worker asked only what was not recorded
