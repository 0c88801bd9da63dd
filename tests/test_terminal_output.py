"""Model and web text reaches the terminal as text, never as terminal commands (issue 12, item 6).

Every command runs as a real process; its stdout is what a terminal would receive.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from duragent import Agent, BuiltinTools, Runtime, ScriptedModel, Timing, ToolCall
from duragent._terminal import clean, safe
from duragent.types import TaskStatus
from support.llm_servers import Answer, ScriptedOpenAIServer, ToolCall as WireToolCall
from support.server_live import child_env

# A window-title change (OSC, ended by BEL and by ST), a screen clear (CSI), an
# 8-bit CSI, a bare C0 control, and Rich markup that must print as written.
EVIL = (
    "before \x1b]2;pwned\x07 [bold red]loud[/bold red] \x1b]0;also\x1b\\"
    "\x1b[2J\x9b31m red \x08\x00 after"
)
SHOWN = "before  [bold red]loud[/bold red]  red  after"


def run_cli(*args: str, timeout: float = 60) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "duragent", *args],
        capture_output=True,
        env=child_env(COLUMNS="200", DURAGENT_TEST_KEY="sk-unused"),
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    out = result.stdout.decode("utf-8", errors="strict")
    assert result.returncode == 0, out + result.stderr.decode(errors="replace")
    return out


def assert_inert(out: str) -> None:
    for control in ("\x1b", "\x07", "\x9b", "\x08", "\x00"):
        assert control not in out, (control, out)


def test_clean_strips_every_kind_of_control_sequence() -> None:
    assert clean(EVIL) == SHOWN
    assert clean("tab\tand\nnewline stay; \r carriage return and \x7f DEL go") == (
        "tab\tand\nnewline stay;  carriage return and  DEL go"
    )
    assert clean("\x1bP1;2|secret\x1b\\ok \x1b(B \x1bc done") == "ok   done"
    assert clean("\x9d8;;http://x\x9c link") == " link"  # 8-bit OSC ended by 8-bit ST
    assert clean("unterminated \x1b]2;title forever") == "unterminated "
    assert safe("[bold]x[/] \x1b[1m") == "\\[bold]x\\[/] "


@pytest.mark.slow
def test_run_prints_a_hostile_answer_as_plain_text(tmp_path: Path) -> None:
    server = ScriptedOpenAIServer(
        [
            Answer(EVIL, [WireToolCall("list_dir", {"path": "\x1b]2;pwned\x07[red]x"})]),
            Answer(EVIL),
        ],
        answer_by="history",
    ).start()
    try:
        out = run_cli(
            "run",
            "hi",
            "--model",
            "openai:gpt-4o-mini",
            "--base-url",
            server.base_url,
            "--api-key-env",
            "DURAGENT_TEST_KEY",
            "--store",
            f"sqlite:///{tmp_path}/t.db",
            "--workdir",
            str(tmp_path),
            "--yes",
        )
    finally:
        server.close()
    assert_inert(out)
    assert SHOWN in out  # the sequences' payloads are gone too
    assert "list_dir(path='\\x1b]2;pwned\\x07[red]x')" in out  # arguments show as repr


@pytest.mark.slow
def test_show_follow_and_ls_print_hostile_text_as_plain_text(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/t.db"
    agent = Agent(
        name="evil",
        model=ScriptedModel([[ToolCall("echo", {"text": EVIL})], EVIL]),
        tools=[],
        builtin_tools=BuiltinTools(plan=False),
    )

    async def make() -> str:
        async with Runtime(url, [agent], poll_interval=0.05) as rt:
            # Stores refuse NUL in what a client sends; the model's EVIL keeps it.
            hostile = EVIL.replace("\x00", "")
            sub = await rt.submit("evil", hostile, owner="[b]\x1b]2;pwned\x07", session_id=hostile)
            task = await sub.wait(timeout=30)
            assert task.status is TaskStatus.COMPLETED, task.error
            return task.id

    task_id = asyncio.run(make())
    for args in (("show", task_id), ("show", task_id, "--follow"), ("ls",)):
        out = run_cli(*args, "--store", url)
        assert_inert(out)
        assert "[bold red]" in out or args == ("ls",)
    assert "[b]" in run_cli("ls", "--store", url)


@pytest.mark.slow
def test_show_prints_markup_split_across_streamed_pieces_as_written(tmp_path: Path) -> None:
    """Each streamed piece holds half a tag; joined, they must not become a live link."""
    url = f"sqlite:///{tmp_path}/t.db"
    hostile = "x [link=https://evil.example]click here[/link] y"
    agent = Agent(
        name="linker",
        model=ScriptedModel([hostile], chunk_size=6),  # "x [lin", "k=http", ...
        tools=[],
        builtin_tools=BuiltinTools(plan=False),
        timing=Timing(progress_interval=0),  # every piece its own progress entry
    )

    async def make() -> str:
        async with Runtime(url, [agent], poll_interval=0.05) as rt:
            task = await (await rt.submit("linker", "go")).wait(timeout=30)
            assert task.status is TaskStatus.COMPLETED, task.error
            pieces = [e for e in await rt.store.entries(task.id) if e.kind.value == "progress"]
            assert len(pieces) > 3  # the text really was streamed in pieces
            return task.id

    task_id = asyncio.run(make())
    out = run_cli("show", task_id, "--store", url)
    assert_inert(out)
    assert f"streamed '{hostile}'" in out
    # A terminal-like console styles text (ESC[...m) but must never emit a hyperlink (ESC]8).
    colored = subprocess.run(
        [sys.executable, "-m", "duragent", "show", task_id, "--store", url],
        capture_output=True,
        env=child_env(COLUMNS="200", FORCE_COLOR="1"),
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert colored.returncode == 0, colored.stderr.decode(errors="replace")
    assert b"\x1b]" not in colored.stdout and b"evil.example" in colored.stdout
