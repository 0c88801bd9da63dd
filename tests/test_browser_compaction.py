"""The page marks a compaction: the rounds it summarised and the summary the model
sees instead, in real headless Chromium."""

from __future__ import annotations

import pytest

from support.browser import Page, expect, gates, page, server, sign_in, start_task, status
from support.server_live import LiveServer

pytestmark = pytest.mark.browser
__all__ = ["gates", "page", "server"]  # the fixtures this module uses from support.browser


@pytest.mark.slow
def test_the_page_shows_a_compaction_and_its_summary(page: Page, server: LiveServer) -> None:
    sign_in(page, server)
    start_task(page, "reader", "Read the pages.")
    expect(status(page)).to_have_attribute("data-status", "completed")
    block = page.locator(".compaction").first
    expect(block).to_contain_text("Rounds 1–")
    expect(block).to_contain_text("summarised")
    block.locator("summary").click()
    expect(block.locator(".text")).to_contain_text("last page")
    page.click("#rounds-panel summary")
    expect(page.locator("#rounds .round").first).to_contain_text("compacted in the model's view")
