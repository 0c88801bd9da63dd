"""Pydantic AI tools that need approval (`requires_approval=True`) wait for duragent's
approvals: the task waits, a person approves or denies through the library, REST
or the CLI, the decision is durable and the run goes on from its steps."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

pytest.importorskip("pydantic_ai", reason="the pydantic-ai extra is part of the dev install")

from pydantic_ai import Agent as PydanticAgent, ApprovalRequired, RunContext
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from duragent import Runtime, TaskStatus, UsageError
from duragent.cli import app
from duragent.pydantic_ai import DurableAgent
from duragent.server import TokenStore, create_app
from support.api import TOKENS, auth


@dataclass
class Shop:
    """Round 1 looks a price up (no approval), rounds 2 and 3 each pay (approval),
    then the model says what the tools told it."""

    asked: list[int] = field(default_factory=list)
    paid: list[int] = field(default_factory=list)

    def durable(self) -> DurableAgent:
        def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            n = sum(isinstance(m, ModelResponse) for m in messages) + 1
            self.asked.append(n)
            if n == 1:
                return ModelResponse(parts=[ToolCallPart("price", {}, tool_call_id="p")])
            if n <= 3:
                args = {"amount": 10 * n}
                return ModelResponse(parts=[ToolCallPart("pay", args, tool_call_id=f"pay{n}")])
            said = [
                str(p.content)
                for m in messages
                for p in getattr(m, "parts", ())
                if isinstance(p, ToolReturnPart)
            ]
            return ModelResponse(parts=[TextPart(" | ".join(said))])

        pyd = PydanticAgent(FunctionModel(model))

        @pyd.tool_plain
        def price() -> str:
            return "12"

        @pyd.tool_plain(requires_approval=True)
        def pay(amount: int) -> str:
            self.paid.append(amount)
            return f"paid {amount}"

        return DurableAgent(pyd, name="shop")


async def waiting(rt: Runtime, task_id: str) -> None:
    task = await rt.wait(task_id, timeout=30, until=lambda t: t.status is TaskStatus.WAITING)
    assert task.status is TaskStatus.WAITING, task


@pytest.mark.slow
async def test_an_approved_call_runs_a_denied_one_tells_the_model_and_neither_is_asked_again(
    tmp_path: Path,
) -> None:
    shop = Shop()
    durable = shop.durable()
    async with Runtime(f"sqlite:///{tmp_path}/a.db", agents=[durable.agent]) as rt:
        sub = await rt.submit("shop", "buy")
        await waiting(rt, sub.task_id)
        assert shop.paid == [] and shop.asked == [1, 2]
        await rt.respond(sub.task_id, approve=True)
        await waiting(rt, sub.task_id)  # the second payment
        assert shop.paid == [20] and shop.asked == [1, 2, 3]
        with pytest.raises(UsageError, match="without edited arguments"):
            await rt.respond(sub.task_id, approve=True, arguments={"amount": 1})
        await rt.respond(sub.task_id, approve=False, reason="too much")
        done = await rt.wait(sub.task_id, timeout=30)
        assert done.output == "12 | paid 20 | The tool call was denied. Reason: too much"
        steps = await durable.steps(rt, sub.task_id)
    assert shop.paid == [20] and shop.asked == [1, 2, 3, 4]  # no request asked twice
    assert steps == [
        "model:1", "tool:1:p", "model:2", "ask:2:pay2", "approval:2:pay2", "tool:2:pay2",
        "model:3", "ask:3:pay3", "approval:3:pay3", "model:4",
    ]  # fmt: skip


@pytest.mark.slow
async def test_rest_shows_the_approval_and_takes_the_decisions(tmp_path: Path) -> None:
    shop = Shop()
    durable = shop.durable()
    rt = Runtime(f"sqlite:///{tmp_path}/api.db", [durable.agent], poll_interval=0.05)
    async with rt:
        transport = httpx.ASGITransport(app=create_app(rt, TokenStore.from_mapping(TOKENS)))
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            h = auth("alice")
            r = await client.post("/v1/tasks", json={"agent": "shop", "input": "buy"}, headers=h)
            tid = r.json()["id"]
            await waiting(rt, tid)
            (wait,) = (await client.get(f"/v1/tasks/{tid}", headers=h)).json()["waiting_for"]
            assert (wait["wait"], wait["tool"], wait["arguments"], wait["editable"]) == (
                "approval", "pay", {"amount": 20}, False,
            )  # fmt: skip
            r = await client.post(
                f"/v1/tasks/{tid}/respond", json={"approve": True}, headers=auth("bob")
            )
            assert r.status_code == 404
            r = await client.post(f"/v1/tasks/{tid}/respond", json={"approve": True}, headers=h)
            assert r.status_code == 200, r.text
            await waiting(rt, tid)
            body = {"approve": False, "reason": "no"}
            r = await client.post(f"/v1/tasks/{tid}/respond", json=body, headers=h)
            assert r.status_code == 200, r.text
            done = await rt.wait(tid, timeout=30)
    assert done.output == "12 | paid 20 | The tool call was denied. Reason: no"
    assert shop.paid == [20] and shop.asked == [1, 2, 3, 4]


@pytest.mark.slow
def test_the_cli_lists_approves_and_denies_the_calls(tmp_path: Path) -> None:
    url, runner = f"sqlite:///{tmp_path}/cli.db", CliRunner()
    shop = Shop()
    durable = shop.durable()

    async def run_until_it_stops(task_id: str | None = None) -> str:
        async with Runtime(url, [durable.agent], poll_interval=0.05) as rt:
            if task_id is None:
                task_id = (await rt.submit("shop", "buy")).task_id
            stopped = {TaskStatus.WAITING, TaskStatus.COMPLETED}
            task = await rt.wait(task_id, timeout=30, until=lambda t: t.status in stopped)
            return f"{task.id} {task.status.value} {task.output}"

    def cli(*args: str) -> str:
        out = runner.invoke(app, [*args, "--store", url], env={"COLUMNS": "200"})
        assert out.exit_code == 0, out.output
        return out.output

    tid, status, _ = asyncio.run(run_until_it_stops()).split(" ", 2)
    assert status == "waiting"
    listed = cli("approvals", tid)
    assert "pay" in listed and '"amount": 20' in listed
    cli("approve", tid)
    assert asyncio.run(run_until_it_stops(tid)).split(" ", 2)[1] == "waiting"
    cli("deny", tid, "--reason", "over budget")
    final = asyncio.run(run_until_it_stops(tid))
    assert final == f"{tid} completed 12 | paid 20 | The tool call was denied. Reason: over budget"
    assert shop.paid == [20] and shop.asked == [1, 2, 3, 4]


@pytest.mark.slow
async def test_a_tool_raising_approval_required_waits_for_a_person_too() -> None:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            calls = [ToolCallPart("send", {"amount": a}, tool_call_id=f"s{a}") for a in (5, 500)]
            return ModelResponse(parts=calls)
        said = [str(p.content) for p in messages[-1].parts if isinstance(p, ToolReturnPart)]
        return ModelResponse(parts=[TextPart(" | ".join(said))])

    pyd = PydanticAgent(FunctionModel(model))
    sent: list[int] = []

    @pyd.tool
    def send(ctx: RunContext[object], amount: int) -> str:
        if amount > 100 and not ctx.tool_call_approved:
            raise ApprovalRequired  # only large amounts need a person
        sent.append(amount)
        return f"sent {amount}"

    durable = DurableAgent(pyd, name="sender")
    async with Runtime("memory://", agents=[durable.agent]) as rt:
        sub = await rt.submit("sender", "send")
        await waiting(rt, sub.task_id)
        assert sent == [5]
        await rt.respond(sub.task_id, approve=True)
        done = await rt.wait(sub.task_id, timeout=30)
        steps = await durable.steps(rt, sub.task_id)
    assert done.output == "sent 5 | sent 500" and sent == [5, 500]
    assert "tool:1:s500:approved" in steps and "approval:1:s500" in steps
