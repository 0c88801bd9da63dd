"""Load on real `duragent serve` processes: submissions with and without 200 open
event streams, beside a bare FastAPI endpoint driven by the same client.

    python -m bench.http_load                        # every mode, 3 runs each (~4 min)
    python -m bench.http_load --modes sqlite --runs 1 --subscribers 20   # a smoke run

Modes: `sqlite` (one server, a SQLite file), `postgres` (one server, a
PostgreSQL schema made for the run and dropped after), `postgres-x2` (two
servers on one schema: requests alternate between them, a stream is answered
through the other server than the one it is open on). Each server is a child
process on 127.0.0.1 with 4 in-process workers and its metrics port.

One run: `--subscribers` tasks that wait for an answer are made; then
`--submissions` short tasks (`POST` then `GET /v1/tasks/{id}`, `--concurrency`
at a time) with no stream open; then the same with one `/events` stream open
on each waiting task, of which `--probes` are answered during the
submissions: each entry those streams receive gives the latency from its
`created_at` (set in the commit that writes it) to the client; then the
submissions again with no stream (the rate without streams is the mean of the
two phases around the one with, so a drift of the shared machine's load
favours neither). Store reads are the servers'
`duragent_store_reads_total` (the task rows and entries read, by anyone):
what the open streams cost is the reads of the phase with streams minus those
of the phase without, per commit of the phase. Rounds per CPU-second: rounds
started (`duragent_rounds_total`) over the servers' CPU time in the phase with
streams. Last, the bare endpoint (bench/http_bare.py) gets the same
submissions with no stream.
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
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

import httpx

from bench.common import PG_URL, child_env, drop_schema, fmt, new_schema, postgres_unreachable
from duragent import Agent, BuiltinTools, ScriptedModel, ToolCall

HOST = "127.0.0.1"  # loopback only: this generates load, never towards another machine
USERS = 10
MODES = ("sqlite", "postgres", "postgres-x2")


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    url: str
    proc: subprocess.Popen[bytes]
    metrics: str = ""

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def scrape(self) -> dict[str, float]:
        """Sums of the counters this bench reads, by name."""
        out: dict[str, float] = {}
        for line in httpx.get(self.metrics, timeout=10).text.splitlines():
            name = line.split("{")[0].split(" ")[0]
            if name in ("duragent_store_reads_total", "duragent_commits_total") or (
                name == "duragent_rounds_total"
            ):
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        return out


def wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            raise RuntimeError(log.read_text())
        try:
            if httpx.get(f"{url}/v1/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} did not start")
        time.sleep(0.05)


@contextmanager
def child(args: list[str], tmp: Path, name: str, port: int) -> Iterator[Server]:
    log_path = tmp / f"{name}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=child_env())
        server = Server(f"http://{HOST}:{port}", proc)
        try:
            wait_healthy(server.url, proc, log_path)
            yield server
        except BaseException:
            tail = log_path.read_text(errors="replace")[-3000:]
            print(f"--- {name} (exit {proc.poll()}), its log's end:\n{tail}", file=sys.stderr)
            raise
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextmanager
def duragent_servers(store: str, n: int, tmp: Path) -> Iterator[list[Server]]:
    tokens = tmp / "tokens.txt"
    tokens.write_text("".join(f"user{u}:{token(u)}\n" for u in range(USERS)))
    with ExitStack() as stack:
        servers = []
        for i in range(n):
            port, mport = free_port(), free_port()
            cmd = [sys.executable, "-c", "from duragent.cli import main; main()", "serve"]
            cmd += ["--store", store, "--agents", "bench.http_load:agents", "--workers", "4"]
            cmd += ["--host", HOST, "--port", str(port), "--tokens", str(tokens)]
            cmd += ["--metrics-port", str(mport), "--log-level", "warning"]
            # Every client here is one address: 200 streams beside the API calls.
            cmd += ["--max-connections-per-address", "1000"]
            server = stack.enter_context(child(cmd, tmp, f"serve-{i}", port))
            server.metrics = f"http://{HOST}:{mport}/metrics"
            servers.append(server)
        yield servers


@dataclass
class Run:
    mode: str
    none_per_s: float = 0.0  # submissions/s, no stream open
    streams_per_s: float = 0.0  # submissions/s, the subscribers' streams open
    bare_per_s: float = 0.0  # the bare endpoint's submissions/s
    stream_reads_per_commit: float = 0.0
    latency_p50_ms: float = 0.0
    latency_p99_ms: float = 0.0
    latency_samples: int = 0
    rounds_per_cpu_s: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)


async def send(api: httpx.AsyncClient, method: str, url: str, **kw: object) -> httpx.Response:
    """A request, sent again once if the server closed an idle kept-alive connection
    as it went out (a race of every HTTP/1.1 client, not an error of the server)."""
    try:
        return await api.request(method, url, **kw)  # type: ignore[arg-type]
    except (httpx.ReadError, httpx.RemoteProtocolError, httpx.WriteError):
        return await api.request(method, url, **kw)  # type: ignore[arg-type]


def note(counts: dict[str, int], what: str) -> None:
    counts[what] = counts.get(what, 0) + 1


async def submissions(
    api: httpx.AsyncClient, urls: list[str], n: int, concurrency: int, counts: dict[str, int]
) -> float:
    """`n` POST + GET pairs, `concurrency` at a time, spread over `urls`; pairs per second."""
    sem = asyncio.Semaphore(concurrency)

    async def one(k: int) -> None:
        url, user = urls[k % len(urls)], k % USERS
        async with sem:
            body = {"agent": "quick", "input": f"job {k}"}
            r = await send(api, "POST", f"{url}/v1/tasks", json=body, headers=auth(user))
            if r.status_code != 201:
                note(counts, f"submit {r.status_code}")
                return
            g = await send(api, "GET", f"{url}/v1/tasks/{r.json()['id']}", headers=auth(user))
            if g.status_code != 200:
                note(counts, f"get {g.status_code}")

    start = time.perf_counter()
    await asyncio.gather(*(one(k) for k in range(n)))
    return n / (time.perf_counter() - start)


async def subscribe(
    client: httpx.AsyncClient,
    url: str,
    task_id: str,
    user: int,
    opened: asyncio.Event,
    latencies: list[float] | None,
    counts: dict[str, int],
) -> None:
    """Read a task's stream; with `latencies`, note each entry's commit→here time."""
    async with client.stream("GET", f"{url}/v1/tasks/{task_id}/events", headers=auth(user)) as r:
        opened.set()
        if r.status_code != 200:
            note(counts, f"subscribe {r.status_code}")
            return
        async for line in r.aiter_lines():
            if line.startswith("data: ") and latencies is not None:
                data = json.loads(line[6:])
                if "created_at" in data:
                    made = datetime.fromisoformat(data["created_at"]).timestamp()
                    latencies.append((time.time() - made) * 1000)


async def answer(api: httpx.AsyncClient, url: str, task_id: str, user: int) -> None:
    body = {"answer": "Paris"}
    await send(api, "POST", f"{url}/v1/tasks/{task_id}/respond", json=body, headers=auth(user))


def totals(servers: list[Server]) -> dict[str, float]:
    out: dict[str, float] = {}
    for s in servers:
        for k, v in s.scrape().items():
            out[k] = out.get(k, 0.0) + v
    out["cpu"] = sum(s.cpu_seconds() for s in servers)
    return out


async def waiting_tasks(
    api: httpx.AsyncClient, urls: list[str], n: int
) -> list[tuple[str, int, int]]:
    """`n` tasks that wait for an answer: (id, user, index of the server of its stream)."""
    out = []
    for i in range(n):
        user = i % USERS
        body = {"agent": "asker", "input": "?"}
        r = await send(
            api, "POST", f"{urls[i % len(urls)]}/v1/tasks", json=body, headers=auth(user)
        )
        out.append((r.json()["id"], user, i % len(urls)))
    # Each waits once its first round ran.
    for task_id, user, _ in out:
        r = await send(
            api,
            "GET",
            f"{urls[0]}/v1/tasks/{task_id}/wait",
            params={"until": "input", "timeout": 60},
            headers=auth(user),
        )
        assert r.json()["status"] == "waiting", r.text
    return out


async def measure(servers: list[Server], run: Run, args: argparse.Namespace) -> None:
    urls = [s.url for s in servers]
    counts: dict[str, int] = {}
    limits = httpx.Limits(max_connections=args.subscribers + 8, max_keepalive_connections=8)
    async with (
        httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(60.0, read=None)) as streams,
        httpx.AsyncClient(timeout=60.0) as api,
    ):
        await submissions(api, urls, 40, args.concurrency, counts)  # warm up
        waiting = await waiting_tasks(api, urls, args.subscribers + args.probes)
        quiet, watched = waiting[: args.probes], waiting[args.probes :]

        # No stream open; `probes` waiting tasks without streams are answered meanwhile.
        a0 = totals(servers)
        answers = [
            asyncio.create_task(answer(api, urls[(s + 1) % len(urls)], t, u)) for t, u, s in quiet
        ]
        run.none_per_s = await submissions(api, urls, args.submissions, args.concurrency, counts)
        await asyncio.gather(*answers)
        a1 = totals(servers)

        # A stream on each other waiting task; `probes` of them are answered meanwhile.
        latencies: list[float] = []
        opened = [asyncio.Event() for _ in watched]
        readers = [
            asyncio.create_task(
                subscribe(
                    streams, urls[s], t, u, ev, latencies if i < args.probes else None, counts
                )
            )
            for i, ((t, u, s), ev) in enumerate(zip(watched, opened, strict=True))
        ]
        await asyncio.wait_for(asyncio.gather(*(ev.wait() for ev in opened)), 120)
        await asyncio.sleep(1.0)  # the streams' catch-up reads land before the count starts
        b0 = totals(servers)

        async def probe() -> None:
            # Spread over the phase, as long as the one without streams took.
            gap = args.submissions / max(run.none_per_s, 1e-3) / (args.probes + 1)
            for t, u, s in watched[: args.probes]:
                await asyncio.sleep(gap)
                await answer(api, urls[(s + 1) % len(urls)], t, u)

        latencies.clear()
        run.streams_per_s, _ = await asyncio.gather(
            submissions(api, urls, args.submissions, args.concurrency, counts), probe()
        )
        b1 = totals(servers)
        for task in readers:
            task.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
        # Again with the streams closed: the phases without streams before and
        # after the one with, so a drift of the shared machine's load favours neither.
        again = await submissions(api, urls, args.submissions, args.concurrency, counts)
        run.none_per_s = (run.none_per_s + again) / 2

    phase_a = a1["duragent_store_reads_total"] - a0["duragent_store_reads_total"]
    phase_b = b1["duragent_store_reads_total"] - b0["duragent_store_reads_total"]
    commits = b1["duragent_commits_total"] - b0["duragent_commits_total"]
    run.stream_reads_per_commit = round(max(phase_b - phase_a, 0.0) / max(commits, 1), 3)
    rounds = b1["duragent_rounds_total"] - b0["duragent_rounds_total"]
    run.rounds_per_cpu_s = round(rounds / max(b1["cpu"] - b0["cpu"], 1e-3), 1)
    if latencies:
        ordered = sorted(latencies)
        run.latency_p50_ms = round(statistics.median(ordered), 2)
        run.latency_p99_ms = round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 2)
        run.latency_samples = len(ordered)
    run.errors = counts


async def bare(url: str, args: argparse.Namespace) -> float:
    counts: dict[str, int] = {}
    async with httpx.AsyncClient(timeout=60.0) as api:
        await submissions(api, [url], 40, args.concurrency, counts)
        rate = await submissions(api, [url], args.submissions, args.concurrency, counts)
    if counts:
        raise RuntimeError(f"bare endpoint errors: {counts}")
    return rate


def one_run(mode: str, args: argparse.Namespace) -> Run:
    run = Run(mode)
    schema = new_schema("bench_http") if mode.startswith("postgres") else ""
    with tempfile.TemporaryDirectory(prefix="dg-http-load-") as tmp_dir:
        tmp = Path(tmp_dir)
        store = f"{PG_URL}?schema={schema}" if schema else f"sqlite:///{tmp}/load.db"
        try:
            n = 2 if mode == "postgres-x2" else 1
            with duragent_servers(store, n, tmp) as servers:
                asyncio.run(asyncio.wait_for(measure(servers, run, args), args.timeout))
        finally:
            if schema:
                drop_schema(schema)
        port = free_port()
        cmd = [sys.executable, "-m", "bench.http_bare", "--port", str(port)]
        with child([*cmd, "--db", str(tmp / "bare.db")], tmp, "bare", port) as server:
            run.bare_per_s = asyncio.run(bare(server.url, args))
    return run


def report(runs: list[Run], args: argparse.Namespace) -> str:
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    lines = [
        f"## HTTP load: {args.subscribers} event streams, {args.submissions} submissions "
        f"({args.concurrency} at a time), {args.runs} runs per mode",
        "",
        f"`python -m bench.http_load --runs {args.runs}`; median (min–max) over the runs; "
        f"load average at the end: {load}.",
        "",
        "| mode | subs/s, no stream | subs/s, streams open | ratio | bare endpoint subs/s "
        "| duragent / bare | stream reads per commit | commit→client p50 / p99 ms "
        "| rounds/s per CPU-s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for mode in args.modes:
        rs = [r for r in runs if r.mode == mode]
        if not rs:
            continue
        ratio = [r.streams_per_s / r.none_per_s for r in rs]
        vs_bare = [r.none_per_s / r.bare_per_s for r in rs]
        lines.append(
            f"| {mode} | {fmt([r.none_per_s for r in rs], 0)} "
            f"| {fmt([r.streams_per_s for r in rs], 0)} | {fmt(ratio)} "
            f"| {fmt([r.bare_per_s for r in rs], 0)} | {fmt(vs_bare)} "
            f"| {fmt([r.stream_reads_per_commit for r in rs])} "
            f"| {fmt([r.latency_p50_ms for r in rs], 1)} "
            f"/ {fmt([r.latency_p99_ms for r in rs], 1)} "
            f"| {fmt([r.rounds_per_cpu_s for r in rs], 0)} |"
        )
    errors = {k: v for r in runs for k, v in r.errors.items()}
    lines += ["", f"Errors: {json.dumps(errors) if errors else 'none'}."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default=",".join(MODES), help=f"Some of {', '.join(MODES)}.")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--subscribers", type=int, default=200)
    parser.add_argument("--probes", type=int, default=20, help="Streams answered meanwhile.")
    parser.add_argument("--submissions", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--timeout", type=float, default=300, help="Seconds one run may take.")
    parser.add_argument("--json", action="store_true", help="Print every run as JSON.")
    args = parser.parse_args(argv)
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if bad := [m for m in args.modes if m not in MODES]:
        parser.error(f"unknown mode {bad[0]!r}: one of {', '.join(MODES)}")
    if args.subscribers + args.probes > USERS * 32:
        parser.error(f"at most {USERS * 32} streams (the default per-user stream limit)")
    if any(m.startswith("postgres") for m in args.modes) and (why := postgres_unreachable()):
        parser.error(why)
    runs = [one_run(mode, args) for _ in range(args.runs) for mode in args.modes]
    print(json.dumps([asdict(r) for r in runs], indent=2) if args.json else report(runs, args))


if __name__ == "__main__":
    main()
