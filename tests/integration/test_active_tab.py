"""The active tab is the tab on screen, played for real: a page "Real Bank" served by the fake upstream
through the session's proxy opens "Phish" (window.open, a target=_blank link), the agent's own CDP
connection opens and fronts tabs, and the agent's replies, its input, its navigations and the
recording must name the tab a person would see. Also: two closes at once (native and CDP) leave a
page, and native navigate refuses the pages CDP refuses (chrome://, file://...)."""

from __future__ import annotations

import io
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from corral.recording.bundle import read_bundle
from corral.sdk import Sandbox

from .cdpwire import cdp_call, cdp_socket
from .conftest import center, find_color, wait_for
from .egress_fixtures import session_fixtures
from .gateway_fixtures import KEY_A, RunningGateway

pytestmark = pytest.mark.usefixtures("desktop_image", "egress_image")

BANK = "https://allowed.test/page/bank.html"
PHISH = "https://allowed.test/page/phish.html"
BLUE, RED, GREEN, MAGENTA = (0, 0, 255), (200, 0, 0), (0, 200, 0), (255, 0, 255)


upstream, gw, sb = session_fixtures("tabs", upstream_name="corral-tabs-upstream")


def screen(sb: Sandbox) -> Image.Image:
    return Image.open(io.BytesIO(sb.screenshot())).convert("RGB")


def shows(sb: Sandbox, rgb: tuple[int, int, int]) -> bool:
    try:
        find_color(screen(sb), rgb)
    except AssertionError:
        return False
    return True


def open_bank(sb: Sandbox) -> None:
    sb.act({"type": "navigate", "url": BANK}, wait_for="stable")
    assert sb.page_info().title == "Real Bank"


def click_on(sb: Sandbox, rgb: tuple[int, int, int]) -> None:
    x, y = center(find_color(screen(sb), rgb))
    sb.act({"type": "click", "x": x, "y": y}, wait_for="stable")


def active(sb: Sandbox) -> list[str]:
    return [tab.title for tab in sb.tabs() if tab.active]


def phish_in_front(sb: Sandbox) -> str:
    """Phish is on screen (its green band) and the agent is told so; else what the agent is told."""
    # Generous: the popup loads through the proxy, on a machine that may be loaded (a CI of many sessions).
    assert wait_for(lambda: shows(sb, GREEN), timeout_s=30), "Phish never came on screen"
    told: str = wait_for(lambda: (t := sb.page_info().title).startswith("Phish") and t, timeout_s=30)
    return told or f"on screen: Phish; told: {sb.page_info().title}"


def shot_event(gw: RunningGateway, session_id: str, tmp_path: Path) -> dict[str, Any]:
    """The recording's event of the test's JPEG screenshot, once the recorder has written it whole."""

    def read() -> dict[str, Any] | None:
        with gw.client(KEY_A) as c:
            response = c.get(f"/v1/sessions/{session_id}/recording")
        assert response.status_code == 200, response.text
        (tmp_path / "bundle.zip").write_bytes(response.content)
        for action in read_bundle(tmp_path / "bundle.zip").actions:
            native = action.get("native") or [{}]
            if native[0].get("type") == "screenshot" and native[0].get("format") == "jpeg" and "title" in action:
                return action
        return None

    event: dict[str, Any] | None = wait_for(read, timeout_s=30)
    assert event is not None, "the recording did not catch up"
    return event


def test_a_popup_a_page_opens_is_the_tab_the_agent_reads_types_into_and_navigates(
    gw: RunningGateway, sb: Sandbox, tmp_path: Path
) -> None:
    open_bank(sb)
    click_on(sb, BLUE)  # window.open("/page/phish.html")
    assert phish_in_front(sb) == "Phish"
    # What the agent is told is what is on screen: Phish, not the opener.
    info = sb.page_info()
    assert (info.title, info.url) == ("Phish", PHISH)
    assert active(sb) == ["Phish"]
    assert {tab.title for tab in sb.tabs()} == {"Real Bank", "Phish"}
    # A screenshot's recorded event names the tab it shows.
    sb.act({"type": "screenshot", "format": "jpeg"})  # the one JPEG of the test: its event is told apart
    shot = shot_event(gw, sb.id, tmp_path)
    assert (shot["title"], shot["url"]) == ("Phish", PHISH)
    # Text off the X keymap goes over CDP into the focused tab: Phish's field, not the bank's.
    sb.act({"type": "type", "text": "pässword"})
    assert wait_for(lambda: sb.page_info().title == "Phish typed pässword", timeout_s=10)
    assert sorted(tab.title for tab in sb.tabs()) == ["Phish typed pässword", "Real Bank"]
    # The next navigate loads in the tab on screen, not in the hidden opener.
    opened = sb.act({"type": "navigate", "url": BANK + "?again"}, wait_for="stable")["result"]
    assert opened["title"] == "Real Bank"
    # Phish's tab is gone to the bank (the opener would have been reloaded behind it): then the screen.
    assert sorted((tab.title, tab.url) for tab in sb.tabs()) == [("Real Bank", BANK), ("Real Bank", BANK + "?again")]
    assert shows(sb, BLUE) and not shows(sb, GREEN)


def test_a_target_blank_link_is_the_active_tab_and_closing_it_returns_to_the_opener(sb: Sandbox) -> None:
    open_bank(sb)
    click_on(sb, RED)  # <a target=_blank>
    assert phish_in_front(sb) == "Phish"
    assert active(sb) == ["Phish"]
    # tab_close without a tab closes the active one: the popup on screen, not the opener behind it.
    sb.act({"type": "tab_close"})
    assert [tab.title for tab in sb.tabs()] == ["Real Bank"]
    assert sb.page_info().title == "Real Bank" and shows(sb, BLUE)
    # The popup closing itself (window.close()) hands the front back to the opener, and the agent follows.
    click_on(sb, RED)
    assert phish_in_front(sb) == "Phish"
    click_on(sb, MAGENTA)
    assert wait_for(lambda: len(sb.tabs()) == 1, timeout_s=10)
    assert sb.page_info().title == "Real Bank" and active(sb) == ["Real Bank"]


def _page_targets(ws: Any, id: int) -> list[dict[str, Any]]:
    targets = cdp_call(ws, id, "Target.getTargets")["result"]["targetInfos"]
    return [t for t in targets if t["type"] == "page"]


def test_a_tab_the_agents_cdp_connection_opens_or_fronts_is_the_active_tab(gw: RunningGateway, sb: Sandbox) -> None:
    open_bank(sb)
    with cdp_socket(gw, sb) as ws:
        bank = next(t for t in _page_targets(ws, 1) if t["title"] == "Real Bank")["targetId"]
        made = cdp_call(ws, 2, "Target.createTarget", {"url": PHISH})
        assert "error" not in made, made
        assert phish_in_front(sb) == "Phish"
        assert active(sb) == ["Phish"]
        # A tab made in the background is not on screen: the active tab stays.
        behind = cdp_call(ws, 3, "Target.createTarget", {"url": BANK + "?behind", "background": True})
        assert "error" not in behind, behind
        assert wait_for(lambda: len(sb.tabs()) == 3, timeout_s=10)
        assert sb.page_info().title == "Phish" and active(sb) == ["Phish"]
        # Brought to the front by the client: the bank is the active tab again.
        assert "error" not in cdp_call(ws, 4, "Target.activateTarget", {"targetId": bank})
        assert wait_for(lambda: sb.page_info().url == BANK, timeout_s=10)
        assert shows(sb, BLUE) and active(sb) == ["Real Bank"]
        # The front tab closed by the client: the agent follows the tab Chromium shows next.
        assert "error" not in cdp_call(ws, 5, "Target.closeTarget", {"targetId": bank})
        assert wait_for(lambda: len(sb.tabs()) == 2, timeout_s=10)
        shown = "Phish" if shows(sb, GREEN) else "Real Bank"
        assert sb.page_info().title == shown and active(sb) == [shown]


# A tab that, each time it comes to the front, keeps its main thread busy for BUSY_MS: it cannot say
# whether it is shown meanwhile (ASK_TIMEOUT_S is 1 s), as any tab on a loaded machine.
BUSY_MS = 6000
BUSY = (
    "data:text/html,<title>Busy</title><script>document.addEventListener('visibilitychange', () => "
    "{ if (document.visibilityState === 'visible') setTimeout(() => "
    f"{{ const t = Date.now(); while (Date.now() - t < {BUSY_MS}) {{}} }}, 50); }});</script>"
)


def test_a_tab_in_front_too_busy_to_answer_is_not_passed_over_for_the_hidden_one(
    gw: RunningGateway, sb: Sandbox
) -> None:
    # docs/design/0411: the tab named last (the bank) says it is hidden, the one in front does not
    # answer in time; the agent is told of the tab in front (once it answers), never of the bank.
    open_bank(sb)
    with cdp_socket(gw, sb) as ws:
        made = cdp_call(ws, 1, "Target.createTarget", {"url": BUSY, "background": True})
        assert "error" not in made, made
        assert wait_for(lambda: len(sb.tabs()) == 2, timeout_s=10)
        assert sb.page_info().title == "Real Bank"
        assert "error" not in cdp_call(ws, 2, "Target.activateTarget", {"targetId": made["result"]["targetId"]})
    time.sleep(0.5)  # its busy loop starts 50 ms after it is shown and runs BUSY_MS
    started = time.monotonic()
    assert sb.page_info().title == "Busy"
    assert time.monotonic() - started > 2  # it was asked while busy (its title came once the loop ended)


ROUNDS = 6


def _close_both_at_once(sb: Sandbox, ws: Any, tab: str, target: str, n: int) -> dict[str, Any]:
    """The agent's native ``tab_close`` of ``tab`` and its CDP ``Target.closeTarget`` of ``target``, sent
    at the same moment; their answers."""
    answers: dict[str, Any] = {}
    start = threading.Barrier(2)

    def native() -> None:
        start.wait()
        answers["native"] = sb.request({"action": {"type": "tab_close", "tab": tab}})

    def cdp() -> None:
        start.wait()
        answers["cdp"] = cdp_call(ws, 200 + n, "Target.closeTarget", {"targetId": target})

    threads = [threading.Thread(target=native), threading.Thread(target=cdp)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return answers


def test_two_closes_at_once_native_and_cdp_leave_a_page(gw: RunningGateway, sb: Sandbox) -> None:
    with cdp_socket(gw, sb) as ws:
        for round_ in range(ROUNDS):
            # Two pages, told apart by their URLs: the native close takes one, the CDP close the other.
            mine, theirs = f"{BANK}?native{round_}", f"{BANK}?cdp{round_}"
            sb.act({"type": "navigate", "url": mine})
            sb.act({"type": "tab_new", "url": theirs})
            tabs = sb.tabs()
            assert len(tabs) == 2, tabs
            native_closes = next(t for t in tabs if t.url == mine).id
            cdp_closes = next(t for t in _page_targets(ws, 100 + round_) if t["url"] == theirs)["targetId"]
            answers = _close_both_at_once(sb, ws, native_closes, cdp_closes, round_)
            assert set(answers) == {"native", "cdp"}, answers
            # Chromium is alive (its socket answers: it quits with its last page) and has a page.
            assert "Chrome" in cdp_call(ws, 300 + round_, "Browser.getVersion")["result"]["product"]
            assert _page_targets(ws, 400 + round_), f"round {round_}: no page left"
            assert sb.tabs()


REFUSED = [
    "chrome://settings",
    "chrome://version",
    "file:///etc/passwd",
    "view-source:https://allowed.test/page/bank.html",
    "devtools://devtools/bundled/inspector.html",
    "chrome-extension://abcdefghijklmnopabcdefghijklmnop/page.html",
    "about:version",
    "javascript:document.title='ran'",
]


def test_navigate_refuses_what_cdp_refuses(gw: RunningGateway, sb: Sandbox) -> None:
    open_bank(sb)
    for url in REFUSED:
        for action in ({"type": "navigate", "url": url}, {"type": "tab_new", "url": url}):
            reply = sb.request({"action": action})
            assert reply["ok"] is False, (url, reply)
            assert (reply["error"]["code"], reply["error"]["field"]) == ("url_refused", "action.url"), reply
    assert sb.page_info().title == "Real Bank" and len(sb.tabs()) == 1
    with cdp_socket(gw, sb) as ws:
        for n, url in enumerate(REFUSED):
            made = cdp_call(ws, 10 + n, "Target.createTarget", {"url": url})
            assert made["error"]["message"].endswith("(rule internal_pages)"), made
    # What a web page is stays open to both.
    assert sb.act({"type": "navigate", "url": "data:text/html,<title>made</title>"})["result"]["title"] == "made"
