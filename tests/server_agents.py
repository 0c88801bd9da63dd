"""Agents for the server, CLI and browser tests (`--agents server_agents:agents`).

All use ScriptedModel, so they behave the same in every process and after a restart.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from typing import Any

from duragent import (
    Agent,
    BuiltinTools,
    ContextPolicy,
    Limits,
    ModelError,
    ScriptedModel,
    Timing,
    ToolCall,
    ToolContext,
    Turn,
    tool,
)
from duragent.types import ToolMessage, UserMessage

# Streaming speed: seconds between chunks (the browser test wants several seconds of text).
CHUNK_DELAY = float(os.environ.get("DURAGENT_TEST_CHUNK_DELAY", "0.04"))

FIRST = (
    "Let me think about durable execution step by step. A task is a log of committed "
    "entries; every round is a commit, so a crash loses nothing that was stored. "
    "I will look the topic up first. "
)
SECOND = (
    "The lookup confirms it. Durable agents commit before they publish, record a tool's "
    "intent before its effect, and resume from the last committed step. A paused task "
    "keeps its log; resuming continues exactly where it stopped. That is the whole idea."
)


@tool(replay="safe")
async def lookup(topic: str, ctx: ToolContext) -> str:
    """Look a topic up in the encyclopedia (takes a moment)."""
    await ctx.report(f"searching for {topic}…")
    await asyncio.sleep(0.5)
    return f"{topic}: surviving crashes by committing every step."


@tool(requires_approval=True)
def send_email(to: str, body: str) -> str:
    """Send an email (asks for approval first)."""
    return f"sent to {to}"


@tool(name="send_email", requires_approval=True, approval_timeout=600)
def send_email_within_10_minutes(to: str, body: str) -> str:
    """Send an email (asks for approval first; denied after 10 minutes without one)."""
    return f"sent {body!r} to {to}"


def mail_two(messages: list[Any]) -> Any:
    """Round 1 sends two emails; round 2 says what became of them."""
    results = [m.content for m in messages if isinstance(m, ToolMessage)]
    if not results:
        return [
            ToolCall("send_email", {"to": "bob@example.com", "body": "hi"}),
            ToolCall("send_email", {"to": "ann@example.com", "body": "hello"}),
        ]
    return " | ".join(results)


@tool
def delegate(job: str, ctx: ToolContext) -> object:
    """Hand a job to the `quick` agent as a sub-task."""
    return ctx.spawn("quick", job)


@tool
async def note(text: str, ctx: ToolContext) -> str:
    """Add a line to the session's notes; answers with the notes as they were."""
    assert ctx.session_documents is not None, "the notebook needs a session_id"
    before = await ctx.session_documents.get("notes", [])
    ctx.session_documents.put("notes", [*before, text])
    return json.dumps(before)


def notebook_script(messages: list[Any]) -> Any:
    """Note the latest user message, then answer with what the notes held before."""
    last = messages[-1]
    if isinstance(last, ToolMessage):
        return f"notes before: {last.content}"
    assert isinstance(last, UserMessage)
    return [ToolCall("note", {"text": last.content})]


def notebook() -> Agent:
    """Reads and writes a session document: the probe for per-owner session scopes."""
    return Agent(
        name="notebook",
        model=ScriptedModel(notebook_script),
        tools=[note],
        builtin_tools=BuiltinTools(plan=False),
    )


@tool(replay="safe")
async def hold(gate: str) -> str:
    """Wait until the test opens the gate (a file named `gate` in DURAGENT_TEST_GATES)."""
    path = os.path.join(os.environ.get("DURAGENT_TEST_GATES", "."), gate)
    while not os.path.exists(path):
        await asyncio.sleep(0.02)
    return f"gate {gate} opened"


def hold_at_the_gate(messages: list[object]) -> str | Turn:
    gate = next(str(m.content) for m in messages if getattr(m, "role", "") == "user")  # type: ignore[attr-defined]
    if not any(getattr(m, "role", "") == "assistant" for m in messages):
        return Turn(
            text="Holding on until the gate opens.", tool_calls=[ToolCall("hold", {"gate": gate})]
        )
    return "Through the gate."


_FAILED_ONCE: set[str] = set()


def fail_once(messages: list[object]) -> str | list[ToolCall]:
    """Fails the task the first time its input (which must start "fail") is seen, with
    an error the model gives up on; the retry of the same task then completes."""
    first = next(str(m.content) for m in messages if getattr(m, "role", "") == "user")  # type: ignore[attr-defined]
    done = sum(1 for m in messages if getattr(m, "role", "") == "assistant")
    if done == 0:
        return [ToolCall("lookup", {"topic": "retries"})]
    if first.startswith("fail") and first not in _FAILED_ONCE:
        _FAILED_ONCE.add(first)
        raise ModelError("the provider refused the request (scripted failure)")
    return "Done after a retry."


@tool(replay="safe")
def fetch_page(n: int) -> str:
    """Fetch page n (long: the reader's window fits only a few)."""
    return f"page {n}: " + "lorem ipsum " * 250


def read_pages(messages: list[Any]) -> Any:
    """Fetch pages 1..12, one a round; reads where it is from the calls in view and
    from a summary's "last page N" (the reader's view is compacted as it goes)."""
    if messages and messages[0].role == "system" and "compress" in messages[0].content:
        pages = [
            int(n)
            for n in re.findall(r'"n": ?(\d+)|last page (\d+)', messages[1].content)
            for n in n
            if n
        ]
        return f"Read the pages; last page {max(pages, default=0)}."
    done = 0
    for m in messages:
        if m.role == "user":
            done = max([done, *(int(n) for n in re.findall(r"last page (\d+)", m.content))])
        for c in getattr(m, "tool_calls", None) or ():
            done = max(done, json.loads(c.function.arguments)["n"])
    return "Read all 12 pages." if done >= 12 else [ToolCall("fetch_page", {"n": done + 1})]


@tool(replay="safe")
async def import_rows(path: str, ctx: ToolContext) -> str:
    """Import a file's rows, telling each batch as a custom event."""
    for batch in (1, 2):
        await ctx.emit("batch_imported", {"path": path, "batch": batch})
    return "2 batches"


def desk() -> Agent:
    """`triage` hands the task to `billing` (served with it), which answers."""
    billing = Agent(
        name="billing",
        model=ScriptedModel(["-", "Refunded order 42."]),
        instructions="You are billing.",
        builtin_tools=BuiltinTools(plan=False),
        handoff_description="Refunds and invoices.",
    )
    return Agent(
        name="triage",
        model=ScriptedModel([[ToolCall("transfer_to_billing", {})]]),
        instructions="You triage.",
        builtin_tools=BuiltinTools(plan=False),
        handoffs=[billing],
    )


def agents() -> list[Agent]:
    return [
        desk(),
        Agent(
            name="importer",
            model=ScriptedModel([[ToolCall("import_rows", {"path": "a.csv"})], "Imported."]),
            tools=[import_rows],
            builtin_tools=BuiltinTools(plan=False),
        ),
        Agent(
            name="quick",
            model=ScriptedModel(["Hello from quick."]),
            builtin_tools=BuiltinTools(plan=False),
        ),
        Agent(
            name="streamer",
            model=ScriptedModel(
                [
                    Turn(text=FIRST, tool_calls=[ToolCall("lookup", {"topic": "durability"})]),
                    SECOND,
                ],
                chunk_delay=CHUNK_DELAY,
                chunk_size=4,
            ),
            tools=[lookup],
            timing=Timing(progress_interval=0.05),
            builtin_tools=BuiltinTools(plan=False),
        ),
        Agent(
            # Streams for about a minute: something to pause, abort and watch.
            name="slow",
            model=ScriptedModel(["tick " * 600], chunk_delay=0.1, chunk_size=5),
            timing=Timing(progress_interval=0.05),
            builtin_tools=BuiltinTools(plan=False),
        ),
        Agent(
            name="approver",
            model=ScriptedModel(
                [[ToolCall("send_email", {"to": "bob@example.com", "body": "hi"})], "Email done."]
            ),
            tools=[send_email],
            builtin_tools=BuiltinTools(plan=False),
        ),
        Agent(
            name="asker",
            model=ScriptedModel(
                [[ToolCall("ask_user", {"question": "Which city?"})], "Thanks for answering."]
            ),
            builtin_tools=BuiltinTools(ask_user=True, plan=False),
        ),
        Agent(
            name="flaky",
            model=ScriptedModel(fail_once),
            tools=[lookup],
            builtin_tools=BuiltinTools(plan=False),
        ),
        Agent(
            # A pause waits 0.5 s for its held tool, then cancels it.
            name="holder",
            model=ScriptedModel(hold_at_the_gate),
            tools=[hold],
            builtin_tools=BuiltinTools(plan=False),
            timing=Timing(tool_grace=0.5),
        ),
        Agent(
            name="parent",
            model=ScriptedModel([[ToolCall("delegate", {"job": "say hello"})], "Delegated."]),
            tools=[delegate],
            builtin_tools=BuiltinTools(plan=False),
        ),
        notebook(),
        Agent(
            # A long task through a small window: its view is compacted as it goes.
            name="reader",
            model=ScriptedModel(read_pages),
            tools=[fetch_page],
            limits=Limits(max_iterations=50),
            builtin_tools=BuiltinTools(plan=False),
            context=ContextPolicy(window=3_000, keep_rounds=1, elide_over=100_000),
        ),
        Agent(
            # Two approvals at once, each open for 10 minutes: edit, batch, expiry.
            name="mailer",
            model=ScriptedModel(mail_two),
            tools=[send_email_within_10_minutes],
            builtin_tools=BuiltinTools(plan=False),
        ),
        Agent(
            # A structured answer (output_type): the page shows its JSON.
            name="structured",
            model=ScriptedModel([Turn(output={"city": "Oslo", "population": 700000})]),
            output_type={
                "title": "City",
                "type": "object",
                "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
                "required": ["city", "population"],
            },
            builtin_tools=BuiltinTools(plan=False),
        ),
    ]
