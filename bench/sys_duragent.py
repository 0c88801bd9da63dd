"""duragent under the shared workloads (each function is one measurement, run in a child)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import json
import os
import statistics
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, runtime_checkable

from bench.common import (
    PG_URL,
    TOOL_NAME,
    USER_TEXT,
    RoundClock,
    assistant_text,
    call_id,
    drop_schema,
    new_schema,
    repeated,
    schema_bytes,
    sqlite_bytes,
    tool_args,
    tool_output,
)
from duragent import (
    Agent,
    BuiltinTools,
    Limits,
    Runtime,
    ScriptedModel,
    ToolCall,
    Turn,
    open_store,
    tool,
)
from duragent.llm._base import ModelRequest, ResponseAssembler
from duragent.runtime._engine import TaskRunner
from duragent.runtime._log import api_entry, result_entries
from duragent.runtime._submit import new_task
from duragent.store._commits import Commit, TaskPatch
from duragent.types import (
    AssistantMessage,
    EntryKind,
    NewEntry,
    Task,
    TaskStatus,
    ToolMessage,
    UserMessage,
)

# sqlite-normal / sqlite-full / postgres / memory: the store URLs a config names
# (postgres-psycopg: the PostgreSQL store on psycopg's documented API, `?wire=psycopg`);
# "none": the same model and tool driven by a bare loop, nothing persisted and no
# runtime (the shape of LangGraph's no-checkpointer row).
CONFIGS = ("none", "memory", "sqlite-normal", "sqlite-full", "postgres", "postgres-psycopg")


def store_url(config: str, workdir: str) -> tuple[str, str | None]:
    """The URL for a config, and the Postgres schema to drop afterwards."""
    if config == "memory":
        return "memory://", None
    if config == "sqlite-normal":
        return f"sqlite:///{workdir}/duragent.db", None
    if config == "sqlite-full":
        return f"sqlite:///{workdir}/duragent.db?durability=full", None
    if config in ("postgres", "postgres-psycopg"):
        schema = new_schema("bench_duragent")
        wire = "&wire=psycopg" if config == "postgres-psycopg" else ""
        return f"{PG_URL}?schema={schema}{wire}", schema
    raise ValueError(f"unknown duragent config {config!r}")


def postgres_store_problem() -> str | None:
    """Why the Postgres store cannot be benchmarked here, or None."""
    schema = new_schema("bench_probe")
    try:

        async def probe() -> None:
            store = open_store(f"{PG_URL}?schema={schema}")
            await store.open()
            t = new_task(bench_agent(1, RoundClock()), USER_TEXT)[0]
            await store.create_task(t)
            await store.close()

        asyncio.run(probe())
    except Exception as exc:
        return f"open_store({PG_URL!r}) failed: {type(exc).__name__}: {exc}"
    finally:
        with contextlib.suppress(Exception):
            drop_schema(schema)
    return None


def bench_agent(rounds: int, clock: RoundClock, name: str = "bench") -> Agent:
    def script(messages: list[Any]) -> Any:
        done = clock.tick()
        if done < rounds:
            r = done + 1
            return Turn(text=assistant_text(r), tool_calls=[ToolCall(TOOL_NAME, tool_args(r))])
        return f"All {rounds} steps are done."

    @tool(name=TOOL_NAME)
    async def work(n: int) -> str:
        """Process batch n."""
        return tool_output(n)

    return Agent(
        name=name,
        model=ScriptedModel(script, chunk_size=10_000),  # one text delta: a zero-latency model
        tools=[work],
        limits=Limits(max_iterations=rounds + 10),
        builtin_tools=BuiltinTools(plan=False),
    )


def _store_size(store: Any, url: str, schema: str | None) -> int:
    if schema is not None:
        return schema_bytes(schema)
    return sqlite_bytes(store.path)


def _measure(measured: dict[str, int], n: int, store: Any, url: str, schema: str | None) -> None:
    measured[str(n)] = _store_size(store, url, schema)


def _set_when_ended(ended: asyncio.Event) -> Callable[[Task, TaskStatus, TaskStatus], None]:
    """A status hook that sets `ended` once the task reaches a terminal status."""

    def hook(task: Task, old: TaskStatus, new: TaskStatus) -> None:
        if new.terminal:
            ended.set()

    return hook


@runtime_checkable
class Batching(Protocol):
    """The SQLite and PostgreSQL stores' writer counters."""

    @property
    def jobs_done(self) -> int: ...
    @property
    def batches(self) -> int: ...


async def bare_loop(rounds: int) -> Any:
    """The round loop with nothing durable: ask the model, run the tool, append, repeat."""
    clock = RoundClock()
    agent = bench_agent(rounds, clock)
    tool_fn = agent.tool_map[TOOL_NAME]
    messages: list[Any] = [UserMessage(content=USER_TEXT)]
    t0 = time.perf_counter()
    c0 = time.process_time()
    while True:
        request = ModelRequest(model="bench", messages=messages, tools=[tool_fn.spec()])
        assembler = ResponseAssembler()
        async for event in agent.chat_model.stream(request):
            assembler.add(event)
        response = assembler.response(call_id_prefix="call")
        messages.append(response.message())
        if not response.tool_calls:
            break
        for call in response.tool_calls:
            out = await tool_fn.fn(**json.loads(call.function.arguments))
            messages.append(ToolMessage(tool_call_id=call.id, content=str(out)))
    total = time.perf_counter() - t0
    cpu = time.process_time() - c0
    return {**clock.summary(), "total_s": total, "cpu_ms_per_round": cpu / rounds * 1e3}


async def rounds(config: str, workdir: str, rounds: int, sizes: list[int] | None = None) -> Any:
    """One task of `rounds` tool rounds; ms per round, and store bytes after `sizes` rounds."""
    if config == "none":
        return await bare_loop(rounds)
    url, schema = store_url(config, workdir)
    clock = RoundClock()
    measured: dict[str, int] = {}
    ended = asyncio.Event()
    # Learn of the end from the status hook, not by polling `wait()`: an observer
    # re-reading the task after every commit is not part of making rounds durable.
    rt = Runtime(
        url,
        agents=[bench_agent(rounds, clock)],
        poll_interval=0.05,
        on_status_change=_set_when_ended(ended),
    )
    for n in sizes or ():
        clock.hooks[n] = functools.partial(_measure, measured, n, rt.store, url, schema)
    try:
        async with rt:
            t0 = time.perf_counter()
            c0 = time.process_time()  # this process: engine, store and driver threads
            sub = await rt.submit("bench", USER_TEXT)
            await asyncio.wait_for(ended.wait(), 1800)
            total = time.perf_counter() - t0
            cpu = time.process_time() - c0
            task = await rt.get(sub.task_id)
            assert task.status is TaskStatus.COMPLETED, task
            out = {
                **clock.summary(),
                "total_s": total,
                "sizes": measured,
                "cpu_ms_per_round": cpu / rounds * 1e3,
            }
            if isinstance(rt.store, Batching):
                out["commits"] = rt.store.jobs_done
                out["transactions"] = rt.store.batches
        return out
    finally:
        if schema is not None:
            drop_schema(schema)


# --- resume -------------------------------------------------------------------


async def _fill(url: str, entries: int) -> str:
    """A task whose log holds `entries` entries shaped like real rounds (3 per round)."""
    store = open_store(url)
    await store.open()
    agent = bench_agent(1, RoundClock())
    task, first = new_task(agent, USER_TEXT)
    task, _ = await store.create_task(task, [first])
    total_rounds = (entries - 1) // 3
    batch: list[NewEntry] = []
    for r in range(1, total_rounds + 1):
        msg = AssistantMessage.model_validate(
            {
                "role": "assistant",
                "content": assistant_text(r),
                "tool_calls": [
                    {
                        "id": call_id(r),
                        "type": "function",
                        "function": {"name": TOOL_NAME, "arguments": f'{{"n": {r}}}'},
                    }
                ],
            }
        )
        batch.append(api_entry(task.id, r, msg))
        batch.append(
            NewEntry(
                task_id=task.id,
                kind=EntryKind.TOOL_INTENT,
                round=r,
                payload={"call_id": call_id(r), "name": TOOL_NAME, "replay": "never"},
            )
        )
        batch += result_entries(task.id, r, call_id(r), tool_output(r), "ok")
        if len(batch) >= 600 or r == total_rounds:
            # round_seq: the last seq before the latest round, as the runtime keeps it.
            round_seq = task.last_seq + len(batch) - 3
            patch = TaskPatch(task.id, {"iterations": r, "round_seq": round_seq})
            res = await store.commit(Commit(entries=batch, patches=[patch]))
            task = res.tasks[task.id]
            batch = []
    await store.close()
    return task.id


async def resume(config: str, workdir: str, entries: int, repeats: int) -> Any:
    """Reopen the store and rebuild what a worker needs to continue a long task."""
    url, schema = store_url(config, workdir)
    try:
        task_id = await _fill(url, entries)
        agent = bench_agent(1, RoundClock())
        view_ms, resume_ms = [], []
        messages = 0
        for _ in range(repeats):
            t0 = time.perf_counter()
            store = open_store(url)
            await store.open()
            task = await store.get_task(task_id)
            runner = TaskRunner(store, agent, task)
            await runner.recovery.start()  # model view + last round's entries + recovery decision
            resume_ms.append((time.perf_counter() - t0) * 1e3)
            messages = len(runner.view)
            t1 = time.perf_counter()
            view = await store.model_view(task_id)
            view_ms.append((time.perf_counter() - t1) * 1e3)
            await runner.state.close()
            await store.close()
            # Freed here, untimed: freeing a view of 10,000 entries takes
            # milliseconds, and a resume does not include freeing the last one.
            del runner, view
        stored = len(await _entries(url, task_id))
        return {
            "entries": stored,
            "messages": messages,
            "resume_ms": statistics.median(resume_ms),
            "view_ms": statistics.median(view_ms),
        }
    finally:
        if schema is not None:
            drop_schema(schema)


async def _entries(url: str, task_id: str) -> list[Any]:
    store = open_store(url)
    await store.open()
    try:
        return await store.entries(task_id)
    finally:
        await store.close()


# --- many tasks at once ---------------------------------------------------------


async def concurrent(config: str, workdir: str, tasks: int, rounds: int) -> Any:
    """`tasks` tasks at once in one Runtime: commits per second and commits per transaction."""
    url, schema = store_url(config, workdir)
    done = asyncio.Event()
    finished: dict[str, TaskStatus] = {}

    def on_status(task: Any, old: Any, new: TaskStatus) -> None:
        if new.terminal:
            finished[task.id] = new
            if len(finished) == tasks:
                done.set()

    rt = Runtime(
        url,
        agents=[_concurrent_agent(rounds)],
        concurrency=tasks,
        poll_interval=0.05,
        on_status_change=on_status,
    )
    collector = GcTime()
    try:
        async with rt:
            store: Any = rt.store
            jobs0, batches0 = getattr(store, "jobs_done", 0), getattr(store, "batches", 0)
            t0 = time.perf_counter()
            c0 = time.process_time()  # this process: engine, store and writer threads
            with collector:
                await asyncio.gather(*(rt.submit("many", f"task {i}") for i in range(tasks)))
                await asyncio.wait_for(done.wait(), 600)
            elapsed = time.perf_counter() - t0
            cpu = time.process_time() - c0
            commits = getattr(store, "jobs_done", 0) - jobs0
            transactions = getattr(store, "batches", 0) - batches0
        assert set(finished.values()) == {TaskStatus.COMPLETED}, finished
        return {
            # One process runs Python on one core at a time: 1,000 / this is the
            # rounds/s it could reach if nothing but its CPU limited it.
            "cpu_ms_per_round": cpu / (tasks * rounds) * 1e3,
            "gc_share": collector.seconds / elapsed,  # of the wall time, in collections
            "tasks": tasks,
            "rounds": rounds,
            "elapsed_s": elapsed,
            "commits": commits,
            "transactions": transactions,
            "commits_per_s": commits / elapsed,
            "rounds_per_s": tasks * rounds / elapsed,
            "commits_per_tx": commits / max(1, transactions),
            # At FULL every transaction is one WAL fsync (its COMMIT).
            "transactions_per_s": transactions / elapsed,
        }
    finally:
        if schema is not None:
            drop_schema(schema)


class GcTime:
    """Wall time spent in the cyclic garbage collector while inside the block."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._start = 0.0

    def _hook(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start

    def __enter__(self) -> GcTime:
        gc.callbacks.append(self._hook)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._hook)


def _concurrent_agent(rounds: int) -> Agent:
    # Each task's i-th model call answers turn i, counted by the model from its
    # task's assistant messages (carried over from its last call, not rescanned).
    script = [
        Turn(text=assistant_text(r), tool_calls=[ToolCall(TOOL_NAME, tool_args(r))])
        for r in range(1, rounds + 1)
    ]

    @tool(name=TOOL_NAME)
    async def work(n: int) -> str:
        """Process batch n."""
        return tool_output(n)

    return Agent(
        name="many",
        model=ScriptedModel(script, chunk_size=10_000, final=f"All {rounds} steps are done."),
        tools=[work],
        limits=Limits(max_iterations=rounds + 10),
        builtin_tools=BuiltinTools(plan=False),
    )


# --- a streaming model ----------------------------------------------------------

STREAM_CHUNKS = 12  # text deltas per answer, STREAM_DELAY apart: the answer takes 0.3 s
STREAM_DELAY = 0.025


async def streaming(config: str, workdir: str, rounds: int) -> Any:
    """One task whose model streams each answer over 0.3 s (progress committed every
    `progress_interval`, 0.1 s by default): ms per round and commits per round."""
    url, schema = store_url(config, workdir)
    clock = RoundClock()
    ended = asyncio.Event()

    def script(messages: list[Any]) -> Any:
        done = clock.tick()
        text = (assistant_text(done + 1) + " ") * 20
        text = text[: STREAM_CHUNKS * 20].ljust(STREAM_CHUNKS * 20, ".")
        if done < rounds:
            return Turn(text=text, tool_calls=[ToolCall(TOOL_NAME, tool_args(done + 1))])
        return text

    @tool(name=TOOL_NAME)
    async def work(n: int) -> str:
        """Process batch n."""
        return tool_output(n)

    agent = Agent(
        name="stream",
        model=ScriptedModel(script, chunk_size=20, chunk_delay=STREAM_DELAY),
        tools=[work],
        limits=Limits(max_iterations=rounds + 10),
        builtin_tools=BuiltinTools(plan=False),
    )
    rt = Runtime(
        url,
        agents=[agent],
        poll_interval=0.05,
        on_status_change=_set_when_ended(ended),
    )
    try:
        async with rt:
            sub = await rt.submit("stream", USER_TEXT)
            await asyncio.wait_for(ended.wait(), 600)
            entries = await rt.store.entries(sub.task_id)
        progress = sum(1 for e in entries if e.kind is EntryKind.PROGRESS)
        return {**clock.summary(), "progress_per_round": progress / (rounds + 1)}
    finally:
        if schema is not None:
            drop_schema(schema)


async def commit_cpu(config: str, workdir: str, commits: int) -> Any:
    """CPU per commit of a claimed task's one-entry commits (bench/commit_cpu.py)."""
    from bench.commit_cpu import once

    return await once(config, commits, workdir)


async def compaction(config: str, workdir: str, rounds: int, window: int) -> Any:
    """One task through a `window`-token window and the same task without one
    (bench/compaction.py): ms per round and resume, from the same run."""
    from bench.compaction import one

    url, schema = store_url(config, workdir)
    try:
        windowed = await one(url, rounds, window)
    finally:
        if schema is not None:
            drop_schema(schema)
    url, schema = store_url(config, os.path.join(workdir, "whole"))
    os.makedirs(os.path.join(workdir, "whole"), exist_ok=True)
    try:
        return {"windowed": windowed, "whole": await one(url, rounds, None)}
    finally:
        if schema is not None:
            drop_schema(schema)


def run(workload: str, params: dict[str, Any]) -> Any:
    workloads: dict[str, Callable[..., Coroutine[Any, Any, Any]]] = {
        "rounds": rounds,
        "commit_cpu": commit_cpu,
        "resume": resume,
        "concurrent": concurrent,
        "streaming": streaming,
        "compaction": compaction,
    }
    fn = workloads[workload]
    # `repeats` of a rounds run = tasks in this process; resume has its own repeats.
    repeats = params.pop("repeats", 1) if workload == "rounds" else 1
    workdir = params.pop("workdir")

    def once(i: int) -> Any:
        os.makedirs(os.path.join(workdir, str(i)), exist_ok=True)
        return asyncio.run(fn(workdir=os.path.join(workdir, str(i)), **params))

    return repeated(once, repeats)
