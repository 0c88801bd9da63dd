"""A task is pinned to where its data goes and what its tools may touch
(runtime/_pins.py): a worker whose agent would send it elsewhere, or root its
tools elsewhere, blocks it instead, until it is re-pinned on purpose."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from duragent import Agent, BuiltinTools, Runtime
from duragent.errors import UsageError
from duragent.runtime._worker import lease_alive
from duragent.store import open_store
from duragent.toolsets import toolset
from duragent.types import Task, TaskStatus
from support.llm_servers import ScriptedOpenAIServer
from support.server_live import child_env, duragent, stop

SECRET = "sk-pins-SECRET-42"


def agent_at(url: str, **kw: object) -> Agent:
    """The same agent, its model requests sent to `url`. A model string, not a model:
    the Runtime that builds the model from it closes it (its HTTP client's sockets)."""
    options = {"base_url": url, "api_key": SECRET}
    return Agent(
        name="pinned",
        model="openai:gpt-4o-mini",
        model_options=options,
        builtin_tools=BuiltinTools(plan=False),
        **kw,  # type: ignore[arg-type]
    )


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


async def test_the_sdks_base_url_variable_is_pinned_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No base_url given: the SDK sends to $OPENAI_BASE_URL, so that is the pin."""
    store = f"sqlite:///{tmp_path}/pins.db"

    def agent() -> Agent:
        options = {"api_key": SECRET}
        return Agent(name="pinned", model="openai:gpt-4o-mini", model_options=options)

    with ScriptedOpenAIServer(["from A"]) as a:
        monkeypatch.setenv("OPENAI_BASE_URL", a.base_url)
        async with Runtime(store, agents=[agent()], run_worker=False) as rt:
            task_id = (await rt.submit("pinned", "hello")).task_id
            assert (await rt.get(task_id)).config["request"]["base_url"] == a.base_url
        monkeypatch.delenv("OPENAI_BASE_URL")  # a worker where the variable is not set
        async with Runtime(store, agents=[agent()], poll_interval=0.05) as rt:
            await rt.resume()
            task = await rt.wait(task_id, timeout=30, until=is_blocked)
        assert task.status_reason == "pinned"
        assert "the provider's public endpoint" in (task.error or "")


@pytest.mark.slow  # waits out a dead worker's lease (10 s)
async def test_repin_waits_until_no_live_worker_holds_the_task(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/pins.db"
    with ScriptedOpenAIServer(["from A"]) as a, ScriptedOpenAIServer(["from B"]) as b:
        a.stall_next(after=0)
        dead = Runtime(store, agents=[agent_at(a.base_url)], lease_ttl=10.0, poll_interval=0.05)
        await dead.__aenter__()
        task_id = (await dead.submit("pinned", "hello")).task_id
        await asyncio.to_thread(a.wait_stalled)
        await dead.close(graceful=False)  # as if killed: its lease still holds the task
        a.release()
        async with Runtime(store, agents=[agent_at(b.base_url)], run_worker=False) as rt:
            assert lease_alive(await rt.get(task_id))
            with pytest.raises(UsageError, match="live worker"):
                await rt.repin(task_id)
            await rt.wait(task_id, timeout=30, until=lambda t: not lease_alive(t))
            task = await rt.repin(task_id)  # running, its worker gone
        assert task.status is TaskStatus.RUNNING
        async with Runtime(store, agents=[agent_at(b.base_url)], poll_interval=0.05) as rt:
            await rt.resume()
            task = await rt.wait(task_id, timeout=30)
        assert task.status is TaskStatus.COMPLETED and task.output == "from B"
        assert len(a.requests) == 1 and len(b.requests) == 1


async def test_repin_refuses_an_ended_task(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/pins.db"
    with ScriptedOpenAIServer(["done"]) as a:
        async with Runtime(store, agents=[agent_at(a.base_url)], poll_interval=0.05) as rt:
            task = await (await rt.submit("pinned", "hello")).wait(timeout=30)
            assert task.status is TaskStatus.COMPLETED
            with pytest.raises(UsageError, match="has ended"):
                await rt.repin(task.id)


async def until_status(url: str, task_id: str, status: TaskStatus, timeout: float = 60) -> Task:
    store = open_store(url)
    await store.open()
    try:
        async with asyncio.timeout(timeout):
            while (task := await store.get_task(task_id)).status is not status:
                await store.wait_for_change(0.1)
            return task
    finally:
        await store.close()


def worker_at(url: str, base_url: str, log: Path) -> subprocess.Popen[bytes]:
    """`duragent worker` whose agent `pinned` sends its model requests to `base_url`."""
    args = ["worker", "--store", url, "--agents", "pinned_agents:AGENTS", "--poll-interval", "0.1"]
    return duragent(*args, log=log, env=child_env(PINNED_BASE_URL=base_url))


@pytest.mark.slow
async def test_duragent_worker_and_resume_keep_the_pin(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/pins.db"
    with ScriptedOpenAIServer(["from A"]) as a, ScriptedOpenAIServer(["from B"]) as b:
        async with Runtime(url, agents=[agent_at(a.base_url)], run_worker=False) as rt:
            task_id = (await rt.submit("pinned", "hello")).task_id

        # A worker deployed with another URL: blocked, nothing sent anywhere.
        worker = worker_at(url, b.base_url, tmp_path / "b.log")
        try:
            task = await until_status(url, task_id, TaskStatus.BLOCKED)
        finally:
            stop(worker)
        assert task.status_reason == "pinned" and b.base_url in (task.error or "")
        assert a.requests == [] and b.requests == []

        # `duragent resume`, then a worker with the pinned URL: it runs there.
        resumed = subprocess.run(
            [sys.executable, "-m", "duragent", "resume", task_id, "--store", url],
            capture_output=True,
            text=True,
            timeout=60,
            env=child_env(),
        )
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        worker = worker_at(url, a.base_url, tmp_path / "a.log")
        try:
            task = await until_status(url, task_id, TaskStatus.COMPLETED)
        finally:
            stop(worker)
        assert task.output == "from A" and len(a.requests) == 1 and b.requests == []


async def test_a_stand_in_definition_that_only_submits_pins_nothing_it_does_not_declare(
    tmp_path: Path,
) -> None:
    """A process that only submits often names the agent with a stand-in (a scripted
    model, no tools): the workers' real definition then decides, nothing is blocked."""
    store = f"sqlite:///{tmp_path}/pins.db"
    stand_in = Agent(name="pinned", model="scripted:none", builtin_tools=BuiltinTools(plan=False))
    with ScriptedOpenAIServer(["from A"]) as a:
        async with Runtime(store, agents=[stand_in], run_worker=False) as rt:
            task_id = (await rt.submit("pinned", "hello")).task_id
            task = await rt.get(task_id)
        assert "base_url" not in task.config["request"] and "tools" not in task.config
        tools = toolset("readonly", root=tmp_path, allow={"read"})
        async with Runtime(store, agents=[agent_at(a.base_url, tools=tools)]) as rt:
            task = await rt.wait(task_id, timeout=30)
    assert task.status is TaskStatus.COMPLETED and task.output == "from A"
