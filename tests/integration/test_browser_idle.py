"""The Playwright driver (node) is started on first need and stopped when idle: an idle session does not
hold it, and Chromium's tabs (their ids, the one active) are as they were when it comes back."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator

import pytest
from PIL import Image

from corral.client import SandboxClient
from corral.runtime import SandboxAddress, SandboxSpec

from .conftest import center, find_color, html_url, screenshot_image, wait_for
from .dockerutil import DockerHarness

IDLE_STOP_S = 2


def _page(name: str) -> str:
    return html_url(f"<h1>{name}</h1>", f"document.title = {name!r};")


@pytest.fixture(scope="module")
def quick_stop(runtime: DockerHarness, desktop_image: str) -> Iterator[SandboxAddress]:
    """A sandbox whose driver stops after IDLE_STOP_S unused (45 s by default)."""
    name = f"corral-it-idle-{os.getpid()}"
    runtime.remove(name)
    spec = SandboxSpec(
        image=desktop_image,
        name=name,
        labels={"corral.test": "1"},
        environment={"CORRAL_BROWSER_IDLE_STOP_S": str(IDLE_STOP_S)},
    )
    box = runtime.start_sandbox(spec)
    try:
        runtime.wait_ready(box, timeout_s=90)
        yield box
    finally:
        runtime.remove(box.id)


def driver_running(runtime: DockerHarness, box: SandboxAddress) -> bool:
    code, out = runtime.exec(box.id, ["ps", "-eo", "args"])
    assert code == 0, out
    return "run-driver" in out


def test_no_driver_at_boot_and_none_after_an_idle_stop(runtime: DockerHarness, quick_stop: SandboxAddress) -> None:
    with SandboxClient(quick_stop.ws_url, controller_secret=quick_stop.secret) as client:
        # Looking at the screen and running commands need no driver.
        client.screenshot("jpeg")
        client.act({"type": "cursor_position"})
        assert not driver_running(runtime, quick_stop)
        client.act({"type": "navigate", "url": _page("one")})
        assert driver_running(runtime, quick_stop)
        wait_for(lambda: not driver_running(runtime, quick_stop), timeout_s=IDLE_STOP_S + 15)


def test_tabs_and_the_active_tab_survive_an_idle_stop(runtime: DockerHarness, quick_stop: SandboxAddress) -> None:
    with SandboxClient(quick_stop.ws_url, controller_secret=quick_stop.secret) as client:
        client.act({"type": "navigate", "url": _page("first")})
        second = client.act({"type": "tab_new", "url": _page("second")})["result"]
        before = client.act({"type": "tabs"})["result"]["tabs"]
        first = next(t for t in before if t["title"] == "first")["id"]
        client.act({"type": "tab_switch", "tab": first})
        wait_for(lambda: not driver_running(runtime, quick_stop), timeout_s=IDLE_STOP_S + 15)

        # The next browser call starts the driver again and finds the same tabs under the same ids.
        after = client.act({"type": "tabs"})["result"]["tabs"]
        assert [(t["id"], t["title"]) for t in after] == [(t["id"], t["title"]) for t in before]
        assert [t["id"] for t in after if t["active"]] == [first]
        wait_for(lambda: not driver_running(runtime, quick_stop), timeout_s=IDLE_STOP_S + 15)
        # A navigation after a stop goes to the tab that was active, and the other is left as it was.
        assert client.act({"type": "navigate", "url": _page("third")})["result"]["title"] == "third"
        titles = {t["id"]: t["title"] for t in client.act({"type": "tabs"})["result"]["tabs"]}
        assert titles[first] == "third" and titles[second["id"]] == "second"
        assert client.act({"type": "tab_switch", "tab": second["id"]})["result"]["title"] == "second"
        client.act({"type": "tab_close", "tab": second["id"]})


def idle_stops(runtime: DockerHarness, box: SandboxAddress) -> int:
    """How often the controller stopped the driver for idleness so far (its log says each)."""
    return runtime.logs(box.id, 20_000).count("stopped the Playwright driver")


POPUP_OPENER = html_url(
    '<button id=open style="position:absolute;left:40px;top:40px;width:300px;height:200px;border:0;'
    'background:#0000ff"></button>',
    "document.title = 'opener'; document.getElementById('open').onclick = () => {"
    " const popup = window.open('about:blank'); popup.document.title = 'popup'; };",
)


def test_a_popup_opened_while_the_driver_was_stopped_is_the_active_tab(
    runtime: DockerHarness, quick_stop: SandboxAddress
) -> None:
    with SandboxClient(quick_stop.ws_url, controller_secret=quick_stop.secret) as client:
        client.act({"type": "navigate", "url": POPUP_OPENER})
        x, y = center(find_color(screenshot_image(client), (0, 0, 255)))
        assert wait_for(lambda: not driver_running(runtime, quick_stop), timeout_s=60)
        stops = idle_stops(runtime, quick_stop)
        client.act({"type": "click", "x": x, "y": y})  # the page opens its popup, which comes to the front
        # The click started the driver in the background; once it stopped again, the next call connects anew.
        assert wait_for(lambda: idle_stops(runtime, quick_stop) > stops, timeout_s=60)
        assert client.act({"type": "page_info"})["result"]["title"] == "popup"
        tabs = client.act({"type": "tabs"})["result"]["tabs"]
        assert [t["title"] for t in tabs if t["active"]] == ["popup"] and len(tabs) == 2
        client.act({"type": "tab_close"})  # the active tab: the popup on screen
        assert client.act({"type": "page_info"})["result"]["title"] == "opener"


def test_input_brings_the_driver_back_for_the_settle(runtime: DockerHarness, quick_stop: SandboxAddress) -> None:
    with SandboxClient(quick_stop.ws_url, controller_secret=quick_stop.secret) as client:
        client.act({"type": "navigate", "url": _page("clicked")})
        wait_for(lambda: not driver_running(runtime, quick_stop), timeout_s=IDLE_STOP_S + 15)
        client.act({"type": "click", "x": 5, "y": 300})
        # Started in the background (the click did not wait for it), so the next settles see requests.
        wait_for(lambda: driver_running(runtime, quick_stop), timeout_s=10)


def _screen_segment_rss(runtime: DockerHarness, box: SandboxAddress) -> int:
    """The resident bytes of the controller's MIT-SHM segment (its 0600 owner reads /proc/sysvipc/shm)."""
    code, out = runtime.exec(box.id, ["cat", "/proc/sysvipc/shm"])
    assert code == 0, out
    header, *rows = (line.split() for line in out.splitlines() if line.strip())
    ours = [dict(zip(header, row, strict=True)) for row in rows if row[header.index("size")] == str(1280 * 800 * 4)]
    assert len(ours) == 1, out
    return int(ours[0]["rss"])


def test_an_idle_session_hands_the_screens_segment_back_and_the_next_grab_is_whole(
    runtime: DockerHarness, quick_stop: SandboxAddress
) -> None:
    with SandboxClient(quick_stop.ws_url, controller_secret=quick_stop.secret) as client:
        client.act(
            {"type": "navigate", "url": html_url("<div style='background:#00f;width:100vw;height:100vh'></div>")}
        )
        client.screenshot("jpeg")
        assert _screen_segment_rss(runtime, quick_stop) >= 1280 * 800 * 4 - 4096  # a frame in both sides' pages
        assert wait_for(lambda: not driver_running(runtime, quick_stop), timeout_s=IDLE_STOP_S + 15)
        assert wait_for(lambda: _screen_segment_rss(runtime, quick_stop) == 0, timeout_s=5)
        # Grabbed anew: the page as it was, not the emptied segment's zeros.
        shot = client.screenshot("png")
        image = Image.open(io.BytesIO(shot)).convert("RGB")
        assert image.getpixel((640, 500)) == (0, 0, 255)
        assert _screen_segment_rss(runtime, quick_stop) > 0
