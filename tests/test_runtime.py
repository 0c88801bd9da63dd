"""The runtime in one process: rounds, errors the model sees, lifecycle, views."""

from __future__ import annotations

import asyncio
import gc
import json
import warnings
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from duragent import (
    Agent,
    BuiltinTools,
    InvalidTransition,
    Limits,
    RetryPolicy,
    Runtime,
    ScriptedModel,
    TaskStatus,
    Timing,
    ToolCall,
    ToolContext,
    Turn,
    tool,
)
from duragent.errors import (
    MalformedModelOutput,
    ModelError,
    RetryableModelError,
    TaskNotFound,
    UnknownAgent,
)
from duragent.llm._base import Finish, ModelRequest, StreamEvent, TextDelta, UsageDelta
from duragent.store._protocol import Store
from duragent.types import AssistantMessage, EntryKind, Task, ToolMessage, UINotice, UIToolCard


@pytest.fixture(params=["memory", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return "memory://" if request.param == "memory" else f"sqlite:///{tmp_path}/rt.db"


def tool_messages(view: list[Any]) -> list[str]:
    return [m.content for m in view if isinstance(m, ToolMessage)]


async def wait_for_entry(rt: Runtime, task_id: str, kind: EntryKind, **match: Any) -> None:
    async def look() -> None:
        async for e in rt.subscribe(task_id):
            if e.kind is kind and all(e.payload.get(k) == v for k, v in match.items()):
                return
        raise AssertionError(f"task ended without a {kind} entry matching {match}")

    await asyncio.wait_for(look(), 30)


async def pause_requested(rt: Runtime, task_id: str) -> None:
    """Until the task's runner holds the pause (or abort) request: what it does next
    is decided by the request, not by how fast the request got there."""

    async def look() -> None:
        assert rt.worker is not None
        while (runner := rt.worker.runner(task_id)) is None or runner.control is None:
            await asyncio.sleep(0.01)

    await asyncio.wait_for(look(), 30)


async def test_final_answer_completes_with_output_and_usage(url: str) -> None:
    agent = Agent(name="a", model=ScriptedModel(["Hello there."]))
    async with Runtime(url, agents=[agent]) as rt:
        task = await (await rt.submit("a", "hi", owner="u")).wait(30)
    assert task.status is TaskStatus.COMPLETED and task.output == "Hello there."
    assert task.iterations == 1 and task.usage.output_tokens > 0 and task.usage.input_tokens > 0
    assert task.completed_at is not None and task.owner == "u"


async def test_parallel_tool_calls_run_concurrently(url: str) -> None:
    both_started = asyncio.Barrier(2)

    @tool
    async def meet(name: str) -> str:
        """Wait until the other call has started too."""
        await asyncio.wait_for(both_started.wait(), 30)  # deadlocks if run one after another
        return f"met {name}"

    model = ScriptedModel(
        [[ToolCall("meet", {"name": "x"}), ToolCall("meet", {"name": "y"})], "ok"]
    )
    async with Runtime(url, agents=[Agent(name="a", model=model, tools=[meet])]) as rt:
        task = await (await rt.submit("a", "go")).wait(30)
        assert task.status is TaskStatus.COMPLETED
        assert sorted(tool_messages(await rt.model_view(task.id))) == ["met x", "met y"]


async def test_tool_errors_become_results_the_model_can_react_to(url: str) -> None:
    @tool
    def explode(n: int) -> str:
        """Always fails."""
        raise RuntimeError(f"boom {n}")

    seen: list[list[str]] = []

    def script(messages: list[Any]) -> Any:
        rounds = sum(isinstance(m, AssistantMessage) for m in messages)
        seen.append(tool_messages(messages))
        if rounds == 0:
            return [
                ToolCall("explode", {"n": 1}),
                ToolCall("no_such_tool", {}),
                ToolCall("explode", {"n": "not a number"}),
                ToolCall("explode", raw_arguments='{"n": 1'),  # truncated JSON
            ]
        return "I saw the errors."

    agent = Agent(name="a", model=ScriptedModel(script), tools=[explode])
    async with Runtime(url, agents=[agent]) as rt:
        task = await (await rt.submit("a", "go")).wait(30)
    assert task.status is TaskStatus.COMPLETED
    errors = seen[-1]
    assert len(errors) == 4 and all(e.startswith("Error:") for e in errors)
    joined = "\n".join(errors)
    assert "RuntimeError: boom 1" in joined
    assert "unknown tool 'no_such_tool'" in joined and "explode" in joined
    assert "invalid arguments for explode" in joined
    assert "not valid JSON" in joined


async def test_max_iterations_fails_with_that_reason(url: str) -> None:
    @tool
    def noop() -> str:
        """Does nothing."""
        return "ok"

    model = ScriptedModel(lambda msgs: [ToolCall("noop")])
    async with Runtime(
        url, agents=[Agent(name="a", model=model, tools=[noop], limits=Limits(max_iterations=3))]
    ) as rt:
        task = await (await rt.submit("a", "loop forever")).wait(30)
    assert task.status is TaskStatus.FAILED and task.iterations == 3
    assert task.error is not None and "max_iterations" in task.error


async def test_request_id_returns_the_same_task(url: str) -> None:
    agent = Agent(name="a", model=ScriptedModel(["done"]))
    async with Runtime(url, agents=[agent]) as rt:
        first = await rt.submit("a", "x", request_id="r", owner="u")
        again = await rt.submit("a", "x", request_id="r", owner="u")
        other = await rt.submit("a", "x", request_id="r", owner="v")
        assert first.created and not again.created and again.task_id == first.task_id
        assert other.task_id != first.task_id
        await first.wait(30)
        assert len((await rt.list_tasks(owner="u")).tasks) == 1


@pytest.mark.slow
async def test_cancelling_a_wait_never_cancels_the_task(url: str) -> None:
    gate = asyncio.Event()

    @tool
    async def slow() -> str:
        """Waits for the test."""
        await gate.wait()
        return "finished"

    agent = Agent(name="a", model=ScriptedModel([[ToolCall("slow")], "done"]), tools=[slow])
    async with Runtime(url, agents=[agent]) as rt:
        sub = await rt.submit("a", "go")
        waiter = asyncio.ensure_future(sub.wait())
        await wait_for_entry(rt, sub.task_id, EntryKind.TOOL_INTENT)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        with pytest.raises(TimeoutError):
            await sub.wait(timeout=0.2)
        assert await sub.status() is TaskStatus.RUNNING
        gate.set()
        assert (await sub.wait(30)).status is TaskStatus.COMPLETED


async def test_unknown_agent_is_a_clear_error(url: str) -> None:
    async with Runtime(url, agents=[Agent(name="a", model=ScriptedModel(["x"]))]) as rt:
        with pytest.raises(UnknownAgent, match="known agents: a"):
            await rt.submit("nope", "x")


async def test_resume_of_a_completed_task_names_both_states(url: str) -> None:
    async with Runtime(url, agents=[Agent(name="a", model=ScriptedModel(["x"]))]) as rt:
        task = await (await rt.submit("a", "x")).wait(30)
        with pytest.raises(InvalidTransition, match="'completed' to 'pending'"):
            await rt.resume(task.id)
        with pytest.raises(InvalidTransition, match="'completed' to 'paused'"):
            await rt.pause(task.id)


def streaming_model(text: str = "word " * 200) -> ScriptedModel:
    return ScriptedModel(
        [Turn(text=text, tool_calls=[ToolCall("noop")]), "finished"], chunk_delay=0.01, chunk_size=5
    )


@tool(replay="safe")
def noop() -> str:
    """Does nothing."""
    return "noop done"


@pytest.mark.slow
@pytest.mark.parametrize("rollback", [False, True])
async def test_pause_mid_stream_then_resume_completes(url: str, rollback: bool) -> None:
    agent = Agent(
        name="a", model=streaming_model(), tools=[noop], timing=Timing(progress_interval=0.02)
    )
    async with Runtime(url, agents=[agent]) as rt:
        sub = await rt.submit("a", "talk")
        await wait_for_entry(rt, sub.task_id, EntryKind.PROGRESS)
        paused = await rt.pause(sub.task_id, rollback=rollback)
        assert paused.status is TaskStatus.PAUSED and paused.iterations == 0
        assert [type(m).__name__ for m in await rt.model_view(sub.task_id)] == ["UserMessage"]
        markers = await rt.store.entries(sub.task_id, kinds=[EntryKind.ROLLBACK])
        assert [m.payload["scope"] for m in markers] == (["progress"] if rollback else [])
        await rt.resume(sub.task_id)
        done = await sub.wait(30)
        assert done.status is TaskStatus.COMPLETED and done.output == "finished"
        view = await rt.model_view(sub.task_id)
        assert [type(m).__name__ for m in view] == [
            "UserMessage",
            "AssistantMessage",
            "ToolMessage",
            "AssistantMessage",
        ]


@pytest.mark.parametrize("rollback", [False, True])
async def test_pause_mid_tool_lets_it_finish_then_resume(url: str, rollback: bool) -> None:
    release = asyncio.Event()
    runs: list[int] = []

    @tool
    async def slow(n: int) -> str:
        """A tool the test holds open."""
        runs.append(n)
        await release.wait()
        return f"slow {n} done"

    model = ScriptedModel(
        [Turn(text="working", tool_calls=[ToolCall("slow", {"n": 1})]), "all done"]
    )
    agent = Agent(name="a", model=model, tools=[slow], timing=Timing(tool_grace=10))
    async with Runtime(url, agents=[agent]) as rt:
        sub = await rt.submit("a", "go")
        await wait_for_entry(rt, sub.task_id, EntryKind.TOOL_INTENT)
        pausing = asyncio.ensure_future(rt.pause(sub.task_id, rollback=rollback))
        await pause_requested(rt, sub.task_id)
        assert not pausing.done(), "pause waits for the running tool (grace period)"
        release.set()
        paused = await asyncio.wait_for(pausing, 30)
        assert paused.status is TaskStatus.PAUSED
        view = await rt.model_view(sub.task_id)
        ui = await rt.ui_messages(sub.task_id)
        # `slow` is never-replay and finished within the grace period: a rollback
        # keeps its call and result in the model's view, so it is not run again.
        assert tool_messages(view) == ["slow 1 done"]
        assert any(isinstance(m, UIToolCard) and m.state == "ok" for m in ui)
        await rt.resume(sub.task_id)
        done = await sub.wait(30)
        assert done.status is TaskStatus.COMPLETED and done.output == "all done"
        assert runs == [1]


async def test_pause_past_the_grace_period_interrupts_the_tool(url: str) -> None:
    @tool
    async def forever() -> str:
        """Never returns."""
        await asyncio.sleep(3600)
        return "unreachable"

    model = ScriptedModel([[ToolCall("forever")], "ok then"])
    agent = Agent(name="a", model=model, tools=[forever], timing=Timing(tool_grace=0.1))
    async with Runtime(url, agents=[agent]) as rt:
        sub = await rt.submit("a", "go")
        await wait_for_entry(rt, sub.task_id, EntryKind.TOOL_INTENT)
        paused = await rt.pause(sub.task_id)
        assert paused.status is TaskStatus.PAUSED
        results = await rt.store.entries(sub.task_id, kinds=[EntryKind.TOOL_RESULT])
        assert [r.payload["outcome"] for r in results] == ["interrupted"]
        await rt.resume(sub.task_id)
        assert (await sub.wait(30)).output == "ok then"


async def test_abort_is_terminal_and_cancels_the_tool(url: str) -> None:
    cancelled = asyncio.Event()

    @tool
    async def forever() -> str:
        """Never returns."""
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "unreachable"

    agent = Agent(name="a", model=ScriptedModel([[ToolCall("forever")]]), tools=[forever])
    async with Runtime(url, agents=[agent]) as rt:
        sub = await rt.submit("a", "go")
        await wait_for_entry(rt, sub.task_id, EntryKind.TOOL_INTENT)
        aborted = await rt.abort(sub.task_id, reason="user changed their mind")
        assert aborted.status is TaskStatus.ABORTED and cancelled.is_set()
        assert aborted.error == "user changed their mind"
        results = await rt.store.entries(sub.task_id, kinds=[EntryKind.TOOL_RESULT])
        assert [r.payload["outcome"] for r in results] == ["interrupted"]
        with pytest.raises(InvalidTransition, match="'aborted' to 'pending'"):
            await rt.resume(sub.task_id)


async def test_pause_and_abort_a_task_no_worker_runs(url: str) -> None:
    agent = Agent(name="a", model=ScriptedModel(["x"]))
    async with Runtime(url, agents=[agent], run_worker=False) as rt:
        sub = await rt.submit("a", "queued")
        assert (await rt.pause(sub.task_id)).status is TaskStatus.PAUSED
        assert (await rt.resume(sub.task_id)).status is TaskStatus.PENDING  # type: ignore[union-attr]
        assert (await rt.abort(sub.task_id)).status is TaskStatus.ABORTED


async def test_load_task_deep_merges_context(url: str) -> None:
    agent = Agent(name="a", model=ScriptedModel(["x"]))
    async with Runtime(url, agents=[agent], run_worker=False) as rt:
        sub = await rt.submit(
            "a", "x", context={"user": {"name": "Ann", "prefs": {"lang": "en"}}, "n": 1}
        )
        task = await rt.load_task(sub.task_id, context={"user": {"prefs": {"tz": "UTC"}}, "n": 2})
        assert task.context == {
            "user": {"name": "Ann", "prefs": {"lang": "en", "tz": "UTC"}},
            "n": 2,
        }
        assert (await rt.get(sub.task_id)).context == task.context


@pytest.mark.slow
async def test_subscribe_yields_every_committed_entry_once_and_ends(url: str) -> None:
    agent = Agent(
        name="a",
        model=streaming_model("abc " * 40),
        tools=[noop],
        timing=Timing(progress_interval=0.01),
    )
    async with Runtime(url, agents=[agent]) as rt:
        sub = await rt.submit("a", "x")
        seqs = [e.seq async for e in rt.subscribe(sub.task_id)]
        task = await rt.get(sub.task_id)
        assert task.status is TaskStatus.COMPLETED
        assert seqs == list(range(1, task.last_seq + 1))
        kinds = {e.kind for e in await rt.store.entries(sub.task_id)}
        assert EntryKind.PROGRESS in kinds


async def test_tool_context_state_documents_and_steps(url: str) -> None:
    @tool
    async def remember(fact: str, ctx: ToolContext) -> str:
        """Remember a fact."""
        ctx.update_state(facts=[*ctx.context.get("facts", []), fact])
        ctx.documents.put("notes", {"last": fact, "key": ctx.idempotency_key})
        return "noted"

    model = ScriptedModel(
        [
            [ToolCall("update_plan", {"steps": ["remember", "answer"]})],
            Turn(text="Remembering.", tool_calls=[ToolCall("remember", {"fact": "sky is blue"})]),
            [ToolCall("update_plan", {"steps": ["answer"]})],
            "The sky is blue.",
        ]
    )
    statuses: list[tuple[str, str]] = []
    agent = Agent(name="a", model=model, tools=[remember])
    async with Runtime(
        url, agents=[agent], on_status_change=lambda t, a, b: statuses.append((a.value, b.value))
    ) as rt:
        task = await (await rt.submit("a", "x", context={"facts": []})).wait(30)
        assert task.context == {"facts": ["sky is blue"]}
        doc = await rt.store.get_document(f"task:{task.id}", "notes")
        assert doc is not None and doc.value["last"] == "sky is blue"
        assert doc.value["key"] == f"{task.id}:2:call_1_0"
        steps = await rt.steps(task.id)
        assert [s.round for s in steps.completed] == [1, 2, 3, 4]
        assert steps.completed[1].thought == "Remembering."
        assert steps.completed[1].actions[0]["observation"] == "noted"
        assert steps.pending == ["answer"] and steps.output == "The sky is blue."
    assert statuses == [("pending", "running"), ("running", "completed")]


@tool
def remember_sync(fact: str, ctx: ToolContext) -> str:
    """Remember a fact (a sync tool: it runs in a thread)."""
    ctx.update_state(facts=[*ctx.context.get("facts", []), fact])
    return "noted"


@pytest.mark.slow
async def test_a_sync_tool_updates_state_without_error_or_warning(store: Store) -> None:
    model = ScriptedModel([[ToolCall("remember_sync", {"fact": "sky"})], "done"])
    agent = Agent(name="a", model=model, tools=[remember_sync], timing=Timing(state_debounce=0.01))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        async with Runtime(store, agents=[agent]) as rt:
            task = await (await rt.submit("a", "x")).wait(30)
            view = await rt.messages(task.id)
        gc.collect()  # an un-awaited coroutine warns when it is collected
    assert [m.content for m in view if isinstance(m, ToolMessage)] == ["noted"]
    assert task.status is TaskStatus.COMPLETED and task.context == {"facts": ["sky"]}
    never_awaited = [w for w in caught if "never awaited" in str(w.message)]
    assert never_awaited == []


async def test_status_hook_reports_every_change_from_pending_to_completed(store: Store) -> None:
    seen: list[tuple[str, str]] = []
    model = ScriptedModel([[ToolCall("remember_sync", {"fact": "x"})], "ok"])
    agent = Agent(name="a", model=model, tools=[remember_sync])
    async with Runtime(
        store, agents=[agent], on_status_change=lambda t, a, b: seen.append((a.value, b.value))
    ) as rt:
        await (await rt.submit("a", "x")).wait(30)
    assert seen == [("pending", "running"), ("running", "completed")]


def quick_agent() -> Agent:
    return Agent(name="q", model=ScriptedModel(["done"]), builtin_tools=BuiltinTools(plan=False))


async def test_the_views_of_a_missing_or_purged_task_raise_task_not_found(store: Store) -> None:
    async with Runtime(store, agents=[quick_agent()]) as rt:
        for read in (rt.model_view, rt.ui_messages, rt.messages, rt.get, rt.history):
            with pytest.raises(TaskNotFound):
                await read("t_nosuchtask")
        sub = await rt.submit("q", "hi")
        await sub.wait(20)
        assert await rt.model_view(sub.task_id)  # a task that is there has its view
        await rt.purge(before=timedelta(0), agent="q")
        for read in (rt.model_view, rt.ui_messages, rt.messages, rt.get, rt.history):
            with pytest.raises(TaskNotFound):
                await read(sub.task_id)


async def test_an_async_status_hook_is_awaited_for_every_change_in_order(store: Store) -> None:
    seen: list[tuple[str, str]] = []

    async def hook(task: Task, old: TaskStatus, new: TaskStatus) -> None:
        await asyncio.sleep(0)  # a real coroutine: it only counts once awaited
        seen.append((old.value, new.value))

    async with Runtime(store, agents=[quick_agent()], on_status_change=hook) as rt:
        sub = await rt.submit("q", "hi")
        await sub.wait(20)
    assert seen == [("pending", "running"), ("running", "completed")]


class FlakyModel:
    """Fails with a retryable error `fails` times, then answers."""

    name = "flaky"

    def __init__(self, fails: int, fatal: bool = False) -> None:
        self.fails = fails
        self.fatal = fatal

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        if self.fails:
            self.fails -= 1
            yield TextDelta("partial ")
            if self.fatal:
                raise ModelError("the API key was rejected (401)")
            raise RetryableModelError("overloaded (529)", retry_after=0.01)
        yield TextDelta("recovered")
        yield Finish("stop")


async def test_retryable_model_errors_are_retried_and_visible(url: str) -> None:
    async with Runtime(url, agents=[Agent(name="a", model=FlakyModel(2))]) as rt:
        task = await (await rt.submit("a", "x")).wait(30)
        assert task.status is TaskStatus.COMPLETED and task.output == "recovered"
        notices = [m.message for m in await rt.ui_messages(task.id) if m.type == "notice"]
        assert len(notices) == 2 and "retry 1 of 4" in notices[0] and "overloaded" in notices[0]


async def test_non_retryable_model_error_fails_with_a_readable_reason(url: str) -> None:
    async with Runtime(url, agents=[Agent(name="a", model=FlakyModel(1, fatal=True))]) as rt:
        task = await (await rt.submit("a", "x")).wait(30)
        assert task.status is TaskStatus.FAILED
        assert task.error is not None and "API key was rejected" in task.error


async def test_retry_budget_is_bounded(url: str) -> None:
    agent = Agent(name="a", model=FlakyModel(10), model_retry=RetryPolicy(max_retries=2))
    async with Runtime(url, agents=[agent]) as rt:
        task = await (await rt.submit("a", "x")).wait(30)
        assert task.status is TaskStatus.FAILED and "failed 3 times" in (task.error or "")


def test_tool_schema_comes_from_hints_and_docstring() -> None:
    @tool(replay="safe")
    def search(query: str, limit: int = 5, ctx: ToolContext | None = None) -> list[str]:
        """Search the web.

        Args:
            query: what to look for
            limit: how many results
        """
        return []

    assert search.name == "search" and search.description == "Search the web."
    assert search.replay == "safe" and search.context_param == "ctx"
    props = search.parameters["properties"]
    assert props["query"] == {"description": "what to look for", "type": "string"}
    assert props["limit"]["default"] == 5 and props["limit"]["type"] == "integer"
    assert search.parameters["required"] == ["query"]
    assert "ctx" not in props
    with pytest.raises(ValueError, match="replay"):
        tool(replay="sometimes")(lambda: None)  # type: ignore[call-overload]


def test_run_sync_for_scripts(tmp_path: Path) -> None:
    rt = Runtime(
        f"sqlite:///{tmp_path}/s.db", agents=[Agent(name="a", model=ScriptedModel(["sync ok"]))]
    )
    task = rt.run_sync("a", "x", timeout=10)
    assert task.output == "sync ok"
    assert json.loads(task.model_dump_json())["status"] == "completed"


class UsageThenFailModel:
    """Reports usage, then breaks with `error`; answers on the next call."""

    name = "usage-then-fail"

    def __init__(self, error: Exception) -> None:
        self.error: Exception | None = error

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        yield UsageDelta(input_tokens=100, output_tokens=7)
        if self.error is not None:
            err, self.error = self.error, None
            raise err
        yield TextDelta("fine now")
        yield Finish("stop")


async def test_a_garbled_stream_is_asked_again_and_its_tokens_counted(url: str) -> None:
    model = UsageThenFailModel(MalformedModelOutput("the stream had an unparseable event"))
    async with Runtime(
        url, agents=[Agent(name="a", model=model, model_retry=RetryPolicy(base_delay=0.01))]
    ) as rt:
        task = await (await rt.submit("a", "x")).wait(30)
    assert task.status is TaskStatus.COMPLETED and task.output == "fine now"
    assert task.usage.input_tokens == 200 and task.usage.output_tokens == 14


async def test_abort_cuts_a_pause_grace_period_short(url: str) -> None:
    @tool
    async def stuck() -> str:
        """Never returns."""
        await asyncio.sleep(3600)
        return "unreachable"

    agent = Agent(
        name="a",
        model=ScriptedModel([[ToolCall("stuck")]]),
        tools=[stuck],
        timing=Timing(tool_grace=3600),
    )
    async with Runtime(url, agents=[agent]) as rt:
        sub = await rt.submit("a", "go")
        await wait_for_entry(rt, sub.task_id, EntryKind.TOOL_INTENT)
        pausing = asyncio.ensure_future(rt.pause(sub.task_id))
        await pause_requested(rt, sub.task_id)
        assert not pausing.done()  # waiting for the stuck tool
        aborted = await asyncio.wait_for(rt.abort(sub.task_id), 30)
        assert aborted.status is TaskStatus.ABORTED
        with pytest.raises(InvalidTransition, match="'aborted' to 'paused'"):
            await asyncio.wait_for(pausing, 30)
        results = await rt.store.entries(sub.task_id, kinds=[EntryKind.TOOL_RESULT])
        assert [r.payload["outcome"] for r in results] == ["interrupted"]


async def test_model_options_reach_the_model_a_string_builds(url: str) -> None:
    agent = Agent(name="a", model="scripted:demo", model_options={"final": "from options"})
    async with Runtime(url, agents=[agent]) as rt:
        task = await (await rt.submit("a", "x")).wait(30)
    assert task.output == "from options"
    assert "model_options" not in repr(agent)


async def test_pause_cuts_a_retry_back_off_short(url: str) -> None:
    class SlowRetryModel(FlakyModel):
        async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
            if self.fails:
                self.fails -= 1
                raise RetryableModelError("rate limited (429)", retry_after=3600)
            yield TextDelta("after the pause")
            yield Finish("stop")

    async with Runtime(url, agents=[Agent(name="a", model=SlowRetryModel(1))]) as rt:
        sub = await rt.submit("a", "x")
        await wait_for_entry(rt, sub.task_id, EntryKind.UI_MESSAGE)  # the retry notice
        paused = await asyncio.wait_for(rt.pause(sub.task_id), 30)  # not an hour
        assert paused.status is TaskStatus.PAUSED
        await rt.resume(sub.task_id)
        assert (await sub.wait(30)).output == "after the pause"


@pytest.mark.slow
async def test_rollback_keeps_completed_never_replay_results_and_voids_the_rest(
    store: Store,
) -> None:
    """A round with a never-replay call that completed and a replay-safe one:
    pause with rollback keeps the assistant message and the never-replay result,
    voids the safe call's result and answers it "rolled back"; the model, asked
    again, sees what was done and is not led to repeat it."""
    release = asyncio.Event()
    notes: list[str] = []
    asked: list[list[Any]] = []

    @tool
    async def write_note(text: str) -> str:
        """Write a note (a side effect)."""
        notes.append(text)
        return f"note {text!r} written"

    @tool(replay="safe")
    async def fetch(url: str) -> str:
        """Fetch a page (held open by the test)."""
        await release.wait()
        return "page text"

    def script(messages: list[Any]) -> Any:
        asked.append(list(messages))
        if not any(isinstance(m, AssistantMessage) for m in messages):
            return [ToolCall("write_note", {"text": "hi"}), ToolCall("fetch", {"url": "x"})]
        return "done"

    agent = Agent(
        name="a",
        model=ScriptedModel(script),
        tools=[write_note, fetch],
        timing=Timing(tool_grace=10),
    )
    async with Runtime(store, agents=[agent]) as rt:
        sub = await rt.submit("a", "go")
        await wait_for_entry(rt, sub.task_id, EntryKind.TOOL_RESULT)  # write_note's result
        pausing = asyncio.ensure_future(rt.pause(sub.task_id, rollback=True))
        await pause_requested(rt, sub.task_id)
        release.set()
        paused = await asyncio.wait_for(pausing, 30)
        assert paused.status is TaskStatus.PAUSED and paused.iterations == 1  # round closed
        view = await rt.model_view(sub.task_id)
        ui = await rt.ui_messages(sub.task_id)
        await rt.resume(sub.task_id)
        done = await sub.wait(30)
    assert [type(m).__name__ for m in view] == [
        "UserMessage",
        "AssistantMessage",
        "ToolMessage",
        "ToolMessage",
    ]
    assert tool_messages(view)[0] == "note 'hi' written"
    assert tool_messages(view)[1].startswith("Rolled back")
    # Every call of the kept assistant message has exactly one result in the view.
    calls = [c.id for c in view[1].tool_calls]  # type: ignore[union-attr]
    assert sorted(m.tool_call_id for m in view if isinstance(m, ToolMessage)) == sorted(calls)
    assert done.status is TaskStatus.COMPLETED and notes == ["hi"]
    assert "note 'hi' written" in [getattr(m, "content", None) for m in asked[-1]]
    cards = {m.name: m for m in ui if isinstance(m, UIToolCard)}
    assert cards["write_note"].state == "ok" and cards["fetch"].state == "rolled_back"
    assert not any(getattr(m, "voided", False) for m in ui)  # nothing of the round vanished
    notices = [m.message for m in ui if isinstance(m, UINotice)]
    assert any("Kept, as they are never replayed, the results of: write_note" in n for n in notices)


async def test_rollback_of_a_round_of_replay_safe_calls_voids_it_and_marks_it(url: str) -> None:
    release = asyncio.Event()
    runs: list[str] = []

    @tool(replay="safe")
    async def fetch(url: str) -> str:
        """Fetch a page (held open by the test)."""
        runs.append(url)
        await release.wait()
        return "page text"

    model = ScriptedModel(
        [Turn(text="fetching", tool_calls=[ToolCall("fetch", {"url": "x"})]), "ok"]
    )
    agent = Agent(name="a", model=model, tools=[fetch], timing=Timing(tool_grace=10))
    async with Runtime(url, agents=[agent]) as rt:
        sub = await rt.submit("a", "go")
        await wait_for_entry(rt, sub.task_id, EntryKind.TOOL_INTENT)
        pausing = asyncio.ensure_future(rt.pause(sub.task_id, rollback=True))
        await pause_requested(rt, sub.task_id)
        release.set()
        await asyncio.wait_for(pausing, 30)
        view = await rt.model_view(sub.task_id)
        ui = await rt.ui_messages(sub.task_id)
        await rt.resume(sub.task_id)
        done = await sub.wait(30)
    assert [type(m).__name__ for m in view] == ["UserMessage"]  # the model redoes the round
    voided = [m for m in ui if getattr(m, "voided", False)]
    assert [type(m).__name__ for m in voided] == ["UIText", "UIToolCard"]  # marked, still there
    assert done.status is TaskStatus.COMPLETED and runs == ["x", "x"]
