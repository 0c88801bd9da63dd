"""The page shows a task's deadline, and the failure once it passed, in real headless Chromium."""

from __future__ import annotations

from datetime import datetime

import httpx
import pytest

from support.browser import Page, expect, gates, page, server, shot, sign_in, status
from support.server_live import LiveServer

pytestmark = pytest.mark.browser
__all__ = ["gates", "page", "server"]  # the fixtures this module uses from test_browser


@pytest.mark.slow
def test_the_deadline_is_shown_and_a_waiting_task_fails_at_it(
    page: Page, server: LiveServer
) -> None:
    body = {"agent": "approver", "input": "Email Bob.", "deadline": 1.5}
    r = httpx.post(f"{server.url}/v1/tasks", json=body, headers=server.headers(), timeout=30)
    assert r.status_code == 201, r.text
    task = r.json()
    sign_in(page, server)
    page.evaluate("id => { location.hash = 'task=' + id; }", task["id"])
    expect(page.locator("#task-id")).to_have_text(task["id"])
    deadline = page.locator("#deadline")
    expect(deadline).to_be_visible()
    expect(deadline).to_have_attribute("data-deadline", task["deadline"])
    expect(deadline).to_contain_text("Deadline ")
    # Waiting for an approval nobody gives: the worker fails it at the deadline.
    expect(status(page)).to_have_attribute("data-status", "failed")
    expect(status(page)).to_contain_text("deadline")
    expect(page.locator("#task-error")).to_contain_text(
        f"deadline exceeded: {datetime.fromisoformat(task['deadline']).isoformat()}"
    )
    expect(page.locator("#retry")).to_be_enabled()
    shot(page, "30-deadline")

    # A task without a deadline shows none.
    plain = httpx.post(
        f"{server.url}/v1/tasks",
        json={"agent": "quick", "input": "hi"},
        headers=server.headers(),
        timeout=30,
    ).json()
    page.evaluate("id => { location.hash = 'task=' + id; }", plain["id"])
    expect(page.locator("#task-id")).to_have_text(plain["id"])
    expect(page.locator("#deadline")).to_be_hidden()
