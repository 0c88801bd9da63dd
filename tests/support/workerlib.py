"""Start real `duragent worker` processes for tests."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from duragent import Runtime
from duragent.types import AssistantMessage, ToolMessage

# tests/, where the agent modules and child scripts are
HERE = Path(__file__).resolve().parent.parent


class WorkerProc:
    """A `python -m duragent worker` child whose output is collected as it comes."""

    def __init__(
        self,
        url: str,
        *,
        ttl: float = 2.0,
        concurrency: int = 50,
        poll: float = 0.1,
        args: tuple[str, ...] = (),
        unset: tuple[str, ...] = (),
        **env: str,
    ) -> None:
        """Start the worker; `env` is added to this process's environment, minus `unset`."""
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "duragent",
                "worker",
                "--store",
                url,
                "--agents",
                "worker_agents:AGENTS",
                "--concurrency",
                str(concurrency),
                "--lease-ttl",
                str(ttl),
                "--poll-interval",
                str(poll),
                *args,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={
                **{k: v for k, v in os.environ.items() if k not in unset},
                "PYTHONPATH": f"{HERE}:{os.environ.get('PYTHONPATH', '')}",
                "PYTHONUNBUFFERED": "1",
                **env,
            },
        )
        self.out: list[str] = []
        self.err: list[str] = []
        self._threads = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, self.out), daemon=True),
            threading.Thread(target=self._pump, args=(self.proc.stderr, self.err), daemon=True),
        ]
        for t in self._threads:
            t.start()

    @staticmethod
    def _pump(stream: object, sink: list[str]) -> None:
        for line in stream:  # type: ignore[attr-defined]
            sink.append(line.rstrip("\n"))

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def wait_output(self, prefix: str, timeout: float = 120, stream: str = "out") -> str:
        sink = self.out if stream == "out" else self.err
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            for line in sink:
                if prefix in line:
                    return line
            if self.proc.poll() is not None and not any(prefix in x for x in sink):
                raise AssertionError(
                    f"worker exited ({self.proc.returncode}) before {prefix!r}:\n"
                    + "\n".join(self.err[-30:])
                )
            await asyncio.sleep(0.02)
        raise AssertionError(
            f"no {prefix!r} from worker within {timeout}s:\n" + "\n".join(self.err[-30:])
        )

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        # The pumps end at their pipe's end of file; then the pipe is closed here
        # (not left to the collector, which warns of an unclosed file).
        for thread, stream in zip(self._threads, (self.proc.stdout, self.proc.stderr), strict=True):
            thread.join(10)
            if stream is not None and not thread.is_alive():
                stream.close()


async def one_result_per_call(rt: Runtime, task_id: str) -> None:
    view = await rt.model_view(task_id)
    calls = [c.id for m in view if isinstance(m, AssistantMessage) for c in m.tool_calls or ()]
    results = Counter(m.tool_call_id for m in view if isinstance(m, ToolMessage))
    assert set(results) == set(calls) and all(n == 1 for n in results.values()), (calls, results)


def ledger_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.fixture
def workers() -> Iterator[list[WorkerProc]]:
    """The worker processes a test starts (append them), killed when it ends."""
    procs: list[WorkerProc] = []
    yield procs
    for p in procs:
        p.stop()
