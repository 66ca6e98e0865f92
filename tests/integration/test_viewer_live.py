"""The viewer page's live screen and control, in a real Chromium driven by Playwright.

First against a scripted stream (Playwright answers the page's HTTP and WebSocket, in the design's
wire: no gateway), then end to end against a real session through the gateway's links."""

from __future__ import annotations

import io
import json
import os
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from PIL import Image

from corral.errors import ActionFailed
from corral.gateway.viewer import viewer_page
from corral.sdk import Sandbox

from .conftest import html_url
from .gateway_fixtures import KEY_A, RunningGateway, gateway

ORIGIN = "http://viewer.test"
SECRET = "crl_link_" + "s" * 43
ME = "human:lnk_3kq9x0a1b2c4"
OTHER = "human:lnk_0therv1ewer0"


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


def squashed(actions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive ``type`` actions as one: the page sends the characters typed within one
    animation frame together, so how many actions a burst makes depends on timing."""
    out: list[dict[str, Any]] = []
    for action in actions:
        if action["type"] == "type" and out and out[-1]["type"] == "type":
            out[-1] = {"type": "type", "text": out[-1]["text"] + action["text"]}
        else:
            out.append(action)
    return out


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
    # The pointer's move to the point may come first (one per animation frame): wait for the release.
    for _ in range(100):
        if any(i["type"] == "mouse_up" for i in s.inputs(mark)):
            break
        page.wait_for_timeout(50)
    down, up = [i for i in s.inputs(mark) if i["type"] != "move"][-2:]
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
        {"type": "type", "text": "hi!"},
        *({"type": "key", "keys": k} for k in ("Return", "BackSpace", "Left", "Escape", "Tab", "Delete", "Home",
          "End", "Prior", "Next", "F1", "F12", "ctrl+a", "ctrl+shift+t", "alt+F4", "super+e", "shift+Tab")),
        {"type": "type", "text": " "},
    ]  # fmt: skip
    for _ in range(100):
        sent = s.inputs(mark)
        if sent and sent[-1] == {"type": "type", "text": " "}:
            break
        page.wait_for_timeout(50)
    assert sent[0]["type"] == "scroll" and sent[0]["dy"] == 120 and sent[0]["dx"] == 0
    assert squashed(sent[1:]) == expected
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
    assert len(s.event_requests) == asked and len(s.stream_urls) == 1
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


# ---- End to end: a real session through the gateway, its viewer links and live stream ----


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, desktop_image: str, egress_image: str) -> Iterator[RunningGateway]:
    with gateway(tmp_path_factory.mktemp("viewer-live-gw"), f"vlive-{os.getpid()}") as running:
        yield running


def make_link(gw: RunningGateway, session_id: str, mode: str) -> dict[str, Any]:
    with gw.client() as c:
        made = c.post(f"/v1/sessions/{session_id}/links", json={"mode": mode, "ttl_s": 600})
    assert made.status_code == 201, made.text
    link: dict[str, Any] = made.json()
    assert link["mode"] == mode and link["url"].startswith(f"{gw.url}/v1/sessions/{session_id}/viewer#link=")
    return link


class Opened:
    """A viewer page opened from a link, with what it requested, its streams and its console."""

    def __init__(self, browser: Any, url: str) -> None:
        self.page = browser.new_page(viewport={"width": 1600, "height": 1000})
        self.urls: list[str] = []
        self.streams: list[Any] = []
        self.console: list[str] = []
        self.page.on("request", lambda r: self.urls.append(r.url))
        self.page.on("websocket", lambda ws: self.streams.append(ws))
        self.page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}"))
        self.page.on("pageerror", lambda e: self.console.append(f"pageerror: {e}"))
        response = self.page.goto(url)
        assert response is not None and response.ok
        self.headers: dict[str, str] = response.headers
        self.page.wait_for_function("() => +(document.getElementById('screen').dataset.frames || 0) >= 1")

    def wait_color(self, x: int, y: int, rgb: tuple[int, int, int], timeout_ms: int = 10_000) -> None:
        self.page.wait_for_function(
            """([x, y, rgb]) => {
              const d = document.getElementById('screen').getContext('2d').getImageData(x, y, 1, 1).data;
              return rgb.every((v, i) => Math.abs(d[i] - v) < 24); }""",
            arg=[x, y, list(rgb)],
            timeout=timeout_ms,
        )

    def assert_clean(self, secret: str) -> None:
        # The page's own headers, and the secret in no URL it asked for (page, fetches, stream).
        csp = self.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "connect-src 'self'" in csp and "unsafe" not in csp
        assert self.headers["referrer-policy"] == "no-referrer" and self.headers["cache-control"] == "no-store"
        assert self.streams and all(secret not in ws.url for ws in self.streams)
        assert all(secret not in url.split("#", 1)[0] for url in self.urls)
        # Same-origin ws: is within connect-src 'self': nothing was refused, nothing thrown.
        assert not [line for line in self.console if "Content Security Policy" in line or "pageerror" in line]


FILL = '<div style="position:fixed;inset:0;background:{color}"></div>'


def test_a_view_link_shows_the_screen_and_follows_an_agent_action(gw: RunningGateway, browser: Any) -> None:
    with Sandbox.create(url=gw.url, api_key=KEY_A) as sb:
        sb.act({"type": "navigate", "url": html_url(FILL.format(color="#ffffff"))}, wait_for="stable")
        link = make_link(gw, sb.id, "view")
        secret = link["url"].split("#link=", 1)[1]
        opened = Opened(browser, link["url"])
        page = opened.page
        width, height = page.evaluate(
            "() => [document.getElementById('screen').width, document.getElementById('screen').height]"
        )
        x, y = width // 2, height // 2
        opened.wait_color(x, y, (255, 255, 255))
        assert page.is_hidden("#control") and page.inner_text("#lease").startswith("In control: agent since ")
        started = time.monotonic()
        sb.act({"type": "navigate", "url": html_url(FILL.format(color="#00c000"))}, wait_for="stable")
        opened.wait_color(x, y, (0, 192, 0))
        assert time.monotonic() - started < 10
        opened.assert_clean(secret)
        page.close()


TYPING = (
    '<input id="t" style="position:fixed;left:0;top:0;width:100%;height:100%;font-size:48px;border:0">',
    "let clicks = 0; const t = document.getElementById('t');"
    "const show = () => { document.title = 'clicks=' + clicks + ' value=' + t.value; };"
    "document.addEventListener('click', () => { clicks += 1; show(); }); t.addEventListener('input', show);",
)


def test_a_control_link_answers_a_request_for_help(gw: RunningGateway, browser: Any) -> None:
    with Sandbox.create(url=gw.url, api_key=KEY_A) as sb:
        sb.act({"type": "navigate", "url": html_url(*TYPING)}, wait_for="stable")
        link = make_link(gw, sb.id, "control")
        me = "human:" + link["id"]
        opened = Opened(browser, link["url"])
        page = opened.page
        assert page.is_visible("#take") and page.is_disabled("#handback")

        # The agent asks for help (and waits for it on a thread of its own).
        answers: list[httpx.Response] = []
        ask = {"action": {"type": "request_control", "reason": "please type the greeting", "wait_ms": 60_000}}

        def request_help() -> None:
            with httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {KEY_A}"}, timeout=90) as c:
                answers.append(c.post(f"/v1/sessions/{sb.id}/actions", json=ask))

        helper = threading.Thread(target=request_help)
        helper.start()
        try:
            page.wait_for_selector("#help:not([hidden])", timeout=10_000)
            assert page.inner_text("#help").startswith("The agent asks for help: please type the greeting")

            page.click("#take")
            page.wait_for_function(f"() => document.getElementById('lease').dataset.holder === {json.dumps(me)}")
            assert page.inner_text("#lease").startswith(f"In control: {me} (you) since ")
            with pytest.raises(ActionFailed) as taken:  # the agent is refused while the human holds it
                sb.act({"type": "page_info"})
            assert taken.value.code == "control_taken" and taken.value.error["holder"] == me

            page.locator("#screen").click()  # the middle of the screen: the page's input
            page.keyboard.type("hello corral")
            page.fill("#note", "typed it for you")
            page.click("#handback")
            helper.join(timeout=30)
        finally:
            helper.join(timeout=90)
        assert answers and answers[0].status_code == 200, answers and answers[0].text
        handed = answers[0].json()["result"]["handed_back"]
        assert handed["by"] == me and handed["note"] == "typed it for you" and handed["left"] is False
        page.wait_for_function("() => document.getElementById('lease').dataset.holder === 'agent'")
        assert page.is_hidden("#help") and page.input_value("#note") == ""
        # What the human did happened in the sandbox.
        info = sb.act({"type": "page_info"})
        assert info["result"]["title"] == "clicks=1 value=hello corral", info
        # The recording lists the human's input under their name, and the lease's changes.
        page.wait_for_selector(f"#actions li[data-actor='{me}']", timeout=15_000)
        # (textContent: inner_text would fold a typed space into the one before "delay_ms")
        humans = page.locator(f"#actions li[data-actor='{me}']").evaluate_all("items => items.map(i => i.textContent)")
        typed = "".join(re.findall(r"\] type text=(.*?) delay_ms=", "\n".join(humans)))
        assert typed == "hello corral", humans
        assert page.locator("#actions li.event.control").count() >= 2
        opened.assert_clean(link["url"].split("#link=", 1)[1])
        page.close()


def test_a_revoked_link_stops_the_page_and_closes_its_stream(gw: RunningGateway, browser: Any) -> None:
    with Sandbox.create(url=gw.url, api_key=KEY_A) as sb:
        link = make_link(gw, sb.id, "control")
        opened = Opened(browser, link["url"])
        page = opened.page
        stream = opened.streams[-1]
        assert not stream.is_closed()
        with gw.client() as c:
            revoked = c.delete(f"/v1/sessions/{sb.id}/links/{link['id']}")
        assert revoked.status_code == 200 and revoked.json()["id"] == link["id"]
        started = time.monotonic()
        page.wait_for_function("() => document.getElementById('status').textContent === 'stopped: link revoked'")
        assert time.monotonic() - started < 3 and stream.is_closed()
        assert page.is_hidden("#live")
        # Opened again, the link is refused outright.
        again = browser.new_page()
        again.goto(link["url"])
        again.wait_for_function("() => document.getElementById('heading').textContent.includes('link revoked')")
        again.close()
        page.close()


class Squatters:
    """``count`` sockets on a session's live stream that never send their credential, each opened
    again the moment the gateway closes it (a timeout, a refusal, its place taken): an attacker
    holding every place for sockets waiting to authenticate. Runs on a loop of its own."""

    def __init__(self, ws_url: str, count: int) -> None:
        self.ws_url, self.count = ws_url, count
        self.opened = 0
        self.closes: dict[int, int] = {}
        self.holding = threading.Event()
        self._stop: Any = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Squatters:
        self._thread.start()
        assert self.holding.wait(60), f"only {self.opened} squatting sockets opened"
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    def _run(self) -> None:
        import asyncio

        self._loop = asyncio.new_event_loop()
        self._loop.run_until_complete(self._main())
        self._loop.close()

    async def _main(self) -> None:
        import asyncio

        self._stop = asyncio.Event()
        tasks = [asyncio.create_task(self._squat()) for _ in range(self.count)]
        await self._stop.wait()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _squat(self) -> None:
        from websockets.asyncio.client import connect
        from websockets.exceptions import ConnectionClosed, InvalidHandshake

        while not self._stop.is_set():
            try:
                async with connect(self.ws_url, open_timeout=30, close_timeout=1) as ws:
                    self.opened += 1
                    if self.opened >= self.count:
                        self.holding.set()
                    try:
                        await ws.recv()
                    except ConnectionClosed as closed:
                        code = closed.rcvd.code if closed.rcvd is not None else 1006
                        self.closes[code] = self.closes.get(code, 0) + 1
            except (OSError, TimeoutError, InvalidHandshake):
                continue


def test_sockets_that_never_authenticate_cannot_keep_a_viewer_out(gw: RunningGateway, browser: Any) -> None:
    """500 sockets on the session's live stream that never send their credential, opened again as
    soon as they are closed: the gateway's places for sockets waiting to authenticate were all theirs,
    and a viewer's socket was refused (1013) as long as the attack went on."""
    with Sandbox.create(url=gw.url, api_key=KEY_A) as sb:
        sb.act({"type": "navigate", "url": html_url(FILL.format(color="#00c000"))}, wait_for="stable")
        link = make_link(gw, sb.id, "view")
        ws_url = gw.url.replace("http://", "ws://") + f"/v1/sessions/{sb.id}/live"
        with Squatters(ws_url, 500) as squatters:
            started = time.monotonic()
            opened = Opened(browser, link["url"])  # waits for the page's first frame (Playwright: 30 s)
            took = time.monotonic() - started
            width, height = opened.page.evaluate(
                "() => [document.getElementById('screen').width, document.getElementById('screen').height]"
            )
            opened.wait_color(width // 2, height // 2, (0, 192, 0))
            assert took < 10, took  # as without the attack: the page, its auth, a frame
            assert squatters.opened >= 500 and squatters.closes.get(1013, 0) > 0, (squatters.opened, squatters.closes)
        opened.page.close()
