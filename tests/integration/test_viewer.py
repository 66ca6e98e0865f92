"""The session viewer page, in a real Chromium (Debian's, on the host) driven by Playwright."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.recording.bundle import read_bundle
from corral.sdk import Sandbox

from .conftest import html_url
from .gateway_fixtures import KEY_A, KEY_B, RunningGateway, gateway

pytestmark = pytest.mark.usefixtures("desktop_image", "egress_image")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    with gateway(tmp_path_factory.mktemp("viewer-gw"), f"viewer-{os.getpid()}") as running:
        yield running


def test_the_viewer_steps_through_a_recorded_session(gw: RunningGateway) -> None:
    from playwright.sync_api import sync_playwright

    with Sandbox.create(url=gw.url, api_key=KEY_A) as sb:
        sb.act({"type": "navigate", "url": html_url("<h1>first</h1>", "document.title='first'")}, screenshot=True,
               wait_for="stable")
        sb.act({"type": "click", "x": 300, "y": 300}, screenshot=True, wait_for="stable")
        blocked = sb.act({"type": "navigate", "url": "https://blocked.test/page"}, screenshot=True,
                         wait_for="stable")
        session_id = sb.id
    directory = gw.settings.data_dir / "recordings" / session_id
    assert len(read_bundle(Path(directory)).actions) == 3
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page()
            page.goto(f"{gw.url}/v1/sessions/{session_id}/viewer?token={KEY_A}")
            page.wait_for_function("document.querySelectorAll('#actions li').length === 3")
            items = page.locator("#actions li").all_inner_texts()
            assert items[0].startswith("1. navigate") and items[1].startswith("2. click x=300 y=300")
            page.wait_for_function("document.getElementById('frame').naturalWidth === 640")
            assert page.inner_text("#position") == "step 1 of 3"
            assert '"title": "first"' in page.inner_text("#details")
            # Scrub to the last step with the timeline; it shows the refused request it caused.
            page.locator("#timeline").fill("3")
            page.wait_for_function("document.getElementById('position').textContent === 'step 3 of 3'")
            assert blocked["action_id"] in page.inner_text("#details")
            page.wait_for_selector("#network tr.deny")
            network = page.inner_text("#network")
            assert "blocked.test" in network and "default-deny" in network
            page.keyboard.press("ArrowLeft")
            page.wait_for_function("document.getElementById('position').textContent === 'step 2 of 3'")
            assert page.locator("#actions li.current").inner_text().startswith("2. click")
            page.wait_for_function(
                "document.getElementById('frame').src.endsWith('/recording/frames/000002.webp?token=' + "
                f"'{KEY_A}')"
            )
            # Another key gets nothing.
            other = browser.new_page()
            other.goto(f"{gw.url}/v1/sessions/{session_id}/viewer?token={KEY_B}")
            assert "forbidden" in other.content()
        finally:
            browser.close()


def test_the_viewer_follows_a_live_session(gw: RunningGateway) -> None:
    from playwright.sync_api import sync_playwright

    with Sandbox.create(url=gw.url, api_key=KEY_A) as sb, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page()
            page.goto(f"{gw.url}/v1/sessions/{sb.id}/viewer?token={KEY_A}")
            sb.act({"type": "navigate", "url": html_url("<p>live</p>")}, screenshot=True, wait_for="stable")
            page.wait_for_function("document.querySelectorAll('#actions li').length === 1", timeout=15_000)
            time.sleep(0.1)
            sb.act({"type": "click", "x": 10, "y": 300}, screenshot=True, wait_for="stable")
            page.wait_for_function("document.querySelectorAll('#actions li').length === 2", timeout=15_000)
        finally:
            browser.close()
