"""Durable steps inside a tool (ctx.step): recorded once, skipped on a re-run."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import drop_schema, require_postgres
from duragent import (
    Agent,
    Runtime,
    ScriptedModel,
    StepFailed,
    Store,
    TaskStatus,
    ToolCall,
    ToolContext,
    tool,
)
from duragent.store import open_store
from duragent.types import EntryKind
from support.crashlib import finish, kill_at, ledger_lines, spawn


@pytest.fixture(params=["sqlite", "postgres"])
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A store several processes share: a SQLite file, or a PostgreSQL schema."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/shared.db"
        return
    schema = f"test_{uuid.uuid4().hex[:12]}"
    yield f"{require_postgres()}?schema={schema}"
    drop_schema(schema)


async def outcome_of(url: str) -> tuple[str, str, str]:
    """(status, outcome, content) of the one task's one tool call."""
    store = open_store(url)
    await store.open()
    try:
        (task,) = (await store.list_tasks()).tasks
        (result,) = await store.entries(task.id, kinds=[EntryKind.TOOL_RESULT])
        return task.status.value, result.payload["outcome"], result.payload["content"]
    finally:
        await store.close()


@pytest.mark.slow
@pytest.mark.parametrize("replay", ["resume", "safe"])
async def test_sigkill_between_steps_skips_the_recorded_step(
    shared_url: str, tmp_path: Path, replay: str
) -> None:
    url, ledger = shared_url, tmp_path / "ledger.txt"
    kill_at(spawn("step_agent.py", url, str(ledger), "after_reserve", replay), "AT after_reserve")
    assert ledger_lines(ledger) == ["tool attempt=1", "reserve book"]

    out = finish(spawn("step_agent.py", url, str(ledger), "none", replay))
    assert "DONE completed" in out
    # The tool ran again, the recorded step did not: its result came from the log.
    assert ledger_lines(ledger) == [
        "tool attempt=1",
        "reserve book",
        "tool attempt=2",
        "charge 42",
        "ship",
    ]
    status, outcome, content = await outcome_of(url)
    assert (status, outcome, content) == ("completed", "ok", "r-book ch-42 shipped")


@pytest.mark.slow
async def test_sigkill_inside_an_unsafe_step_interrupts_the_call(
    shared_url: str, tmp_path: Path
) -> None:
    url, ledger = shared_url, tmp_path / "ledger.txt"
    kill_at(spawn("step_agent.py", url, str(ledger), "in_charge", "resume"), "AT in_charge")
    out = finish(spawn("step_agent.py", url, str(ledger), "none", "resume"))
    assert "DONE completed" in out
    # The charge began once and was never repeated; ship never ran.
    assert ledger_lines(ledger) == ["tool attempt=1", "reserve book", "charge 42", "tool attempt=2"]
    status, outcome, content = await outcome_of(url)
    assert (status, outcome) == ("completed", "interrupted")
    assert "interrupted in step 'charge'" in content and "'reserve'" in content


@pytest.mark.slow
async def test_sigkill_inside_a_safe_step_runs_it_again(tmp_path: Path) -> None:
    url, ledger = f"sqlite:///{tmp_path}/steps.db", tmp_path / "ledger.txt"
    kill_at(spawn("step_agent.py", url, str(ledger), "in_charge", "resume", "1"), "AT in_charge")
    out = finish(spawn("step_agent.py", url, str(ledger), "none", "resume", "1"))
    assert "DONE completed" in out
    assert ledger_lines(ledger) == [
        "tool attempt=1",
        "reserve book",
        "charge 42",
        "tool attempt=2",
        "charge 42",
        "ship",
    ]
    assert await outcome_of(url) == ("completed", "ok", "r-book ch-42 shipped")


@pytest.mark.slow
async def test_sigkill_in_a_never_replay_tool_with_steps_is_interrupted(tmp_path: Path) -> None:
    url, ledger = f"sqlite:///{tmp_path}/steps.db", tmp_path / "ledger.txt"
    kill_at(spawn("step_agent.py", url, str(ledger), "after_reserve", "never"), "AT after_reserve")
    finish(spawn("step_agent.py", url, str(ledger), "none", "never"))
    assert ledger_lines(ledger) == ["tool attempt=1", "reserve book"]
    status, outcome, _ = await outcome_of(url)
    assert (status, outcome) == ("completed", "interrupted")


# --- in one process, on every store ---------------------------------------------


def shop(calls: list[str], *, fail_charge: bool = False) -> Agent:
    async def charge(amount: int) -> dict[str, Any]:
        calls.append("charge")
        if fail_charge:
            raise RuntimeError("card declined")
        return {"charged": amount, "at": (1, 2)}

    @tool(replay="resume")
    async def order(item: str, ctx: ToolContext) -> str:
        """Order an item."""
        first = await ctx.step("charge", charge, 7)
        try:
            await ctx.step("charge", charge, 7)
        except ValueError as exc:
            calls.append(f"refused: {exc}")
        return f"{item}: {first}"

    model = ScriptedModel([[ToolCall("order", {"item": "pen"})], "Done."])
    return Agent(name="shop", model=model, tools=[order])


async def test_step_results_are_committed_as_json_on_every_store(store: Store) -> None:
    calls: list[str] = []
    async with Runtime(store, agents=[shop(calls)]) as rt:
        task = await (await rt.submit("shop", "buy")).wait(20)
    assert task.status is TaskStatus.COMPLETED
    assert calls[0] == "charge" and "ran twice" in calls[1] and len(calls) == 2
    steps = [
        e.payload
        for e in await store.entries(task.id, kinds=[EntryKind.CHECKPOINT])
        if e.payload.get("type", "").startswith("step")
    ]
    # An unsafe step: intent first, then the result (a tuple comes back as a list).
    assert [(p["type"], p["step"]) for p in steps] == [
        ("step_started", "charge"),
        ("step", "charge"),
    ]
    assert steps[1]["value"] == {"charged": 7, "at": [1, 2]}
    (result,) = await store.entries(task.id, kinds=[EntryKind.TOOL_RESULT])
    assert result.payload["content"] == "pen: {'charged': 7, 'at': [1, 2]}"


async def test_a_failed_step_is_recorded_and_raised_to_the_tool(store: Store) -> None:
    calls: list[str] = []
    async with Runtime(store, agents=[shop(calls, fail_charge=True)]) as rt:
        task = await (await rt.submit("shop", "buy")).wait(20)
    (result,) = await store.entries(task.id, kinds=[EntryKind.TOOL_RESULT])
    assert result.payload["outcome"] == "error"
    assert result.payload["content"] == (
        "Error: StepFailed: step 'charge' failed: RuntimeError: card declined"
    )
    (failed,) = [
        e.payload
        for e in await store.entries(task.id, kinds=[EntryKind.CHECKPOINT])
        if e.payload.get("type") == "step"
    ]
    assert failed["error"] == "RuntimeError: card declined"


@pytest.mark.slow
async def test_a_recorded_failure_is_raised_again_after_a_crash(store: Store) -> None:
    ran: list[int] = []
    hang = asyncio.Event()

    def charge() -> str:
        ran.append(1)
        raise RuntimeError("card declined")

    @tool(replay="resume")
    async def order(ctx: ToolContext) -> str:
        """Order."""
        try:
            await ctx.step("charge", charge)
        except StepFailed as exc:
            if ctx.attempt == 1:
                await hang.wait()  # the worker dies here (cancelled, lease left to expire)
            return f"attempt {ctx.attempt}: {exc}"
        return "charged"

    def agent() -> Agent:
        model = ScriptedModel([[ToolCall("order", {})], "Done."])
        return Agent(name="shop", model=model, tools=[order])

    first = Runtime(store, agents=[agent()], lease_ttl=1.0, poll_interval=0.1)
    sub = await first.submit("shop", "buy")

    async def failure_recorded() -> None:  # committed, not merely raised
        while not any(
            e.payload.get("type") == "step" and e.payload.get("error")
            for e in await store.entries(sub.task_id, kinds=[EntryKind.CHECKPOINT])
        ):
            await asyncio.sleep(0.01)

    await asyncio.wait_for(failure_recorded(), 20)
    await first.close(graceful=False)
    async with Runtime(store, agents=[agent()], lease_ttl=1.0, poll_interval=0.1) as second:
        task = await second.wait(sub.task_id, timeout=30)
    assert task.status is TaskStatus.COMPLETED and ran == [1]
    (result,) = await store.entries(task.id, kinds=[EntryKind.TOOL_RESULT])
    assert (
        result.payload["content"] == "attempt 2: step 'charge' failed: RuntimeError: card declined"
    )


async def test_a_step_result_that_is_not_json_is_a_clear_error(tmp_path: Path) -> None:
    @tool(replay="resume")
    async def bad(ctx: ToolContext) -> str:
        """Return something unstorable."""
        await ctx.step("object", object)
        return "unreachable"

    model = ScriptedModel([[ToolCall("bad", {})], "Done."])
    async with Runtime("memory://", agents=[Agent(name="a", model=model, tools=[bad])]) as rt:
        task = await (await rt.submit("a", "go")).wait(20)
        (result,) = await rt.store.entries(task.id, kinds=[EntryKind.TOOL_RESULT])
    assert result.payload["outcome"] == "error"
    assert "cannot be stored as JSON" in result.payload["content"]


def test_resume_is_a_replay_policy_and_others_are_refused() -> None:
    @tool(replay="resume")
    def f() -> str:
        """F."""
        return ""

    assert f.replay == "resume"
    with pytest.raises(ValueError, match="'never', 'safe' or 'resume'"):
        tool(replay="sometimes")(f.fn)  # type: ignore[call-overload]
    assert asyncio.iscoroutinefunction(ToolContext.step)


@pytest.mark.slow
def test_the_guides_steps_example_runs(tmp_path: Path) -> None:
    import subprocess
    import sys

    from support.readme import first_block_under

    out = subprocess.run(
        [sys.executable, "-c", first_block_under("Durable steps inside a tool")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "Ordered."
