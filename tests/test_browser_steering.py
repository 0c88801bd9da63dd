"""The page's round list and "Fork from here", in real headless Chromium."""

from __future__ import annotations

import pytest

from support.browser import Page, expect, gates, page, server, shot, sign_in, start_task, status
from support.server_live import LiveServer

pytestmark = pytest.mark.browser
__all__ = ["gates", "page", "server"]  # the fixtures this module uses from support.browser


def test_rounds_list_and_fork_from_here(page: Page, server: LiveServer) -> None:
    sign_in(page, server)
    start_task(page, "parent", "Delegate a greeting.")
    expect(status(page)).to_have_attribute("data-status", "completed")
    source_id = page.locator("#task-id").inner_text()
    page.click("#rounds-panel summary")
    rounds = page.locator("#rounds .round")
    expect(rounds).to_have_count(2)
    expect(rounds.nth(0)).to_have_attribute("data-status", "complete")
    expect(rounds.nth(0)).to_contain_text("delegate → ok: Hello from quick.")
    expect(rounds.nth(1)).to_contain_text("Delegated.")
    expect(page.locator("#forked-from")).to_be_hidden()
    shot(page, "20-rounds")

    page.fill("#fork-message", "Now <b>another</b> one.")
    rounds.nth(0).locator("button.fork").click()
    # The page opens the fork: a new task, linked to its source, that runs to the end.
    expect(page.locator("#task-id")).not_to_have_text(source_id)
    expect(page.locator("#forked-from")).to_have_text(f"Forked from {source_id} at round 1")
    expect(status(page)).to_have_attribute("data-status", "completed")
    expect(page.locator(".bubble.user .text").last).to_have_text("Now <b>another</b> one.")
    expect(page.locator("#rounds .round")).to_have_count(2)
    # The delegated sub-task of round 1 was copied, not run again: one card, one result.
    expect(page.locator('.tool-card:has(.tool-name:text("delegate"))')).to_have_count(1)
    shot(page, "21-forked")
    # Back to the source through the link: it is unchanged.
    page.click("#forked-from a")
    expect(page.locator("#task-id")).to_have_text(source_id)
    expect(page.locator(".bubble.user")).to_have_count(1)
