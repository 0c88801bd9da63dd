"""A child process for webhook crash tests: runs one task whose status changes
call a webhook, then waits to be killed (or exits once the outbox is empty).

    python tests/webhook_agent.py STORE_URL WEBHOOK_URL MODE

MODE "run": run the task, print `DONE <status> <id>`, then block (the test
SIGKILLs it). MODE "deliver": run a worker until the outbox is empty, print
`DELIVERED` and exit. The secret comes from DURAGENT_WEBHOOK_SECRET; a child
started without it writes events and never sends them.
"""

from __future__ import annotations

import asyncio
import sys

from duragent import Agent, Runtime, ScriptedModel
from duragent.webhooks import OUTBOX, WebhookDelivery

URL, HOOK, MODE = sys.argv[1:4]
agent = Agent(name="hooked", model=ScriptedModel(["All done."]), webhook=HOOK)


async def main() -> None:
    delivery = WebhookDelivery(base_delay=0.05, poll_interval=0.1)
    rt = Runtime(URL, agents=[agent], lease_ttl=1.0, poll_interval=0.1, webhook_delivery=delivery)
    async with rt:
        if MODE == "run":
            sub = await rt.submit("hooked", "go", request_id="hook-task")
            task = await sub.wait(timeout=60)
            print(f"DONE {task.status.value} {task.id}", flush=True)
            await asyncio.sleep(3600)
        rt.start_worker()
        while await rt.store.list_documents(OUTBOX):
            await rt.store.wait_for_change(0.1)
        print("DELIVERED", flush=True)


asyncio.run(main())
