"""A task is pinned to where its data goes and what its tools may touch
(runtime/pins.py): a worker whose agent would send it elsewhere, or root its
tools elsewhere, blocks it instead, until it is re-pinned on purpose."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from duragent import Agent, Runtime
from duragent.errors import UsageError
from duragent.llm.openai import OpenAIChat
from duragent.toolsets import toolset
from duragent.types import Task, TaskStatus
from support.llm_servers import ScriptedOpenAIServer

SECRET = "sk-pins-SECRET-42"


def agent_at(url: str, **kw: object) -> Agent:
    """The same agent, its model requests sent to `url`."""
    model = OpenAIChat("gpt-4o-mini", base_url=url, api_key=SECRET)
    return Agent(name="pinned", model=model, plan_tool=False, **kw)  # type: ignore[arg-type]


def is_blocked(task: Task) -> bool:
    return task.status is TaskStatus.BLOCKED


def blocked_after(version: int) -> Callable[[Task], bool]:
    return lambda task: is_blocked(task) and task.version > version


async def test_a_worker_never_sends_a_task_to_another_provider_url(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/pins.db"
    with ScriptedOpenAIServer(["from A"]) as a, ScriptedOpenAIServer(["from B"]) as b:
        async with Runtime(store, agents=[agent_at(a.base_url)], run_worker=False) as rt:
            task_id = (await rt.submit("pinned", "hello")).task_id
            task = await rt.get(task_id)
        assert task.config["request"]["base_url"] == a.base_url
        assert SECRET not in json.dumps(task.config)  # never a secret

        # A worker whose agent now points at B: the task is blocked, B hears nothing.
        async with Runtime(store, agents=[agent_at(b.base_url)], poll_interval=0.05) as rt:
            await rt.resume()
            task = await rt.wait(
                task_id, timeout=30, until=lambda t: t.status is TaskStatus.BLOCKED
            )
            assert task.status_reason == "pinned", task
            assert a.base_url in (task.error or "") and b.base_url in (task.error or "")
            assert "repin" in (task.error or "")
            assert b.requests == [] and a.requests == []

            # Re-pinned on purpose, it runs at B.
            await rt.repin(task_id)
            await rt.resume(task_id)
            task = await rt.wait(task_id, timeout=30)
        assert task.status is TaskStatus.COMPLETED and task.output == "from B"
        assert task.config["request"]["base_url"] == b.base_url
        assert len(b.requests) == 1 and a.requests == []


async def test_a_worker_with_the_pinned_url_runs_the_task(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/pins.db"
    with ScriptedOpenAIServer(["from A"]) as a:
        async with Runtime(store, agents=[agent_at(a.base_url)], run_worker=False) as rt:
            task_id = (await rt.submit("pinned", "hello")).task_id
        async with Runtime(store, agents=[agent_at(a.base_url)], poll_interval=0.05) as rt:
            await rt.resume()
            task = await rt.wait(task_id, timeout=30)
    assert task.status is TaskStatus.COMPLETED and task.output == "from A"


async def test_a_worker_never_roots_a_tasks_tools_elsewhere(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/pins.db"
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    with ScriptedOpenAIServer(["done"]) as a:
        tools = toolset("readonly", root=first, allow=["read"])
        agent = agent_at(a.base_url, tools=tools)
        async with Runtime(store, agents=[agent], run_worker=False) as rt:
            task_id = (await rt.submit("pinned", "hello")).task_id
            task = await rt.get(task_id)
        assert task.config["tools"] == [
            {"workdir": str(first.resolve()), "allow": ["read"], "private_network": False}
        ]
        for other in (
            toolset("readonly", root=second, allow=["read"]),  # another directory
            toolset("readonly", root=first, allow=["read", "http"]),  # more permissions
        ):
            agent = agent_at(a.base_url, tools=other)
            async with Runtime(store, agents=[agent], poll_interval=0.05) as rt:
                before = await rt.get(task_id)
                await rt.resume(task_id if before.status is TaskStatus.BLOCKED else None)
                task = await rt.wait(task_id, timeout=30, until=blocked_after(before.version))
                assert task.status_reason == "pinned", task
                assert str(first.resolve()) in (task.error or "")
        assert a.requests == []


async def test_repin_refuses_an_ended_task(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/pins.db"
    with ScriptedOpenAIServer(["done"]) as a:
        async with Runtime(store, agents=[agent_at(a.base_url)], poll_interval=0.05) as rt:
            task = await (await rt.submit("pinned", "hello")).wait(timeout=30)
            assert task.status is TaskStatus.COMPLETED
            with pytest.raises(UsageError, match="has ended"):
                await rt.repin(task.id)
