"""The viewer page's live screen and control, in a real Chromium driven by Playwright.

First against a scripted stream (Playwright answers the page's HTTP and WebSocket, in the design's
wire: no gateway), then end to end against a real session through the gateway's links."""

from __future__ import annotations

import io
import json
import shutil
from collections.abc import Iterator
from typing import Any

import pytest
from PIL import Image

from corral.gateway.viewer import viewer_page

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ORIGIN = "http://viewer.test"
SECRET = "crl_link_" + "s" * 43
ME = "human:lnk_3kq9x0a1b2c4"
OTHER = "human:lnk_0therv1ewer0"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            yield chromium
        finally:
            chromium.close()


def jpeg(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), rgb).save(out, "JPEG", quality=90)
    return out.getvalue()


def lease(holder: str, help_reason: str | None = None) -> dict[str, Any]:
    return {
        "holder": holder,
        "since": 1733000000.0,
        "help": {"reason": help_reason, "at": 1733000001.0} if help_reason else None,
    }


class Scripted:
    """The viewer page with its HTTP answered from ``events`` and its live stream played by the test."""

    def __init__(self, browser: Any, session: str, events: list[dict[str, Any]], mode: str = "control") -> None:
        self.session, self.events, self.mode = session, events, mode
        self.page = browser.new_page(viewport={"width": 1280, "height": 900})
        self.received: list[dict[str, Any]] = []  # what the page sent on its stream, in order
        self.stream_urls: list[str] = []
        self.event_requests: list[str] = []
        self.console: list[str] = []
        self.ws: Any = None
        self.page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}"))
        self.page.on("pageerror", lambda e: self.console.append(f"pageerror: {e}"))
        self.page.route(f"{ORIGIN}/**", self._answer)
        self.page.route_web_socket(f"{ORIGIN.replace('http', 'ws')}/**", self._stream)

    def _answer(self, route: Any) -> None:
        url = route.request.url
        page = viewer_page(self.session)
        if url.endswith("/viewer"):
            route.fulfill(status=200, body=page.body, headers=page.headers, content_type="text/html")
        elif "/recording/events" in url:
            self.event_requests.append(url)
            events = self.events if "after=0" in url else []
            route.fulfill(status=200, json={"events": events, "ended": False})
        else:
            route.fulfill(status=404, json={"error": {"code": "not_found", "message": "no"}})

    def _stream(self, ws: Any) -> None:
        self.ws = ws
        self.stream_urls.append(ws.url)
        ws.on_message(lambda m: self.received.append(json.loads(m)))

    def open(self, fragment: str) -> None:
        self.page.goto(f"{ORIGIN}/v1/sessions/{self.session}/viewer#{fragment}")
        self.page.wait_for_function("() => document.getElementById('status').textContent === 'live'")
        self.wait_sent(1)

    def wait_sent(self, count: int) -> list[dict[str, Any]]:
        for _ in range(100):
            if len(self.received) >= count:
                return self.received
            self.page.wait_for_timeout(50)
        raise AssertionError(f"the page sent {self.received}, expected {count} messages")

    def push(self, message: dict[str, Any] | bytes) -> None:
        self.ws.send(message if isinstance(message, bytes) else json.dumps(message))

    def hello(self, screen: tuple[int, int], holder: str = "agent", help_reason: str | None = None) -> None:
        size = {"width": screen[0], "height": screen[1]}
        self.push(
            {"type": "hello", "viewer": ME, "mode": self.mode, "screen": size, "lease": lease(holder, help_reason)}
        )

    def inputs(self, after: int) -> list[dict[str, Any]]:
        return [m["action"] for m in self.received[after:] if m["type"] == "input"]


HUMAN_CLICK = {"seq": 1, "time": 1.0, "event": "action", "ok": True, "action_id": "h1.boot", "actor": ME,
               "dialect": "human", "native": [{"type": "mouse_down", "x": 5, "y": 6}], "frame": None}  # fmt: skip
AGENT_CLICK = {"seq": 3, "time": 2.0, "event": "action", "ok": True, "action_id": "a1.boot",
               "native": [{"type": "click", "x": 7, "y": 8}], "frame": None}  # fmt: skip
TAKEN = {"seq": 2, "time": 1.5, "event": "control", "change": "taken", "holder": ME, "previous": "agent"}
CDP = {"seq": 4, "time": 3.0, "event": "cdp", "change": "refused", "conn": "cdp_1a2b3c4d", "exclusive": False,
       "method": "Browser.close", "rule": "browser_lifecycle"}  # fmt: skip


def test_a_control_link_draws_frames_takes_control_and_sends_input(browser: Any) -> None:
    s = Scripted(browser, "ses_live1", [HUMAN_CLICK, TAKEN, AGENT_CLICK, CDP])
    page = s.page
    s.open(f"link={SECRET}")
    # The credential went as the stream's first message, and in no URL.
    assert s.received[0] == {"type": "auth", "credential": SECRET}
    assert s.stream_urls == ["ws://viewer.test/v1/sessions/ses_live1/live"]
    assert all(SECRET not in url for url in s.event_requests)

    # The list: human actions name their actor, lease and CDP events are lines of their own, not steps.
    items = page.locator("#actions li").all_inner_texts()
    assert items == [
        f"1. [{ME}] mouse_down x=5 y=6",
        f"control taken: held by {ME}, before agent",
        "2. click x=7 y=8",
        "cdp cdp_1a2b3c4d refused Browser.close, rule browser_lifecycle",
    ]
    assert page.inner_text("#position") == "step 1 of 2"

    width, height = 1600, 1000  # wider than the page's column: the canvas is scaled down
    s.hello((width, height), help_reason="solve the CAPTCHA on the login page")
    s.push(jpeg(width, height, (200, 30, 30)))
    page.wait_for_function("() => document.getElementById('screen').dataset.frames === '1'")
    red = page.evaluate(
        "() => Array.from(document.getElementById('screen').getContext('2d').getImageData(800, 500, 1, 1).data)"
    )
    assert red[0] > 180 and red[1] < 60 and red[2] < 60
    assert page.inner_text("#lease").startswith("In control: agent since ")
    assert page.inner_text("#help").startswith("The agent asks for help: solve the CAPTCHA on the login page")
    assert page.is_enabled("#take") and page.is_disabled("#handback")
    s.push(jpeg(width, height, (30, 30, 200)))
    page.wait_for_function("() => document.getElementById('screen').dataset.frames === '2'")

    # Input before the lease is this viewer's goes nowhere.
    page.locator("#screen").click(position={"x": 10, "y": 10})
    page.keyboard.type("x")
    assert s.inputs(1) == []

    page.click("#take")
    assert s.wait_sent(2)[1] == {"type": "take", "seq": 1}
    s.push({"type": "ack", "seq": 1})
    s.push({"type": "lease", "lease": lease(ME)})
    page.wait_for_function("() => document.getElementById('screen').classList.contains('holding')")
    assert page.inner_text("#lease").startswith(f"In control: {ME} (you) since ")
    assert page.is_hidden("#help") and page.is_disabled("#take") and page.is_enabled("#handback")

    # A click at a CSS point lands at the screen pixel under it.
    box = page.locator("#screen").bounding_box()
    assert box is not None and box["width"] < width
    mark = len(s.received)
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 4)
    s.wait_sent(mark + 2)
    down, up = s.inputs(mark)[-2:]
    assert down["type"] == "mouse_down" and up["type"] == "mouse_up" and down["button"] == "left"
    assert (
        abs(down["x"] - width / 2) <= 2
        and abs(down["y"] - height / 4) <= 2
        and (up["x"], up["y"]) == (down["x"], down["y"])
    )
    assert page.evaluate("() => document.activeElement.id") == "screen"

    # Moves in one burst go as one, at the last position.
    mark = len(s.received)
    page.evaluate(
        """() => { const c = document.getElementById('screen'), b = c.getBoundingClientRect();
          for (let i = 1; i <= 50; i++) c.dispatchEvent(new PointerEvent('pointermove',
            {clientX: b.left + i, clientY: b.top + 2 * i, bubbles: true})); }"""
    )
    s.wait_sent(mark + 1)
    page.wait_for_timeout(100)
    moves = s.inputs(mark)
    assert len(moves) == 1 and moves[0]["type"] == "move"
    inner_w, inner_h = box["width"] - 2, box["height"] - 2  # inside the canvas's 1px border
    assert moves[0]["x"] == int(49 * width / inner_w) and moves[0]["y"] == int(99 * height / inner_h)

    # The wheel as scroll pixels; keys as text or xdotool names.
    mark = len(s.received)
    page.mouse.wheel(0, 120)
    page.keyboard.type("hi!")
    for key in ("Enter", "Backspace", "ArrowLeft", "Escape", "Tab", "Delete", "Home", "End", "PageUp", "PageDown",
                "F1", "F12", "Control+a", "Control+Shift+T", "Alt+F4", "Meta+e", "Shift+Tab", " "):  # fmt: skip
        page.keyboard.press(key)
    expected = [
        {"type": "type", "text": "h"}, {"type": "type", "text": "i"}, {"type": "type", "text": "!"},
        *({"type": "key", "keys": k} for k in ("Return", "BackSpace", "Left", "Escape", "Tab", "Delete", "Home",
          "End", "Prior", "Next", "F1", "F12", "ctrl+a", "ctrl+shift+t", "alt+F4", "super+e", "shift+Tab")),
        {"type": "type", "text": " "},
    ]  # fmt: skip
    s.wait_sent(mark + 1 + len(expected))
    sent = s.inputs(mark)
    assert sent[0]["type"] == "scroll" and sent[0]["dy"] == 120 and sent[0]["dx"] == 0
    assert sent[1:] == expected
    assert page.evaluate("() => document.activeElement.id") == "screen"  # Tab stayed on the canvas

    # Paste is typed.
    mark = len(s.received)
    page.evaluate(
        """() => { const d = new DataTransfer(); d.setData('text/plain', 'pasted words');
          document.getElementById('screen').dispatchEvent(
            new ClipboardEvent('paste', {clipboardData: d, bubbles: true})); }"""
    )
    assert s.wait_sent(mark + 1)[mark]["action"] == {"type": "type", "text": "pasted words"}

    # An error answering a request is shown in the status line.
    s.push(
        {
            "type": "error",
            "seq": s.received[-1]["seq"],
            "error": {"code": "invalid_field", "message": "bad text", "field": "action.text"},
        }
    )
    page.wait_for_function(
        "() => document.getElementById('status').textContent.includes('type refused: invalid_field')"
    )
    assert page.inner_text("#status") == "live \u2014 type refused: invalid_field (bad text) [action.text]"

    # Hand back with a note.
    page.fill("#note", "logged in; the code was 1234")
    mark = len(s.received)
    page.click("#handback")
    release = s.wait_sent(mark + 1)[mark]
    assert release == {"type": "release", "seq": release["seq"], "note": "logged in; the code was 1234"}
    s.push({"type": "ack", "seq": release["seq"]})
    s.push({"type": "lease", "lease": lease("agent")})
    page.wait_for_function("() => !document.getElementById('screen').classList.contains('holding')")
    assert page.input_value("#note") == ""
    mark = len(s.received)
    page.locator("#screen").click(position={"x": 20, "y": 20})
    page.keyboard.type("y")
    page.wait_for_timeout(100)
    assert s.inputs(mark) == []

    # Revoked: the stream closes with 4003; the page says so and asks for nothing more.
    s.ws.close(code=4003, reason="link revoked")
    page.wait_for_function("() => document.getElementById('status').textContent === 'stopped: link revoked'")
    assert page.is_hidden("#live")
    asked = len(s.event_requests)
    page.wait_for_timeout(2500)
    assert len(s.event_requests) <= asked + 1 and len(s.stream_urls) == 1
    assert page.inner_text("#status") == "stopped: link revoked"
    assert not [line for line in s.console if "Content Security Policy" in line or "pageerror" in line], s.console
    page.close()


def test_a_view_link_watches_and_cannot_control(browser: Any) -> None:
    s = Scripted(browser, "ses_live2", [], mode="view")
    page = s.page
    s.open("token=key-1")
    assert s.received[0] == {"type": "auth", "credential": "key-1"}
    s.hello((320, 200), holder=OTHER)
    s.push(jpeg(320, 200, (20, 160, 20)))
    page.wait_for_function("() => document.getElementById('screen').dataset.frames === '1'")
    assert page.is_hidden("#control") and page.is_visible("#screen")
    assert page.inner_text("#lease").startswith(f"In control: {OTHER} since ")
    page.locator("#screen").click(position={"x": 10, "y": 10})
    page.keyboard.type("abc")
    page.wait_for_timeout(100)
    assert len(s.received) == 1  # the auth message only
    # A refusal (not a revocation) hides the screen and says so; polling goes on.
    s.ws.close(code=4403, reason="forbidden")
    page.wait_for_function("() => document.getElementById('status').textContent.includes('live view refused')")
    assert page.inner_text("#status") == "live \u2014 live view refused: forbidden (forbidden)"
    assert page.is_hidden("#live")
    assert not [line for line in s.console if "Content Security Policy" in line or "pageerror" in line], s.console
    page.close()
