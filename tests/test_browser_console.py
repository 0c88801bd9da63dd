"""The page as an ops console, in real headless Chromium against `duragent serve`:
filters kept in the URL and paging, counts per agent, queue limits an admin edits
(a non-admin cannot), schedules, a fork from the timeline with an edited message,
and a phone-sized layout (390 px) with nothing wider than the screen."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import pytest

from support.browser import ARGS, ARTIFACTS, CHROMIUM, TIMEOUT, Page, expect, shot, sign_in
from support.server_live import TOKENS, LiveServer, live_server

pytestmark = pytest.mark.browser
sync_api = pytest.importorskip("playwright.sync_api")

LATER = "2099-01-01T00:00:00Z"  # tasks held until then stay pending: no worker runs them
HOSTILE = '<img src=x onerror="window.pwned=1">'


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing: apt-get install -y chromium")
    with live_server(tmp_path_factory.mktemp("console"), workers=1, args=["--admin", "alice"]) as s:
        yield s


def http(server: LiveServer, user: str) -> httpx.Client:
    headers = {"Authorization": f"Bearer {TOKENS[user]}"}
    return httpx.Client(base_url=server.url, headers=headers, timeout=30)


def submit(c: httpx.Client, **body: Any) -> str:
    r = c.post("/v1/tasks", json={"agent": "quick", "input": "hi", **body})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def finished(c: httpx.Client, task_id: str) -> dict[str, Any]:
    r = c.get(f"/v1/tasks/{task_id}/wait", params={"until": "finished", "timeout": 30})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    assert body["status"] == "completed", body
    return body


class Browser:
    """Headless Chromium; every page's JavaScript errors, which the test must not have."""

    def __init__(self, chromium: Any) -> None:
        self.chromium = chromium
        self.errors: list[str] = []


@pytest.fixture
def browser(server: LiveServer) -> Iterator[Browser]:
    ARTIFACTS.mkdir(exist_ok=True)  # for the screenshots
    with sync_api.sync_playwright() as p:
        b = Browser(p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True))
        try:
            yield b
        finally:
            b.chromium.close()
        assert b.errors == [], f"JavaScript errors on the page: {b.errors}"


def new_page(browser: Browser, width: int = 1280, height: int = 860) -> Page:
    context = browser.chromium.new_context(viewport={"width": width, "height": height})
    page: Page = context.new_page()
    page.set_default_timeout(TIMEOUT)
    page.on("pageerror", lambda exc: browser.errors.append(str(exc)))
    return page


def url_params(page: Page) -> dict[str, list[str]]:
    return parse_qs(urlsplit(page.url).fragment)


@pytest.mark.slow
def test_filters_change_the_list_and_the_url_and_pages_follow_next_cursor(
    server: LiveServer, browser: Browser
) -> None:
    with http(server, "alice") as c:
        red = [submit(c, queue="reports", metadata={"team": "red"}) for _ in range(2)]
        blue = submit(c, queue="reports", metadata={"team": "blue"})
        held = submit(c, start_at=LATER, metadata={"team": "red"})
        paged = [submit(c, start_at=LATER, metadata={"batch": "many"}) for _ in range(53)]
        for tid in (*red, blue):
            finished(c, tid)
    with http(server, "bob") as c:
        submit(c, queue="reports", metadata={"team": "red"})  # not alice's: never listed

    page = new_page(browser)
    sign_in(page, server)
    items = page.locator("#tasks .task-item")
    page.select_option("#filter-status", "pending")
    page.fill("#filter-meta", "team:red")
    expect(items).to_have_count(1)
    expect(items).to_have_attribute("data-id", held)
    assert url_params(page) == {"status": ["pending"], "meta": ["team:red"]}
    page.select_option("#filter-status", "")
    page.fill("#filter-queue", "reports")
    expect(items).to_have_count(2)
    assert {items.nth(i).get_attribute("data-id") for i in range(2)} == set(red)
    page.select_option("#filter-agent", "quick")
    expect(items).to_have_count(2)
    # The one object the bulk actions will send: the REST filter names.
    assert page.evaluate("window.duragent.filter()") == {
        "agent": "quick",
        "queue": "reports",
        "meta": ["team:red"],
    }
    expect(page.locator("#filter-summary")).to_contain_text("queue reports")
    shot(page, "30-console-filters")
    # A time range: nothing was created after 2098.
    page.click("#filter-times summary")
    page.fill("#filter-created_after", "2098-06-01T10:00")
    expect(page.locator("#tasks .empty")).to_have_text("No tasks match.")
    assert url_params(page)["created_after"][0].startswith("2098-06-01T")

    # The URL is the console's state: opened in another tab, it shows the same list.
    page.fill("#filter-created_after", "")
    expect(items).to_have_count(2)
    shared = page.url
    other = new_page(browser)
    sign_in(other, server)
    other.goto(shared)
    other.reload()
    expect(other.locator("#filter-queue")).to_have_value("reports")
    expect(other.locator("#filter-meta")).to_have_value("team:red")
    expect(other.locator("#filter-agent")).to_have_value("quick")
    expect(other.locator("#tasks .task-item")).to_have_count(2)

    # Paging follows next_cursor: 53 tasks are a page of 50 and one of 3, and back.
    page.click("#filter-clear")
    assert url_params(page) == {}
    page.fill("#filter-meta", "batch:many")
    expect(items).to_have_count(50)
    expect(page.locator("#page-newer")).to_be_disabled()
    page.click("#page-older")
    expect(items).to_have_count(3)
    expect(page.locator("#page-no")).to_have_text("page 2")
    expect(page.locator("#page-older")).to_be_disabled()
    seen = {items.nth(i).get_attribute("data-id") for i in range(3)}
    page.click("#page-newer")
    expect(items).to_have_count(50)
    seen |= {items.nth(i).get_attribute("data-id") for i in range(50)}
    assert seen == set(paged)
    # The search box: task ids starting with what is typed (GET /v1/tasks?id_prefix=).
    page.click("#filter-clear")
    page.fill("#filter-id_prefix", held[:12])
    expect(items).to_have_count(1)
    expect(items).to_have_attribute("data-id", held)
    assert url_params(page) == {"id_prefix": [held[:12]]}
    assert page.evaluate("window.duragent.filter()") == {"id_prefix": held[:12]}
    with http(server, "bob") as c:  # bob's search never finds alice's task
        assert c.get("/v1/tasks", params={"id_prefix": held}).json()["tasks"] == []
    page.fill("#filter-id_prefix", "t_%")
    expect(page.locator("#tasks .empty")).to_have_text("No tasks match.")
    # A filter's metadata that is no key:value says so, in one line, as text.
    page.fill("#filter-meta", HOSTILE)
    expect(page.locator("#filter-summary")).to_have_text(f"metadata {HOSTILE} should be key:value")
    assert page.evaluate("window.pwned") is None


@pytest.mark.slow
def test_counts_per_agent_and_status_pick_their_tasks(server: LiveServer, browser: Browser) -> None:
    with http(server, "bob") as c:
        done = submit(c)
        finished(c, done)
        waiting = submit(c, agent="structured", input="x", start_at=LATER)
        baseline = c.get("/v1/counts").json()["total"]
    page = new_page(browser)
    sign_in(page, server, "bob")
    page.click('.view-tab[data-view="counts"]')
    assert url_params(page)["view"] == ["counts"]
    table = page.locator("#counts-table")
    quick = table.locator('tr[data-agent="quick"]')
    expect(quick.locator('button[data-status="completed"]')).to_have_text(
        str(_count(server, "bob", "quick", "completed"))
    )
    structured = table.locator('tr[data-agent="structured"]')
    expect(structured.locator('button[data-status="pending"]')).to_have_text("1")
    expect(table.locator(".total-row button").last).to_have_text(str(baseline))
    shot(page, "31-console-counts")
    # A number lists its tasks: the view goes back to the list, filtered.
    structured.locator('button[data-status="pending"]').click()
    expect(page.locator("#view-tasks")).to_be_visible()
    expect(page.locator("#tasks .task-item")).to_have_count(1)
    expect(page.locator("#tasks .task-item")).to_have_attribute("data-id", waiting)
    assert url_params(page) == {"status": ["pending"], "agent": ["structured"]}


def _count(server: LiveServer, user: str, agent: str, status: str) -> int:
    with http(server, user) as c:
        counts = c.get("/v1/counts", params={"agent": agent}).json()["counts"]
    return sum(row.get(status, 0) for row in counts.values())


@pytest.mark.slow
def test_an_admin_edits_queue_limits_and_a_schedule_a_non_admin_cannot(
    server: LiveServer, browser: Browser
) -> None:
    with http(server, "alice") as c:
        assert c.put("/v1/queues/mail", json={"concurrency": 2}).status_code == 200
        for name in ("nightly", HOSTILE):
            r = c.post("/v1/schedules", json={"name": name, "agent": "quick", "every": 3600})
            assert r.status_code == 201, r.text
    with http(server, "bob") as c:
        submit(c, queue=HOSTILE, start_at=LATER)

    admin = new_page(browser)
    sign_in(admin, server, "alice")
    admin.click('.view-tab[data-view="queues"]')
    mail = admin.locator('.queue[data-queue="mail"]')
    expect(mail.locator('[data-limit="concurrency"]')).to_have_text("2 at once")
    mail.locator("button.edit-queue").click()
    form = mail.locator(".limits-form")
    expect(form.locator('input[name="concurrency"]')).to_have_value("2")
    form.locator('input[name="concurrency"]').fill("7")
    form.locator('input[name="per_owner"]').fill("3")
    form.locator("button.save-limits").click()
    expect(mail.locator('[data-limit="concurrency"]')).to_have_text("7 at once")
    expect(mail.locator('[data-limit="per_owner"]')).to_have_text("3 per owner")
    with http(server, "alice") as c:
        got = c.get("/v1/queues/mail").json()
    assert (got["concurrency"], got["per_owner"]) == (7, 3)
    # A new queue's limits, by name.
    admin.fill("#new-queue", "fresh")
    admin.locator("#queue-admin button").click()
    fresh = admin.locator('.queue[data-queue="fresh"]')
    fresh.locator('input[name="rate_tasks"]').fill("10")
    fresh.locator('input[name="rate_seconds"]').fill("60")
    fresh.locator("button.save-limits").click()
    expect(fresh.locator('[data-limit="rate"]')).to_have_text("10 starts per 1 min")
    shot(admin, "32-console-queues-admin")

    # The admin's schedule: edited (every 2 h) and paused from the page.
    admin.click('.view-tab[data-view="schedules"]')
    nightly = admin.locator('.schedule[data-schedule="nightly"]')
    expect(nightly.locator(".schedule-when")).to_contain_text("every 1 h")
    expect(admin.locator(".schedule-name", has_text="onerror")).to_have_text(HOSTILE)
    assert admin.locator("#view-schedules img").count() == 0
    nightly.locator("button.edit-schedule").click()
    admin.locator('.schedule-form input[name="every"]').fill("7200")
    admin.locator(".schedule-form button.save-schedule").click()
    expect(nightly.locator(".schedule-when")).to_contain_text("every 2 h")
    nightly.locator("button", has_text="Pause").click()
    expect(nightly).to_have_attribute("data-paused", "true")
    with http(server, "alice") as c:
        s = c.get("/v1/schedules/nightly").json()
    assert (s["every"], s["paused"]) == (7200, True)

    # Bob: the limits read-only (no control; the server refuses him anyway), and
    # no one else's schedule; a queue name he sent shows as text.
    page = new_page(browser)
    sign_in(page, server, "bob")
    page.click('.view-tab[data-view="queues"]')
    expect(page.locator('.queue[data-queue="mail"] [data-limit="concurrency"]')).to_have_text(
        "7 at once"
    )
    hostile = page.locator(".queue-name", has_text="onerror")
    expect(hostile).to_have_text(HOSTILE)
    assert page.locator("#view-queues img").count() == 0
    assert page.locator("#view-queues").locator("button, input, select, form").count() == 0
    expect(page.locator("#queues-readonly")).to_be_visible()
    with http(server, "bob") as c:
        assert c.put("/v1/queues/mail", json={"concurrency": 1}).status_code == 403
        assert c.get("/v1/schedules/nightly").status_code == 404
    page.click('.view-tab[data-view="schedules"]')
    expect(page.locator("#schedule-list .empty")).to_have_text("No schedules.")
    expect(page.locator('.schedule[data-schedule="nightly"]')).to_have_count(0)
    assert page.evaluate("window.pwned") is None


@pytest.mark.slow
def test_fork_from_the_timeline_with_an_edited_message_opens_the_fork(
    server: LiveServer, browser: Browser
) -> None:
    with http(server, "alice") as c:
        source = submit(c, input="Say hello to Oslo.")
        finished(c, source)
    page = new_page(browser)
    sign_in(page, server)
    page.goto(f"{server.url}/#task={source}")
    page.reload()
    expect(page.locator("#task-id")).to_have_text(source)
    page.click("#rounds-panel summary")
    page.locator('#rounds .round[data-round="1"] button.fork').click()
    editor = page.locator("#fork-editor")
    expect(editor).to_be_visible()
    expect(page.locator("#fork-round")).to_have_text("round 1")
    expect(page.locator("#fork-redo")).to_be_checked()
    expect(page.locator("#fork-message")).to_have_value("Say hello to Oslo.")
    page.fill("#fork-message", "Say hello to <b>Bergen</b>.")
    shot(page, "33-console-fork-editor")
    page.click("#fork-go")
    # The fork opens: a new task, linked to its source, that ran the edited message.
    expect(page.locator("#task-id")).not_to_have_text(source)
    fork = page.locator("#task-id").inner_text()
    assert url_params(page)["task"] == [fork]
    expect(page.locator("#forked-from")).to_have_text(f"Forked from {source} at round 1")
    expect(page.locator("#status")).to_have_attribute("data-status", "completed")
    expect(page.locator(".bubble.user:not(.voided) .text")).to_have_text(
        ["Say hello to <b>Bergen</b>."]
    )
    assert page.locator(".timeline b").count() == 0
    with http(server, "alice") as c:
        view = c.get(f"/v1/tasks/{fork}/messages").json()["messages"]
        assert [m["content"] for m in view if m["role"] == "user"] == [
            "Say hello to <b>Bergen</b>."
        ]
        before = c.get(f"/v1/tasks/{source}/messages").json()["messages"]
        assert [m["content"] for m in before if m["role"] == "user"] == ["Say hello to Oslo."]
        # Another user's task, by link: not found, like a missing one.
        assert (
            c.get(
                f"/v1/tasks/{fork}", headers={"Authorization": f"Bearer {TOKENS['bob']}"}
            ).status_code
            == 404
        )

    # "Continue after it": the round stays, the message comes after it.
    page.click("#forked-from a")
    expect(page.locator("#task-id")).to_have_text(source)
    if not page.locator("#rounds").is_visible():
        page.click("#rounds-panel summary")
    page.locator('#rounds .round[data-round="1"] button.fork').click()
    page.check("#fork-continue")
    expect(page.locator("#fork-message")).to_have_value("")
    page.fill("#fork-message", "And to Tromsø.")
    page.click("#fork-go")
    expect(page.locator("#forked-from")).to_have_text(f"Forked from {source} at round 1")
    expect(page.locator(".bubble.user .text")).to_have_text(
        ["Say hello to Oslo.", "And to Tromsø."]
    )

    bob = new_page(browser)
    sign_in(bob, server, "bob")
    bob.goto(f"{server.url}/#task={fork}")
    expect(bob.locator("#empty")).to_have_text("That task does not exist (or is not yours).")


def no_overflow(page: Page) -> None:
    """Nothing on the page is wider than the 390 px screen (no sideways scrolling)."""
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, f"the page is {width} px wide"
    wide = page.evaluate(
        """() => [...document.querySelectorAll('body *')].filter((el) => {
             const r = el.getBoundingClientRect();
             return r.width > 0 && (r.right > 391 || r.left < -1) && !el.closest('.table-scroll');
           }).map((el) => el.id || el.className || el.tagName).slice(0, 5)"""
    )
    assert wide == [], f"wider than the screen: {wide}"


def reachable(page: Page, selector: str) -> None:
    el = page.locator(selector)
    el.scroll_into_view_if_needed()
    expect(el).to_be_visible()
    box = el.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390, (selector, box)


@pytest.mark.slow
def test_the_console_at_390_px_wide(server: LiveServer, browser: Browser) -> None:
    with http(server, "alice") as c:
        tid = submit(c, queue="a-rather-long-queue-name-that-goes-on", input="Phone " * 40)
        finished(c, tid)
    page = new_page(browser, 390, 844)
    sign_in(page, server)
    expect(page.locator("#tasks .task-item").first).to_be_visible()
    no_overflow(page)
    for selector in (
        "#filter-status",
        "#filter-agent",
        "#filter-queue",
        "#filter-meta",
        "#filter-clear",
        "#action-bar",
        "#filter-id_prefix",
        "#page-older",
    ):
        reachable(page, selector)
    page.click("#filter-times summary")
    reachable(page, "#filter-updated_before")
    page.select_option("#filter-status", "completed")
    expect(page.locator("#filter-summary")).to_contain_text("status completed")
    no_overflow(page)
    page.evaluate("window.scrollTo(0, 0)")
    shot(page, "34-console-390-list")
    for view in ("counts", "queues", "schedules"):
        page.click(f'.view-tab[data-view="{view}"]')
        expect(page.locator(f"#view-{view}")).to_be_visible()
        no_overflow(page)
    page.click('.view-tab[data-view="tasks"]')
    page.locator(f'.task-item[data-id="{tid}"]').click()
    expect(page.locator("#status")).to_have_attribute("data-status", "completed")
    page.click("#rounds-panel summary")
    page.locator('#rounds .round[data-round="1"] button.fork').click()
    reachable(page, "#fork-go")
    reachable(page, "#fork-message")
    no_overflow(page)
    shot(page, "35-console-390-fork")


@pytest.mark.slow
def test_a_paused_schedule_edited_from_the_page_stays_paused(
    server: LiveServer, browser: Browser
) -> None:
    """The page's Edit keeps what its form does not show (overlap, queue, priority,
    metadata), and a paused schedule stays paused: a POST replaces the schedule,
    and a new one ticks."""
    with http(server, "bob") as c:
        body = {"name": "weekly", "agent": "quick", "every": 3600, "priority": 5}
        assert c.post("/v1/schedules", json=body).status_code == 201
        assert c.post("/v1/schedules/weekly/pause").status_code == 200
    page = new_page(browser)
    sign_in(page, server, "bob")
    page.click('.view-tab[data-view="schedules"]')
    weekly = page.locator('.schedule[data-schedule="weekly"]')
    expect(weekly).to_have_attribute("data-paused", "true")
    weekly.locator("button.edit-schedule").click()
    page.locator('.schedule-form input[name="every"]').fill("7200")
    page.locator(".schedule-form button.save-schedule").click()
    expect(weekly.locator(".schedule-when")).to_contain_text("every 2 h")
    expect(weekly).to_have_attribute("data-paused", "true")
    with http(server, "bob") as c:
        s = c.get("/v1/schedules/weekly").json()
    assert (s["every"], s["priority"], s["paused"]) == (7200, 5, True)


@pytest.mark.slow
def test_a_shared_link_lists_what_its_filter_says(server: LiveServer, browser: Browser) -> None:
    """A console link's filter is the list's, to the letter: a metadata value with
    a comma in it, and a time to the millisecond (the time fields show minutes)."""
    with http(server, "bob") as c:
        pair = submit(c, start_at=LATER, metadata={"tags": "a,b", "link": "x"})
        single = submit(c, start_at=LATER, metadata={"tags": "a", "link": "x"})
        later = submit(c, start_at=LATER, metadata={"link": "x"})
        created = c.get(f"/v1/tasks/{single}").json()["created_at"]
    after = (datetime.fromisoformat(created) + timedelta(milliseconds=1)).isoformat()
    page = new_page(browser)
    sign_in(page, server, "bob")
    items = page.locator("#tasks .task-item")
    page.goto(f"{server.url}/#{urlencode({'meta': 'tags:a,b'})}")
    page.reload()
    expect(page.locator("#filter-meta")).to_have_value("tags:a,b")
    expect(items).to_have_count(1)
    expect(items).to_have_attribute("data-id", pair)
    assert url_params(page)["meta"] == ["tags:a,b"]
    page.goto(f"{server.url}/#{urlencode({'meta': 'link:x', 'created_after': after})}")
    page.reload()
    expect(items).to_have_count(1)  # `single` was created 1 ms before the link's time
    expect(items).to_have_attribute("data-id", later)
    shown = url_params(page)["created_after"][0]
    assert datetime.fromisoformat(shown) == datetime.fromisoformat(after)
