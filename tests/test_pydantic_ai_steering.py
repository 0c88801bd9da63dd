"""Forks and retries of Pydantic AI tasks (duragent.pydantic_ai), like native ones:
a fork at round k replays the recorded steps of rounds 1..k and goes on live; a
retry of a failed run goes on from its last good step. Library, REST and CLI."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

pytest.importorskip("pydantic_ai", reason="the pydantic-ai extra is part of the dev install")

from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from duragent import Runtime, TaskFailed, TaskStatus, UsageError
from duragent.cli import app
from duragent.pydantic_ai import DurableAgent
from duragent.runtime._steering import Edit
from duragent.server import TokenStore, create_app
from duragent.store import Store
from support.api import TOKENS, auth

ROUNDS = 3


@dataclass
class Script:
    """A three-round Pydantic AI agent whose model and tool say which generation
    (`gen`) answered, so a replayed answer is told apart from a live one."""

    gen: str = "a"
    fail_at: int = 0  # the model request that raises, once
    asked: list[int] = field(default_factory=list)  # model requests answered live
    ran: list[str] = field(default_factory=list)  # tool calls run live

    def durable(self) -> DurableAgent:
        def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            n = sum(isinstance(m, ModelResponse) for m in messages) + 1
            if n == self.fail_at:
                self.fail_at = 0
                raise RuntimeError(f"the provider is down at request {n}")
            self.asked.append(n)
            if n <= ROUNDS:
                return ModelResponse(
                    parts=[ToolCallPart("work", {"i": n}, tool_call_id=f"w{n}-{self.gen}")]
                )
            said = [
                str(p.content)
                for m in messages
                for p in getattr(m, "parts", ())
                if isinstance(p, ToolReturnPart)
            ]
            return ModelResponse(parts=[TextPart(" ".join(said) + f" / {self.gen}")])

        pyd = PydanticAgent(FunctionModel(model))

        @pyd.tool_plain
        def work(i: int) -> str:  # never replayed
            self.ran.append(f"{i}{self.gen}")
            return f"{i}{self.gen}"

        return DurableAgent(pyd, name="rounds")


@pytest.mark.slow
async def test_a_fork_replays_rounds_up_to_k_and_goes_on_live(store: Store) -> None:
    script = Script()
    durable = script.durable()
    async with Runtime(store, agents=[durable.agent], poll_interval=0.05) as rt:
        source = await durable.run(rt, "go", timeout=30)
        assert source.output == "1a 2a 3a / a"
        script.gen, script.asked, script.ran = "b", [], []
        sub = await rt.fork(source.task.id, 2)
        fork = await durable.result(rt, await sub.wait(timeout=30))
        # Rounds 1 and 2 came from the store; round 3 and the answer were live.
        assert fork.output == "1a 2a 3b / b"
        assert (script.asked, script.ran) == ([3, 4], ["3b"])
        assert await durable.steps(rt, sub.task_id) == [
            "model:1", "tool:1:w1-a", "model:2", "tool:2:w2-a",
            "model:3", "tool:3:w3-b", "model:4",
        ]  # fmt: skip
        task = await rt.get(sub.task_id)
        assert task.config["forked_from"] == {"task_id": source.task.id, "round": 2}
        assert (await rt.get(source.task.id)).output == "1a 2a 3a / a"  # untouched
        # The same request_id gives the same fork; a fork at the last round answers at once.
        again = await rt.fork(source.task.id, 4, request_id="f4")
        assert (await durable.result(rt, await again.wait(timeout=30))).output == source.output
        assert (await rt.fork(source.task.id, 4, request_id="f4")).task_id == again.task_id
        assert script.asked == [3, 4]


@pytest.mark.slow
async def test_a_fork_past_the_closed_rounds_or_with_an_edit_is_refused() -> None:
    script = Script()
    durable = script.durable()
    async with Runtime("memory://", agents=[durable.agent]) as rt:
        source = await durable.run(rt, "go", timeout=30)
        with pytest.raises(UsageError, match=r"4 closed rounds .* round 5 cannot be forked"):
            await rt.fork(source.task.id, 5)
        with pytest.raises(UsageError, match="at_round must be 1 or more"):
            await rt.fork(source.task.id, 0)
        with pytest.raises(UsageError, match="fork it without an edit"):
            await rt.fork(source.task.id, 2, edit=Edit(append_user="more"))


@pytest.mark.slow
async def test_a_retry_goes_on_from_the_last_good_step(shared_url: str) -> None:
    script = Script(fail_at=3)
    durable = script.durable()
    async with Runtime(shared_url, agents=[durable.agent], poll_interval=0.05) as rt:
        with pytest.raises(TaskFailed, match="the provider is down at request 3") as failed:
            await durable.run(rt, "go", timeout=30)
        task_id = failed.value.task_id
        task = await rt.get(task_id)
        assert task.error == (
            "the Pydantic AI run failed: RuntimeError: the provider is down at request 3"
        )
        assert (script.asked, script.ran) == ([1, 2], ["1a", "2a"])
        await rt.retry(task_id)
        done = await durable.result(rt, await rt.wait(task_id, timeout=30))
    assert done.output == "1a 2a 3a / a"
    # Requests 1 and 2 and their tools came from the store; request 3 was asked again.
    assert (script.asked, script.ran) == ([1, 2, 3, 4], ["1a", "2a", "3a"])


@pytest.mark.slow
async def test_rest_forks_and_retries_a_pydantic_ai_task(tmp_path: Path) -> None:
    script = Script(fail_at=2)
    durable = script.durable()
    rt = Runtime(f"sqlite:///{tmp_path}/api.db", [durable.agent], poll_interval=0.05)
    async with rt:
        transport = httpx.ASGITransport(app=create_app(rt, TokenStore.from_mapping(TOKENS)))
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            h = auth("alice")
            r = await client.post("/v1/tasks", json={"agent": "rounds", "input": "go"}, headers=h)
            tid = r.json()["id"]
            failed = await rt.wait(tid, timeout=30)
            assert failed.status is TaskStatus.FAILED and "request 2" in (failed.error or "")
            r = await client.post(f"/v1/tasks/{tid}/retry", headers=h)
            assert r.status_code == 200, r.text
            done = await rt.wait(tid, timeout=30)
            assert done.output == "1a 2a 3a / a" and script.asked == [1, 2, 3, 4]
            script.gen, script.asked, script.ran = "b", [], []
            r = await client.post(f"/v1/tasks/{tid}/fork", json={"at_round": 1}, headers=h)
            assert r.status_code == 201, r.text
            fork = await rt.wait(r.json()["id"], timeout=30)
            assert fork.output == "1a 2b 3b / b" and script.ran == ["2b", "3b"]
            r = await client.post(f"/v1/tasks/{tid}/fork", json={"at_round": 9}, headers=h)
            assert r.status_code == 400 and "cannot be forked" in r.json()["detail"]
            bob = auth("bob")
            r = await client.post(f"/v1/tasks/{tid}/fork", json={"at_round": 1}, headers=bob)
            assert r.status_code == 404


@pytest.mark.slow
def test_the_cli_forks_and_retries_a_pydantic_ai_task(tmp_path: Path) -> None:
    url, runner = f"sqlite:///{tmp_path}/cli.db", CliRunner()
    script = Script(fail_at=4)
    durable = script.durable()

    async def run(task_id: str | None = None) -> str:
        async with Runtime(url, [durable.agent], poll_interval=0.05) as rt:
            if task_id is None:
                task_id = (await rt.submit("rounds", "go")).task_id
            task = await rt.wait(task_id, timeout=30, until=lambda t: t.status.terminal)
            return f"{task.id} {task.status.value} {task.output}"

    tid, status, _ = asyncio.run(run()).split(" ", 2)
    assert status == "failed"
    out = runner.invoke(app, ["retry", tid, "--store", url], env={"COLUMNS": "200"})
    assert out.exit_code == 0 and f"task {tid} is pending" in out.output, out.output
    assert asyncio.run(run(tid)) == f"{tid} completed 1a 2a 3a / a"
    assert script.asked == [1, 2, 3, 4]  # request 4 asked again, 1-3 replayed
    script.gen, script.ran = "b", []
    out = runner.invoke(app, ["fork", tid, "--at", "3", "--store", url], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    fork_id = out.output.split()[2]
    assert asyncio.run(run(fork_id)) == f"{fork_id} completed 1a 2a 3a / b"
    assert script.ran == []


async def test_a_fork_keeps_its_sources_agent_version(store: Store) -> None:
    # A fork's rounds were made by its source's code: it runs on the same version
    # (as a native task's fork does), not on whatever version a worker serves.
    durable = Script().durable()
    async with Runtime(store, agents=[durable.agent], poll_interval=0.05) as rt:
        source = await durable.run(rt, "go", timeout=30)
        assert source.task.agent_version == durable.agent.version
        sub = await rt.fork(source.task.id, 2)
        assert (await rt.get(sub.task_id)).agent_version == durable.agent.version
