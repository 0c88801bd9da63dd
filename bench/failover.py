"""Failover: SIGKILL the worker running a task; time until another worker's first commit.

The owner process runs a long task; a standby worker process waits on the same
store. At a random moment the owner is SIGKILLed; the parent polls the store
for the standby's takeover (the `status` entry with payload takeover=true, the
new owner's first commit) and reports its commit time minus the kill time.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from typing import IO

from bench.common import child_env
from duragent import open_store
from duragent.types import EntryKind


def _spawn(url: str, role: str, ttl: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "bench.failover_child", url, role, ttl],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,  # never read: a full pipe would block the child
        text=True,
        env=child_env(),
    )


def _wait_line(stream: IO[str] | None, marker: str, timeout: float = 60) -> None:
    assert stream is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            raise RuntimeError(f"child exited before printing {marker}")
        if line.startswith(marker):
            return
    raise RuntimeError(f"no {marker} within {timeout}s")


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=10)


async def _takeover_time(url: str, timeout: float) -> float:
    store = open_store(url)
    await store.open()
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            page = await store.list_tasks()
            for task in page.tasks:
                for e in await store.entries(task.id, kinds=[EntryKind.STATUS]):
                    if e.payload.get("takeover"):
                        return e.created_at.timestamp()
            await asyncio.sleep(0.01)
        raise RuntimeError(f"no takeover within {timeout}s")
    finally:
        await store.close()


def trial(workdir: str, ttl: str) -> float:
    """Seconds from SIGKILL of the owner to the standby's takeover commit."""
    os.makedirs(workdir, exist_ok=True)
    url = f"sqlite:///{workdir}/failover.db"
    lease = 30.0 if ttl == "default" else float(ttl)
    owner = _spawn(url, "owner", ttl)
    standby = None
    try:
        _wait_line(owner.stdout, "RUNNING")
        standby = _spawn(url, "standby", ttl)
        _wait_line(standby.stdout, "READY")
        # A random moment within one heartbeat period (lease_ttl / 3), so the kill
        # lands anywhere between two lease renewals.
        time.sleep(random.uniform(0.2, 0.2 + lease / 3))
        killed_at = time.time()
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(10)
        took_over = asyncio.run(_takeover_time(url, timeout=lease * 3 + 30))
        return took_over - killed_at
    finally:
        _stop(owner)
        if standby is not None:
            _stop(standby)
