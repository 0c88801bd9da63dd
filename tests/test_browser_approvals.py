"""The page's edit-and-approve, in real headless Chromium."""

from __future__ import annotations

import pytest

from support.browser import Page, expect, gates, page, server, shot, sign_in, start_task, status
from support.server_live import LiveServer

pytestmark = pytest.mark.browser
__all__ = ["gates", "page", "server"]  # the fixtures this module uses from test_browser


@pytest.mark.slow
def test_edit_the_arguments_then_approve(page: Page, server: LiveServer) -> None:
    sign_in(page, server)
    start_task(page, "mailer", "Mail Bob and Ann.")
    expect(status(page)).to_have_attribute("data-status", "waiting")
    cards = page.locator('.tool-card:has(.tool-name:text("send_email"))')
    expect(cards).to_have_count(2)
    bob, ann = cards.nth(0), cards.nth(1)
    expect(bob).to_have_attribute("data-state", "waiting")
    # Each approval says when it is denied without a decision (approval_timeout=600).
    expect(bob.locator(".expires")).to_contain_text("Denied automatically at")

    bob.locator("button.edit").click()
    editor = bob.locator("textarea.edit-args")
    expect(editor).to_be_visible()
    expect(editor).to_have_value('{\n  "to": "bob@example.com",\n  "body": "hi"\n}')
    # Not JSON: the page says so and sends nothing.
    editor.fill("{not json")
    bob.locator("button.approve").click()
    expect(bob.locator(".edit-problem")).to_have_text("The arguments must be a JSON object.")
    # JSON the tool's schema refuses: the server's 422 is shown, nothing changes.
    editor.fill('{"to": "bob@example.com"}')
    bob.locator("button.approve").click()
    expect(page.locator(".toast").last).to_contain_text("Invalid tool arguments")
    expect(page.locator(".toast").last).to_contain_text("body: Field required")
    expect(bob).to_have_attribute("data-state", "waiting")

    editor.fill('{"to": "bob@example.com", "body": "<b>see you</b> at 5"}')
    expect(bob.locator("button.approve")).to_have_text("Approve with these arguments")
    shot(page, "30-edit-approval")
    bob.locator("button.approve").click()
    expect(bob).not_to_have_attribute("data-state", "waiting")
    expect(bob.locator(".tool-args")).to_contain_text("<b>see you</b> at 5")
    expect(bob.locator(".tool-edited")).to_contain_text("edited before approval")
    expect(bob.locator(".tool-args-original")).to_contain_text('"body": "hi"')
    # The other approval is still open (one alone: no "decide all" bar); deny it.
    expect(page.locator("#approvals-bar")).to_be_hidden()
    ann.locator("input.reason").fill("not Ann")
    ann.locator("button.deny").click()
    expect(status(page)).to_have_attribute("data-status", "completed")
    expect(bob).to_have_attribute("data-state", "ok")
    expect(bob.locator(".tool-result")).to_contain_text("a person edited this call's arguments")
    expect(bob.locator(".tool-result")).to_contain_text(
        "sent '<b>see you</b> at 5' to bob@example.com"
    )
    expect(ann.locator(".tool-result")).to_have_text("The user denied this call: not Ann")
    expect(page.locator("b")).to_have_count(0)  # the edit is text, never markup
    shot(page, "31-edited-and-approved")


@pytest.mark.slow
def test_approve_all_open_calls_at_once(page: Page, server: LiveServer) -> None:
    sign_in(page, server, "bob")
    start_task(page, "mailer", "Mail them both.")
    expect(status(page)).to_have_attribute("data-status", "waiting")
    bar = page.locator("#approvals-bar")
    expect(bar).to_be_visible()
    expect(page.locator("#approvals-count")).to_have_text("2 calls wait for approval")
    shot(page, "32-approve-all")
    page.click("#approve-all")
    expect(status(page)).to_have_attribute("data-status", "completed")
    expect(bar).to_be_hidden()
    cards = page.locator('.tool-card:has(.tool-name:text("send_email"))')
    expect(cards.nth(0).locator(".tool-result")).to_have_text("sent 'hi' to bob@example.com")
    expect(cards.nth(1).locator(".tool-result")).to_have_text("sent 'hello' to ann@example.com")
