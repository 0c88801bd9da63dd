"""Fork one task again and again until SIGKILLed (for test_steering_crash.py).

    python fork_child.py STORE_URL SOURCE_ID ROUND

Prints `forked <i> <id>` after each fork is committed.
"""

from __future__ import annotations

import asyncio
import sys

from duragent import Edit, Runtime


async def main(url: str, source: str, at_round: int) -> None:
    async with Runtime(url, run_worker=False) as rt:
        print("ready", flush=True)
        for i in range(1_000):
            edit = Edit(append_user=f"fork {i}")
            sub = await rt.fork(source, at_round, edit=edit, request_id=f"fork-{i}")
            print(f"forked {i} {sub.task_id}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
