"""The web page in real headless Chromium against a real `duragent serve`."""

from __future__ import annotations

from pathlib import Path

import pytest

from server_agents import SECOND
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
    streamed_length,
    wait_stream_past,
)
from support.server_live import TOKENS, LiveServer

pytestmark = pytest.mark.browser
__all__ = ["gates", "page", "server"]  # the fixtures this module uses from support.browser


@pytest.mark.slow
def test_watch_reload_pause_resume_complete(page: Page, server: LiveServer) -> None:
    page.goto(server.url + "/")
    page.fill("#token", "not-a-token")
    page.click("#signin-button")
    expect(page.locator("#signin-error")).to_have_text("That token is not valid.")
    shot(page, "01-signin")
    sign_in(page, server)

    start_task(page, "streamer", "Explain durable agents, please.")
    expect(page.locator(".bubble.user .text")).to_have_text("Explain durable agents, please.")
    # Text streams in: the bubble grows while the task runs.
    wait_stream_past(page, 10)
    first = streamed_length(page)
    wait_stream_past(page, first + 12)
    expect(status(page)).to_have_attribute("data-status", "running")
    expect(page.locator("#step")).to_have_text("Step 1")
    shot(page, "02-streaming")

    # A reload in the middle: the page rebuilds from REST and the stream goes on.
    before = streamed_length(page)
    task_url = page.url
    assert "#task=t_" in task_url
    page.reload()
    expect(page.locator("#task")).to_be_visible()
    expect(page.locator("#conn")).to_have_text("● live")
    wait_stream_past(page, before + 8)
    assert page.locator(".bubble.streaming").count() == 1
    shot(page, "03-after-reload")
    # A tab closed and opened again picks the task up too, once signed in (the token
    # is kept per tab, in session storage).
    tab = page.context.new_page()
    tab.goto(task_url)
    expect(tab.locator("#signin")).to_be_visible()
    tab.fill("#token", TOKENS["alice"])
    tab.click("#signin-button")
    expect(tab.locator("#conn")).to_have_text("● live")
    expect(tab.locator("#task-id")).to_have_text(task_url.rsplit("=", 1)[1])
    expect(tab.locator(".bubble.user")).to_have_count(1)
    tab.close()

    # The tool call: a card that ends "done" with its result.
    card = page.locator('.tool-card:has(.tool-name:text("lookup"))')
    expect(card).to_have_attribute("data-state", "ok")
    expect(card.locator(".tool-result")).to_contain_text("surviving crashes")
    expect(card.locator(".replay")).to_have_text("replay: safe")
    # Round 2 streams; pause in the middle of it.
    expect(page.locator("#step")).to_have_text("Step 2")
    wait_stream_past(page, 20)
    page.click("#pause")
    expect(status(page)).to_have_attribute("data-status", "paused")
    expect(page.locator(".notice").last).to_have_text("Paused.")
    expect(page.locator("#resume")).to_be_enabled()
    expect(page.locator("#pause")).to_be_disabled()
    paused_len = streamed_length(page)  # the interrupted stream's text, still shown
    assert SECOND.startswith(page.locator(".bubble.streaming .text").inner_text())
    shot(page, "04-paused")

    page.click("#resume")
    # Recovery voids the interrupted stream and asks again: the page drops the
    # partial text and shows the new stream from its start, not glued onto it.
    expect(page.locator(".notice", has_text="asking again")).to_be_visible()
    wait_stream_past(page, paused_len + 8)
    restarted = page.locator(".bubble.streaming .text").inner_text()
    assert SECOND.startswith(restarted), restarted
    expect(page.locator(".bubble.streaming")).to_have_count(1)
    expect(status(page)).to_have_attribute("data-status", "completed", timeout=60_000)
    final = page.locator(".bubble.assistant:not(.streaming)").last
    expect(final).to_contain_text("That is the whole idea.")
    # The interrupted stream was dropped and streamed again: one answer per round.
    expect(page.locator(".bubble.streaming")).to_have_count(0)
    expect(page.locator(".bubble.assistant")).to_have_count(2)
    expect(page.locator("#step")).to_have_text("2 steps")
    expect(page.locator("#pause")).to_be_disabled()
    expect(page.locator("#resume")).to_be_disabled()
    item = page.locator(".task-item.selected")
    expect(item.locator(".badge")).to_have_attribute("data-status", "completed")
    page.locator(".timeline-scroll").evaluate("el => el.scrollTop = el.scrollHeight")
    shot(page, "05-completed")


@pytest.mark.slow
def test_approve_and_answer_from_the_page(page: Page, server: LiveServer) -> None:
    sign_in(page, server, "bob")
    start_task(page, "approver", "Email Bob.")
    card = page.locator('.tool-card:has(.tool-name:text("send_email"))')
    expect(card).to_have_attribute("data-state", "waiting")
    expect(status(page)).to_have_attribute("data-status", "waiting")
    expect(card.locator(".question")).to_contain_text("Approve send_email")
    shot(page, "06-approval")
    card.locator("button.approve").click()
    expect(status(page)).to_have_attribute("data-status", "completed")
    expect(card).to_have_attribute("data-state", "ok")
    expect(card.locator(".tool-result")).to_have_text("sent to bob@example.com")

    start_task(page, "asker", "Plan my trip.")
    card = page.locator('.tool-card:has(.tool-name:text("ask_user"))')
    expect(card.locator(".question")).to_have_text("Which city?")
    card.locator("input.answer").fill("Lisbon")
    shot(page, "07-question")
    card.locator("button[type=submit]").click()
    expect(status(page)).to_have_attribute("data-status", "completed")
    expect(card.locator(".tool-result")).to_have_text("Lisbon")
    expect(page.locator(".bubble.assistant").last).to_have_text("AssistantThanks for answering.")
    # Bob's list holds only bob's tasks.
    expect(page.locator(".task-item")).to_have_count(2)
    shot(page, "08-answered")


@pytest.mark.slow
def test_token_stays_in_the_tab_not_in_local_storage(page: Page, server: LiveServer) -> None:
    violations: list[str] = []
    page.on(
        "console",
        lambda msg: violations.append(msg.text) if "Content Security Policy" in msg.text else None,
    )
    # A token an older page left in local storage is removed, not used.
    page.goto(server.url + "/")
    page.evaluate("t => localStorage.setItem('duragent.token', t)", TOKENS["bob"])
    page.reload()
    expect(page.locator("#signin")).to_be_visible()
    assert page.evaluate("localStorage.getItem('duragent.token')") is None
    sign_in(page, server)
    assert TOKENS["alice"] not in page.evaluate("JSON.stringify(localStorage)")
    assert page.evaluate("sessionStorage.getItem('duragent.token')") == TOKENS["alice"]
    # A reload keeps the tab signed in; another tab of the same browser is not.
    page.reload()
    expect(page.locator("#user")).to_have_text("alice")
    other = page.context.new_page()
    other.goto(server.url + "/")
    expect(other.locator("#signin")).to_be_visible()
    other.close()
    # The page runs under its Content-Security-Policy without a violation.
    assert violations == []


@pytest.mark.slow
def test_a_rolled_back_round_stays_visible_marked_as_voided(
    page: Page, server: LiveServer, gates: Path
) -> None:
    sign_in(page, server)
    card = start_held_task(page, "gate-rollback")
    page.click("#rollback")  # the held tool is cancelled after the agent's grace period
    expect(status(page)).to_have_attribute("data-status", "paused")
    # The round is out of the model's view, not off the page: marked, still there.
    expect(page.locator(".bubble.assistant.voided")).to_have_count(1)
    expect(card).to_have_attribute("data-voided", "")
    expect(card.locator(".voided-label")).to_have_text("rolled back")
    expect(page.locator(".notice").last).to_have_text("Paused (incomplete round rolled back).")
    shot(page, "09-rolled-back")
    (gates / "gate-rollback").write_text("open")  # the redone round goes through
    page.click("#resume")
    expect(status(page)).to_have_attribute("data-status", "completed")
    # The model redid the round: a new card, not marked; the old one still marked.
    expect(page.locator(".tool-card:not(.voided)")).to_have_count(1)
    expect(page.locator(".tool-card.voided")).to_have_count(1)
    expect(page.locator(".bubble.assistant").last).to_contain_text("Through the gate.")


@pytest.mark.slow
def test_retry_a_failed_task_from_the_page(page: Page, server: LiveServer) -> None:
    sign_in(page, server, "bob")
    start_task(page, "flaky", "fail-from-the-page")
    expect(status(page)).to_have_attribute("data-status", "failed")
    expect(page.locator("#task-error")).to_contain_text("scripted failure")
    expect(page.locator("#retry")).to_be_visible()
    shot(page, "10-failed")
    page.click("#retry")
    expect(status(page)).to_have_attribute("data-status", "completed")
    expect(page.locator(".notice", has_text="Retried after the failure")).to_be_visible()
    expect(page.locator(".bubble.assistant").last).to_contain_text("Done after a retry.")
    expect(page.locator("#retry")).to_be_hidden()
    expect(page.locator("#task-error")).to_be_hidden()


@pytest.mark.slow
def test_a_structured_answer_shows_as_pretty_json(page: Page, server: LiveServer) -> None:
    page.goto(server.url + "/")
    sign_in(page, server)
    start_task(page, "structured", "The largest city of Norway?")
    expect(status(page)).to_have_attribute("data-status", "completed")
    expect(page.locator("#task-output-panel")).to_be_visible()
    expect(page.locator("#task-output")).to_have_text(
        '{\n  "city": "Oslo",\n  "population": 700000\n}'
    )
    # A task whose answer is text has no output panel: the text is in the conversation.
    start_task(page, "quick", "Hi")
    expect(status(page)).to_have_attribute("data-status", "completed")
    expect(page.locator("#task-output-panel")).to_be_hidden()
