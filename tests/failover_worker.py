"""A worker process for the database failover tests (tests/test_db_failover.py).

`python failover_worker.py URL ACKS [--ttl S] [--concurrency N] [--poll S]` runs a
Runtime's worker for worker_agents.AGENTS on the PostgreSQL store at URL, and
appends to the file ACKS one line per entry whose commit the store acknowledged
(`<unix time> <task id> <seq> <kind>`), written as soon as the commit returns:
what this worker was told is durable, for the test to look for on the server
it failed over to. Prints `READY` once its worker runs; runs until killed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Iterable
from typing import Any

from duragent import Runtime
from duragent.store._commits import Commit, CommitResult, PendingCommit
from duragent.store._postgres import PostgresStore
from duragent.types import Entry, Task
from worker_agents import AGENTS


class AckingStore(PostgresStore):
    """A PostgreSQL store that writes down every entry it acknowledged."""

    def __init__(self, url: str, acks: str, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self._acks = os.open(acks, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _ack(self, entries: Iterable[Entry]) -> None:
        now = time.time()
        lines = "".join(f"{now:.6f} {e.task_id} {e.seq} {e.kind.value}\n" for e in entries)
        if lines:
            os.write(self._acks, lines.encode())

    async def commit(self, commit: Commit) -> CommitResult:
        result = await super().commit(commit)
        self._ack(result.entries)
        return result

    def commit_soon(self, commit: Commit) -> PendingCommit:
        pending = super().commit_soon(commit)
        assert pending.future is not None

        def landed(future: asyncio.Future[CommitResult]) -> None:
            if not future.cancelled() and future.exception() is None:
                self._ack(future.result().entries)

        pending.future.add_done_callback(landed)
        return pending

    async def claim_tasks(self, worker_id: str, n: int = 1, **kwargs: Any) -> list[Task]:
        claimed = await super().claim_tasks(worker_id, n, **kwargs)
        now = time.time()
        lines = "".join(f"{now:.6f} {t.id} {t.last_seq} status\n" for t in claimed)
        if lines:
            os.write(self._acks, lines.encode())
        return claimed


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("acks")
    parser.add_argument("--ttl", type=float, default=3.0)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--poll", type=float, default=0.5)
    args = parser.parse_args()
    store = AckingStore(args.url, args.acks)
    async with Runtime(
        store,
        agents=AGENTS,
        concurrency=args.concurrency,
        lease_ttl=args.ttl,
        poll_interval=args.poll,
    ) as rt:
        rt.start_worker()
        print("READY", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
