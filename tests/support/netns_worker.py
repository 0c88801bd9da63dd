"""The worker side of tests/test_postgres_netns.py, run inside a network namespace.

`python -m support.netns_worker URL SCHEMA LEASE_TTL` (tests/ on the path), then
one command a line on stdin, one JSON answer a line on stdout:

- `open`: open the store and start listening (LISTEN, as a worker does);
- `claim TASK TTL`: claim the task for a lease of TTL seconds;
- `hold TASK`: a commit in flight on one of the store's pooled sessions: its
  transaction open, the task's row locked (answers the backend's pid);
- `get TASK`: read the task; answers how long that took and what it raised.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from duragent.store._postgres import PostgresStore


async def main(url: str, schema: str, lease_ttl: float) -> None:
    store = PostgresStore(url, schema=schema, lease_ttl=lease_ttl)
    held: list[Any] = []  # pooled connections kept out of the pool on purpose
    while line := await asyncio.to_thread(sys.stdin.readline):
        command, *args = line.split()
        answer: dict[str, Any] = {}
        if command == "open":
            await store.open()
            store.watch_controls(lambda task_id: None)
            assert store._listener is not None
            await asyncio.wait_for(store._listener.ready.wait(), 30)
            answer["application_name"] = store.application_name
        elif command == "claim":
            claimed = await store.claim_task("w1", task_id=args[0], ttl=float(args[1]))
            answer["claimed"] = claimed is not None
        elif command == "hold":
            conn = store._pool.getconn()
            conn.execute("BEGIN")
            conn.execute("SELECT 1 FROM tasks WHERE id = %s FOR UPDATE", (args[0],))
            held.append(conn)
            answer["pid"] = conn.info.backend_pid
        elif command == "get":
            started = time.monotonic()
            try:
                await store.get_task(args[0])
                answer["error"] = None
            except Exception as exc:
                answer["error"], answer["message"] = type(exc).__name__, str(exc)
            answer["elapsed"] = time.monotonic() - started
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
