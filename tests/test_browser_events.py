"""A tool's custom events (`ctx.emit`) on the page, in real headless Chromium."""

from __future__ import annotations

import pytest

from support.browser import Page, expect, gates, page, server, sign_in, start_task, status
from support.server_live import LiveServer

pytestmark = pytest.mark.browser
__all__ = ["gates", "page", "server"]  # the fixtures this module uses from support.browser


@pytest.mark.slow
def test_a_tools_custom_events_show_under_its_card(page: Page, server: LiveServer) -> None:
    sign_in(page, server, "alice")
    start_task(page, "importer", "Import a.csv.")
    expect(status(page)).to_have_attribute("data-status", "completed")
    card = page.locator('.tool-card:has(.tool-name:text("import_rows"))')
    events = card.locator(".tool-event")
    expect(events).to_have_count(2)
    expect(events.first.locator(".event-name")).to_have_text("batch_imported")
    expect(events.nth(1).locator(".event-data")).to_have_text('{"path":"a.csv","batch":2}')
