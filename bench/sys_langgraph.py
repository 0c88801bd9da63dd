"""LangGraph under the shared workloads: the standard ReAct graph (agent node + ToolNode over
MessagesState), a zero-latency scripted chat model, and a checkpointer with durability="sync"
(every super-step's checkpoint is written before the next step starts)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import statistics
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Annotated, Any, TypedDict

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode, tools_condition
from pydantic import ConfigDict

try:
    from langgraph.channels import DeltaChannel
except ImportError:  # LangGraph before DeltaChannel
    DeltaChannel = None  # type: ignore[assignment,misc]

from bench.common import (
    PG_URL,
    TOOL_NAME,
    USER_TEXT,
    RoundClock,
    assistant_text,
    call_id,
    create_schema,
    drop_schema,
    new_schema,
    repeated,
    schema_bytes,
    sqlite_bytes,
    tool_args,
    tool_output,
    with_search_path,
)

# "-delta": the messages channel is a DeltaChannel (each checkpoint stores the new
# messages, not the whole list), where the installed LangGraph has one.
# "postgres-pool": AsyncPostgresSaver over a connection pool.
CONFIGS = (
    "none",
    "memory",
    "sqlite",
    "postgres",
    "postgres-pool",
    "sqlite-delta",
    "postgres-delta",
)


class ScriptedChatModel(BaseChatModel):
    """Answers instantly: round r calls the tool once, then a final answer."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    rounds: int
    clock: Any
    count_from_history: bool = False

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _answer(self, messages: list[Any]) -> AIMessage:
        if self.count_from_history:
            done = sum(1 for m in messages if isinstance(m, AIMessage))
        else:
            done = self.clock.tick()
        if done < self.rounds:
            r = done + 1
            return AIMessage(
                content=assistant_text(r),
                tool_calls=[{"name": TOOL_NAME, "args": tool_args(r), "id": call_id(r)}],
            )
        return AIMessage(content=f"All {self.rounds} steps are done.")

    def _generate(
        self, messages: list[Any], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self._answer(messages))])

    async def _agenerate(
        self, messages: list[Any], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        return self._generate(messages, stop)


@tool(TOOL_NAME)
async def work(n: int) -> str:
    """Process batch n."""
    return tool_output(n)


def _delta_reducer(state: Any, writes: Any) -> Any:
    for w in writes:  # add_messages per write: batching-invariant for appends
        state = add_messages(state, w)
    return state


if DeltaChannel is not None:

    class DeltaMessagesState(TypedDict):
        """MessagesState with its messages in a DeltaChannel."""

        messages: Annotated[list[Any], DeltaChannel(_delta_reducer)]


def delta_state() -> Any:
    """The DeltaChannel state (None if this LangGraph has no DeltaChannel)."""
    return DeltaMessagesState if DeltaChannel is not None else None


def react_graph(model: ScriptedChatModel, checkpointer: Any, delta: bool = False) -> Any:
    async def agent(state: Any) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    state_type = delta_state() if delta else MessagesState
    if state_type is None:
        raise RuntimeError("this LangGraph version has no DeltaChannel")
    builder = StateGraph(state_type)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode([work]))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=checkpointer)


@contextlib.asynccontextmanager
async def saver(config: str, workdir: str, schema: str | None) -> AsyncIterator[Any]:
    if config == "none":
        yield None  # the graph alone: nothing is checkpointed
    elif config == "memory":
        from langgraph.checkpoint.memory import InMemorySaver

        yield InMemorySaver()
    elif config in ("sqlite", "sqlite-delta"):
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        async with AsyncSqliteSaver.from_conn_string(f"{workdir}/langgraph.db") as s:
            await s.setup()
            yield s
    elif config in ("postgres", "postgres-delta"):
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

        assert schema is not None
        async with AsyncPostgresSaver.from_conn_string(with_search_path(PG_URL, schema)) as pg:
            await pg.setup()
            yield pg
    elif config == "postgres-pool":
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
        from psycopg.rows import dict_row
        from psycopg_pool import AsyncConnectionPool

        assert schema is not None
        async with AsyncConnectionPool(
            with_search_path(PG_URL, schema),
            min_size=2,
            max_size=10,
            kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
            open=False,
        ) as pool:
            pooled = AsyncPostgresSaver(pool)  # type: ignore[arg-type]
            await pooled.setup()
            yield pooled
    else:
        raise ValueError(f"unknown langgraph config {config!r}")


def _size(config: str, workdir: str, schema: str | None) -> int:
    if config.startswith("sqlite"):
        return sqlite_bytes(f"{workdir}/langgraph.db")
    assert schema is not None
    return schema_bytes(schema)


def _measure(
    measured: dict[str, int], n: int, config: str, workdir: str, schema: str | None
) -> None:
    measured[str(n)] = _size(config, workdir, schema)


def _thread(tid: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": tid}, "recursion_limit": 1_000_000}


async def rounds(config: str, workdir: str, rounds: int, sizes: list[int] | None = None) -> Any:
    schema = new_schema("bench_langgraph") if config.startswith("postgres") else None
    if schema:
        create_schema(schema)
    clock = RoundClock()
    measured: dict[str, int] = {}
    for n in sizes or () if config != "none" and config != "memory" else ():
        clock.hooks[n] = functools.partial(_measure, measured, n, config, workdir, schema)
    try:
        async with saver(config, workdir, schema) as cp:
            graph = react_graph(
                ScriptedChatModel(rounds=rounds, clock=clock), cp, config.endswith("-delta")
            )
            t0 = time.perf_counter()
            # durability="sync": each checkpoint is written before the next step runs.
            extra = {"durability": "sync"} if cp is not None else {}
            out = await graph.ainvoke(
                {"messages": [HumanMessage(USER_TEXT)]}, _thread("t1"), **extra
            )
            total = time.perf_counter() - t0
            assert len(out["messages"]) == 2 * rounds + 2, len(out["messages"])
        return {**clock.summary(), "total_s": total, "sizes": measured}
    finally:
        if schema:
            drop_schema(schema)


def _history(total_rounds: int) -> list[Any]:
    out: list[Any] = []
    for r in range(1, total_rounds + 1):
        out.append(
            AIMessage(
                content=assistant_text(r),
                tool_calls=[{"name": TOOL_NAME, "args": tool_args(r), "id": call_id(r)}],
            )
        )
        out.append(ToolMessage(content=tool_output(r), tool_call_id=call_id(r), name=TOOL_NAME))
    return out


async def resume(config: str, workdir: str, entries: int, repeats: int) -> Any:
    """A thread holding the same conversation as a duragent task of `entries` entries
    (user message + (entries-1)/3 rounds), written as 10 state updates; then time
    reopening the checkpointer and `aget_state` of the thread."""
    schema = new_schema("bench_langgraph") if config.startswith("postgres") else None
    if schema:
        create_schema(schema)
    total_rounds = (entries - 1) // 3
    history = _history(total_rounds)
    clock = RoundClock()
    try:
        async with saver(config, workdir, schema) as cp:
            graph = react_graph(ScriptedChatModel(rounds=0, clock=clock), cp)
            cfg = _thread("resume")
            chunk = max(2, len(history) // 10 // 2 * 2)
            await graph.aupdate_state(cfg, {"messages": [HumanMessage(USER_TEXT)]}, as_node="agent")
            for i in range(0, len(history), chunk):
                await graph.aupdate_state(
                    cfg, {"messages": history[i : i + chunk]}, as_node="tools"
                )
        times = []
        messages = 0
        for _ in range(repeats):
            t0 = time.perf_counter()
            async with saver(config, workdir, schema) as cp:
                graph = react_graph(ScriptedChatModel(rounds=0, clock=clock), cp)
                state = await graph.aget_state(_thread("resume"))
                times.append((time.perf_counter() - t0) * 1e3)
                messages = len(state.values["messages"])
            del state, graph  # freed untimed, as duragent's runner is (sys_duragent.resume)
        return {"messages": messages, "resume_ms": statistics.median(times)}
    finally:
        if schema:
            drop_schema(schema)


async def concurrent(config: str, workdir: str, tasks: int, rounds: int) -> Any:
    """`tasks` threads at once on one checkpointer."""
    schema = new_schema("bench_langgraph") if config.startswith("postgres") else None
    if schema:
        create_schema(schema)
    try:
        async with saver(config, workdir, schema) as cp:
            model = ScriptedChatModel(rounds=rounds, clock=None, count_from_history=True)
            graph = react_graph(model, cp)
            t0 = time.perf_counter()
            await asyncio.gather(
                *(
                    graph.ainvoke(
                        {"messages": [HumanMessage(f"task {i}")]},
                        _thread(f"t{i}"),
                        durability="sync",
                    )
                    for i in range(tasks)
                )
            )
            elapsed = time.perf_counter() - t0
        return {"elapsed_s": elapsed, "rounds_per_s": tasks * rounds / elapsed}
    finally:
        if schema:
            drop_schema(schema)


def run(workload: str, params: dict[str, Any]) -> Any:
    workloads: dict[str, Callable[..., Coroutine[Any, Any, Any]]] = {
        "rounds": rounds,
        "resume": resume,
        "concurrent": concurrent,
    }
    fn = workloads[workload]
    # `repeats` of a rounds run = tasks in this process; resume has its own repeats.
    repeats = params.pop("repeats", 1) if workload == "rounds" else 1
    workdir = params.pop("workdir")

    def once(i: int) -> Any:
        os.makedirs(os.path.join(workdir, str(i)), exist_ok=True)
        return asyncio.run(fn(workdir=os.path.join(workdir, str(i)), **params))

    return repeated(once, repeats)
