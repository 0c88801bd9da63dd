"""Load on a real `duragent serve`: event-stream subscribers plus a burst of submissions.

    python -m bench.http_load                      # 200 subscribers, 2,000 submissions
    python -m bench.http_load --subscribers 20 --submissions 200   # a smoke run

The server is a child process on 127.0.0.1 (loopback only) with a SQLite store
in a temporary directory and its default limits; the run is bounded by
`--timeout`. Subscribers hold one `/events` stream each on a task that waits
for an answer (spread over users so no one passes the per-user stream limit);
submissions start short tasks `--concurrency` at a time, and each is followed
by a `GET /v1/tasks/{id}`, whose latency is reported (p50/p99). The server's
RSS and open files (from /proc) are read before, at the peak, and after the
streams closed and the tasks finished.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from bench.common import child_env
from duragent import Agent, BuiltinTools, ScriptedModel, ToolCall

HOST = "127.0.0.1"  # loopback only: this generates load, never towards another machine
USERS = 10


def agents() -> list[Agent]:
    """`--agents bench.http_load:agents` for the server under load."""
    return [
        Agent(name="quick", model=ScriptedModel(["Done."]), builtin_tools=BuiltinTools(plan=False)),
        Agent(
            name="asker",
            model=ScriptedModel([[ToolCall("ask_user", {"question": "Which city?"})], "Thanks."]),
            builtin_tools=BuiltinTools(ask_user=True, plan=False),
        ),
    ]


def token(user: int) -> str:
    return f"load-user-{user:02d}-token-0123456789"


def auth(user: int) -> dict[str, str]:
    return {"Authorization": f"Bearer {token(user)}"}


@dataclass
class Usage:
    rss_mb: float
    open_files: int


def usage(pid: int) -> Usage:
    rss = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
    return Usage(round(rss / 2**20, 1), len(os.listdir(f"/proc/{pid}/fd")))


@dataclass
class Result:
    subscribers: int
    submissions: int
    concurrency: int
    seconds: float = 0.0
    submit_per_second: float = 0.0
    get_p50_ms: float = 0.0
    get_p99_ms: float = 0.0
    get_max_ms: float = 0.0
    submit_p50_ms: float = 0.0
    submit_p99_ms: float = 0.0
    events_received: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    before: Usage | None = None
    peak: Usage | None = None
    after: Usage | None = None


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@contextmanager
def server(tmp: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    tokens = tmp / "tokens.txt"
    tokens.write_text("".join(f"user{u}:{token(u)}\n" for u in range(USERS)))
    port = free_port()
    log = (tmp / "serve.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from duragent.cli import main; main()",
            "serve",
            "--store",
            f"sqlite:///{tmp}/load.db",
            "--agents",
            "bench.http_load:agents",
            "--workers",
            "4",
            "--host",
            HOST,
            "--port",
            str(port),
            "--tokens",
            str(tokens),
            "--log-level",
            "warning",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=child_env(),
    )
    url = f"http://{HOST}:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError((tmp / "serve.log").read_text())
            try:
                if httpx.get(f"{url}/v1/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("server did not start")
            time.sleep(0.05)
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


async def subscribe(
    client: httpx.AsyncClient,
    url: str,
    task_id: str,
    user: int,
    opened: asyncio.Event,
    counts: dict[str, int],
) -> None:
    async with client.stream("GET", f"{url}/v1/tasks/{task_id}/events", headers=auth(user)) as r:
        if r.status_code != 200:
            counts[f"subscribe {r.status_code}"] = counts.get(f"subscribe {r.status_code}", 0) + 1
            opened.set()
            return
        opened.set()
        async for line in r.aiter_lines():
            if line.startswith("id: "):
                counts["events"] = counts.get("events", 0) + 1


async def run(url: str, pid: int, args: argparse.Namespace) -> Result:
    result = Result(args.subscribers, args.submissions, args.concurrency)
    counts: dict[str, int] = {}
    limits = httpx.Limits(max_connections=args.subscribers + 8, max_keepalive_connections=8)
    timeout = httpx.Timeout(60.0, read=None)
    async with (
        httpx.AsyncClient(limits=limits, timeout=timeout) as streams,
        httpx.AsyncClient(timeout=60.0) as api,
    ):
        # Warm up, then the baseline.
        for _ in range(20):
            await api.post(
                f"{url}/v1/tasks", json={"agent": "quick", "input": "warm"}, headers=auth(0)
            )
        await asyncio.sleep(1.0)
        result.before = usage(pid)

        # Subscribers: one stream each on a task that waits for an answer.
        waiting = []
        for i in range(args.subscribers):
            user = i % USERS
            r = await api.post(
                f"{url}/v1/tasks", json={"agent": "asker", "input": "?"}, headers=auth(user)
            )
            waiting.append((r.json()["id"], user))
        opened = [asyncio.Event() for _ in waiting]
        subscribers = [
            asyncio.create_task(subscribe(streams, url, task_id, user, ev, counts))
            for (task_id, user), ev in zip(waiting, opened, strict=True)
        ]
        await asyncio.wait_for(asyncio.gather(*(ev.wait() for ev in opened)), 120)

        # Submissions, each followed by a read of the task.
        submit_ms: list[float] = []
        get_ms: list[float] = []
        peak = usage(pid)
        sem = asyncio.Semaphore(args.concurrency)

        async def submit(n: int) -> None:
            nonlocal peak
            user = n % USERS
            async with sem:
                t0 = time.perf_counter()
                r = await api.post(
                    f"{url}/v1/tasks",
                    json={"agent": "quick", "input": f"job {n}"},
                    headers=auth(user),
                )
                submit_ms.append((time.perf_counter() - t0) * 1000)
                if r.status_code != 201:
                    counts[f"submit {r.status_code}"] = counts.get(f"submit {r.status_code}", 0) + 1
                    return
                t0 = time.perf_counter()
                g = await api.get(f"{url}/v1/tasks/{r.json()['id']}", headers=auth(user))
                get_ms.append((time.perf_counter() - t0) * 1000)
                if g.status_code != 200:
                    counts[f"get {g.status_code}"] = counts.get(f"get {g.status_code}", 0) + 1
                if n % 100 == 0:
                    now = usage(pid)
                    if now.rss_mb > peak.rss_mb or now.open_files > peak.open_files:
                        peak = Usage(
                            max(now.rss_mb, peak.rss_mb), max(now.open_files, peak.open_files)
                        )

        start = time.perf_counter()
        await asyncio.gather(*(submit(n) for n in range(args.submissions)))
        result.seconds = round(time.perf_counter() - start, 2)
        result.peak = peak

        # Answer the waiting tasks: their streams end; then let the worker drain.
        for task_id, user in waiting:
            await api.post(
                f"{url}/v1/tasks/{task_id}/respond", json={"answer": "Paris"}, headers=auth(user)
            )
        await asyncio.wait_for(asyncio.gather(*subscribers, return_exceptions=True), 120)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            active = 0
            for user in range(USERS):
                r = await api.get(
                    f"{url}/v1/tasks",
                    params={"status": ["pending", "running", "waiting"], "limit": 1},
                    headers=auth(user),
                )
                active += len(r.json()["tasks"])
            if active == 0:
                break
            await asyncio.sleep(0.5)
    # Clients closed: what the server still holds is its own.
    await asyncio.sleep(1.0)
    result.after = usage(pid)

    result.submit_per_second = round(args.submissions / result.seconds, 1)
    result.get_p50_ms = round(percentile(get_ms, 0.50), 2)
    result.get_p99_ms = round(percentile(get_ms, 0.99), 2)
    result.get_max_ms = round(max(get_ms), 2)
    result.submit_p50_ms = round(statistics.median(submit_ms), 2)
    result.submit_p99_ms = round(percentile(submit_ms, 0.99), 2)
    result.events_received = counts.pop("events", 0)
    result.errors = counts
    return result


def report(r: Result) -> str:
    assert r.before and r.peak and r.after
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return "\n".join(
        [
            f"## HTTP load: {r.subscribers} event-stream subscribers + {r.submissions} submissions "
            f"({r.concurrency} at a time)",
            "",
            f"Loopback, SQLite store, 4 in-process workers; load average at the end: {load}.",
            "",
            "| figure | value |",
            "| --- | ---: |",
            f"| submissions per second | {r.submit_per_second} ({r.seconds} s in all) |",
            f"| `POST /v1/tasks` p50 / p99 | {r.submit_p50_ms} / {r.submit_p99_ms} ms |",
            f"| `GET /v1/tasks/{{id}}` p50 / p99 (max) | {r.get_p50_ms} / {r.get_p99_ms} "
            f"({r.get_max_ms}) ms |",
            f"| events received by subscribers | {r.events_received} |",
            f"| server RSS before / peak / after | {r.before.rss_mb} / {r.peak.rss_mb} / "
            f"{r.after.rss_mb} MB |",
            f"| server open files before / peak / after | {r.before.open_files} / "
            f"{r.peak.open_files} / {r.after.open_files} |",
            f"| errors | {json.dumps(r.errors) if r.errors else 'none'} |",
        ]
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subscribers", type=int, default=200)
    parser.add_argument("--submissions", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--timeout", type=float, default=900, help="Seconds the run may take.")
    parser.add_argument("--json", action="store_true", help="Print the figures as JSON.")
    args = parser.parse_args(argv)
    if args.subscribers > USERS * 32:
        parser.error(f"at most {USERS * 32} subscribers (the default per-user stream limit)")
    with (
        tempfile.TemporaryDirectory(prefix="dg-http-load-") as tmp,
        server(Path(tmp)) as (url, proc),
    ):
        result = asyncio.run(asyncio.wait_for(run(url, proc.pid, args), args.timeout))
    print(json.dumps(asdict(result), indent=2) if args.json else report(result))


if __name__ == "__main__":
    main()
