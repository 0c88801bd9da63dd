"""The web page's test kit: a live `duragent serve`, headless Chromium, sign-in and page helpers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from support.server_live import TOKENS, LiveServer, child_env, live_server

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TIMEOUT = 30_000  # ms, for every wait on a condition

sync_api = pytest.importorskip("playwright.sync_api")
if TYPE_CHECKING:  # the same names, typed; re-exported for the browser tests
    from playwright.sync_api import Locator as Locator, Page as Page, expect as expect
else:
    Page = sync_api.Page
    Locator = sync_api.Locator
    expect = sync_api.expect


@pytest.fixture(scope="module")
def gates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the `holder` agent's tool waits for the test to create its gate file."""
    return tmp_path_factory.mktemp("gates")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, gates: Path) -> Iterator[LiveServer]:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing: apt-get install -y chromium")
    tmp = tmp_path_factory.mktemp("browser")
    # Text streams slowly enough to watch it, reload and pause in the middle.
    env = child_env(DURAGENT_TEST_CHUNK_DELAY="0.08", DURAGENT_TEST_GATES=str(gates))
    with live_server(tmp, workers=4, env=env) as s:
        yield s


@pytest.fixture
def page(server: LiveServer) -> Iterator[Page]:
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        context = browser.new_context(viewport={"width": 1280, "height": 860})
        pg = context.new_page()
        pg.set_default_timeout(TIMEOUT)
        errors: list[str] = []
        pg.on("pageerror", lambda exc: errors.append(str(exc)))
        try:
            yield pg
        finally:
            browser.close()
        assert errors == [], f"JavaScript errors on the page: {errors}"


def shot(page: Page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"))


def sign_in(page: Page, server: LiveServer, user: str = "alice") -> None:
    page.goto(server.url + "/")
    expect(page.locator("#signin")).to_be_visible()
    page.fill("#token", TOKENS[user])
    page.click("#signin-button")
    expect(page.locator("#user")).to_have_text(user)


def start_task(page: Page, agent: str, text: str) -> None:
    page.select_option("#agent", agent)
    page.fill("#input", text)
    page.click("#start")
    expect(page.locator("#task")).to_be_visible()


def start_held_task(page: Page, gate: str) -> Locator:
    """Start a "holder" task whose `hold` tool waits for the file `gate`; its tool
    card, once the call runs."""
    start_task(page, "holder", gate)
    card = page.locator('.tool-card:has(.tool-name:text("hold"))')
    expect(card).to_have_attribute("data-state", "running")
    return card


def streamed_length(page: Page) -> int:
    return len(page.locator(".bubble.streaming .text").inner_text())


def wait_stream_past(page: Page, n: int) -> None:
    page.wait_for_function(
        "n => { const el = document.querySelector('.bubble.streaming .text');"
        " return el && el.textContent.length > n; }",
        arg=n,
    )


def status(page: Page) -> Locator:
    return page.locator("#status")
