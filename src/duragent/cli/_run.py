"""`duragent run`: start an agent task from the terminal and watch it stream;
`duragent continue`: pick such a task up again after Ctrl-C or a crash.

Ctrl-C pauses the task at its next safe point; a second Ctrl-C aborts it.
(`duragent resume ID` is the operator command that only marks a task runnable
for a worker; `continue` runs it here, in the terminal.)
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import shlex
import signal
import sys
import threading
import uuid
from collections.abc import Awaitable, Coroutine
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from duragent._fetch import NetworkPolicy
from duragent._terminal import safe
from duragent.cli._common import (
    STORE,
    default_store_url,
    make_console,
    parse_duration,
    prepare_store,
    require_store,
    run_async,
)
from duragent.cli._format import count, lease_left
from duragent.cli._transcript import Transcript
from duragent.errors import DuragentError, UsageError
from duragent.llm import ChatModel, resolve_model
from duragent.runtime._agent import Agent, BuiltinTools, Limits, Timing
from duragent.runtime._output import given_schema
from duragent.runtime._pins import pinned_base_url, pinned_reach
from duragent.runtime._runtime import Runtime
from duragent.runtime._waits import open_waits
from duragent.runtime._worker import lease_alive
from duragent.toolsets import PERMISSIONS, WORKDIR_KEY, check_permissions, toolset
from duragent.types import Task, TaskStatus, utcnow

app = typer.Typer()

AGENT_PREFIX = "run-"
INSTRUCTIONS = (
    "You are a careful assistant working for a user at a terminal. Use the tools when "
    "they help; file paths are relative to the user's working directory. When the task "
    "is done, answer with the result."
)
# How long a pause waits for running tools before cutting them off.
TOOL_GRACE = 5.0
EXIT_INTERRUPTED = 130  # the shell's code for "stopped by Ctrl-C"

BASE_URL = typer.Option(
    None, "--base-url", help="The provider's URL, e.g. a local OpenAI-compatible server."
)
ALLOW = typer.Option(
    "",
    "--allow",
    help=f"Let these tools run without asking first, comma-separated: {', '.join(PERMISSIONS)}.",
)
YES = typer.Option(False, "--yes", "-y", help="Let every tool run without asking first.")
ALLOW_PRIVATE = typer.Option(
    False,
    "--allow-private-network",
    help="Let http_get reach loopback, private and link-local addresses (off: public only).",
)
API_KEY_ENV = typer.Option(
    None,
    "--api-key-env",
    help="Environment variable holding the API key (default: OPENAI_API_KEY or "
    "ANTHROPIC_API_KEY). The key itself is never written anywhere.",
)


# --- building the agent ----------------------------------------------------------


def build_model(spec: str, base_url: str | None, api_key_env: str | None) -> ChatModel:
    options: dict[str, Any] = {}
    if base_url:
        options["base_url"] = base_url
    if api_key_env:
        key = os.environ.get(api_key_env)
        if not key:
            raise UsageError(f"--api-key-env {api_key_env}: that environment variable is not set")
        options["api_key"] = key
    if spec.startswith("scripted:") and options:
        raise UsageError("a scripted model takes no --base-url or --api-key-env")
    try:
        return resolve_model(spec, **options)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


@dataclass(frozen=True)
class Grants:
    """What the user lets this run's tools do, from the command line (never from the task)."""

    root: Path
    allow: frozenset[str] = frozenset()
    private_network: bool = False

    @classmethod
    def from_options(cls, root: Path, allow: str, yes: bool, private_network: bool) -> Grants:
        granted = frozenset(PERMISSIONS) if yes else check_permissions(allow.split(","))
        return cls(root.resolve(), granted, private_network)

    def flags(self) -> list[str]:
        """The options that grant the same again (for the `continue` hint)."""
        out = ["--workdir", str(self.root)]
        out += ["--allow", ",".join(sorted(self.allow))] if self.allow else []
        return out + (["--allow-private-network"] if self.private_network else [])


@dataclass(frozen=True)
class Options:
    """What `duragent continue` was given on the command line (None: not given)."""

    base_url: str | None
    workdir: Path | None
    allow: str
    yes: bool
    private_network: bool

    def against(self, task: Task) -> tuple[str | None, Grants, list[str]]:
        """The provider URL and grants to continue `task` with, and the flags that
        contradict what it is pinned to (runtime/_pins.py). A flag not given takes
        the pinned value; a task from before pins falls back to the current
        directory, as it did."""
        clashes: list[str] = []
        has_url, pinned_url = pinned_base_url(task)
        url = self.base_url if self.base_url is not None else pinned_url
        if has_url and self.base_url is not None and self.base_url != pinned_url:
            clashes.append(f"--base-url {self.base_url} (pinned: {pinned_url or 'none'})")
        reach = pinned_reach(task)
        pin = reach[0] if reach else None
        if pin is None:
            root = (self.workdir or Path.cwd()).resolve()
            recorded = str(task.context.get(WORKDIR_KEY) or "")
            if reach is None and self.workdir is None and recorded and recorded != str(root):
                raise UsageError(
                    f"task {task.id} was started in {recorded!r}, not in this directory; "
                    "continue it with --workdir DIR, naming the directory its file tools may use"
                )
            grants = Grants.from_options(root, self.allow, self.yes, self.private_network)
            return url, grants, clashes
        pinned_root = Path(str(pin.get("workdir")))
        root = pinned_root if self.workdir is None else self.workdir.resolve()
        if self.workdir is not None and root != pinned_root:
            clashes.append(f"--workdir {root} (pinned: {pinned_root})")
        elif not root.is_dir():
            raise UsageError(
                f"task {task.id}'s workdir {str(root)!r} is gone; pass --workdir DIR --force "
                "to give its file tools another one"
            )
        pinned_allow = frozenset(pin.get("allow") or ())
        allow = check_permissions(self.allow.split(","))
        granted = frozenset(PERMISSIONS) if self.yes else allow if self.allow else pinned_allow
        if (self.yes or self.allow) and granted != pinned_allow:
            given = "--yes" if self.yes else f"--allow {','.join(sorted(granted))}"
            clashes.append(f"{given} (pinned: {','.join(sorted(pinned_allow)) or 'none'})")
        private = bool(pin.get("private_network")) or self.private_network
        if private != bool(pin.get("private_network")):
            clashes.append("--allow-private-network (pinned: public addresses only)")
        return url, Grants(root, granted, private), clashes


def run_agent(
    name: str,
    model: ChatModel,
    max_iterations: int,
    grants: Grants,
    output_schema: dict[str, Any] | None = None,
) -> Agent:
    """The agent of a `duragent run` task; `name` is `run-<toolset>-<token>`.

    The name is unique per task because this process's worker claims every
    runnable task of the agents it knows: a shared name would let it pick up
    another terminal's task, whose requests may be pinned to another model.
    """
    kit = name.removeprefix(AGENT_PREFIX).rpartition("-")[0]
    return Agent(
        name=name,
        model=model,
        instructions=INSTRUCTIONS,
        tools=toolset(
            kit,
            root=grants.root,
            network=NetworkPolicy(allow_private=grants.private_network),
            allow=grants.allow,
        ),
        limits=Limits(max_iterations=max_iterations),
        timing=Timing(tool_grace=TOOL_GRACE),
        builtin_tools=BuiltinTools(plan=False),
        output_type=output_schema,
    )


def load_output_schema(path: Path | None) -> dict[str, Any] | None:
    """The JSON schema in the file `--output-schema` names (None without one)."""
    if path is None:
        return None
    try:
        schema = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"--output-schema {path}: not a JSON file ({exc})") from None
    if not isinstance(schema, dict):
        raise UsageError(f"--output-schema {path}: a JSON schema is an object")
    return schema


def _continue_hint(task_id: str, flags: list[str]) -> str:
    return "duragent continue " + shlex.join([task_id, *flags])


# --- driving a task ----------------------------------------------------------------


class _Stdin:
    """Lines typed by the user, read in a daemon thread so a blocked read never
    keeps the process alive, and so Ctrl-C still works while we wait for one."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._lines: asyncio.Queue[str | None] = asyncio.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            line = sys.stdin.readline()
            self._loop.call_soon_threadsafe(self._lines.put_nowait, line or None)
            if not line:
                return

    async def line(self) -> str | None:
        """The next line, or None at the end of input."""
        return await self._lines.get()


@dataclass
class TerminalRun:
    """A task driven from this terminal: Ctrl-C pauses or aborts it, its questions
    are asked here, and how it ended is said at the end."""

    rt: Runtime
    task_id: str
    console: Console
    flags: list[str]
    interrupts: int = 0
    stopping: list[asyncio.Future[None]] = field(default_factory=list)
    interrupted: asyncio.Event = field(default_factory=asyncio.Event)
    stdin: _Stdin | None = None
    transcript: Transcript = field(init=False)

    def __post_init__(self) -> None:
        self.transcript = Transcript(self.console)

    def on_sigint(self) -> None:
        self.interrupts += 1
        self.interrupted.set()
        if self.task_id:  # else: acted on as soon as the task exists
            self.pause_or_abort()

    def pause_or_abort(self) -> None:
        """Pause on the first Ctrl-C, abort on the second."""
        self.transcript.end_line()
        if self.interrupts == 1:
            self.console.print(
                f"[yellow]Pausing at the next safe point (running tools get up to "
                f"{TOOL_GRACE:.0f} s)… press Ctrl-C again to abort.[/]"
            )
            self._control(self.rt.pause(self.task_id))
        elif self.interrupts == 2:
            self.console.print("[red]Aborting…[/]")
            self._control(self.rt.abort(self.task_id, reason="aborted from the terminal (Ctrl-C)"))
            # A third Ctrl-C is the default one: it stops this process at once.
            asyncio.get_running_loop().remove_signal_handler(signal.SIGINT)

    def _control(self, call: Awaitable[Task]) -> None:
        async def quietly() -> None:
            # The task may have ended or paused meanwhile; its final state is shown anyway.
            with contextlib.suppress(DuragentError):
                await call

        self.stopping.append(asyncio.ensure_future(quietly()))

    async def follow(self, after_seq: int) -> Task:
        """Show entries as they are committed until the task stops running."""
        transcript = self.transcript
        seq = after_seq
        while True:
            batch = await self.rt.store.entries(self.task_id, after_seq=seq, limit=500)
            for entry in batch:
                seq = entry.seq
                transcript.show(entry)
            if batch:
                continue
            task = await self.rt.get(self.task_id)
            if task.last_seq > seq:
                continue
            if task.status in (TaskStatus.PENDING, TaskStatus.RUNNING):
                await self.rt.store.wait_for_change(0.5)
            elif task.status is TaskStatus.WAITING:
                if task.status_reason == "input" and not self.interrupts:
                    if not await self._answer(task):
                        break
                else:  # a timer or a sub-task: the worker wakes it
                    await self.rt.store.wait_for_change(0.5)
            else:
                break
        for job in self.stopping:
            await job
        for entry in await self.rt.store.entries(self.task_id, after_seq=seq):
            transcript.show(entry)
        transcript.end_line()
        return await self.rt.get(self.task_id)

    async def _answer(self, task: Task) -> bool:
        """Ask the user what the task waits for; False if there is no one to ask."""
        waits = {
            cid: w
            for cid, w in (await open_waits(self.rt.store, task)).items()
            if w["wait"] in ("approval", "input")
        }
        for call_id, wait in waits.items():
            approval = wait["wait"] == "approval"
            question = wait.get("question", "")
            if not approval:
                line = await self._ask(f"{question}\n> ")
                if line is None:
                    return False
                await self.rt.respond(self.task_id, answer=line.rstrip("\n"), call_id=call_id)
                continue
            while True:
                line = await self._ask(f"{question} [y/N/e to edit the arguments] ")
                if line is None:
                    return False
                word = line.strip().lower()
                if word not in ("e", "edit"):
                    yes = word in ("y", "yes")
                    reason = None if yes else "the user said no at the terminal"
                    await self.rt.respond(self.task_id, approve=yes, reason=reason, call_id=call_id)
                    break
                if await self._approve_edited(call_id, wait.get("arguments")):
                    break
        return True

    async def _ask(self, prompt: str) -> str | None:
        """Print `prompt` and read a line; None if there is no one to answer."""
        self.transcript.end_line()
        self.console.print(f"[bold magenta]? {safe(prompt)}[/]", end="")
        line = await self._read_line()
        if line is None or not sys.stdin.isatty():
            self.console.print()  # the terminal echoed the Enter; a pipe did not
        return line

    async def _approve_edited(self, call_id: str, arguments: Any) -> bool:
        """Approve the call with arguments typed as JSON; False to ask again (a
        line that is not a JSON object, or one the tool's schema refuses)."""
        current = json.dumps(arguments if isinstance(arguments, dict) else {})
        line = await self._ask(f"arguments as JSON (now {current})\n> ")
        if line is None or not line.strip():
            return False
        try:
            edited = json.loads(line)
        except ValueError as exc:
            self.console.print(f"[red]not JSON: {safe(str(exc))}[/]")
            return False
        if not isinstance(edited, dict):
            self.console.print("[red]the arguments are a JSON object: {...}[/]")
            return False
        try:
            await self.rt.respond(self.task_id, approve=True, arguments=edited, call_id=call_id)
        except UsageError as exc:
            self.console.print(f"[red]{safe(str(exc))}[/]")
            return False
        return True

    async def _read_line(self) -> str | None:
        if self.stdin is None:
            self.stdin = _Stdin()
        read = asyncio.ensure_future(self.stdin.line())
        stop = asyncio.ensure_future(self.interrupted.wait())
        try:
            await asyncio.wait({read, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if not read.done():
            read.cancel()
            return None  # Ctrl-C: the pause shows what happens next
        return read.result()

    def summary(self, task: Task) -> int:
        """Say how the task ended; the process's exit code."""
        c, tid = self.console, task.id
        tokens = f"{task.usage.input_tokens} in, {task.usage.output_tokens} out tokens"
        hint = _continue_hint(tid, self.flags)
        if task.status is TaskStatus.COMPLETED:
            if task.output is not None and not isinstance(task.output, str):  # --output-schema
                c.print(safe(json.dumps(task.output, indent=2, ensure_ascii=False)))
            c.print(
                f"[green]✓ completed[/] task {tid} ({count(task.iterations, 'round')}; {tokens})"
            )
            return 0
        if task.status is TaskStatus.PAUSED:
            c.print(f"[yellow]⏸ paused[/] task {tid} ({tokens})")
            c.print(f"Continue it with: {safe(hint)}")
            return EXIT_INTERRUPTED if self.interrupts else 0
        if task.status is TaskStatus.WAITING:
            c.print(f"[magenta]… task {tid} waits for your answer.[/]")
            c.print(f"Answer it with: {safe(hint)}")
            return 0
        if task.status is TaskStatus.ABORTED:
            c.print(f"[red]✗ aborted[/] task {tid}: {safe(task.error or '')}")
            return EXIT_INTERRUPTED if self.interrupts else 1
        reason = f" ({task.status_reason})" if task.status_reason else ""
        c.print(f"[red]✗ {task.status.value}{reason}[/] task {tid}: {safe(task.error or '')}")
        if task.status is TaskStatus.BLOCKED:
            c.print(f"Fix the cause, then: {safe(hint)}")
        return 1


async def _drive(
    store: str,
    model: ChatModel,
    flags: list[str],
    *,
    start: str | None = None,
    existing: str | None = None,
    agent_name: str,
    grants: Grants,
    request_id: str | None,
    max_iterations: int,
    deadline: timedelta | None = None,
    repin: bool = False,
    output_schema: dict[str, Any] | None = None,
) -> int:
    # Soft wrap: a pipe gets whole lines (a hint to copy must not be cut in two).
    console = make_console(soft_wrap=True)
    agent = run_agent(agent_name, model, max_iterations, grants, output_schema)
    loop = asyncio.get_running_loop()
    try:
        async with Runtime(store, agents=[agent], lease_ttl=15.0, poll_interval=0.25) as rt:
            run = TerminalRun(rt, existing or "", console, flags)
            # Handle Ctrl-C from before the task exists: none is ever lost half-way.
            loop.add_signal_handler(signal.SIGINT, run.on_sigint)
            after = 0
            if existing is None:
                sub = await rt.submit(
                    agent_name,
                    start,
                    request_id=request_id,
                    # Recorded for `duragent continue`; the tools' root is `grants.root`.
                    context={WORKDIR_KEY: str(grants.root)},
                    deadline=deadline,
                )
                run.task_id = sub.task_id
                console.print(f"task {sub.task_id}")
                if not sub.created:  # the request id's task already exists: pick it up
                    after = await _restart(rt, sub.task_id, console)
                for n in range(1, run.interrupts + 1):  # Ctrl-C before the task existed
                    run.interrupts = n
                    run.pause_or_abort()
            else:
                if repin:
                    await _repin(rt, existing, console)
                after = await _restart(rt, existing, console)
            task = await run.follow(after)
            return run.summary(task)
    finally:
        with contextlib.suppress(ValueError, RuntimeError):
            loop.remove_signal_handler(signal.SIGINT)
        aclose = getattr(model, "aclose", None)
        if aclose is not None:
            await aclose()


async def _restart(rt: Runtime, task_id: str, console: Console) -> int:
    """Make the task runnable here; the seq to show entries after."""
    task = await rt.get(task_id)
    if task.status.terminal:
        console.print(f"task {task.id} has ended; there is nothing to continue")
        return task.last_seq
    console.print(f"task {task.id} is {task.status.value}; continuing it")
    if task.status in (TaskStatus.PAUSED, TaskStatus.BLOCKED):
        await rt.resume(task_id)
    elif task.status is TaskStatus.RUNNING and lease_alive(task):
        console.print(
            f"[yellow]• waiting for the previous owner's lease, {escape(lease_left(task))}: "
            "if that process is gone (a crash), this one takes the task over then.[/]"
        )
        rt.start_worker()
    else:  # pending, waiting, or running with its worker gone
        await rt.resume()
    return task.last_seq


async def _repin(rt: Runtime, task_id: str, console: Console) -> None:
    """Pin the task to this run's flags (`--force`), once no live worker holds it."""
    task = await rt.get(task_id)
    if task.status is TaskStatus.RUNNING and lease_alive(task):
        console.print(
            f"[yellow]• waiting for the previous owner's lease, {escape(lease_left(task))}, "
            "before re-pinning the task[/]"
        )
        while task.status is TaskStatus.RUNNING and lease_alive(task):
            assert task.lease.expires_at is not None
            left = (task.lease.expires_at - utcnow()).total_seconds()
            await asyncio.sleep(max(0.05, min(left, 1.0)))
            task = await rt.get(task_id)
    if not task.status.terminal:
        await rt.repin(task_id)
        console.print(f"task {task_id} is re-pinned to the flags given (--force)")


def _exit_with(command: Coroutine[Any, Any, int]) -> None:
    """Run a command and exit with its code; an error is one line (see `run_async`)."""
    raise typer.Exit(run_async(command))


# --- the commands --------------------------------------------------------------------


def _flags(model: str, base_url: str | None, api_key_env: str | None, store: str) -> list[str]:
    flags = ["--model", model]
    if base_url:
        flags += ["--base-url", base_url]
    if api_key_env:
        flags += ["--api-key-env", api_key_env]
    if store != default_store_url():
        flags += ["--store", store]
    return flags


@app.command("run")
def run_command(
    text: str = typer.Argument(..., help="What the agent should do."),
    model: str = typer.Option(
        ..., "--model", "-m", help="provider:model, e.g. openai:gpt-4o-mini."
    ),
    base_url: str | None = BASE_URL,
    api_key_env: str | None = API_KEY_ENV,
    store: str = STORE,
    agent_tools: str = typer.Option(
        "default", "--agent-tools", help="Toolset: default, readonly or none."
    ),
    workdir: Path = typer.Option(
        Path("."),
        "--workdir",
        exists=True,
        file_okay=False,
        help="The only directory the file tools may touch.",
    ),
    allow: str = ALLOW,
    yes: bool = YES,
    allow_private_network: bool = ALLOW_PRIVATE,
    max_iterations: int = typer.Option(25, min=1, help="Rounds before the task fails."),
    request_id: str | None = typer.Option(
        None, help="Idempotency key: the same id returns the same task."
    ),
    deadline: str | None = typer.Option(
        None, help="Fail the task if it has not ended by then: 90s, 15m, 2h, 1d from now."
    ),
    output_schema: Path | None = typer.Option(
        None,
        "--output-schema",
        dir_okay=False,
        help="A JSON schema file (of an object): the answer must be JSON of that shape.",
    ),
) -> None:
    """Run an agent task here, streaming it. Ctrl-C pauses, twice aborts.

    Exit code: 0 completed (or paused/waiting without Ctrl-C), 1 failed or
    blocked, 130 stopped by Ctrl-C.
    """

    limit = None if deadline is None else parse_duration(deadline, "a deadline")

    async def go() -> int:
        prepare_store(store)
        grants = Grants.from_options(workdir, allow, yes, allow_private_network)
        toolset(agent_tools, root=grants.root)  # an unknown name fails before anything starts
        chat = build_model(model, base_url, api_key_env)
        # The same request id names the same agent, so a rerun can run the task it finds.
        token = (
            hashlib.sha256(request_id.encode()).hexdigest()[:8]
            if request_id
            else uuid.uuid4().hex[:8]
        )
        return await _drive(
            store,
            chat,
            _flags(model, base_url, api_key_env, store) + grants.flags(),
            start=text,
            agent_name=f"{AGENT_PREFIX}{agent_tools}-{token}",
            grants=grants,
            request_id=request_id,
            max_iterations=max_iterations,
            deadline=limit,
            output_schema=load_output_schema(output_schema),
        )

    _exit_with(go())


@app.command("continue")
def continue_command(
    task_id: str = typer.Argument(..., help="The id `duragent run` printed."),
    model: str | None = typer.Option(
        None, "--model", "-m", help="The task's model (default: the one it started with)."
    ),
    base_url: str | None = BASE_URL,
    api_key_env: str | None = API_KEY_ENV,
    store: str = STORE,
    workdir: Path | None = typer.Option(
        None,
        "--workdir",
        exists=True,
        file_okay=False,
        help="The only directory the file tools may touch (default: the task's own).",
    ),
    allow: str = ALLOW,
    yes: bool = YES,
    allow_private_network: bool = ALLOW_PRIVATE,
    max_iterations: int = typer.Option(25, min=1, help="Rounds before the task fails."),
    force: bool = typer.Option(
        False,
        "--force",
        help="Use --base-url, --workdir or permissions that differ from the task's "
        "pinned ones, and re-pin the task to them.",
    ),
) -> None:
    """Continue a task started by `duragent run` (paused, crashed or waiting), streaming it.

    The task goes on where it was pinned when it started: its provider URL
    (--base-url), its workdir and its permissions. A flag that differs is
    refused unless --force is given. Exit code as for `run`.
    """

    async def go() -> int:
        require_store(store)
        async with Runtime(store, run_worker=False) as rt:
            task = await rt.get(task_id)
        if not task.agent.startswith(AGENT_PREFIX):
            raise UsageError(
                f"task {task_id} runs agent {task.agent!r}, not one of `duragent run`; "
                f"use `duragent resume {task_id}` and a worker that has that agent"
            )
        pinned = str((task.config.get("request") or {}).get("model") or "")
        spec = model or pinned
        if pinned and spec != pinned:
            raise UsageError(
                f"task {task_id} was started with --model {pinned}; its requests are pinned "
                "to that model, so continue it with the same one"
            )
        options = Options(base_url, workdir, allow, yes, allow_private_network)
        url, grants, clashes = options.against(task)
        if clashes and not force:
            raise UsageError(
                f"task {task_id} was started with other settings: {'; '.join(clashes)}. "
                "Leave the flag out to use the task's own, or add --force to re-pin the "
                "task to the flags given"
            )
        chat = build_model(spec, url, api_key_env)
        return await _drive(
            store,
            chat,
            _flags(spec, url, api_key_env, store) + grants.flags(),
            existing=task_id,
            agent_name=task.agent,
            grants=grants,
            request_id=None,
            max_iterations=max_iterations,
            repin=bool(clashes),
            # The task's pinned answer schema, as `run --output-schema` gave it (not
            # its strict form: the answer is validated the same as before).
            output_schema=given_schema((task.config.get("request") or {}).get("output")),
        )

    _exit_with(go())
