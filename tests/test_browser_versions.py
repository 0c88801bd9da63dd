"""The page: a task's agent version, a migration from the task's controls, and a
task no live worker serves saying so (issue 43, item 1), in headless Chromium."""

from __future__ import annotations

import re

import pytest

from support.browser import Page, expect, gates, page, server, shot, sign_in, start_task, status
from support.server_live import LiveServer

pytestmark = pytest.mark.browser
__all__ = ["gates", "page", "server"]  # the fixtures this module uses from support.browser


@pytest.mark.slow
def test_migrate_from_the_page_and_a_task_no_worker_serves_says_so(
    page: Page, server: LiveServer
) -> None:
    sign_in(page, server, "bob")
    start_task(page, "approver", "Email Bob.")
    expect(status(page)).to_have_attribute("data-status", "waiting")
    expect(page.locator("#task-version")).to_have_text(re.compile(r"^@[0-9a-f]{12}$"))
    first = page.locator("#task-version").inner_text()[1:]  # its fingerprint
    expect(page.locator("#unserved")).to_be_hidden()
    page.once("dialog", lambda dialog: dialog.accept("v9"))
    page.click("#migrate")
    expect(page.locator("#task-version")).to_have_text("@v9")
    moved = f"Migrated from approver@{first} to approver@v9"
    expect(page.locator(".notice", has_text=moved)).to_be_visible()
    card = page.locator('.tool-card:has(.tool-name:text("send_email"))')
    card.locator("button.approve").click()
    # Runnable now, but no worker serves v9: the task and the list say so.
    why = "waiting for approver@v9: no worker serves it"
    expect(status(page)).to_have_attribute("data-status", "pending")
    expect(page.locator("#unserved")).to_have_text(why)
    expect(page.locator(".task-item.selected .unserved")).to_have_text(why)
    shot(page, "30-unserved")
    page.once("dialog", lambda dialog: dialog.accept(first))
    page.click("#migrate")
    expect(status(page)).to_have_attribute("data-status", "completed")
    expect(page.locator("#unserved")).to_be_hidden()
    expect(page.locator("#migrate")).to_be_disabled()
