"""What a new user sees first on the page (real headless Chromium against `duragent serve`):
what a waiting task waits for, whether a running task's worker lives, a phone-sized
screen, the favicon, and where tokens come from."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from duragent.runtime._presence import WORKERS_SCOPE
from duragent.store import open_store
from duragent.store._commits import Commit, DocumentWrite
from duragent.types import Task, utcnow
from support.browser import (
    Page,
    expect,
    gates,
    page,
    server,
    shot,
    sign_in,
    start_held_task,
    status,
)
from support.server_live import LiveServer

pytestmark = pytest.mark.browser
__all__ = ["gates", "page", "server"]  # the fixtures this module uses from support.browser


def create(server: LiveServer, agent: str, text: str) -> str:
    body = {"agent": agent, "input": text}
    r = httpx.post(f"{server.url}/v1/tasks", json=body, headers=server.headers(), timeout=30)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def open_task(page: Page, task_id: str) -> None:
    page.evaluate("id => { location.hash = 'task=' + id; }", task_id)
    expect(page.locator("#task-id")).to_have_text(task_id)


@pytest.mark.slow
def test_a_task_waiting_for_an_approval_says_so_and_names_the_tool(
    page: Page, server: LiveServer
) -> None:
    approval = create(server, "approver", "Email Bob.")
    question = create(server, "asker", "Where to?")
    sign_in(page, server)
    open_task(page, approval)
    expect(status(page)).to_have_attribute("data-status", "waiting")
    expect(status(page)).to_have_text("waiting for approval · send_email")
    row = page.locator(f'.task-item[data-id="{approval}"] .badge')
    expect(row).to_have_text("waiting for approval · send_email")
    shot(page, "42-waiting-for-approval")
    # A question (the same status_reason, "input") reads as one.
    expect(page.locator(f'.task-item[data-id="{question}"] .badge')).to_have_text(
        "waiting for your answer"
    )
    listed = httpx.get(f"{server.url}/v1/tasks", headers=server.headers(), timeout=30).json()
    waits = {t["id"]: t["waiting_on"] for t in listed["tasks"]}
    assert waits[approval] == [{"wait": "approval", "tool": "send_email"}]
    assert waits[question] == [{"wait": "input", "tool": None}]


async def held_by_a_worker_gone_silent(store_url: str) -> str:
    """A running task of alice's under a 10-minute lease whose worker last checked in
    two minutes ago (a SIGKILL's aftermath, its lease still running)."""
    store = open_store(store_url)
    await store.open()
    try:
        task, _ = await store.create_task(Task(agent="gone", owner="alice", input="hi"))
        worker = "dead-host:4242:0badc0de"
        claimed = await store.claim_task(worker, task_id=task.id, ttl=600)
        assert claimed is not None
        seen = utcnow() - timedelta(minutes=2)
        record = {
            "agents": ["gone"],
            "expires_at": (seen + timedelta(seconds=15)).isoformat(),
            "seen_at": seen.isoformat(),
            "every": 5.0,
        }
        await store.commit(Commit(documents=[DocumentWrite(WORKERS_SCOPE, worker, record)]))
        return task.id
    finally:
        await store.close()


@pytest.mark.slow
def test_the_lease_line_tells_a_live_worker_from_a_gone_one(
    page: Page, server: LiveServer, gates: Path
) -> None:
    sign_in(page, server)
    start_held_task(page, "alive-lease")  # runs on the server's own (live) worker
    lease = page.locator("#lease")
    expect(lease).to_have_attribute("data-state", "alive")
    expect(lease).to_contain_text("Its worker is alive")
    alive_text = lease.inner_text()
    shot(page, "43-lease-worker-alive")
    (gates / "alive-lease").touch()
    expect(status(page)).to_have_attribute("data-status", "completed")
    expect(lease).to_be_hidden()

    with ThreadPoolExecutor(1) as pool:  # Playwright's loop runs in this thread
        task_id = pool.submit(asyncio.run, held_by_a_worker_gone_silent(server.store_url)).result()
    r = httpx.get(f"{server.url}/v1/tasks/{task_id}", headers=server.headers(), timeout=30)
    assert r.json()["lease_worker_seen_at"] is not None, r.text
    open_task(page, task_id)
    expect(lease).to_have_attribute("data-state", "gone")
    expect(lease).to_contain_text("has not checked in for")
    expect(lease).to_contain_text("then another worker takes the task over")
    assert lease.inner_text() != alive_text
    shot(page, "44-lease-worker-gone")


@pytest.mark.slow
def test_a_phone_sized_screen_shows_my_tasks_first(page: Page, server: LiveServer) -> None:
    create(server, "quick", "Say hello.")
    page.set_viewport_size({"width": 390, "height": 844})
    sign_in(page, server)
    row = page.locator(".task-item").first
    expect(row).to_be_visible()
    box = row.bounding_box()
    assert box is not None
    assert box["y"] >= 0 and box["y"] + box["height"] <= 844, box  # on the first screen
    assert box["x"] >= 0 and box["x"] + box["width"] <= 390, box
    # ...and seen there, not clipped away inside a scrolled box.
    expect(row).to_be_in_viewport()
    shown = row.evaluate(
        "el => { const r = el.getBoundingClientRect(); return el.contains("
        "document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2)); }"
    )
    assert shown
    # Nothing wider than the screen (no sideways scrolling).
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    expect(page.locator("#new-task")).to_be_attached()  # still there, below the list
    shot(page, "40-phone-task-list")
    row.click()  # the task opens in view, below
    expect(page.locator("#task-title, .task-title").first).to_be_in_viewport()
    shot(page, "45-phone-task-open")


@pytest.mark.slow
def test_the_sign_in_page_says_where_tokens_come_from_and_has_an_icon(
    page: Page, server: LiveServer
) -> None:
    missing: list[str] = []
    page.on("response", lambda r: missing.append(r.url) if r.status == 404 else None)
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(server.url + "/")
    help_text = page.locator("#token-help")
    expect(help_text).to_be_visible()
    for said in ("duragent serve", "--tokens", "DURAGENT_TOKENS", "user:token"):
        expect(help_text).to_contain_text(said)
    shot(page, "41-phone-sign-in")
    icon = page.evaluate(
        "fetch('/favicon.ico').then(r => [r.status, r.headers.get('content-type')])"
    )
    assert icon == [200, "image/svg+xml"]
    linked = page.locator('link[rel="icon"]').get_attribute("href")
    assert httpx.get(f"{server.url}{linked}", timeout=30).status_code == 200
    assert missing == []
