"""Prometheus metrics of real `duragent worker` and `duragent serve` processes, scraped."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("prometheus_client", reason="the metrics extra is part of the dev install")

from prometheus_client.parser import text_string_to_metric_families

from duragent import Runtime
from duragent.metrics import OTHER_QUEUES, count_tasks
from support.server_live import TOKENS, duragent, free_port, stop, wait_healthy
from support.workerlib import WorkerProc
from worker_agents import AGENTS, build_agents

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return sum(v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls))


def wait_listening(port: int, proc: object, log: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:  # type: ignore[attr-defined]
            raise RuntimeError(f"process exited:\n{log.read_text()}")
        try:
            httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=1.0)
            return
        except httpx.TransportError:
            time.sleep(0.05)
    raise TimeoutError(f"no metrics on {port}:\n{log.read_text()}")


@pytest.mark.slow
async def test_worker_metrics_are_scraped_from_a_real_process(tmp_path: Path) -> None:
    url, port, log = f"sqlite:///{tmp_path}/m.db", free_port(), tmp_path / "worker.log"
    proc = duragent(
        "worker",
        "--store",
        url,
        "--agents",
        "worker_agents:AGENTS",
        "--lease-ttl",
        "3",
        "--poll-interval",
        "0.1",
        "--metrics-port",
        str(port),
        log=log,
    )
    try:
        await asyncio.to_thread(wait_listening, port, proc, log)
        async with Runtime(url, agents=AGENTS, run_worker=False) as rt:
            subs = [await rt.submit("researcher", f"q{i}") for i in range(2)]
            subs.append(await rt.submit("researcher", "q2", queue="reports"))
            for sub in subs:
                assert (await sub.wait(30)).output == "42"
        async with Runtime(url, agents=build_agents("v9"), run_worker=False) as rt:
            await rt.submit("researcher", "for a version no worker serves")
        samples = await asyncio.to_thread(scrape, port)
    finally:
        stop(proc)
    # By status and queue (the default queue is the agent's name), counted in the store.
    assert value(samples, "duragent_tasks", status="completed", queue="researcher") == 2
    # A queue nobody declared is not a series of its own (any client could add them).
    assert value(samples, "duragent_tasks", status="completed", queue="(other)") == 1
    assert value(samples, "duragent_tasks", queue="reports") == 0
    assert value(samples, "duragent_tasks", status="running") == 0
    # Pending on a version no live worker serves: counted, by agent and version.
    assert value(samples, "duragent_tasks_unserved", agent="researcher", version="v9") == 1
    assert value(samples, "duragent_tasks_unserved") == 1
    assert value(samples, "duragent_task_runs_total", agent="researcher") == 3
    assert value(samples, "duragent_rounds_total", agent="researcher") == 6  # tool round + answer
    assert value(samples, "duragent_commits_total", outcome="ok") >= 9
    assert value(samples, "duragent_commit_seconds_count") == value(
        samples, "duragent_commits_total"
    )
    assert value(samples, "duragent_model_call_seconds_count", agent="researcher") == 6
    assert value(samples, "duragent_model_tokens_total", kind="output") > 0
    assert value(samples, "duragent_tool_call_seconds_count", tool="nap", outcome="ok") == 3
    assert value(samples, "duragent_tool_call_seconds_sum", tool="nap") >= 0.6  # three 0.2 s naps
    for name in ("duragent_takeovers_total", "duragent_model_retries_total"):
        assert value(samples, name) == 0
    assert ("duragent_lease_renew_lag_seconds_count", ()) in samples


async def test_queue_labels_are_declared_queues_and_one_other(tmp_path: Path) -> None:
    async with Runtime(f"sqlite:///{tmp_path}/q.db", agents=AGENTS, run_worker=False) as rt:
        for i in range(50):  # fifty names a client made up
            await rt.submit("researcher", "q", queue=f"made-up-{i}")
        await rt.submit("researcher", "q")  # its agent's queue
        await rt.submit("researcher", "q", queue="reports")
        await rt.queue("reports", concurrency=2)  # declared: limits in the store
        counts = await count_tasks(rt.store, known=["researcher"])
    assert counts == {
        ("pending", "researcher"): 1,
        ("pending", "reports"): 1,
        ("pending", OTHER_QUEUES): 50,
    }


@pytest.mark.slow
async def test_serve_metrics_are_on_their_own_port(tmp_path: Path) -> None:
    api_port, metrics_port, log = free_port(), free_port(), tmp_path / "serve.log"
    tokens = tmp_path / "tokens.txt"
    tokens.write_text("".join(f"{u}:{t}\n" for u, t in TOKENS.items()))
    proc = duragent(
        "serve",
        "--store",
        f"sqlite:///{tmp_path}/s.db",
        "--agents",
        "server_agents:agents",
        "--port",
        str(api_port),
        "--tokens",
        str(tokens),
        "--metrics-port",
        str(metrics_port),
        log=log,
    )
    api = f"http://127.0.0.1:{api_port}"
    try:
        await asyncio.to_thread(wait_healthy, api, proc, log)
        auth = {"Authorization": f"Bearer {TOKENS['alice']}"}
        async with httpx.AsyncClient(base_url=api, headers=auth, timeout=30) as client:
            r = await client.post("/v1/tasks", json={"agent": "quick", "input": "hi"})
            assert r.status_code in (200, 201, 202), r.text
            task_id = r.json()["id"]
            for _ in range(300):
                if (await client.get(f"/v1/tasks/{task_id}")).json()["status"] == "completed":
                    break
                await asyncio.sleep(0.1)
            # The API port does not serve the cluster's metrics to its users.
            assert (await client.get("/metrics")).status_code == 404
        samples = await asyncio.to_thread(scrape, metrics_port)
    finally:
        stop(proc)
    assert value(samples, "duragent_tasks", status="completed", queue="quick") == 1
    assert value(samples, "duragent_rounds_total", agent="quick") == 1
    assert value(samples, "duragent_commits_total") >= 1


@pytest.mark.slow
async def test_a_takeover_after_sigkill_is_counted(tmp_path: Path) -> None:
    url, port, log = f"sqlite:///{tmp_path}/m.db", free_port(), tmp_path / "worker.log"
    dying = WorkerProc(url, ttl=1.0, HOLD="nap")
    try:
        async with Runtime(url, agents=AGENTS, run_worker=False) as rt:
            sub = await rt.submit("researcher", "q")
            await dying.wait_output("AT nap")
            dying.signal(signal.SIGKILL)
            dying.stop()
            proc = duragent(
                "worker",
                "--store",
                url,
                "--agents",
                "worker_agents:AGENTS",
                "--lease-ttl",
                "1",
                "--poll-interval",
                "0.1",
                "--metrics-port",
                str(port),
                log=log,
            )
            try:
                task = await sub.wait(30)
                samples = await asyncio.to_thread(scrape, port)
            finally:
                stop(proc)
    finally:
        dying.stop()
    assert task.status.value == "completed" and task.restarts == 1
    assert value(samples, "duragent_takeovers_total", agent="researcher") == 1
    assert value(samples, "duragent_task_runs_total", agent="researcher") == 1
    assert value(samples, "duragent_tool_call_seconds_count", tool="nap") == 0  # not re-run
