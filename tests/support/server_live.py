"""A real `duragent serve` (and `duragent worker`) in child processes, for tests."""

from __future__ import annotations

import os
import resource
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

# tests/, where the agent modules and child scripts are
HERE = Path(__file__).resolve().parent.parent
TOKENS = {"alice": "alice-live-token-1", "bob": "bob-live-token-2"}
CLI = "from duragent.cli import main; main()"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", **extra}


def duragent(
    *args: str, log: Path, env: dict[str, str] | None = None, nofile: int | None = None
) -> subprocess.Popen[bytes]:
    """The CLI in a child process; `nofile` caps its open files (soft and hard limit)."""

    def limit_files() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    with log.open("wb") as out:  # the child writes through its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, "-c", CLI, *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env or child_env(),
            preexec_fn=limit_files if nofile is not None else None,
        )


def duragent_script() -> str:
    """The installed `duragent` script: unlike `python -m duragent` or `python -c`,
    it does not put the current directory on sys.path by itself."""
    beside = Path(sys.executable).parent / "duragent"
    found = str(beside) if beside.exists() else shutil.which("duragent")
    assert found, "the duragent script is not installed (pip install -e .)"
    return found


def run_script(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """The installed `duragent` script run to its end in `cwd`, 200 columns wide."""
    return subprocess.run(
        [duragent_script(), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={"COLUMNS": "200", **(env or child_env())},
        timeout=timeout,
    )


def stop(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)


@dataclass
class LiveServer:
    url: str
    store_url: str
    log: Path
    proc: subprocess.Popen[bytes]
    tokens_path: Path | None = None

    def headers(self, user: str = "alice") -> dict[str, str]:
        return {"Authorization": f"Bearer {TOKENS[user]}"}

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    @property
    def host_port(self) -> tuple[str, int]:
        host, port = self.url.removeprefix("http://").split(":")
        return host, int(port)

    def rss(self) -> int:
        """The server process's resident memory in bytes (VmRSS from /proc)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError(f"no VmRSS for pid {self.proc.pid}")

    def open_files(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))


def wait_healthy(url: str, proc: subprocess.Popen[Any], log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(f"{url}/v1/health", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"server at {url} not healthy after {timeout} s:\n{log.read_text()}")


@contextmanager
def live_server(
    tmp_path: Path,
    *,
    workers: int = 2,
    store_url: str | None = None,
    env: dict[str, str] | None = None,
    tokens_file: bool = True,
    args: Sequence[str] = (),
    nofile: int | None = None,
) -> Iterator[LiveServer]:
    """`duragent serve` on a free port; alice's and bob's tokens in a file unless
    `tokens_file=False` (then the environment's DURAGENT_TOKENS); `args` are more
    serve options, `nofile` caps the process's open files."""
    token_args: list[str] = []
    tokens: Path | None = None
    if tokens_file:
        tokens = tmp_path / "tokens.txt"
        tokens.write_text("".join(f"{u}:{t}\n" for u, t in TOKENS.items()))
        token_args = ["--tokens", str(tokens)]
    store_url = store_url or f"sqlite:///{tmp_path}/live.db"
    port = free_port()
    log = tmp_path / f"serve-{port}.log"
    proc = duragent(
        "serve",
        "--store",
        store_url,
        "--agents",
        "server_agents:agents",
        "--workers",
        str(workers),
        "--port",
        str(port),
        *token_args,
        "--lease-ttl",
        "5",
        *args,
        log=log,
        env=env,
        nofile=nofile,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log)
        yield LiveServer(url, store_url, log, proc, tokens)
    finally:
        stop(proc)
