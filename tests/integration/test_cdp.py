"""CDP for the browser frameworks, for real: Playwright (Python) ``connect_over_cdp`` through the
gateway to a session's Chromium, a fake upstream on the test's own network behind the session's
proxy (names under .test), raw CDP over a WebSocket client for what Playwright never sends."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import sync_playwright
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, connect

from corral.recording.bundle import read_bundle
from corral.sdk import ActionFailed, Sandbox

from .cdpwire import bearer, cdp_call, cdp_socket, closed_with
from .conftest import agent_acts, wait_for
from .dockerutil import DockerHarness
from .egress_fixtures import Upstream, gateway_to, start_upstream
from .gateway_fixtures import KEY_A, RunningGateway, traffic
from .test_takeover import Live

pytestmark = pytest.mark.usefixtures("desktop_image", "egress_image")

CONN_ACTION = re.compile(r"c\d+\.(cdp_[0-9a-f]{8})")


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory, runtime: DockerHarness) -> Iterator[Upstream]:
    network = f"corral-cdp-it-{os.getpid()}"
    yield from start_upstream(runtime, tmp_path_factory.mktemp("upstream"), network, name="corral-cdp-upstream")


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, upstream: Upstream) -> Iterator[RunningGateway]:
    with gateway_to(upstream, tmp_path_factory.mktemp("cdp-gw"), f"cdp-{os.getpid()}") as running:
        yield running


@pytest.fixture(scope="module")
def sb(gw: RunningGateway) -> Iterator[Sandbox]:
    with Sandbox.create(url=gw.url, api_key=KEY_A, allow=["allowed.test"]) as box:
        yield box


def _token(sb: Sandbox) -> str:
    return str(sb.info.token)


def _cdp_events(gw: RunningGateway, session_id: str, tmp_path: Path) -> list[dict[str, Any]]:
    with gw.client() as c:
        response = c.get(f"/v1/sessions/{session_id}/recording")
    assert response.status_code == 200, response.text
    (tmp_path / "bundle.zip").write_bytes(response.content)
    return [e for e in read_bundle(tmp_path / "bundle.zip").events if e.get("event") == "cdp"]


def test_playwright_navigates_evaluates_and_screenshots_through_the_proxy(
    gw: RunningGateway, sb: Sandbox, tmp_path: Path
) -> None:
    with sync_playwright() as p:
        browser = p.chromium.connect_over_cdp(f"{gw.url}/v1/sessions/{sb.id}/cdp", headers=bearer(sb), timeout=30_000)
        try:
            context = browser.contexts[0]
            page = context.pages[0] if context.pages else context.new_page()
            response = page.goto("https://allowed.test/cdp-page", timeout=30_000)
            assert response is not None and response.status == 200
            assert page.title() == "upstream allowed.test"
            assert page.evaluate("() => [location.host, 6 * 7]") == ["allowed.test", 42]
            png = page.screenshot()
            assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 1000
            # A host the session does not allow gets Corral's own 403 page, as the agent's browser does.
            blocked = page.goto("https://other.test/secret", timeout=30_000)
            assert blocked is not None and blocked.status == 403
            assert page.title() == "Blocked by Corral: other.test"
        finally:
            browser.close()
    # What CDP made Chromium fetch is audited and charged to the connection's activity window.
    records = wait_for(
        lambda: [r for r in traffic(gw, sb.id, host="allowed.test", event="request") if "/cdp-page" in r["url"]]
    )
    assert records, "the CDP navigation was not audited"
    found = CONN_ACTION.fullmatch(str(records[-1]["action"]))
    assert found is not None, records[-1]
    assert records[-1]["actor"] == f"cdp:{found.group(1)}"
    # The navigation's own block: Chromium's later fetch of the blocked page's favicon is blocked too,
    # and charged to no action when it comes after the connection's activity window.
    blocks = wait_for(
        lambda: [r for r in traffic(gw, sb.id, host="other.test", event="block") if "/secret" in r.get("url", "")]
    )
    assert blocks and str(blocks[-1].get("actor") or "").startswith("cdp:cdp_"), blocks
    # The connection is in the recording, from its start to its end.
    events = wait_for(lambda: [e for e in _cdp_events(gw, sb.id, tmp_path) if e["conn"] == found.group(1)])
    changes = [e["change"] for e in events]
    assert changes[0] == "connected" and "disconnected" in wait_for(
        lambda: [e["change"] for e in _cdp_events(gw, sb.id, tmp_path) if e["conn"] == found.group(1)]
    )
    assert events[0]["exclusive"] is False


def test_methods_that_bypass_corral_are_refused_naming_the_rule(
    gw: RunningGateway, sb: Sandbox, tmp_path: Path
) -> None:
    with cdp_socket(gw, sb) as ws:
        closed = cdp_call(ws, 1, "Browser.crash")
        assert closed["error"]["code"] == -32000
        assert closed["error"]["message"].startswith("corral refused Browser.crash")
        assert closed["error"]["message"].endswith("(rule browser_lifecycle)")
        proxied = cdp_call(ws, 2, "Target.createBrowserContext", {"proxyServer": "http://elsewhere.test:3128"})
        assert proxied["error"]["message"].endswith("(rule proxy_settings)")
        tether = cdp_call(ws, 3, "Tethering.bind", {"port": 9333})
        assert tether["error"]["message"].endswith("(rule network_bypass)")
        version = cdp_call(ws, 4, "Browser.getVersion")  # the browser is still there, the socket still open
        assert "Chrome" in version["result"]["product"]
        plain = cdp_call(ws, 5, "Target.createBrowserContext")  # a context of the session's own proxy is fine
        context = plain["result"]["browserContextId"]
        assert "error" not in cdp_call(ws, 6, "Target.disposeBrowserContext", {"browserContextId": context})
    refused = wait_for(
        lambda: [e for e in _cdp_events(gw, sb.id, tmp_path) if e["change"] == "refused"][-3:], timeout_s=15
    )
    assert [(e["method"], e["rule"]) for e in refused] == [
        ("Browser.crash", "browser_lifecycle"),
        ("Target.createBrowserContext", "proxy_settings"),
        ("Tethering.bind", "network_bypass"),
    ]
    assert sb.page_info().url  # the agent's browser lives on


def test_an_exclusive_connection_holds_the_lease_until_it_closes(gw: RunningGateway, sb: Sandbox) -> None:
    with cdp_socket(gw, sb, "?exclusive=1") as holder:
        assert "result" in cdp_call(holder, 1, "Browser.getVersion")
        # The agent is refused while the connection holds the lease, naming it.
        with httpx.Client(base_url=gw.url, headers=bearer(sb), timeout=60) as agent:
            reply = agent.post(f"/v1/sessions/{sb.id}/actions", json={"action": {"type": "wait", "ms": 0}})
        assert reply.status_code == 409
        error = reply.json()["error"]
        assert error["code"] == "control_taken" and error["holder"].startswith("cdp:cdp_")
        with pytest.raises(ActionFailed) as taken:
            sb.act({"type": "wait", "ms": 0})
        assert taken.value.code == "control_taken"
        # A second exclusive connection is refused at the upgrade; a shared one may read, not drive.
        with pytest.raises(InvalidStatus) as second:
            cdp_socket(gw, sb, "?exclusive=1")
        assert second.value.response.status_code == 409
        assert json.loads(second.value.response.body or b"{}")["error"]["code"] == "control_taken"
        with cdp_socket(gw, sb) as shared:
            assert "result" in cdp_call(shared, 1, "Browser.getVersion")
            driven = cdp_call(shared, 2, "Target.createTarget", {"url": "about:blank"})
            assert driven["error"]["code"] == -32001
            assert driven["error"]["message"].startswith(f"control_taken: held by {error['holder']} since ")
        # The holder itself drives.
        created = cdp_call(holder, 2, "Target.createTarget", {"url": "about:blank"})
        assert "error" not in cdp_call(holder, 3, "Target.closeTarget", {"targetId": created["result"]["targetId"]})
    # Closed: the lease is the agent's again.
    assert wait_for(lambda: agent_acts(sb), timeout_s=10)


def test_a_connect_ticket_opens_its_session_without_headers(gw: RunningGateway, sb: Sandbox) -> None:
    with httpx.Client(base_url=gw.url, headers=bearer(sb), timeout=60) as holder:
        made = holder.post(f"/v1/sessions/{sb.id}/cdp/connect", json={"ttl_s": 60}).json()
        short = holder.post(f"/v1/sessions/{sb.id}/cdp/connect", json={"ttl_s": 1}).json()
    assert made["url"].startswith(f"{gw.ws}/v1/sessions/{sb.id}/cdp/t/")
    with sync_playwright() as p:
        browser = p.chromium.connect_over_cdp(made["http_url"], timeout=30_000)  # no headers at all
        try:
            assert browser.contexts and browser.version
        finally:
            browser.close()
    with connect(made["url"], open_timeout=20) as ws:
        assert "result" in cdp_call(ws, 1, "Browser.getVersion")
    # A changed, an expired, another session's ticket: refused.
    with connect(made["url"][:-3] + "AAA", open_timeout=20) as ws:
        assert closed_with(ws) == 4401
    time.sleep(1.5)  # past the short ticket's expiry (whole seconds)
    with connect(short["url"], open_timeout=20) as ws:
        assert closed_with(ws) == 4401
    with Sandbox.create(url=gw.url, api_key=KEY_A, allow=[]) as other:
        foreign = made["url"].replace(sb.id, other.id)
        with connect(foreign, open_timeout=20) as ws:
            assert closed_with(ws) == 4403
        assert httpx.get(made["http_url"].replace(sb.id, other.id) + "/json/version").status_code == 403


def test_no_web_page_may_drive_cdp(gw: RunningGateway, sb: Sandbox) -> None:
    with cdp_socket(gw, sb, Origin="https://allowed.test") as ws:
        assert closed_with(ws) == 4403
    answer = httpx.get(
        f"{gw.url}/v1/sessions/{sb.id}/cdp/json/version", headers={**bearer(sb), "Origin": "https://allowed.test"}
    )
    assert answer.status_code == 403 and answer.json()["error"]["code"] == "forbidden"
    version = httpx.get(f"{gw.url}/v1/sessions/{sb.id}/cdp/json/version", headers=bearer(sb)).json()
    assert version["webSocketDebuggerUrl"] == f"{gw.ws}/v1/sessions/{sb.id}/cdp"
    assert "devtoolsFrontendUrl" not in json.dumps(
        httpx.get(f"{gw.url}/v1/sessions/{sb.id}/cdp/json/list", headers=bearer(sb)).json()
    )
    with pytest.raises(PlaywrightError), sync_playwright() as p:
        p.chromium.connect_over_cdp(f"{gw.url}/v1/sessions/{sb.id}/cdp", timeout=15_000)  # no credential


def test_frames_of_tens_of_mib_pass_while_the_agents_channel_keeps_its_limit(gw: RunningGateway, sb: Sandbox) -> None:
    targets = httpx.get(f"{gw.url}/v1/sessions/{sb.id}/cdp/json/list", headers=bearer(sb)).json()
    page = next(t for t in targets if t["type"] == "page")
    assert page["webSocketDebuggerUrl"] == f"{gw.ws}/v1/sessions/{sb.id}/cdp/page/{page['id']}"
    size = 20 << 20  # over the agent's 16 MiB, under CDP's 64 MiB: Chromium's answers
    sent_size = 15 << 20  # a client's command: at most 16 MiB
    with connect(page["webSocketDebuggerUrl"], additional_headers=bearer(sb), max_size=None, open_timeout=20) as ws:
        sent = cdp_call(ws, 1, "Runtime.evaluate", {"expression": "'" + "x" * sent_size + "'.length"})
        assert sent["result"]["result"]["value"] == sent_size
        came = cdp_call(ws, 2, "Runtime.evaluate", {"expression": f"'y'.repeat({size})", "returnByValue": True})
        assert len(came["result"]["result"]["value"]) == size
    with connect(page["webSocketDebuggerUrl"], additional_headers=bearer(sb), max_size=None, open_timeout=20) as ws:
        ws.send(json.dumps({"id": 3, "method": "Runtime.evaluate", "params": {"expression": "'" + "x" * size + "'"}}))
        assert closed_with(ws) == 1009  # decoded by nobody: the relay closes at the frame's size
    with connect(f"{gw.ws}/v1/sessions/{sb.id}/ws?token={_token(sb)}", max_size=None, open_timeout=20) as agent:
        agent.send("x" * (17 << 20))
        assert closed_with(agent) == 1009


def _alive(ws: ClientConnection, id: int) -> None:
    assert "Chrome" in cdp_call(ws, id, "Browser.getVersion")["result"]["product"]


def test_crashes_internal_pages_and_non_flat_sessions_are_refused(gw: RunningGateway, sb: Sandbox) -> None:
    with cdp_socket(gw, sb) as ws:
        page = next(t for t in cdp_call(ws, 1, "Target.getTargets")["result"]["targetInfos"] if t["type"] == "page")
        for n, url in enumerate(
            [
                "chrome://crash",
                "chrome://quit",
                "CHROME://restart/",
                " chrome://kill",
                "devtools://x",
                "file:///etc/passwd",
            ]
        ):
            made = cdp_call(ws, 10 + n, "Target.createTarget", {"url": url})
            assert made["error"]["message"].endswith("(rule internal_pages)"), made
        # A non-flat session would carry any command inside a string, past every rule.
        hidden = json.dumps({"id": 1, "method": "Page.navigate", "params": {"url": "chrome://crash"}})
        for n, (method, params) in enumerate(
            [
                ("Target.attachToTarget", {"targetId": page["targetId"]}),
                ("Target.attachToTarget", {"targetId": page["targetId"], "flatten": False}),
                ("Target.setAutoAttach", {"autoAttach": True, "waitForDebuggerOnStart": False}),
                ("Target.sendMessageToTarget", {"targetId": page["targetId"], "message": hidden}),
            ]
        ):
            refused = cdp_call(ws, 20 + n, method, params)
            assert refused["error"]["message"].endswith("(rule flat_sessions)"), refused
        # A flat session's commands are each checked.
        attached = cdp_call(ws, 30, "Target.attachToTarget", {"targetId": page["targetId"], "flatten": True})
        session = attached["result"]["sessionId"]
        for n, (method, params) in enumerate([("Page.crash", {}), ("Page.navigate", {"url": "chrome://hang"})]):
            ws.send(json.dumps({"id": 40 + n, "method": method, "params": params, "sessionId": session}))
            answer = json.loads(ws.recv(timeout=20))
            while answer.get("id") != 40 + n:
                answer = json.loads(ws.recv(timeout=20))
            assert answer["sessionId"] == session and answer["error"]["code"] == -32000, answer
        _alive(ws, 50)
        # What reaches Chromium is what was checked: a key given twice, a binary frame, no command.
        ws.send('{"id":51,"method":"Browser.getVersion","method":"Browser.close"}')
        assert json.loads(ws.recv(timeout=20))["error"]["code"] == -32600
        ws.send(b'{"id":52,"method":"Browser.close"}')
        assert json.loads(ws.recv(timeout=20))["error"]["code"] == -32600
        _alive(ws, 53)
    assert sb.page_info().url  # the agent's browser lives on


def test_a_framework_sees_nothing_of_a_persons_turn_and_gets_its_pages_back(gw: RunningGateway, sb: Sandbox) -> None:
    """Playwright connected before a person takes the lease: its pages close at the take (their
    sessions detached), nothing it asks for is done, and at the hand-back its pages come back."""
    with sync_playwright() as p:
        browser = p.chromium.connect_over_cdp(f"{gw.url}/v1/sessions/{sb.id}/cdp", headers=bearer(sb), timeout=30_000)
        try:
            context = browser.contexts[0]
            page = context.pages[0]
            assert page.evaluate("() => 6 * 7") == 42
            persons = context.new_cdp_session(page).send("Target.getTargetInfo")["targetInfo"]["targetId"]
            human = Live(gw, sb.id, KEY_A)
            try:
                with page.expect_event("close", timeout=15_000):
                    assert human.ask({"type": "take"})["type"] == "ack"
                with pytest.raises(PlaywrightError, match="control_taken"):
                    context.new_page()
                # A framework that connects during the turn is told so.
                with pytest.raises(PlaywrightError, match="control_taken"):
                    p.chromium.connect_over_cdp(f"{gw.url}/v1/sessions/{sb.id}/cdp", headers=bearer(sb), timeout=30_000)
                with cdp_socket(gw, sb) as ws:
                    for n, (method, params) in enumerate(
                        [
                            ("Target.getTargets", {}),
                            (
                                "Target.setAutoAttach",
                                {"autoAttach": True, "waitForDebuggerOnStart": False, "flatten": True},
                            ),
                            ("Runtime.compileScript", {"expression": "1", "sourceURL": "", "persistScript": True}),
                            ("Page.stopLoading", {}),
                            ("Target.closeTarget", {"targetId": persons}),  # nothing of the agent's closes it
                        ]
                    ):
                        taken = cdp_call(ws, 10 + n, method, params)
                        assert taken["error"]["code"] == -32001 and "held by human:" in taken["error"]["message"], taken
                    assert "Chrome" in cdp_call(ws, 20, "Browser.getVersion")["result"]["product"]
                    # Browser.close lets go of everything and touches no page: its connection ends.
                    assert cdp_call(ws, 21, "Browser.close") == {"id": 21, "result": {}}
                    assert closed_with(ws) == 1000
                with context.expect_page(timeout=15_000) as back:
                    assert human.ask({"type": "release"})["type"] == "ack"
            finally:
                human.close()
            assert back.value.evaluate("() => 6 * 7") == 42  # the page, attached again: Playwright drives it
        finally:
            browser.close()
    assert wait_for(lambda: agent_acts(sb), timeout_s=10)


def test_the_last_page_closes_and_a_blank_one_keeps_chromium_up(gw: RunningGateway) -> None:
    """Headful Chromium on Linux quits when its last page closes (found for real: the socket closed):
    the relay opens a blank tab first, so the close answers and Chromium stays (record 0381)."""
    with Sandbox.create(url=gw.url, api_key=KEY_A, allow=[]) as own, cdp_socket(gw, own) as ws:
        pages = [t for t in cdp_call(ws, 1, "Target.getTargets")["result"]["targetInfos"] if t["type"] == "page"]
        made = cdp_call(ws, 2, "Target.createTarget", {"url": "about:blank"})["result"]["targetId"]
        for n, page in enumerate(pages):
            assert "error" not in cdp_call(ws, 10 + n, "Target.closeTarget", {"targetId": page["targetId"]})
        assert cdp_call(ws, 30, "Target.closeTarget", {"targetId": made}) == {"id": 30, "result": {"success": True}}
        ids = iter(range(100, 200))

        def pages_once_gone(gone: str) -> list[dict[str, Any]]:
            """The page targets once ``gone`` is no longer listed (its close answers before it goes)."""
            listed = cdp_call(ws, next(ids), "Target.getTargets")["result"]["targetInfos"]
            pages = [t for t in listed if t["type"] == "page"]
            return [] if any(t["targetId"] == gone for t in pages) else pages

        left = wait_for(lambda: pages_once_gone(made))
        assert [t["url"] for t in left] == ["about:blank"], left
        # Page.close in a session of the (new) last page: the same.
        attached = cdp_call(ws, 32, "Target.attachToTarget", {"targetId": left[0]["targetId"], "flatten": True})
        answer = cdp_call(ws, 33, "Page.close", {}, sessionId=attached["result"]["sessionId"])
        assert "error" not in answer, answer
        time.sleep(2)  # a browser that quit with its last page would be gone by now
        _alive(ws, 40)
        after = wait_for(lambda: pages_once_gone(left[0]["targetId"]))
        assert [t["url"] for t in after] == ["about:blank"], after
        assert own.page_info().url == "about:blank"  # the agent's browser, on the blank tab


def test_browser_close_ends_only_the_clients_connection(gw: RunningGateway, sb: Sandbox) -> None:
    with cdp_socket(gw, sb) as ws:
        assert cdp_call(ws, 1, "Browser.close") == {"id": 1, "result": {}}
        assert closed_with(ws) == 1000
    with cdp_socket(gw, sb) as again:
        _alive(again, 2)  # Chromium is the session's: still there for the next client and the agent
    assert sb.page_info().url
