"""After a crash, the page says the task waits for its previous worker's lease, and
then for another worker (real headless Chromium against `duragent serve`)."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from duragent.store import open_store
from duragent.types import Task
from support.browser import Page, expect, gates, page, server, sign_in
from support.server_live import LiveServer

pytestmark = pytest.mark.browser
__all__ = ["gates", "page", "server"]  # the fixtures this module uses from support.browser


async def held_by_a_dead_worker(store_url: str, ttl: float) -> str:
    """A running task of alice's whose worker is gone: the state a SIGKILL leaves.
    Its agent is one no worker of the server runs, so nobody takes it over."""
    store = open_store(store_url)
    await store.open()
    try:
        task, _ = await store.create_task(Task(agent="gone", owner="alice", input="hi"))
        claimed = await store.claim_task("dead-host:4242", task_id=task.id, ttl=ttl)
        assert claimed is not None
        return task.id
    finally:
        await store.close()


@pytest.mark.slow
def test_a_crashed_workers_lease_is_counted_down_then_said_to_have_ended(
    page: Page, server: LiveServer
) -> None:
    with ThreadPoolExecutor(1) as pool:  # Playwright's loop runs in this thread
        task_id = pool.submit(asyncio.run, held_by_a_dead_worker(server.store_url, 4.0)).result()
    r = httpx.get(f"{server.url}/v1/tasks/{task_id}", headers=server.headers(), timeout=30)
    assert r.status_code == 200 and r.json()["lease_expires_at"] is not None, r.text
    sign_in(page, server)
    page.evaluate("id => { location.hash = 'task=' + id; }", task_id)
    expect(page.locator("#task-id")).to_have_text(task_id)
    lease = page.locator("#lease")
    expect(lease).to_be_visible()
    expect(lease).to_have_attribute("data-until", r.json()["lease_expires_at"])
    expect(lease).to_have_attribute("data-state", "held")
    expect(lease).to_contain_text("s more")
    # No renewal comes: once the lease has ended (and a fresh read agrees), the page
    # says the task waits for another worker.
    expect(lease).to_have_attribute("data-state", "expired")
    expect(lease).to_contain_text("waiting for another worker to take it over")


@pytest.mark.slow
def test_a_task_that_is_not_running_shows_no_lease(page: Page, server: LiveServer) -> None:
    body = {"agent": "approver", "input": "Email Bob."}
    r = httpx.post(f"{server.url}/v1/tasks", json=body, headers=server.headers(), timeout=30)
    assert r.status_code == 201, r.text
    sign_in(page, server)
    page.evaluate("id => { location.hash = 'task=' + id; }", r.json()["id"])
    expect(page.locator("#status")).to_have_attribute("data-status", "waiting")
    expect(page.locator("#lease")).to_be_hidden()
