"""A handoff on the page's timeline, in real headless Chromium."""

from __future__ import annotations

import pytest

from support.browser import Page, expect, gates, page, server, sign_in, start_task, status
from support.server_live import LiveServer

pytestmark = pytest.mark.browser
__all__ = ["gates", "page", "server"]  # the fixtures this module uses from support.browser


@pytest.mark.slow
def test_a_handoff_shows_as_a_block_from_one_agent_to_the_other(
    page: Page, server: LiveServer
) -> None:
    sign_in(page, server, "alice")
    start_task(page, "triage", "Refund order 42.")
    expect(status(page)).to_have_attribute("data-status", "completed")
    block = page.locator(".handoff")
    expect(block).to_have_count(1)
    expect(block).to_have_attribute("data-from", "triage")
    expect(block.locator(".handoff-to")).to_have_text("billing")
    expect(block).to_contain_text("Handoff: triage → billing")
    expect(page.locator(".bubble.assistant").last).to_contain_text("Refunded order 42.")
    # It sits between the transfer call's card and billing's answer.
    order = page.eval_on_selector_all(
        ".tool-card, .handoff, .bubble.assistant",
        "els => els.map(e => e.classList.contains('handoff') ? 'handoff'"
        " : e.classList.contains('tool-card') ? 'card' : 'answer')",
    )
    assert order == ["card", "handoff", "answer"]


@pytest.mark.slow
def test_the_round_list_names_each_rounds_agent_and_the_handoff(
    page: Page, server: LiveServer
) -> None:
    sign_in(page, server, "alice")
    start_task(page, "triage", "Refund order 42.")
    expect(status(page)).to_have_attribute("data-status", "completed")
    page.click("#rounds-panel summary")
    rounds = page.locator("#rounds .round")
    expect(rounds).to_have_count(2)
    expect(rounds.nth(0).locator(".round-agent")).to_have_text("triage → handed off to billing")
    expect(rounds.nth(1).locator(".round-agent")).to_have_text("billing")
