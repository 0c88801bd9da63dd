"""An OpenAI Agents SDK agent's run SIGKILLed at random points: nothing recorded
is lost or done again, no never-replay tool runs twice, the output is unchanged.

The model is the SDK's `OpenAIChatCompletionsModel` against a local
OpenAI-compatible server in this process, which writes each request it answers
to the same ledger as the child (`run model:N`)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents", reason="the openai-agents extra is part of the dev install")

from duragent import Runtime, TaskStatus
from duragent.types import EntryKind
from support.crashlib import HERE, close_pipes, finish, kill_at, spawn
from support.llm_servers import RecordedRequest, ScriptedOpenAIServer

sys.path.insert(0, str(HERE))
import openai_agents_agent as child

KILLS = 6
REFERENCE = '{"rounds":3,"lookups":["p-0","p-1","p-2"]}'


class Ledgered:
    """The server's script, each request it answers written to the current ledger."""

    def __init__(self) -> None:
        self.ledger = Path(os.devnull)

    def __call__(self, request: RecordedRequest) -> Any:
        done = sum(m["role"] == "assistant" for m in request.json["messages"])
        child.append(str(self.ledger), f"run model:{done + 1}")
        return child.script(request.json)


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[ScriptedOpenAIServer, Ledgered]]:
    script = Ledgered()
    with ScriptedOpenAIServer(script, answer_by="history") as srv:
        monkeypatch.setenv("OAI_BASE_URL", srv.base_url)
        yield srv, script  # type: ignore[misc]


def run_until_at_or_done(url: str, ledger: Path, kill_at: int) -> str | None:
    """Run the child; SIGKILL it at its `AT` line (None), or return its output."""
    proc = spawn("openai_agents_agent.py", url, str(ledger), str(kill_at))
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
            if line.startswith("DONE "):
                finish(proc)
                return line.removeprefix("DONE ").strip()
        err = proc.stderr.read() if proc.stderr else ""
        proc.wait(10)
        close_pipes(proc)
        raise AssertionError(f"child ended without AT or DONE ({proc.returncode}):\n{err}")
    finally:
        watchdog.cancel()


def effect_of(step: str) -> str:
    """The ledger line of a step's effect: the server's answer, or the tool's run."""
    if step.startswith("model:"):
        return f"run {step}"
    if step.startswith("guardrail:"):
        return "run guard"
    _, n, call = step.split(":")  # tool:N:call_<round>_<j>
    return f"run {'charge' if call.endswith('_0') else 'lookup'} {int(n) - 2}"


async def recorded(url: str) -> tuple[TaskStatus, int, dict[str, Any], dict[str, Any]]:
    async with Runtime(url, run_worker=False) as rt:
        (task,) = (await rt.store.list_tasks()).tasks
        task = await rt.get(task.id)
        entries = await rt.store.entries(task.id, kinds=[EntryKind.CHECKPOINT])
        steps = {e.payload["step"]: dict(e.payload) for e in entries if e.payload["type"] == "step"}
        (result,) = await rt.store.entries(task.id, kinds=[EntryKind.TOOL_RESULT])
        return task.status, task.restarts, steps, json.loads(result.payload["content"])


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sigkill_at_random_points_loses_no_step_and_repeats_no_charge(
    tmp_path: Path, server: tuple[ScriptedOpenAIServer, Ledgered], seed: int
) -> None:
    _, script = server
    script.ledger = tmp_path / "ref.txt"
    reference = run_until_at_or_done(f"sqlite:///{tmp_path}/ref.db", script.ledger, 0)
    assert reference == REFERENCE

    url, ledger = f"sqlite:///{tmp_path}/crash.db", tmp_path / "ledger.txt"
    script.ledger = ledger
    rng, kills, output = random.Random(seed), 0, None
    while output is None:
        # The k-th ledger line this process writes (a model call about to go out,
        # a tool's effect, a recorded step) is where it is killed; after KILLS, none.
        kill_at = rng.randint(1, 6) if kills < KILLS else 0
        output = run_until_at_or_done(url, ledger, kill_at)
        kills += output is None
    assert kills >= 1
    assert output == reference

    lines = ledger.read_text().splitlines()
    # 0 lost steps: nothing recorded was run (or asked of the server) again.
    for i, line in enumerate(lines):
        if line.startswith("recorded "):
            effect = effect_of(line.removeprefix("recorded "))
            assert effect not in lines[i + 1 :], f"{line}: {effect} again after it was recorded"
    # 0 duplicate never-replay runs.
    for i in range(3):
        assert lines.count(f"run charge {i}") <= 1

    status, restarts, steps, envelope = asyncio.run(recorded(url))
    assert status is TaskStatus.COMPLETED and restarts == kills
    assert {f"model:{n}" for n in range(1, 6)} | {"guardrail:input:polite"} <= set(steps)
    assert {f"tool:{i + 2}:call_{i + 1}_1" for i in range(3)} <= set(steps)  # the lookups
    assert envelope["last_agent"] == "shop"
    outputs = {
        item["call_id"]: item["output"]
        for item in envelope["input_list"]
        if item.get("type") == "function_call_output"
    }
    for i in range(3):
        step = f"tool:{i + 2}:call_{i + 1}_0"
        if step in steps:  # recorded: its result reached the model
            assert outputs[f"call_{i + 1}_0"] == f"charged {i}"
        else:  # cut off (begun, perhaps before its effect): the model was told, no second run
            assert "interrupted" in outputs[f"call_{i + 1}_0"]


def worker(url: str, ledger: Path, kill_on: str = "") -> subprocess.Popen[str]:
    """A `duragent worker` process serving the child module's agent."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OAI_LEDGER": str(ledger), "OAI_KILL_ON": kill_on}
    return subprocess.Popen(
        [sys.executable, "-m", "duragent", "worker", "--store", url, "--lease-ttl", "1",
         "--poll-interval", "0.1", "--agents", "openai_agents_agent:agents"],
        cwd=HERE, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


@pytest.mark.slow
def test_duragent_workers_run_it_and_one_killed_in_a_charge_hands_it_on(
    tmp_path: Path, server: tuple[ScriptedOpenAIServer, Ledgered]
) -> None:
    url, ledger = f"sqlite:///{tmp_path}/workers.db", tmp_path / "ledger.txt"
    _, script = server
    script.ledger = ledger

    async def submit() -> str:
        async with Runtime(url, agents=[child.durable.agent], run_worker=False) as rt:
            context = child.durable.context_for(child.Shop("p"))
            sub = await rt.submit("shop", "buy things", context=context)
            return sub.task_id

    task_id = asyncio.run(submit())
    kill_at(worker(url, ledger, "run charge 1"), "AT ")
    second = worker(url, ledger)
    try:

        async def result() -> Any:
            async with Runtime(url, agents=[child.durable.agent], run_worker=False) as rt:
                task = await rt.wait(task_id, timeout=60)
                return task, await child.durable.result(rt, task)

        task, run = asyncio.run(result())
    finally:
        second.terminate()
        finish(second)
    assert task.restarts == 1
    assert run.final_output.model_dump_json() == REFERENCE
    assert run.last_agent == "shop"
    lines = ledger.read_text().splitlines()
    assert lines.count("run charge 1") == 1  # cut off in the first worker, not run again
    told = {i["call_id"]: i["output"] for i in run.input_list if "output" in i}
    assert "interrupted" in told["call_2_0"] and told["call_2_1"] == "p-1"
    assert [line for line in lines if line.startswith("run model")] == [
        f"run model:{n}" for n in (1, 2, 3, 4, 5)
    ]  # the second worker asked only what was not recorded
