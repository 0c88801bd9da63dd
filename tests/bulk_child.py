"""A child process for the bulk-operation crash test: a worker that runs bulk operations.

    python tests/bulk_child.py STORE_URL KILL_AT

Runs the store's bulk operations (only those: its runtime defines no other
agent) until none is left running, then exits 0. With KILL_AT = n > 0, once the
n-th task of an operation has been acted on (the trace point `bulk_task`,
after the action's commit), it prints `AT <n>` and blocks for the test to SIGKILL.
"""

from __future__ import annotations

import asyncio
import sys

from duragent import Runtime

URL, KILL_AT = sys.argv[1], int(sys.argv[2])
acted: list[str] = []


async def trace(point: str, **info: object) -> None:
    if point == "bulk_task":
        acted.append(str(info["target"]))
        if len(acted) == KILL_AT:
            print(f"AT {KILL_AT}", flush=True)
            await asyncio.sleep(3600)


async def main() -> None:
    async with Runtime(URL, worker_id="bulk-child", lease_ttl=1.0, trace=trace) as rt:
        await rt.resume()
        while True:
            ops, _ = await rt.bulk_operations()
            running = [op for op in ops if op.status == "running"]
            if not running:
                break
            for op in running:
                await rt.wait(op.id, timeout=60)
    print(f"ACTED {len(acted)}", flush=True)


asyncio.run(main())
