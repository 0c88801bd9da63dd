"""The page's Queues view shows each queue's limits next to my task counts in it,
read-only for a non-admin, as GET /v1/queues gives them; an admin's change over
REST shows up without a reload (real headless Chromium against `duragent serve`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
    with live_server(tmp_path_factory.mktemp("queues"), workers=1, args=["--admin", "alice"]) as s:
        yield s


def client(server: LiveServer, user: str) -> httpx.Client:
    headers = {"Authorization": f"Bearer {TOKENS[user]}"}
    return httpx.Client(base_url=server.url, headers=headers, timeout=30)


def put_queue(server: LiveServer, name: str, limits: dict[str, Any]) -> None:
    with client(server, "alice") as http:
        r = http.put(f"/v1/queues/{name}", json=limits)
        assert r.status_code == 200, r.text


@pytest.mark.slow
def test_queue_limits_are_shown_next_to_my_counts(server: LiveServer) -> None:
    put_queue(
        server,
        "reports",
        {"concurrency": 3, "per_worker": 1, "per_owner": 2, "rate": {"tasks": 10, "seconds": 60}},
    )
    put_queue(server, "quiet", {"per_owner": 1, "ttl": 86400})
    with client(server, "bob") as http:
        # Setting limits stays an admin's: bob's page only reads them.
        assert http.put("/v1/queues/reports", json={"concurrency": 9}).status_code == 403
        for body in (
            {"agent": "quick", "input": "a", "queue": "reports"},
            {"agent": "quick", "input": "b", "start_at": "2099-01-01T00:00:00Z"},
            {"agent": "quick", "input": "c", "queue": "<b>bold</b>"},
        ):
            r = http.post("/v1/tasks", json=body)
            assert r.status_code == 201, r.text
    with client(server, "alice") as http:  # alice's task is not counted on bob's page
        r = http.post("/v1/tasks", json={"agent": "quick", "input": "x", "queue": "reports"})
        assert r.status_code == 201, r.text

    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        page = browser.new_page()
        page.set_default_timeout(TIMEOUT)
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        try:
            sign_in(page, server, "bob")
            page.click('.view-tab[data-view="queues"]')
            queues = page.locator("#queues")
            expect(queues).to_be_visible()
            expect(page.locator("#queues-counted")).to_have_text("(my tasks)")
            reports = queues.locator('.queue[data-queue="reports"]')
            expect(reports.locator(".queue-name")).to_have_text("reports")
            expect(reports.locator('[data-status="completed"]')).to_have_text("1 completed")
            expect(reports.locator('[data-limit="concurrency"]')).to_have_text("3 at once")
            expect(reports.locator('[data-limit="per_worker"]')).to_have_text("1 per worker")
            expect(reports.locator('[data-limit="per_owner"]')).to_have_text("2 per owner")
            expect(reports.locator('[data-limit="rate"]')).to_have_text("10 starts per 1 min")
            quiet = queues.locator('.queue[data-queue="quiet"]')
            expect(quiet.locator(".queue-counts")).to_have_text("no tasks")
            expect(quiet.locator('[data-limit="per_owner"]')).to_have_text("1 per owner")
            expect(quiet.locator('[data-limit="ttl"]')).to_have_text("kept 1 d after the end")
            quick = queues.locator('.queue[data-queue="quick"]')
            expect(quick.locator('[data-status="pending"]')).to_have_text("1 pending")
            expect(quick.locator(".queue-limits")).to_have_text("no limits")
            bold = queues.locator('.queue[data-queue="<b>bold</b>"]')
            expect(bold.locator(".queue-name")).to_have_text("<b>bold</b>")  # text, not markup
            assert queues.locator("b").count() == 0
            assert queues.locator("button, input, select, form").count() == 0  # read-only

            # An admin replaces the limits; the open page shows the new ones.
            put_queue(server, "reports", {"concurrency": 5})
            expect(reports.locator('[data-limit="concurrency"]')).to_have_text("5 at once")
            expect(reports.locator(".limit")).to_have_count(1)

            # An admin's page counts everyone's tasks (GET /v1/queues says so).
            admin = browser.new_page()
            admin.set_default_timeout(TIMEOUT)
            admin.on("pageerror", lambda exc: errors.append(str(exc)))
            sign_in(admin, server, "alice")
            admin.click('.view-tab[data-view="queues"]')
            expect(admin.locator("#queues-counted")).to_have_text("(everyone's tasks)")
            everyone = admin.locator('#queues .queue[data-queue="reports"]')
            expect(everyone.locator('[data-status="completed"]')).to_have_text("2 completed")
        finally:
            browser.close()
        assert errors == [], f"JavaScript errors on the page: {errors}"
