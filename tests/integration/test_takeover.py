"""Issue 15 end to end: the live view, the control lease, viewer links and CDP, across their parts.

A real gateway, real sandboxes and their real mitmproxy sidecars, a fake upstream (names under .test,
on the test's own Docker network), a real Chromium on the host driven by Playwright for the viewer
page, and Python WebSocket clients for the live stream's wire. The human's input goes through the
viewer (or the stream) into the sandbox; what it did is read back from the sandbox's page, the
upstream's log, the audit chain and the recording.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
import time
import urllib.parse
import xml.etree.ElementTree as ET
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from corral.proxy.audit import verify
from corral.recording.bundle import read_bundle
from corral.sdk import Sandbox

from .conftest import center, find_color, html_url, wait_for
from .dockerutil import DockerHarness
from .egress_fixtures import Upstream, session_fixtures
from .gateway_fixtures import KEY_A, KEY_B, RunningGateway, replay_cli, traffic, unpack_recording

pytestmark = pytest.mark.usefixtures("desktop_image", "egress_image")
TAKEOVER_PAGE = "https://allowed.test/page/takeover.html"
BLUE, GREEN = (0, 0, 255), (0, 200, 0)


upstream, gw, sb = session_fixtures("takeover")


# -- links and the live stream's wire ----------------------------------------------------------------------


def make_link(gw: RunningGateway, session_id: str, mode: str, ttl_s: int = 3600, key: str = KEY_A) -> dict[str, Any]:
    with gw.client(key) as c:
        response = c.post(f"/v1/sessions/{session_id}/links", json={"mode": mode, "ttl_s": ttl_s})
    assert response.status_code == 201, response.text
    link: dict[str, Any] = response.json()
    assert link["mode"] == mode and link["id"].startswith("lnk_"), link
    assert link["url"].startswith(f"{gw.url}/v1/sessions/{session_id}/viewer#link=crl_link_"), link
    return link


def secret_of(link: dict[str, Any]) -> str:
    return str(link["url"]).split("#link=", 1)[1]


def revoke(gw: RunningGateway, session_id: str, link_id: str) -> httpx.Response:
    with gw.client() as c:
        return c.delete(f"/v1/sessions/{session_id}/links/{link_id}")


class Refused(Exception):
    """The gateway closed the live stream instead of saying hello."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"{code} {reason}")
        self.code, self.reason = code, reason


class Live:
    """One live stream through the gateway (``WS /v1/sessions/{id}/live``), read on a thread of its own:
    JSON messages in order, binary frames counted, the close kept with its time."""

    def __init__(self, gw: RunningGateway, session_id: str, credential: str) -> None:
        self.ws: ClientConnection = connect(
            f"{gw.ws}/v1/sessions/{session_id}/live", max_size=None, open_timeout=10, legacy=True
        )
        self.ws.send(json.dumps({"type": "auth", "credential": credential}))
        self.messages: list[dict[str, Any]] = []
        self.frames = 0
        self.closed: tuple[int, str, float] | None = None  # code, reason, when (monotonic)
        self._seq = 0
        self._arrived = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        hello = self.wait(lambda m: m["type"] == "hello", 10)
        if hello is None:
            assert self.closed is not None, "no hello and no close"
            raise Refused(self.closed[0], self.closed[1])
        self.hello = hello

    def _read(self) -> None:
        try:
            for message in self.ws:
                with self._arrived:
                    if isinstance(message, bytes):
                        self.frames += 1
                    else:
                        self.messages.append(json.loads(message))
                    self._arrived.notify_all()
        except ConnectionClosed:
            pass
        rcvd = self.ws.close_code, self.ws.close_reason or ""
        with self._arrived:
            self.closed = (rcvd[0] or 1006, rcvd[1], time.monotonic())
            self._arrived.notify_all()

    def wait(self, match: Callable[[dict[str, Any]], bool], timeout_s: float = 10) -> dict[str, Any] | None:
        """The first message so far that ``match``-es, waiting up to ``timeout_s`` (None at the close)."""
        deadline = time.monotonic() + timeout_s
        with self._arrived:
            while True:
                found = next((m for m in self.messages if match(m)), None)
                if found is not None or self.closed is not None:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._arrived.wait(left)

    def wait_frame(self, timeout_s: float) -> bool:
        """Whether a frame came within ``timeout_s``."""
        with self._arrived:
            return self._arrived.wait_for(lambda: self.frames > 0 or self.closed is not None, timeout_s) and (
                self.frames > 0
            )

    def wait_closed(self, timeout_s: float) -> tuple[int, str, float] | None:
        with self._arrived:
            self._arrived.wait_for(lambda: self.closed is not None, timeout_s)
            return self.closed

    def ask(self, message: dict[str, Any]) -> dict[str, Any]:
        """Sends ``message`` with the next seq; its ``ack`` or ``error``."""
        self._seq += 1
        seq = self._seq
        self.ws.send(json.dumps({**message, "seq": seq}))
        answer = self.wait(lambda m: m.get("seq") == seq and m["type"] in ("ack", "error"))
        assert answer is not None, (message, self.closed, self.messages[-5:])
        return answer

    def lease_holder(self, who: str, timeout_s: float = 10) -> dict[str, Any] | None:
        return self.wait(lambda m: m["type"] == "lease" and m["lease"]["holder"] == who, timeout_s)

    def close(self) -> None:
        self.ws.close()
        self._reader.join(5)


def refusal(gw: RunningGateway, session_id: str, credential: str) -> tuple[int, str]:
    """How the gateway closes a live stream that ``credential`` may not open."""
    with pytest.raises(Refused) as refused:
        Live(gw, session_id, credential).close()
    return refused.value.code, refused.value.reason


# -- the agent's side --------------------------------------------------------------------------------------


def http_action(gw: RunningGateway, sb: Sandbox, action: dict[str, Any], **envelope: Any) -> httpx.Response:
    with gw.client(sb.info.token) as c:
        return c.post(f"/v1/sessions/{sb.id}/actions", json={"action": action, **envelope})


def in_thread(work: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """``work`` started on a thread; the list gets its return value (or the exception it raised)."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(work())
        except Exception as exc:  # handed to the test, which asserts on it
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def screen_targets(sb: Sandbox) -> dict[str, tuple[int, int]]:
    """Where the takeover page's field and link are on the screen (screen pixels)."""
    image = Image.open(io.BytesIO(sb.screenshot())).convert("RGB")
    return {"field": center(find_color(image, BLUE)), "link": center(find_color(image, GREEN))}


def open_takeover_page(sb: Sandbox) -> dict[str, tuple[int, int]]:
    sb.act({"type": "navigate", "url": TAKEOVER_PAGE}, wait_for="stable")
    assert sb.page_info().title == "takeover"
    return screen_targets(sb)


# -- the viewer page in a real Chromium --------------------------------------------------------------------

# Installed in the viewer page: samples the live canvas's middle pixel on every animation frame and keeps
# when it last changed (Date.now(): the same clock as the test's time.time()).
WATCH_CANVAS = """() => {
  const canvas = document.getElementById("screen");
  const context = canvas.getContext("2d", {willReadFrequently: true});
  window.__changes = [];
  let last = null;
  const sample = () => {
    if (canvas.width > 0) {
      const pixel = Array.from(context.getImageData(canvas.width >> 1, canvas.height >> 1, 1, 1).data).join(",");
      if (last !== null && pixel !== last) window.__changes.push({at: Date.now(), pixel});
      last = pixel;
    }
    requestAnimationFrame(sample);
  };
  requestAnimationFrame(sample);
}"""


class Viewer:
    """The viewer page opened with a link: its live canvas (``#screen``), lease line (``#lease``), help
    banner (``#help``) and control (``#take``, ``#note``, ``#handback``)."""

    def __init__(self, browser: Any, url: str) -> None:
        self.page = browser.new_page(viewport={"width": 1400, "height": 1000})
        self.requests: list[str] = []
        self.console: list[str] = []
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}"))
        self.page.on("pageerror", lambda e: self.console.append(f"pageerror: {e}"))
        response = self.page.goto(url)
        assert response is not None and response.ok
        # The stream said hello and its first frame is drawn.
        self.page.wait_for_function(
            "() => !document.getElementById('live').hidden"
            " && Number(document.getElementById('screen').dataset.frames || 0) > 0",
            timeout=20_000,
        )

    def holder(self) -> str:
        return str(self.page.get_attribute("#lease", "data-holder") or "")

    def wait_holder(self, who: str, timeout_ms: int = 10_000) -> None:
        self.page.wait_for_function(
            "(who) => document.getElementById('lease').dataset.holder === who", arg=who, timeout=timeout_ms
        )

    def banner(self) -> str | None:
        """The help banner's text, None while hidden."""
        return None if self.page.locator("#help").is_hidden() else str(self.page.inner_text("#help"))

    def take(self, me: str) -> None:
        self.page.click("#take")
        self.wait_holder(me)

    def hand_back(self, note: str | None) -> None:
        if note is not None:
            self.page.fill("#note", note)
        self.page.click("#handback")

    def at(self, x: int, y: int) -> tuple[float, float]:
        """The page point over the screen pixel (x, y) of the live canvas."""
        box = self.page.locator("#screen").bounding_box()
        width, height = self.page.evaluate(
            "() => [document.getElementById('screen').width, document.getElementById('screen').height]"
        )
        return box["x"] + (x + 0.5) * box["width"] / width, box["y"] + (y + 0.5) * box["height"] / height

    def click(self, x: int, y: int) -> None:
        self.page.mouse.click(*self.at(x, y))

    def sent_no_secret(self, secret: str) -> None:
        for url in self.requests:
            assert secret not in url.split("#", 1)[0], url

    def close(self) -> None:
        self.page.close()


# -- the tests ---------------------------------------------------------------------------------------------


def test_a_view_link_shows_the_screen_change_after_an_agent_action(
    gw: RunningGateway, sb: Sandbox, browser: Any
) -> None:
    # Each click flips the whole page between red and white.
    page_html = html_url(
        "<div id=area style='position:fixed;inset:0;background:#fff'></div>",
        "let red = false; document.addEventListener('click', () => { red = !red;"
        " document.getElementById('area').style.background = red ? '#c80000' : '#fff'; });",
    )
    sb.act({"type": "navigate", "url": page_html}, wait_for="stable")
    link = make_link(gw, sb.id, "view")
    viewer = Viewer(browser, link["url"])
    try:
        assert viewer.page.locator("#control").is_hidden()  # a view link has no control
        viewer.page.evaluate(WATCH_CANVAS)
        viewer.page.wait_for_timeout(300)  # a few samples of the settled screen
        latencies = []
        for flip in range(1, 11):
            seen = viewer.page.evaluate("() => window.__changes.length")
            sent = time.time()
            sb.act({"type": "click", "x": 640, "y": 400})
            viewer.page.wait_for_function("(n) => window.__changes.length > n", arg=seen, timeout=10_000)
            change = viewer.page.evaluate("(n) => window.__changes[n]", seen)
            latencies.append((change["at"] / 1000 - sent) * 1000)
            r, g, b = (int(v) for v in change["pixel"].split(",")[:3])
            painted = r > 150 and g < 60 and b < 60 if flip % 2 else min(r, g, b) > 230  # red, then white again
            assert painted, (flip, change)
            viewer.page.wait_for_timeout(200)
        latencies.sort()
        print(
            f"\nview link: agent click to changed canvas pixels, p50 {latencies[4]:.0f} ms, max {latencies[-1]:.0f} ms"
        )
        assert all(0 < ms < 5000 for ms in latencies), latencies
        viewer.sent_no_secret(secret_of(link))
        assert not [line for line in viewer.console if "pageerror" in line or "Content Security" in line]
    finally:
        viewer.close()


def test_a_control_link_takes_over_types_and_hands_back_while_the_agent_is_refused(
    gw: RunningGateway, sb: Sandbox, browser: Any, upstream: Upstream, runtime: DockerHarness, tmp_path: Path
) -> None:
    targets = open_takeover_page(sb)
    link = make_link(gw, sb.id, "control")
    human = f"human:{link['id']}"
    viewer = Viewer(browser, link["url"])
    try:
        viewer.take(human)
        # The agent is refused over the WebSocket and over HTTP, naming the holder and since when.
        refused = sb.request({"action": {"type": "cursor_position"}})
        assert refused["ok"] is False and refused["error"]["code"] == "control_taken", refused
        assert refused["error"]["holder"] == human and refused["error"]["since"] <= time.time()
        answer = http_action(gw, sb, {"type": "page_info"})
        assert answer.status_code == 409, answer.text
        error = answer.json()["error"]
        assert (error["code"], error["holder"]) == ("control_taken", human) and error["since"] <= time.time()
        ran = sb.request({"action": {"type": "exec", "argv": ["true"]}})  # commands could drive X too
        assert ran["ok"] is False and ran["error"]["code"] == "control_taken", ran

        # The human clicks the field and types; the page in the sandbox sends it to the upstream.
        before = len(upstream.hits(runtime))
        viewer.click(*targets["field"])
        viewer.page.keyboard.type("hello human")
        viewer.page.keyboard.press("Enter")
        typed = wait_for(
            lambda: [h for h in upstream.hits(runtime)[before:] if str(h["path"]).startswith("/json?typed=")]
        )
        assert typed and typed[-1]["path"] == "/json?typed=hello%20human", upstream.hits(runtime)[before:]

        # An agent action that waits for control runs once the human hands back, and its reply carries the note.
        waiting, out = in_thread(lambda: sb.request({"action": {"type": "page_info"}, "wait_for_control_ms": 60_000}))
        time.sleep(0.5)
        assert waiting.is_alive() and not out  # it waits
        viewer.hand_back("logged in; over to you")
        waiting.join(30)
        reply = out[0]
        assert not isinstance(reply, Exception), reply
        assert reply["ok"] is True and reply["result"]["title"] == "typed hello human", reply
        assert reply["control"]["by"] == human and reply["control"]["note"] == "logged in; over to you", reply
        assert reply["control"]["left"] is False
        after = sb.request({"action": {"type": "control"}})
        assert after["ok"] is True and "control" not in after, after  # once
        assert after["result"]["holder"] == "agent" and after["result"]["handed_back"] is None, after
        viewer.sent_no_secret(secret_of(link))
    finally:
        viewer.close()


def test_the_control_action_and_request_control_return_the_humans_note(
    gw: RunningGateway, sb: Sandbox, browser: Any
) -> None:
    link = make_link(gw, sb.id, "control")
    human = f"human:{link['id']}"
    # The agent asks for help; every viewer shows the reason; the human takes over and hands back.
    viewer = Viewer(browser, link["url"])
    try:
        asking, asked = in_thread(
            lambda: sb.request(
                {"action": {"type": "request_control", "reason": "solve the CAPTCHA", "wait_ms": 60_000}}
            )
        )
        assert wait_for(lambda: "solve the CAPTCHA" in (viewer.banner() or ""))
        viewer.take(human)
        viewer.hand_back("solved it")
        asking.join(30)
        reply = asked[0]
        assert not isinstance(reply, Exception), reply
        assert reply["ok"] is True, reply
        handed = reply["result"]["handed_back"]
        assert (handed["by"], handed["note"], handed["left"]) == (human, "solved it", False), reply
        assert reply["result"]["holder"] == "agent" and reply["result"]["help"] is None
        assert wait_for(lambda: viewer.banner() is None), viewer.banner()
    finally:
        viewer.close()

    # Nobody comes: request_control returns without a hand-back, not an error.
    nobody = sb.request({"action": {"type": "request_control", "reason": "anyone?", "wait_ms": 300}})
    assert nobody["ok"] is True and nobody["result"]["handed_back"] is None, nobody

    # The control action waits for the hand-back of a human on the live stream.
    live = Live(gw, sb.id, secret_of(link))
    try:
        assert live.hello["mode"] == "control" and live.hello["viewer"] == human
        assert live.ask({"type": "take"})["type"] == "ack"
        waiting, out = in_thread(lambda: sb.request({"action": {"type": "control", "wait_ms": 60_000}}))
        time.sleep(0.3)
        assert waiting.is_alive()
        assert live.ask({"type": "release", "note": "all yours"})["type"] == "ack"
        waiting.join(30)
        reply = out[0]
        assert not isinstance(reply, Exception) and reply["ok"] is True, reply
        assert reply["result"]["holder"] == "agent"
        assert reply["result"]["handed_back"]["note"] == "all yours" and reply["result"]["handed_back"]["by"] == human
        assert "control" not in sb.request({"action": {"type": "cursor_position"}})  # consumed by the action
    finally:
        live.close()


def test_revoking_a_link_closes_its_stream_within_a_second_and_it_stops_working(
    gw: RunningGateway, sb: Sandbox
) -> None:
    link = make_link(gw, sb.id, "control")
    live = Live(gw, sb.id, secret_of(link))
    assert live.wait_frame(5.0), "no frame"  # the current frame, sent to a new stream
    with gw.client() as c:
        listed = c.get(f"/v1/sessions/{sb.id}/links").json()
    mine = next(item for item in listed if item["id"] == link["id"])
    assert mine["streams"] == 1 and mine["revoked_at"] is None and mine["last_used_at"] is not None
    assert "url" not in mine and secret_of(link) not in json.dumps(listed)
    asked = time.monotonic()
    response = revoke(gw, sb.id, link["id"])
    assert response.status_code == 200 and response.json()["id"] == link["id"], response.text
    closed = live.wait_closed(2.0)
    assert closed is not None, "the stream stayed open after the revoke"
    code, reason, at = closed
    print(f"\nrevoke: stream closed {1000 * (at - asked):.0f} ms after the DELETE was sent")
    assert (code, reason) == (4003, "link revoked") and at - asked < 1.0, closed
    assert revoke(gw, sb.id, link["id"]).status_code == 200  # twice is fine
    # It opens nothing any more: no stream, no viewer read.
    assert refusal(gw, sb.id, secret_of(link)) == (4401, "link revoked")
    with gw.client(secret_of(link)) as c:
        read = c.get(f"/v1/sessions/{sb.id}/recording/events")
    assert read.status_code == 401 and read.json()["error"]["message"] == "link revoked", read.text
    assert sb.act({"type": "cursor_position"})["ok"] is True  # the agent never lost anything
    with gw.client() as c:
        gone = c.get(f"/v1/sessions/{sb.id}/links").json()
    assert next(item for item in gone if item["id"] == link["id"])["revoked_at"] is not None


def test_an_expired_link_and_another_sessions_link_are_refused(gw: RunningGateway, sb: Sandbox) -> None:
    short = make_link(gw, sb.id, "view", ttl_s=2)
    live = Live(gw, sb.id, secret_of(short))
    closed = live.wait_closed(short["expires_at"] - time.time() + 1.5)
    assert closed is not None and closed[:2] == (4003, "link expired"), closed
    assert time.time() - short["expires_at"] < 1.5
    assert refusal(gw, sb.id, secret_of(short)) == (4401, "link expired")
    with gw.client(secret_of(short)) as c:
        read = c.get(f"/v1/sessions/{sb.id}/recording/events")
    assert read.status_code == 401 and read.json()["error"]["message"] == "link expired", read.text

    with Sandbox.create(url=gw.url, api_key=KEY_A, allow=["allowed.test"]) as other:
        foreign = make_link(gw, other.id, "control")
        code, _ = refusal(gw, sb.id, secret_of(foreign))
        assert code == 4403
        with gw.client(secret_of(foreign)) as c:
            assert c.get(f"/v1/sessions/{sb.id}/recording/events").status_code == 403
            assert c.get(f"/v1/sessions/{other.id}/recording/events").status_code == 200  # its own
    # Another owner's key cannot make links on this session, nor watch it; the owner's key watches in control.
    with gw.client(KEY_B) as c:
        assert c.post(f"/v1/sessions/{sb.id}/links", json={"mode": "view"}).status_code == 403
    assert refusal(gw, sb.id, KEY_B)[0] == 4403
    assert refusal(gw, sb.id, "crl_link_" + "x" * 43)[0] == 4401  # no such link
    owner = Live(gw, sb.id, KEY_A)
    try:
        assert (owner.hello["viewer"], owner.hello["mode"]) == ("human:owner", "control")
    finally:
        owner.close()


def test_a_session_token_cannot_make_links_and_a_view_link_cannot_act(gw: RunningGateway, sb: Sandbox) -> None:
    with gw.client(sb.info.token) as c:
        made = c.post(f"/v1/sessions/{sb.id}/links", json={"mode": "control"})
    assert made.status_code == 403, made.text
    view = make_link(gw, sb.id, "view")
    live = Live(gw, sb.id, secret_of(view))
    try:
        assert live.hello["mode"] == "view" and live.hello["viewer"] == f"human:{view['id']}"
        for message in (
            {"type": "take"},
            {"type": "input", "action": {"type": "click", "x": 10, "y": 10}},
            {"type": "release"},
        ):
            answer = live.ask(message)
            assert answer["type"] == "error" and answer["error"]["code"] == "forbidden", (message, answer)
        assert sb.act({"type": "cursor_position"})["ok"] is True  # the lease never moved
    finally:
        live.close()
    # A link secret is no credential for anything but the viewer's reads and the stream.
    with gw.client(secret_of(view)) as c:
        acted = c.post(f"/v1/sessions/{sb.id}/actions", json={"action": {"type": "cursor_position"}})
        assert acted.status_code in (401, 403), acted.text
        assert c.get(f"/v1/sessions/{sb.id}/files", params={"path": "/etc/hostname"}).status_code in (401, 403)
        assert c.post(f"/v1/sessions/{sb.id}/links", json={"mode": "control"}).status_code in (401, 403)
        assert c.get(f"/v1/sessions/{sb.id}/cdp/json/version").status_code in (401, 403)
    # The agent's own token opens the stream as a viewer, never in control.
    live = Live(gw, sb.id, sb.info.token)
    try:
        assert (live.hello["viewer"], live.hello["mode"]) == ("agent", "view")
        assert live.ask({"type": "take"})["error"]["code"] == "forbidden"
    finally:
        live.close()


def test_a_humans_input_is_attributed_in_the_recording_and_the_audit(
    gw: RunningGateway, upstream: Upstream, runtime: DockerHarness, tmp_path: Path
) -> None:
    with Sandbox.create(url=gw.url, api_key=KEY_A, allow=["allowed.test"]) as sb:
        targets = open_takeover_page(sb)
        link = make_link(gw, sb.id, "control")
        human = f"human:{link['id']}"
        live = Live(gw, sb.id, secret_of(link))
        try:
            assert live.ask({"type": "take"})["type"] == "ack"
            x, y = targets["field"]
            for action in (
                {"type": "move", "x": x - 5, "y": y - 5},
                {"type": "click", "x": x, "y": y},
                {"type": "type", "text": "by hand"},
                {"type": "key", "keys": "Return"},
            ):
                answer = live.ask({"type": "input", "action": action})
                assert answer["type"] == "ack", (action, answer)
            assert upstream_saw(upstream, runtime, "/json?typed=by%20hand"), upstream.hits(runtime)[-5:]
            link_x, link_y = targets["link"]
            assert live.ask({"type": "input", "action": {"type": "click", "x": link_x, "y": link_y}})["type"] == "ack"
            assert upstream_saw(upstream, runtime, "/landing?by=click"), upstream.hits(runtime)[-5:]
            assert live.ask({"type": "release", "note": "done"})["type"] == "ack"
        finally:
            live.close()
        assert wait_for(lambda: str(sb.page_info().url).startswith("https://allowed.test/landing"))
        revoke(gw, sb.id, link["id"])
        session_id = sb.id

    # The recording: the human's input with its actor (no moves), the lease's changes with the note.
    bundle_dir = unpack_recording(
        gw, session_id, tmp_path, ready=lambda b: any(e.get("event") == "control" for e in b.events)
    )
    bundle = read_bundle(bundle_dir)
    humans = [e for e in bundle.actions if e.get("actor") == human]
    kinds = [step["type"] for e in humans for step in e["native"]]
    assert kinds == ["click", "type", "key", "click"], kinds
    assert all(e["dialect"] == "human" for e in humans), humans
    # A frame each, as the agent's actions have, but where the next request came within the recorder's window.
    assert all(e["frame"] or e["frame_skipped"] for e in humans), humans
    changes = [(e["change"], e["holder"], e["previous"]) for e in bundle.events if e.get("event") == "control"]
    assert changes == [("taken", human, "agent"), ("returned", "agent", human)], changes
    returned = next(e for e in bundle.events if e.get("event") == "control" and e["change"] == "returned")
    assert returned["note"] == "done"

    # A replay runs the human's steps like the agent's: each is sent again, and judged on its frame where it
    # has one (as an agent's step is); but what the person typed was never recorded, so that step is skipped
    # and says why.
    _, junit, _ = replay_cli(gw, bundle_dir, tmp_path)
    cases = ET.fromstring(junit).findall("testcase")
    assert len(cases) == len(bundle.actions), junit
    steps = {int(str(case.get("name")).split(":")[0].removeprefix("step ")): case for case in cases}
    for number, event in enumerate(bundle.actions, start=1):
        if event.get("actor") != human:
            continue
        skipped = steps[number].find("skipped")
        if event["native"][0].get("redacted"):
            assert skipped is not None and "redacted" in str(skipped.get("message")), ET.tostring(steps[number])
        elif event["frame"]:
            assert skipped is None, ET.tostring(steps[number])
        else:
            assert skipped is not None and "no frame to compare" in str(skipped.get("message")), ET.tostring(
                steps[number]
            )

    # The audit chain: the link made, used and revoked, the lease's changes, and the requests the human's
    # input caused, charged to no one; the agent's own requests as before (no actor).
    records = traffic(gw, session_id)
    links = [(r["change"], r["link"], r["mode"]) for r in records if r["event"] == "link"]
    assert [change for change, *_ in links] == ["created", "used", "revoked"], links
    assert {(made, mode) for _, made, mode in links} == {(link["id"], "control")}, links
    assert all(r["actor"] == "api-key:owner" for r in records if r["event"] == "link" and r["change"] != "used")
    controls = [(r["change"], r["holder"], r["previous"]) for r in records if r["event"] == "control"]
    assert controls == [("taken", human, "agent"), ("returned", "agent", human)], controls
    agents = [r for r in records if r["event"] == "request" and "takeover.html" in r.get("url", "")]
    assert agents and all("actor" not in r for r in agents), agents
    log = tmp_path / "audit.jsonl"
    with gw.client() as c:
        log.write_bytes(c.get(f"/v1/sessions/{session_id}/traffic").content)
    assert verify(log).ok
    done = subprocess.run(
        [sys.executable, "-m", "corral.cli", "audit", "verify", str(log)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # Chromium's requests carry no proxy credentials: the proxy cannot tell them from an agent process's,
    # so they are never charged to the person (issue 26): unattributed, with no actor.
    caused = [r for r in records if r["event"] == "request" and ("/landing" in r["url"] or "/json?typed=" in r["url"])]
    assert len(caused) == 2 and all(r["action"] is None and "actor" not in r for r in caused), caused


def test_cdp_traffic_is_attributed_and_recorded(gw: RunningGateway, browser: Any, tmp_path: Path) -> None:
    with Sandbox.create(url=gw.url, api_key=KEY_A, allow=["allowed.test"]) as sb:
        sb.act({"type": "navigate", "url": "https://allowed.test/by-agent"})
        # The module's Playwright (one sync Playwright per thread) connects to the sandbox's browser.
        cdp = browser.browser_type.connect_over_cdp(
            f"{gw.url}/v1/sessions/{sb.id}/cdp", headers={"Authorization": f"Bearer {sb.info.token}"}
        )
        try:
            page = cdp.contexts[0].pages[0]
            page.goto("https://allowed.test/by-cdp")
            assert page.title() == "upstream allowed.test"
        finally:
            cdp.close()
        records = wait_for(lambda: [r for r in traffic(gw, sb.id, event="request") if "/by-cdp" in r["url"]])
        assert records and str(records[0].get("actor", "")).startswith("cdp:cdp_"), records
        conn = str(records[0]["actor"]).removeprefix("cdp:")
        agents = [r for r in traffic(gw, sb.id, event="request") if "/by-agent" in r["url"]]
        assert agents and "actor" not in agents[0], agents
        session_id = sb.id
    # Complete once the session's end answered: the controller ended its CDP connections (this one's
    # end recorded) before the gateway's last read of its recording.
    bundle = read_bundle(unpack_recording(gw, session_id, tmp_path))
    cdp_events = [(e["change"], e["conn"]) for e in bundle.events if e.get("event") == "cdp"]
    assert ("connected", conn) in cdp_events and ("disconnected", conn) in cdp_events, cdp_events
    assert all("frame" not in e or e["frame"] is None for e in bundle.events if e.get("event") == "cdp")


def test_a_cdp_connection_open_when_its_session_ends_is_recorded_to_its_end(gw: RunningGateway, tmp_path: Path) -> None:
    # The session ends with the client still connected: the gateway closes its door, the controller's
    # relay ends after that, and its ``disconnected`` is in the bundle the end closed (not lost to the
    # recorder's last read, which came first).
    sb = Sandbox.create(url=gw.url, api_key=KEY_A)
    session_id = sb.id
    door = f"{gw.url.replace('http', 'ws', 1)}/v1/sessions/{session_id}/cdp"
    with connect(door, additional_headers={"Authorization": f"Bearer {sb.info.token}"}) as client:
        client.send(json.dumps({"id": 1, "method": "Browser.getVersion"}))
        assert json.loads(client.recv(timeout=10))["id"] == 1
        sb.delete()
        with pytest.raises(ConnectionClosed):
            client.recv(timeout=10)
    with gw.client(KEY_A) as c:
        response = c.get(f"/v1/sessions/{session_id}/recording")
    assert response.status_code == 200, response.text
    (tmp_path / "bundle.zip").write_bytes(response.content)
    with zipfile.ZipFile(tmp_path / "bundle.zip") as archive:
        archive.extractall(tmp_path)
    bundle = read_bundle(tmp_path / session_id)
    assert bundle.manifest.get("end_reason") == "deleted", bundle.manifest
    changes = [e["change"] for e in bundle.events if e.get("event") == "cdp"]
    assert changes == ["connected", "disconnected"], changes


def upstream_saw(upstream: Upstream, runtime: DockerHarness, path: str) -> bool:
    return bool(wait_for(lambda: [h for h in upstream.hits(runtime) if h["path"] == path]))


# -- security plays ----------------------------------------------------------------------------------------

# Run inside the sandbox: a WebSocket upgrade to the controller's /v1/live asking for control as a human,
# sent with or without a forged x-corral-auth. Prints the status line, or the error of the connection.
LIVE_UPGRADE = r"""
import json, socket, sys
host, forged = sys.argv[1], sys.argv[2] == "1"
if host == "own":  # the sandbox's address on its session network
    host = socket.gethostbyname(socket.gethostname())
lines = ["GET /v1/live?viewer=human:lnk_aaaaaaaaaaaa&mode=control HTTP/1.1", f"Host: {host}:8765",
         "Upgrade: websocket", "Connection: Upgrade", "Sec-WebSocket-Version: 13",
         "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ=="]
if forged:
    lines.append("x-corral-auth: v1.0.AAAA.BBBB")
try:
    s = socket.create_connection((host, 8765), timeout=3)
    s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    print(json.dumps(s.recv(4096).decode(errors="replace").split("\r\n", 1)[0]))
except OSError as exc:
    print(json.dumps(type(exc).__name__))
"""


def test_the_agents_uid_cannot_take_the_lease_or_open_the_live_stream(
    gw: RunningGateway, sb: Sandbox, runtime: DockerHarness
) -> None:
    box = sb.container
    for host in ("127.0.0.1", "own"):
        code, out = runtime.exec(box, ["python", "-c", LIVE_UPGRADE, host, "0"], user="agent")
        assert code == 0 and json.loads(out.strip().splitlines()[-1]) == "ConnectionRefusedError", out
    # Past the firewall (root, which the agent never is), the controller's door still wants the gateway's
    # signature: no stream opens, signed or forged.
    for forged in ("0", "1"):
        code, out = runtime.exec(box, ["python", "-c", LIVE_UPGRADE, "127.0.0.1", forged], user="root")
        status = json.loads(out.strip().splitlines()[-1])
        assert code == 0 and status.startswith("HTTP/1.1 401"), out
    # And the agent's own command through the session: the same refusal.
    ran = sb.exec(argv=["python3", "-c", LIVE_UPGRADE, "127.0.0.1", "0"])
    assert json.loads(ran.stdout.strip().splitlines()[-1]) == "ConnectionRefusedError", ran
    assert sb.act({"type": "control"})["result"]["holder"] == "agent"


def test_a_page_cannot_reach_the_gateways_cdp_or_live_endpoints(
    gw: RunningGateway, sb: Sandbox, runtime: DockerHarness
) -> None:
    network = runtime.session_network(f"corral-net-{sb.id}")
    assert network is not None
    target = f"{network.gateway}:{gw.settings.port}"
    # Even allowed by name, the gateway's address is refused: the global deny comes first.
    sb.set_allow(["allowed.test", network.gateway])
    query = urllib.parse.urlencode({"target": target, "session": sb.id})
    sb.navigate(f"https://allowed.test/page/attack-gateway.html?{query}")
    title = wait_for(lambda: (t := str(sb.page_info().title)).startswith("done") and t, timeout_s=40)
    assert title, sb.page_info()
    seen = json.loads(title.removeprefix("done "))
    assert seen["cdp version"] in ("failed", "read 403 ") or seen["cdp version"].startswith("read 403"), seen
    assert seen["cdp list"] == "failed" or seen["cdp list"].startswith("read 403"), seen
    for socket_kind in ("cdp socket", "live socket"):
        assert not seen[socket_kind].startswith("message"), seen
    # The proxy refused each before dialling: no address was ever tried.
    blocks = [r for r in traffic(gw, sb.id) if r.get("host") == network.gateway and r["event"] in ("block", "connect")]
    assert blocks and all(r.get("decision") == "deny" and r.get("rule") == "global-deny" for r in blocks), blocks
    assert all(r.get("status") in (None, 403) for r in blocks)
