"""The page shows my task counts per status and filters the list by status and queue
(real headless Chromium against `duragent serve`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from support.browser import ARGS, CHROMIUM, TIMEOUT, sign_in
from support.server_live import TOKENS, LiveServer, live_server

pytestmark = pytest.mark.browser
sync_api = pytest.importorskip("playwright.sync_api")
expect = sync_api.expect


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing: apt-get install -y chromium")
    with live_server(tmp_path_factory.mktemp("counts"), workers=1) as s:
        yield s


@pytest.mark.slow
def test_counts_and_filters(server: LiveServer) -> None:
    headers = {"Authorization": f"Bearer {TOKENS['alice']}"}
    made = {}
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as http:
        for name, body in {
            "q1": {"agent": "quick", "input": "a", "queue": "reports"},
            "q2": {"agent": "quick", "input": "b"},
            "held": {"agent": "quick", "input": "c", "start_at": "2099-01-01T00:00:00Z"},
        }.items():
            r = http.post("/v1/tasks", json=body)
            assert r.status_code == 201, r.text
            made[name] = r.json()["id"]
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        page = browser.new_page()
        page.set_default_timeout(TIMEOUT)
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        try:
            sign_in(page, server)
            counts = page.locator("#counts")
            expect(counts.locator('[data-status="completed"]')).to_have_text("2 completed")
            expect(counts.locator('[data-status="pending"]')).to_have_text("1 pending")
            expect(counts).to_contain_text("in 2 queues")
            expect(page.locator(".task-item")).to_have_count(3)
            page.select_option("#filter-status", "pending")
            expect(page.locator(".task-item")).to_have_count(1)
            expect(page.locator(".task-item")).to_have_attribute("data-id", made["held"])
            page.select_option("#filter-status", "")
            page.fill("#filter-queue", "reports")
            expect(page.locator(".task-item")).to_have_count(1)
            expect(page.locator(".task-item")).to_have_attribute("data-id", made["q1"])
            page.fill("#filter-queue", "nothing-here")
            expect(page.locator("#tasks .empty")).to_have_text("No tasks match.")
        finally:
            browser.close()
        assert errors == [], f"JavaScript errors on the page: {errors}"
