"""Bulk actions from the ops console, in real headless Chromium against `duragent serve`:
the list's filter, a dry-run count in a confirmation dialog, the operation started only
when confirmed and followed live in the "Bulk operations" view; purge needs the count
typed back, an empty filter an explicit "all my tasks"; each user sees only their own
operations; errors in one line; a phone-sized dialog (390 px) fits the screen."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from support.browser import ARGS, ARTIFACTS, CHROMIUM, TIMEOUT, Page, expect, shot, sign_in
from support.server_live import TOKENS, LiveServer, live_server

pytestmark = pytest.mark.browser
sync_api = pytest.importorskip("playwright.sync_api")

RETRIED = "Retried after the failure"  # the notice each retry commits to the task's log


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing: apt-get install -y chromium")
    with live_server(tmp_path_factory.mktemp("bulkui"), workers=2, args=["--admin", "alice"]) as s:
        yield s


def http(server: LiveServer, user: str) -> httpx.Client:
    headers = {"Authorization": f"Bearer {TOKENS[user]}"}
    return httpx.Client(base_url=server.url, headers=headers, timeout=30)


def submit(c: httpx.Client, agent: str, text: str, **body: Any) -> str:
    r = c.post("/v1/tasks", json={"agent": agent, "input": text, **body})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def finished(c: httpx.Client, task_id: str, status: str) -> None:
    r = c.get(f"/v1/tasks/{task_id}/wait", params={"until": "finished", "timeout": 30})
    assert r.status_code == 200, r.text
    assert r.json()["status"] == status, r.json()


def failed_flaky(c: httpx.Client, n: int, batch: str) -> list[str]:
    """Tasks of the `flaky` agent that fail once (their retry completes)."""
    ids = [
        submit(c, "flaky", f"fail {uuid.uuid4().hex} {i}", metadata={"batch": batch})
        for i in range(n)
    ]
    for tid in ids:
        finished(c, tid, "failed")
    return ids


def retries(c: httpx.Client, task_id: str) -> int:
    entries = c.get(f"/v1/tasks/{task_id}/entries", params={"limit": 1000}).json()["entries"]
    return sum(1 for e in entries if RETRIED in json.dumps(e.get("payload")))


def operations(c: httpx.Client) -> list[dict[str, Any]]:
    r = c.get("/v1/bulk")
    assert r.status_code == 200, r.text
    ops: list[dict[str, Any]] = r.json()["operations"]
    return ops


@pytest.fixture
def browser(server: LiveServer) -> Iterator[Any]:
    ARTIFACTS.mkdir(exist_ok=True)
    errors: list[str] = []
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        b.js_errors = errors
        try:
            yield b
        finally:
            b.close()
    assert errors == [], f"JavaScript errors on the page: {errors}"


def new_page(browser: Any, width: int = 1280, height: int = 860) -> Page:
    page: Page = browser.new_context(viewport={"width": width, "height": height}).new_page()
    page.set_default_timeout(TIMEOUT)
    page.on("pageerror", lambda exc: browser.js_errors.append(str(exc)))
    return page


@pytest.mark.slow
def test_retry_failed_tasks_of_one_agent_after_the_dry_run_count_cancel_touches_nothing(
    server: LiveServer, browser: Any
) -> None:
    batch = uuid.uuid4().hex[:8]
    with http(server, "alice") as c:
        ids = failed_flaky(c, 3, batch)
        done = submit(c, "quick", "hi", metadata={"batch": batch})  # not failed: not matched
        finished(c, done, "completed")
        before = len(operations(c))
    with http(server, "bob") as c:
        theirs = failed_flaky(c, 1, batch)  # bob's: never touched by alice's action

    page = new_page(browser)
    sign_in(page, server)
    page.select_option("#filter-status", "failed")
    page.select_option("#filter-agent", "flaky")
    page.fill("#filter-meta", f"batch:{batch}")
    expect(page.locator("#tasks .task-item")).to_have_count(3)
    dialog = page.locator("#bulk-dialog")

    # Cancel: the dialog goes, and nothing started or changed.
    page.select_option("#bulk-action", "retry")
    expect(dialog).to_be_visible()
    question = f"Retry 3 tasks matching: status failed · agent flaky · meta batch:{batch}?"
    expect(page.locator("#bulk-question")).to_have_text(question)
    expect(page.locator("#bulk-typed-row")).to_be_hidden()
    expect(page.locator("#bulk-all-row")).to_be_hidden()
    page.click("#bulk-cancel")
    expect(dialog).to_be_hidden()
    with http(server, "alice") as c:
        assert len(operations(c)) == before
        for tid in ids:
            assert c.get(f"/v1/tasks/{tid}").json()["status"] == "failed"
            assert retries(c, tid) == 0

    # Confirm: the operation starts and the view follows it to done, done == count.
    page.select_option("#bulk-action", "retry")
    expect(page.locator("#bulk-question")).to_have_text(question)
    shot(page, "40-bulk-confirm")
    page.click("#bulk-go")
    expect(dialog).to_be_hidden()
    expect(page.locator("#view-bulk")).to_be_visible()
    op = page.locator("#bulk-list .bulk-op").first
    expect(op).to_have_attribute("data-status", "done")
    expect(op.locator('[data-field="done"]')).to_have_text("3 done")
    expect(op.locator('[data-field="total"]')).to_have_text("3")
    expect(op.locator('[data-field="failed"]')).to_have_text("0 failed")
    shot(page, "41-bulk-done")
    op_id = op.get_attribute("data-id")
    with http(server, "alice") as c:
        got = c.get(f"/v1/bulk/{op_id}").json()
        assert (got["action"], got["status"], got["total"], got["done"]) == ("retry", "done", 3, 3)
        assert got["filter"]["owner"] == "alice"
        for tid in ids:  # retried once each: they complete on their retry
            finished(c, tid, "completed")
            assert retries(c, tid) == 1
        assert c.get(f"/v1/tasks/{done}").json()["status"] == "completed"
    with http(server, "bob") as c:
        assert c.get(f"/v1/tasks/{theirs[0]}").json()["status"] == "failed"
        assert retries(c, theirs[0]) == 0
    # The operation is a task: its link opens it.
    op.locator("a.bulk-task").click()
    expect(page.locator("#task-id")).to_have_text(str(op_id))


@pytest.mark.slow
def test_purge_needs_the_count_typed_and_bob_sees_only_his_operations(
    server: LiveServer, browser: Any
) -> None:
    batch = uuid.uuid4().hex[:8]
    with http(server, "alice") as c:  # alice's operation: bob never sees it
        r = c.post("/v1/bulk", json={"action": "pause", "filter": {"metadata": {"batch": batch}}})
        assert r.status_code == 202, r.text
        alices = r.json()["id"]
    with http(server, "bob") as c:
        ids = [submit(c, "quick", "hi", metadata={"batch": batch}) for _ in range(2)]
        for tid in ids:
            finished(c, tid, "completed")
        held = submit(c, "quick", "later", start_at="2099-01-01T00:00:00Z")  # pending: pausable

    page = new_page(browser)
    sign_in(page, server, "bob")
    page.fill("#filter-meta", f"batch:{batch}")
    expect(page.locator("#tasks .task-item")).to_have_count(2)
    page.select_option("#bulk-action", "purge")
    question = f"Purge 2 tasks matching: meta batch:{batch}?"
    expect(page.locator("#bulk-question")).to_have_text(question)
    go = page.locator("#bulk-go")
    expect(page.locator("#bulk-typed-row")).to_be_visible()
    expect(go).to_be_disabled()
    page.fill("#bulk-typed", "1")
    expect(go).to_be_disabled()
    page.fill("#bulk-typed", "2")
    expect(go).to_be_enabled()
    go.click()
    op = page.locator("#bulk-list .bulk-op").first
    expect(op).to_have_attribute("data-status", "done")
    expect(op.locator('[data-field="done"]')).to_have_text("2 done")
    with http(server, "bob") as c:
        for tid in ids:
            assert c.get(f"/v1/tasks/{tid}").status_code == 404
        mine = [o["id"] for o in operations(c)]
    assert alices not in mine
    shown = page.locator("#bulk-list .bulk-op")
    expect(shown).to_have_count(len(mine))
    assert {shown.nth(i).get_attribute("data-id") for i in range(len(mine))} == set(mine)

    # No criteria at all: "all my tasks" must be ticked before anything starts.
    page.click('.view-tab[data-view="tasks"]')
    page.click("#filter-clear")
    page.select_option("#bulk-action", "pause")
    expect(page.locator("#bulk-question")).to_contain_text("matching: all my tasks?")
    expect(page.locator("#bulk-all-row")).to_be_visible()
    expect(go).to_be_disabled()
    page.check("#bulk-all")
    expect(go).to_be_enabled()
    page.click("#bulk-cancel")
    with http(server, "bob") as c:
        assert [o["id"] for o in operations(c)] == mine
        assert c.get(f"/v1/tasks/{held}").json()["status"] == "pending"

    # Metadata that is no key:value: said in one line, nothing asked of the server.
    page.fill("#filter-meta", "no-colon")
    page.select_option("#bulk-action", "abort")
    expect(page.locator("#bulk-error")).to_have_text("metadata no-colon should be key:value")
    expect(page.locator("#bulk-dialog")).to_be_hidden()
    page.fill("#filter-meta", "")

    # A filter the server refuses (a link's search longer than 200 characters): its
    # answer in one line, as text; the filter stays.
    page.goto(f"{server.url}/#id_prefix={'t' * 250}")
    expect(page.locator("#filter-id_prefix")).to_have_value("t" * 250)
    page.select_option("#bulk-action", "retry")
    expect(page.locator("#bulk-error")).to_contain_text("id_prefix")
    expect(page.locator("#bulk-dialog")).to_be_hidden()
    expect(page.locator("#filter-id_prefix")).to_have_value("t" * 250)
    assert page.locator("#bulk-error").evaluate("(el) => el.children.length") == 0


@pytest.mark.slow
def test_the_bulk_dialog_at_390_px_wide(server: LiveServer, browser: Any) -> None:
    batch = "an-even-longer-value-that-goes-on-and-on-" + uuid.uuid4().hex
    with http(server, "alice") as c:
        failed_flaky(c, 1, batch)
    page = new_page(browser, 390, 844)
    sign_in(page, server)
    page.select_option("#filter-status", "failed")
    page.fill("#filter-meta", f"batch:{batch}")
    page.select_option("#bulk-action", "purge")
    expect(page.locator("#bulk-dialog")).to_be_visible()
    expect(page.locator("#bulk-question")).to_contain_text("Purge 1 task matching")
    for selector in ("#bulk-go", "#bulk-cancel", "#bulk-question", "#bulk-typed"):
        box = page.locator(selector).bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390, (selector, box)
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    wide = page.evaluate(
        """() => [...document.querySelectorAll('#bulk-dialog, #bulk-dialog *, #action-bar *')]
             .filter((el) => { const r = el.getBoundingClientRect();
                               return r.width > 0 && (r.right > 391 || r.left < -1); })
             .map((el) => el.id || el.className || el.tagName)"""
    )
    assert wide == [], f"wider than the screen: {wide}"
    shot(page, "42-bulk-390-dialog")
    page.click("#bulk-cancel")
    page.click('.view-tab[data-view="bulk"]')
    expect(page.locator("#view-bulk")).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth") <= 390


@pytest.mark.slow
def test_the_operations_view_follows_a_running_operation_to_done(
    server: LiveServer, browser: Any
) -> None:
    batch = uuid.uuid4().hex[:8]
    with http(server, "alice") as c:
        ids = [
            submit(c, "quick", "later", start_at="2099-01-01T00:00:00Z", metadata={"batch": batch})
            for _ in range(2)
        ]
        # Hold the next operation back: one start an hour on the operations' queue,
        # taken by a first operation (it matches nothing).
        r = c.put("/v1/queues/duragent.bulk", json={"rate": {"tasks": 1, "seconds": 3600}})
        assert r.status_code == 200, r.text
        try:
            first = c.post("/v1/bulk", json={"action": "pause", "filter": {"id_prefix": "none-"}})
            assert first.status_code == 202, first.text
            finished(c, first.json()["id"], "completed")
            page = new_page(browser)
            sign_in(page, server)
            page.fill("#filter-meta", f"batch:{batch}")
            expect(page.locator("#tasks .task-item")).to_have_count(2)
            page.select_option("#bulk-action", "pause")
            expect(page.locator("#bulk-question")).to_have_text(
                f"Pause 2 tasks matching: meta batch:{batch}?"
            )
            page.click("#bulk-go")
            op = page.locator("#bulk-list .bulk-op").first
            expect(op).to_have_attribute("data-status", "running")
            expect(op.locator('[data-field="status"]')).to_have_text("running")
            expect(op.locator('[data-field="done"]')).to_have_text("0 done")
            shot(page, "43-bulk-running")
        finally:
            assert c.delete("/v1/queues/duragent.bulk").status_code in (200, 204)
        # Released: the same view, never reloaded, reaches done.
        expect(op).to_have_attribute("data-status", "done")
        expect(op.locator('[data-field="done"]')).to_have_text("2 done")
        expect(op.locator('[data-field="total"]')).to_have_text("2")
        for tid in ids:
            assert c.get(f"/v1/tasks/{tid}").json()["status"] == "paused"


@pytest.mark.slow
def test_the_version_filter_narrows_the_list_and_migrate_asks_for_the_version(
    server: LiveServer, browser: Any
) -> None:
    batch = uuid.uuid4().hex[:8]
    with http(server, "alice") as c:
        later = {"start_at": "2099-01-01T00:00:00Z", "metadata": {"batch": batch}}
        ids = [submit(c, "quick", "later", **later) for _ in range(3)]
        version = c.get(f"/v1/tasks/{ids[0]}").json()["agent_version"]
        r = c.post(f"/v1/tasks/{ids[0]}/migrate", json={"to_version": "old1"})
        assert r.status_code == 200, r.text
    with http(server, "bob") as c:
        theirs = submit(c, "quick", "later", **later)

    page = new_page(browser)
    sign_in(page, server)
    page.fill("#filter-meta", f"batch:{batch}")
    expect(page.locator("#tasks .task-item")).to_have_count(3)
    page.fill("#filter-version", version)
    expect(page.locator("#tasks .task-item")).to_have_count(2)
    assert page.evaluate("window.duragent.filter()") == {
        "version": version,
        "meta": [f"batch:{batch}"],
    }
    assert f"version={version}" in page.evaluate("location.hash")
    page.reload()  # the URL keeps it
    expect(page.locator("#filter-version")).to_have_value(version)
    expect(page.locator("#tasks .task-item")).to_have_count(2)

    dialog = page.locator("#bulk-dialog")
    go = page.locator("#bulk-go")
    page.select_option("#bulk-action", "migrate")
    expect(dialog).to_be_visible()
    words = f"version {version} · meta batch:{batch}"
    expect(page.locator("#bulk-question")).to_have_text(
        f"Migrate the tasks matching: {words} to which version?"
    )
    expect(go).to_be_disabled()
    page.fill("#bulk-version", "v 9")
    expect(page.locator("#bulk-dialog-error")).to_contain_text("a version is 1-64 letters")
    expect(go).to_be_disabled()
    page.fill("#bulk-version", "v9")
    expect(page.locator("#bulk-question")).to_have_text(
        f"Migrate 2 tasks matching: {words} to version v9?"
    )
    expect(page.locator("#bulk-dialog-error")).to_have_text("")
    shot(page, "44-bulk-migrate-confirm")
    expect(go).to_be_enabled()
    go.click()
    expect(dialog).to_be_hidden()
    op = page.locator("#bulk-list .bulk-op").first
    expect(op).to_have_attribute("data-status", "done")
    expect(op.locator('[data-field="done"]')).to_have_text("2 done")
    expect(op.locator(".bulk-action-name")).to_have_text("Migrate to v9")
    with http(server, "alice") as c:
        got = [c.get(f"/v1/tasks/{t}").json()["agent_version"] for t in ids]
        assert got == ["old1", "v9", "v9"]
    with http(server, "bob") as c:
        assert c.get(f"/v1/tasks/{theirs}").json()["agent_version"] == version
    page.click('.view-tab[data-view="tasks"]')
    page.fill("#filter-version", "v9")
    expect(page.locator("#tasks .task-item")).to_have_count(2)
