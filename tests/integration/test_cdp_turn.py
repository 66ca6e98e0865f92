"""Issue 26: the agent's CDP connections get nothing of a person's turn, played for real.

The agent's own CDP connection (its session token, through the gateway) sets up what would let it
watch or hold the person (Network events, Fetch interception, a debugger pause, auto-attach waiting
for the debugger) before a person takes the lease through a real live stream and types into a real
page the fake upstream serves through the session's proxy. Every message the connection got, until
after the hand-back, is kept and searched.
"""

from __future__ import annotations

import io
import json
import os
import re
import secrets
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from PIL import Image
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection

from corral.sdk import Sandbox

from .cdpwire import cdp_socket
from .conftest import center, find_color, html_url, wait_for
from .dockerutil import DockerHarness
from .egress_fixtures import Upstream, gateway_to, start_upstream
from .gateway_fixtures import KEY_A, RunningGateway
from .test_takeover import Live

pytestmark = pytest.mark.usefixtures("desktop_image", "egress_image")

LOGIN_PAGE = "https://allowed.test/login"
BLUE, GREEN = (0, 0, 255), (0, 200, 0)


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory, runtime: DockerHarness) -> Iterator[Upstream]:
    network = f"corral-cdpturn-it-{os.getpid()}"
    yield from start_upstream(runtime, tmp_path_factory.mktemp("upstream"), network, name="corral-cdpturn-upstream")


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, upstream: Upstream) -> Iterator[RunningGateway]:
    with gateway_to(upstream, tmp_path_factory.mktemp("cdpturn-gw"), f"cdpturn-{os.getpid()}") as running:
        yield running


@pytest.fixture()
def sb(gw: RunningGateway) -> Iterator[Sandbox]:
    with Sandbox.create(url=gw.url, api_key=KEY_A, allow=["allowed.test"]) as box:
        yield box


class Wire:
    """A raw CDP connection whose every message is kept, as it came, by a thread of its own."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.raw: list[str] = []
        self.closed: int | None = None
        self._next = 100
        self._arrived = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            for message in self.ws:
                with self._arrived:
                    self.raw.append(message if isinstance(message, str) else message.decode(errors="replace"))
                    self._arrived.notify_all()
        except ConnectionClosed:
            pass
        with self._arrived:
            self.closed = self.ws.close_code or 1006
            self._arrived.notify_all()

    def messages(self) -> list[dict[str, Any]]:
        with self._arrived:
            return [json.loads(m) for m in self.raw]

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> int:
        self._next += 1
        message: dict[str, Any] = {"id": self._next, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        self.ws.send(json.dumps(message))
        return self._next

    def answer(self, id: int, timeout_s: float = 20) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        with self._arrived:
            while True:
                for m in self.raw:
                    decoded = json.loads(m)
                    if decoded.get("id") == id:
                        return dict(decoded)
                left = deadline - time.monotonic()
                assert left > 0 and self.closed is None, f"no answer to {id} (closed {self.closed})"
                self._arrived.wait(left)

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        return self.answer(self.send(method, params, session))

    def event(self, method: str, timeout_s: float = 20) -> dict[str, Any] | None:
        """The first event ``method`` so far, waiting up to ``timeout_s``."""
        found = wait_for(lambda: next((m for m in self.messages() if m.get("method") == method), None), timeout_s)
        return found if isinstance(found, dict) else None

    def close(self) -> None:
        self.ws.close()
        self._reader.join(5)


def page_target(wire: Wire) -> str:
    """The page the agent navigated (on screen)."""
    infos = wire.call("Target.getTargets")["result"]["targetInfos"]
    page = next(t for t in infos if t["type"] == "page" and t["url"].startswith(("https://allowed.test", "data:")))
    return str(page["targetId"])


def page_session(wire: Wire) -> str:
    """A flat session on the page the agent navigated."""
    attached = wire.call("Target.attachToTarget", {"targetId": page_target(wire), "flatten": True})
    return str(attached["result"]["sessionId"])


def pages_attached(wire: Wire) -> list[dict[str, Any]]:
    return [
        m
        for m in wire.messages()
        if m.get("method") == "Target.attachedToTarget" and m["params"]["targetInfo"]["type"] == "page"
    ]


def on_screen(sb: Sandbox, *colours: tuple[int, int, int]) -> list[tuple[int, int]]:
    """The centres of the page's fields of ``colours``, once the screen shows them all."""

    def shown() -> Image.Image | None:
        screen = Image.open(io.BytesIO(sb.screenshot())).convert("RGB")
        counts = {found for count, found in screen.getcolors(1 << 24) or [] if count >= 400}
        return screen if all(c in counts for c in colours) else None

    screen = wait_for(shown, timeout_s=15, interval_s=0.2)
    assert screen is not None, f"{colours} never showed"
    return [center(find_color(screen, colour)) for colour in colours]


def posted(upstream: Upstream, runtime: DockerHarness, path: str) -> list[str]:
    """The bodies of the POSTs that reached the upstream's ``path`` (its SEEN lines)."""
    lines = runtime.logs(upstream.name, 100_000).splitlines()
    seen = [json.loads(line[5:]) for line in lines if line.startswith("SEEN ")]
    return [str(s["body"]) for s in seen if s["path"] == path and s["method"] == "POST"]


def hits(upstream: Upstream, runtime: DockerHarness, path: str) -> list[dict[str, object]]:
    return [h for h in upstream.hits(runtime) if str(h["path"]).split("?")[0] == path]


def take(gw: RunningGateway, sb: Sandbox) -> Live:
    human = Live(gw, sb.id, KEY_A)
    assert human.ask({"type": "take"})["type"] == "ack"
    return human


def person(human: Live, *actions: dict[str, Any]) -> None:
    for action in actions:
        answer = human.ask({"type": "input", "action": action})
        assert answer["type"] == "ack", (action, answer)


def hand_back(human: Live) -> None:
    try:
        assert human.ask({"type": "release"})["type"] == "ack"
    finally:
        human.close()


def test_network_events_and_an_awaited_evaluate_never_carry_the_persons_password(
    gw: RunningGateway, sb: Sandbox, upstream: Upstream, runtime: DockerHarness
) -> None:
    password = "Hunter2-" + secrets.token_hex(6)
    sb.navigate(LOGIN_PAGE)
    field, button = on_screen(sb, BLUE, GREEN)
    wire = Wire(cdp_socket(gw, sb))
    try:
        session = page_session(wire)
        for domain in ("Network", "Page", "Runtime", "DOM", "Log"):
            assert "error" not in wire.call(f"{domain}.enable", {}, session), domain
        # An evaluate the person's keystrokes would resolve: in flight at the take.
        keylog = (
            "new Promise(r => { let s = ''; addEventListener('keydown', e => { s += e.key;"
            " if (e.key === 'Enter' || s.length >= 12) r(s); }, true); })"
        )
        waiting = wire.send("Runtime.evaluate", {"expression": keylog, "awaitPromise": True}, session)
        time.sleep(0.5)  # the evaluate reached the page
        human = take(gw, sb)
        try:
            person(
                human,
                {"type": "click", "x": field[0], "y": field[1]},
                {"type": "type", "text": password},
                {"type": "click", "x": button[0], "y": button[1]},
            )
            bodies = wait_for(lambda: [b for b in posted(upstream, runtime, "/reflect") if password in b])
            assert bodies, "the person's login never reached the site"  # the person logged in for real
        finally:
            hand_back(human)
        assert "Chrome" in wire.call("Browser.getVersion")["result"]["product"]  # the connection lives on
        time.sleep(2)  # anything late would have come by now
        assert wire.closed is None
        seen = "\n".join(wire.raw)
        for leaked in (password, password[:-4], "password=", "Hunter2"):
            assert leaked not in seen, f"the agent's CDP connection received {leaked!r}"
        cut = wire.answer(waiting)
        assert cut.get("error", {}).get("code") == -32001, cut  # answered control_taken at the take
    finally:
        wire.close()


def test_the_agents_fetch_interception_does_not_hold_the_persons_reload(
    gw: RunningGateway, sb: Sandbox, upstream: Upstream, runtime: DockerHarness
) -> None:
    path = f"/cdpturn-reload-{secrets.token_hex(4)}"
    sb.navigate(f"https://allowed.test{path}")
    assert wait_for(lambda: hits(upstream, runtime, path))
    wire = Wire(cdp_socket(gw, sb))
    try:
        session = page_session(wire)
        pattern = {"patterns": [{"urlPattern": "*", "requestStage": "Request"}]}
        assert "error" not in wire.call("Fetch.enable", pattern, session)
        assert "error" not in wire.call("Fetch.enable", pattern)  # and the whole browser's
        loaded = len(hits(upstream, runtime, path))
        human = take(gw, sb)
        try:
            person(human, {"type": "key", "keys": "F5"})
            assert wait_for(lambda: len(hits(upstream, runtime, path)) > loaded, timeout_s=15), "the reload was held"
        finally:
            hand_back(human)
        assert not [m for m in wire.messages() if m.get("method") == "Fetch.requestPaused"]
        # Handed back: the browser-wide interception the agent set up is its own again.
        other = f"/cdpturn-after-{secrets.token_hex(4)}"
        wire.send("Target.createTarget", {"url": f"https://allowed.test{other}"})
        paused = wire.event("Fetch.requestPaused")
        assert paused is not None and paused["params"]["request"]["url"].endswith(other)
        wire.call("Fetch.continueRequest", {"requestId": paused["params"]["requestId"]})
        assert wait_for(lambda: hits(upstream, runtime, other))
    finally:
        wire.close()


KEYS_PAGE = html_url(
    "<input id=f autocomplete=off style='position:absolute;left:0;top:0;width:600px;height:200px;"
    "border:0;outline:0;background:#0000ff;color:#fff;font-size:40px'>",
    "let n = 0; document.getElementById('f').addEventListener('keydown', () => {"
    " n += 1; new Image().src = 'https://allowed.test/key-seen?n=' + n; });",
)


def test_the_agents_debugger_does_not_freeze_the_persons_page(
    gw: RunningGateway, sb: Sandbox, upstream: Upstream, runtime: DockerHarness
) -> None:
    sb.navigate(KEYS_PAGE)
    (field,) = on_screen(sb, BLUE)
    seen_before = len(hits(upstream, runtime, "/key-seen"))
    wire = Wire(cdp_socket(gw, sb))
    try:
        session = page_session(wire)
        assert "error" not in wire.call("Debugger.enable", {}, session)
        assert "error" not in wire.call("DOMDebugger.setEventListenerBreakpoint", {"eventName": "keydown"}, session)
        assert "error" not in wire.call("Debugger.pause", {}, session)  # at the page's next statement
        human = take(gw, sb)
        try:
            person(human, {"type": "click", "x": field[0], "y": field[1]}, {"type": "type", "text": "abc"})
            assert wait_for(lambda: len(hits(upstream, runtime, "/key-seen")) >= seen_before + 3, timeout_s=15), (
                "the person's page was frozen by the agent's debugger"
            )
        finally:
            hand_back(human)
        assert not [m for m in wire.messages() if m.get("method") == "Debugger.paused"]
    finally:
        wire.close()


OPENER_PAGE = html_url(
    "<a id=open href='https://allowed.test/opened-by-person' target=_blank style='display:block;"
    "position:absolute;left:0;top:0;width:600px;height:200px;background:#00c800'>open</a>"
)


def test_the_agents_auto_attach_does_not_hang_a_tab_the_person_opens(
    gw: RunningGateway, sb: Sandbox, upstream: Upstream, runtime: DockerHarness
) -> None:
    sb.navigate(OPENER_PAGE)
    (link,) = on_screen(sb, GREEN)
    wire = Wire(cdp_socket(gw, sb))
    try:
        auto = {"autoAttach": True, "waitForDebuggerOnStart": True, "flatten": True}
        assert "error" not in wire.call("Target.setAutoAttach", auto)  # and never runs what waits
        human = take(gw, sb)
        try:
            person(human, {"type": "click", "x": link[0], "y": link[1]})
            assert wait_for(lambda: hits(upstream, runtime, "/opened-by-person"), timeout_s=15), (
                "the person's new tab waits for the agent's debugger"
            )
        finally:
            hand_back(human)
        # Handed back: auto-attach is the agent's again, the person's tab among its targets.
        attached = wait_for(
            lambda: [
                m
                for m in wire.messages()
                if m.get("method") == "Target.attachedToTarget"
                and "opened-by-person" in m["params"]["targetInfo"]["url"]
            ]
        )
        assert attached, "the tab opened during the turn was not attached after the hand-back"
    finally:
        wire.close()


def test_reading_the_field_the_person_typed_into_is_refused_during_the_turn(gw: RunningGateway, sb: Sandbox) -> None:
    secret = "typed-" + secrets.token_hex(6)
    sb.navigate(KEYS_PAGE)
    (field,) = on_screen(sb, BLUE)
    before = Wire(cdp_socket(gw, sb))  # opened before the take, attached to the page
    try:
        target = page_target(before)
        session = page_session(before)
        human = take(gw, sb)
        try:
            person(human, {"type": "click", "x": field[0], "y": field[1]}, {"type": "type", "text": secret})
            during = Wire(cdp_socket(gw, sb))  # opened during the turn
            try:
                attached = during.call("Target.attachToTarget", {"targetId": target, "flatten": True})
                assert attached.get("error", {}).get("code") == -32001, attached
                for wire, on in ((before, session), (during, None)):
                    value = "document.getElementById('f').value"
                    for method, params in (
                        ("Runtime.evaluate", {"expression": value, "returnByValue": True}),
                        ("DOM.getDocument", {"depth": -1, "pierce": True}),
                        ("DOMSnapshot.captureSnapshot", {"computedStyles": []}),
                        ("Page.captureScreenshot", {}),
                        ("Runtime.getProperties", {"objectId": "1.1.1"}),
                    ):
                        answer = wire.call(method, params, on)
                        assert answer.get("error", {}).get("code") == -32001, (method, answer)
                seen = "\n".join(before.raw + during.raw)
                assert secret not in seen and secret[:-3] not in seen
            finally:
                during.close()
        finally:
            hand_back(human)
    finally:
        before.close()


def test_a_human_takes_from_an_exclusive_connection_which_keeps_what_it_had_until_then(
    gw: RunningGateway, sb: Sandbox, upstream: Upstream, runtime: DockerHarness
) -> None:
    password = "Exclusive-" + secrets.token_hex(6)
    sb.navigate(LOGIN_PAGE)
    field, button = on_screen(sb, BLUE, GREEN)
    wire = Wire(cdp_socket(gw, sb, "?exclusive=1"))
    try:
        assert "error" not in wire.call(
            "Target.setAutoAttach", {"autoAttach": True, "waitForDebuggerOnStart": False, "flatten": True}
        )
        attached = wait_for(lambda: pages_attached(wire))
        assert attached, "auto-attach attached no page"
        session = attached[-1]["params"]["sessionId"]
        # Holding the lease, it drives and watches: nothing of it changes.
        assert "error" not in wire.call("Network.enable", {}, session)
        title = wire.call("Runtime.evaluate", {"expression": "document.title", "returnByValue": True}, session)
        assert title["result"]["result"]["value"] == "login"
        wire.call("Runtime.evaluate", {"expression": "location.reload()"}, session)
        assert wire.event("Network.requestWillBeSent") is not None
        ready = {"expression": "document.readyState + ' ' + document.title", "returnByValue": True}
        loaded = wait_for(
            lambda: (
                wire.call("Runtime.evaluate", ready, session).get("result", {}).get("result", {}).get("value")
                == "complete login"
            )
        )
        assert loaded, "the reloaded login page never loaded"
        time.sleep(0.5)  # its first frame on the screen
        # A person takes the lease from it: then it is any agent's connection.
        human = take(gw, sb)
        try:
            person(
                human,
                {"type": "click", "x": field[0], "y": field[1]},
                {"type": "type", "text": password},
                {"type": "click", "x": button[0], "y": button[1]},
            )
            bodies = wait_for(lambda: [b for b in posted(upstream, runtime, "/reflect") if password in b])
            assert bodies, "the person's login never reached the site"
            refused = wire.call("Runtime.evaluate", {"expression": "1"}, session)
            assert refused["error"]["code"] == -32001
        finally:
            handed_back_at = len(wire.raw)
            hand_back(human)
        time.sleep(1)  # anything late would have come by now
        assert password not in "\n".join(wire.raw[:handed_back_at]), "the connection received the person's password"
        # After the hand-back the page is the agent's again: the targets attached anew carry its title (this
        # page reflects the post in it), as Runtime.evaluate would; nothing else of the turn may come late.
        late = [raw for raw in wire.raw[handed_back_at:] if not re.search(r'"method":\s*"Target\.', raw)]
        assert password not in "\n".join(late), "the turn's traffic reached the connection after the hand-back"
        # Handed back to it (it is still attached): its auto-attach is set up again, and it drives.
        again = wait_for(lambda: pages_attached(wire)[len(attached) :])
        assert again, "the page was not attached again at the hand-back"
        again_session = again[-1]["params"]["sessionId"]
        first_word = {"expression": "document.title.split(' ')[0]", "returnByValue": True}
        title = wire.call("Runtime.evaluate", first_word, again_session)
        assert title["result"]["result"]["value"] == "reflected", title
    finally:
        wire.close()
