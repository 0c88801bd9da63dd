"""`duragent run` as a real process against a scripted OpenAI-compatible server."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from duragent.store import open_store
from duragent.types import Task
from support.llm_servers import ScriptedOpenAIServer

SECRET = "sk-test-SECRET-123"
KEY_ENV = "DURAGENT_TEST_KEY"
MODEL = "openai:gpt-4o-mini"
Serve = Callable[..., ScriptedOpenAIServer]


class Cli:
    """A `duragent` process whose output is collected as it comes."""

    def __init__(
        self, *args: str, stdin: int = subprocess.DEVNULL, cwd: Path | None = None
    ) -> None:
        env = {**os.environ, KEY_ENV: SECRET, "PYTHONUNBUFFERED": "1", "COLUMNS": "100"}
        for var in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
            env.pop(var, None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "duragent", *args],
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=cwd,
        )
        self._out = bytearray()
        self._err = b""
        self._cond = threading.Condition()
        self._closed = False
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while chunk := os.read(fd, 4096):
            with self._cond:
                self._out += chunk
                self._cond.notify_all()
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def out(self) -> str:
        with self._cond:
            return self._out.decode(errors="replace")

    def wait_for(self, text: str, timeout: float = 60.0) -> str:
        """Until `text` was printed; all output so far."""
        with self._cond:
            ok = self._cond.wait_for(lambda: text.encode() in self._out or self._closed, timeout)
        if not ok or text not in self.out:
            self.proc.kill()
            raise AssertionError(f"{text!r} never printed; output:\n{self.out}\n{self.err()}")
        return self.out

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode())
        self.proc.stdin.flush()

    def interrupt(self) -> None:
        self.proc.send_signal(signal.SIGINT)

    def err(self) -> str:
        if self.proc.poll() is None:
            return ""
        assert self.proc.stderr is not None
        self._err += self.proc.stderr.read()
        return self._err.decode(errors="replace")

    def finish(self, timeout: float = 60.0) -> tuple[int, str, str]:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"still running after {timeout}s; output:\n{self.out}") from None
        with self._cond:
            drained = self._cond.wait_for(lambda: self._closed, 10)
        ended = self.proc.returncode, self.out, self.err()
        # Closed here, not left to the collector (stdout only once the drain is done with it).
        for stream in (self.proc.stdin, self.proc.stderr, self.proc.stdout if drained else None):
            if stream is not None:
                stream.close()
        return ended


@pytest.fixture
def serve() -> Iterator[Serve]:
    servers: list[ScriptedOpenAIServer] = []

    def start(turns: Any, **options: Any) -> ScriptedOpenAIServer:
        server = ScriptedOpenAIServer(turns, answer_by="history", **options)
        servers.append(server.start())  # type: ignore[arg-type]
        return server

    yield start
    for server in servers:
        server.close()


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("hello from the notes\n")
    return work


def run_args(
    server: ScriptedOpenAIServer, store: str, workdir: Path, text: str, allow: str = "read"
) -> list[str]:
    """`duragent run` against the scripted server; the file reads it allows run unasked."""
    return [
        "run",
        text,
        "--model",
        MODEL,
        "--base-url",
        server.base_url,
        "--api-key-env",
        KEY_ENV,
        "--store",
        store,
        "--workdir",
        str(workdir),
        *(["--allow", allow] if allow else []),
    ]


def task_id_in(out: str) -> str:
    found = re.search(r"^task (t_\w+)$", out, re.MULTILINE)
    assert found, out
    return found.group(1)


def continue_hint(out: str) -> list[str]:
    """The arguments of the `duragent continue ...` line the CLI printed."""
    found = re.search(r"^\w[\w ]*: duragent (continue .*)$", out, re.MULTILINE)
    assert found, out
    return found.group(1).split()


async def stored(store: str, task_id: str) -> tuple[Task, list[Any]]:
    s = open_store(store)
    await s.open()
    try:
        return await s.get_task(task_id), await s.entries(task_id)
    finally:
        await s.close()


def store_bytes(tmp_path: Path) -> bytes:
    # Regular files only: the store's wake-up sockets live in a directory beside it.
    files = [p for p in tmp_path.iterdir() if p.name.startswith("cli.db") and p.is_file()]
    return b"".join(p.read_bytes() for p in files)
