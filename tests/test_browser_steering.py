"""The page's round list, "Fork from here" and the message box of a live task, in real
headless Chromium."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Request, Route

from support.browser import (
    Page,
    expect,
    gates,
    page,
    server,
    shot,
    sign_in,
    start_held_task,
    start_task,
    status,
)
from support.server_live import LiveServer

pytestmark = pytest.mark.browser
__all__ = ["gates", "page", "server"]  # the fixtures this module uses from support.browser


@pytest.mark.slow
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

    rounds.nth(0).locator("button.fork").click()
    page.check("#fork-continue")  # round 1 stays; a new message follows it
    page.fill("#fork-message", "Now <b>another</b> one.")
    page.click("#fork-go")
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


@pytest.mark.slow
def test_message_box_on_a_live_task_enqueue_and_interrupt(
    page: Page, server: LiveServer, gates: Path
) -> None:
    sign_in(page, server)
    card = start_held_task(page, "gate-send")
    expect(page.locator("#send-form")).to_be_visible()
    page.fill("#send-text", "Also <i>say</i> hi.")
    page.click("#send")
    expect(page.locator(".notice").last).to_have_text(
        "New message (enqueue); it is taken when the current turn ends."
    )
    expect(page.locator("#send-text")).to_have_value("")
    shot(page, "22-message-queued")
    (gates / "gate-send").write_text("open")
    expect(status(page)).to_have_attribute("data-status", "completed")
    # Taken once, after the turn's answer, and answered; a finished task has no box.
    expect(page.locator(".bubble.user .text")).to_have_text(["gate-send", "Also <i>say</i> hi."])
    expect(page.locator(".bubble.assistant").last).to_contain_text("Through the gate.")
    expect(page.locator("#send-form")).to_be_hidden()
    shot(page, "23-message-taken")

    start_task(page, "holder", "gate-never")
    expect(page.locator("#task-input")).to_have_text("gate-never")
    expect(card.last).to_have_attribute("data-state", "running")
    page.fill("#send-text", "Stop waiting.")
    page.select_option("#send-strategy", "interrupt")
    page.click("#send")
    # The held call is cut short (the agent's grace period), then the task goes on.
    expect(status(page)).to_have_attribute("data-status", "completed")
    expect(page.locator(".notice", has_text="Interrupted by a new message.")).to_have_count(1)
    expect(page.locator(".bubble.user .text").last).to_have_text("Stop waiting.")
    expect(card.last).to_have_attribute("data-state", "interrupted")


@pytest.mark.slow
def test_a_message_sent_again_after_a_lost_answer_is_taken_once(
    page: Page, server: LiveServer, gates: Path
) -> None:
    sign_in(page, server)
    start_held_task(page, "gate-resend")
    ids: list[str | None] = []

    def note(request: Request) -> None:
        if request.method == "POST" and request.url.endswith("/messages"):
            body = request.post_data_json
            assert body is not None
            ids.append(body.get("request_id"))

    page.on("request", note)

    def lose_the_answer(route: Route) -> None:
        if route.request.method != "POST":
            route.fallback()
            return
        assert route.fetch().status == 202  # the server takes the message...
        route.abort("connectionreset")  # ...and the page never hears of it

    page.route("**/messages", lose_the_answer, times=1)
    page.fill("#send-text", "Only once.")
    page.click("#send")
    expect(page.locator(".toast.error")).to_have_count(1)
    expect(page.locator("#send-text")).to_have_value("Only once.")  # kept for a new try
    page.click("#send")
    expect(page.locator("#send-text")).to_have_value("")
    (gates / "gate-resend").write_text("open")
    expect(status(page)).to_have_attribute("data-status", "completed")
    # Both attempts carried one request id, so the task took the message once.
    assert len(ids) == 2 and ids[0] == ids[1], ids
    expect(page.locator(".bubble.user .text")).to_have_text(["gate-resend", "Only once."])
    expect(page.locator(".notice", has_text="New message")).to_have_count(1)
