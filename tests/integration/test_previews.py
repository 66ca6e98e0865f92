"""Port previews against a real gateway, sandbox and egress proxy (docs/previews.md): a server run
in the sandbox as the agent on 127.0.0.1 only, reached from the host through the preview listener
(HTTP, a large body both ways, a WebSocket echo); the secret's ways in (header, first visit's
cookie) and the server never seeing it; refusals (none, wrong, revoked, a session token making one,
an ended session, nothing listening, a body over the cap, a reserved port, another session's
preview's page using the cookie); a revoke closing an open WebSocket within a second; expiry,
idleness, a session's end and its pause closing connections; the API and the previews on origins
apart; the sandbox unable to reach the preview listener; the preview's records in the verified
audit chain."""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from corral.proxy.audit import verify

from .dockerutil import DockerHarness
from .gateway_fixtures import KEY_A, RunningGateway, module_gateway

pytestmark = pytest.mark.usefixtures("desktop_image", "egress_image")

SERVER = Path(__file__).with_name("preview_server.py")
PORT = 3000
MAX_BODY_MB = 1
MAX_CONNECTIONS = 4
IDLE_S = 4.0


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, runtime: DockerHarness) -> Iterator[RunningGateway]:
    with module_gateway(
        tmp_path_factory,
        runtime,
        "previews",
        preview_max_body_mb=MAX_BODY_MB,
        preview_max_connections=MAX_CONNECTIONS,
        preview_idle_timeout_s=IDLE_S,
    ) as running:
        yield running


def run_server(c: httpx.Client, session_id: str, port: int = PORT) -> None:
    """The test server in the sandbox as the agent, on 127.0.0.1:``port``, answering before this returns."""
    put = c.put(
        f"/v1/sessions/{session_id}/files",
        params={"path": "/tmp/preview_server.py"},
        content=SERVER.read_bytes(),
        headers={"content-type": "application/octet-stream"},
    )
    assert put.status_code == 200, put.text
    started = c.post(
        f"/v1/sessions/{session_id}/actions",
        json={"action": {"type": "exec", "argv": ["python3", "/tmp/preview_server.py", str(port)], "background": True}},
    )
    assert started.status_code == 200 and started.json()["ok"], started.text
    probe = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=1)"
    deadline = time.monotonic() + 20
    while True:
        ran = c.post(
            f"/v1/sessions/{session_id}/actions", json={"action": {"type": "exec", "argv": ["python3", "-c", probe]}}
        )
        if ran.json()["result"]["exit_code"] == 0:
            return
        assert time.monotonic() < deadline, "the test server did not start"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def session(gw: RunningGateway) -> Iterator[dict[str, Any]]:
    with gw.client() as c:
        made = c.post("/v1/sessions", json={})
        assert made.status_code == 201, made.text
        run_server(c, made.json()["id"])
        yield made.json()
        c.delete(f"/v1/sessions/{made.json()['id']}")


def create(gw: RunningGateway, session_id: str, port: int = PORT, **body: Any) -> tuple[dict[str, Any], str]:
    with gw.client() as c:
        made = c.post(f"/v1/sessions/{session_id}/previews", json={"port": port, **body})
    assert made.status_code == 201, made.text
    return made.json(), made.json()["url"].split("corral_preview_token=", 1)[1]


def preview_client(gw: RunningGateway, preview: dict[str, Any], secret: str | None = None) -> httpx.Client:
    """A client of the preview listener that names the preview's host (*.localhost need not resolve here)."""
    headers = {"host": f"{preview['host']}:{gw.settings.preview_port}"}
    if secret is not None:
        headers["x-corral-preview-token"] = secret
    return httpx.Client(base_url=f"http://127.0.0.1:{gw.settings.preview_port}", headers=headers, timeout=60)


def test_http_through_the_preview_never_shows_the_secret(gw: RunningGateway, session: dict[str, Any]) -> None:
    preview, secret = create(gw, session["id"])
    assert preview["host"] == f"{PORT}-{session['id'].removeprefix('ses_')}.localhost"
    assert preview["url"].startswith(
        f"http://{preview['host']}:{gw.settings.preview_port}/?corral_preview_token=crl_prev_"
    )
    with preview_client(gw, preview, secret) as c:
        assert c.get("/").text == "hello from the sandbox"
        seen = c.get("/headers", params={"q": "1"}, headers={"cookie": "theme=dark"}).json()
        big = c.get("/big", params={"n": str(5 << 20)})
        posted = c.post("/echo", content=b"y" * (512 << 10)).json()
    headers = dict(seen["headers"])
    assert secret not in json.dumps(seen)
    assert "x-corral-preview-token" not in headers and headers["cookie"] == "theme=dark"
    assert headers["x-forwarded-host"] == f"{preview['host']}:{gw.settings.preview_port}"
    assert seen["path"] == "/headers?q=1"
    assert big.status_code == 200 and len(big.content) == 5 << 20
    assert posted == {"size": 512 << 10, "sha256": hashlib.sha256(b"y" * (512 << 10)).hexdigest()}
    with gw.client() as c:
        listed = c.get(f"/v1/sessions/{session['id']}/previews").json()["previews"]
    mine = next(p for p in listed if p["id"] == preview["id"])
    assert secret not in json.dumps(listed)
    assert mine["connections"] >= 1 and mine["bytes_out"] > 5 << 20 and mine["bytes_in"] > 512 << 10


def test_first_visit_sets_the_cookie_and_drops_the_token(gw: RunningGateway, session: dict[str, Any]) -> None:
    preview, secret = create(gw, session["id"])
    with preview_client(gw, preview) as c:
        first = c.get("/headers", params={"corral_preview_token": secret, "keep": "me"})
        assert first.status_code == 303, first.text
        assert first.headers["location"] == "/headers?keep=me"
        cookie = first.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=Lax" in cookie and "Domain" not in cookie
        name, value = cookie.split(";", 1)[0].split("=", 1)
        assert value == secret and name.startswith("corral_preview_")
        seen = c.get("/headers?keep=me", headers={"cookie": f"other=1; {name}={value}"})
    assert seen.status_code == 200, seen.text
    assert secret not in seen.text and dict(seen.json()["headers"])["cookie"] == "other=1"


def test_a_page_of_another_session_s_preview_cannot_use_this_preview_s_cookie(
    gw: RunningGateway, session: dict[str, Any]
) -> None:
    # Under an operator's domain every preview is one site to the browser: SameSite=Lax lets a page
    # served by another session's agent post to this preview, fetch it or frame it, and the browser
    # sends this preview's cookie along. These are the headers Chromium sends for such a page's
    # requests (test_preview_clients.py plays it in a real Chromium under preview.test).
    preview, secret = create(gw, session["id"])
    port = gw.settings.preview_port
    with preview_client(gw, preview) as c:
        visit = c.get("/", params={"corral_preview_token": secret})
        cookie = visit.headers["set-cookie"].split(";", 1)[0]
        hostile = f"http://3000-{'ab' * 16}.localhost:{port}"
        own = f"http://4000-{session['id'].removeprefix('ses_')}.localhost:{port}"
        posted = c.post(
            "/echo",
            content=b"transfer all",
            headers={"cookie": cookie, "origin": hostile, "sec-fetch-site": "same-site", "sec-fetch-mode": "cors"},
        )
        framed = c.get(
            "/headers",
            headers={
                "cookie": cookie,
                "referer": hostile + "/",
                "sec-fetch-site": "same-site",
                "sec-fetch-mode": "navigate",
                "sec-fetch-dest": "iframe",
            },
        )
        unknown = c.get(
            "/headers", headers={"cookie": cookie, "sec-fetch-site": "same-site", "sec-fetch-mode": "no-cors"}
        )
        # What still works: a link followed from another site (Lax's own rule), a page of this
        # session's other port (one agent's servers), the secret in the header (its holder's request).
        followed = c.get(
            "/",
            headers={
                "cookie": cookie,
                "referer": hostile + "/",
                "sec-fetch-site": "same-site",
                "sec-fetch-mode": "navigate",
                "sec-fetch-dest": "document",
            },
        )
        sibling = c.post(
            "/echo", content=b"ok", headers={"cookie": cookie, "origin": own, "sec-fetch-site": "same-site"}
        )
        holder = c.post(
            "/echo",
            content=b"ok",
            headers={"x-corral-preview-token": secret, "origin": hostile, "sec-fetch-site": "same-site"},
        )
    for refused in (posted, framed, unknown):
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["code"] == "forbidden"
    assert followed.status_code == 200 and followed.text == "hello from the sandbox"
    assert sibling.status_code == 200 and holder.status_code == 200


def test_the_first_visit_s_redirect_stays_on_the_preview_s_host(gw: RunningGateway, session: dict[str, Any]) -> None:
    # A link to the preview with the secret whose path starts with // (or /\\, which browsers read the
    # same): the 303 that takes the token out must not send the browser to another host.
    preview, secret = create(gw, session["id"])
    port = gw.settings.preview_port
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            f"GET //evil.invalid/x?corral_preview_token={secret}&k=1 HTTP/1.1\r\n"
            f"host: {preview['host']}\r\n\r\n".encode()
        )
        head = sock.recv(65536).decode("latin-1")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            f"GET /\\evil.invalid/?corral_preview_token={secret} HTTP/1.1\r\nhost: {preview['host']}\r\n\r\n".encode()
        )
        backslash = sock.recv(65536).decode("latin-1")
    assert head.startswith("HTTP/1.1 303") and "\r\nlocation: /x?k=1\r\n" in head, head
    assert backslash.startswith("HTTP/1.1 303") and "\r\nlocation: /evil.invalid/\r\n" in backslash, backslash


def test_a_request_pipelined_for_another_preview_is_not_carried_by_the_first(
    gw: RunningGateway, session: dict[str, Any]
) -> None:
    # One connection, admitted to port 3000's preview; behind its request, in the same bytes, one for
    # another preview's host (port 3999 of the same session, its own secret), and a third smuggled in
    # a body framed both ways (Content-Length and chunked). Each request is routed by its own Host.
    preview, secret = create(gw, session["id"])
    other, other_secret = create(gw, session["id"], port=3999)
    smuggled = "GET /headers HTTP/1.1\r\nhost: " + other["host"] + "\r\n\r\n"
    raw = (
        f"GET / HTTP/1.1\r\nhost: {preview['host']}\r\nx-corral-preview-token: {secret}\r\n\r\n"
        f"POST /echo HTTP/1.1\r\nhost: {preview['host']}\r\nx-corral-preview-token: {secret}\r\n"
        f"content-length: {len(smuggled) + 5}\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n{smuggled}"
        f"GET / HTTP/1.1\r\nhost: {other['host']}\r\nx-corral-preview-token: {other_secret}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", gw.settings.preview_port), timeout=20) as sock:
        sock.sendall(raw.encode())
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
    answers = got.decode("latin-1")
    assert answers.startswith("HTTP/1.1 200"), answers[:300]
    assert "hello from the sandbox" in answers
    # The chunked body was empty: the smuggled request is the next one, for another host: refused, closed.
    assert answers.count("HTTP/1.1 ") == 3, answers
    second, third = answers.split("HTTP/1.1 ")[2:]
    assert second.startswith("200") and '"size": 0' in second, second[:400]
    assert third.startswith("422 Unprocessable Content") and "serves another preview" in third, third[:400]


def test_refused_without_the_secret_or_with_a_wrong_one(gw: RunningGateway, session: dict[str, Any]) -> None:
    preview, _ = create(gw, session["id"])
    with preview_client(gw, preview) as c:
        bare = c.get("/")
        wrong = c.get("/", headers={"x-corral-preview-token": "crl_prev_" + "A" * 43})
        page = c.get("/", headers={"accept": "text/html"})
    assert bare.status_code == 401 and bare.json()["error"]["code"] == "unauthorized"
    assert "secret" in bare.json()["error"]["message"]
    assert wrong.status_code == 401 and "not this preview's secret" in wrong.json()["error"]["message"]
    assert page.status_code == 401 and page.headers["content-type"].startswith("text/html")
    # Another session's preview secret opens nothing here, nor does the API key.
    with preview_client(gw, preview, KEY_A) as c:
        assert c.get("/").status_code == 401


def test_a_session_token_cannot_make_list_or_revoke_previews(gw: RunningGateway, session: dict[str, Any]) -> None:
    preview, _ = create(gw, session["id"])
    token = {"Authorization": f"Bearer {session['token']}"}
    with gw.client(None) as c:
        base = f"/v1/sessions/{session['id']}/previews"
        made = c.post(base, json={"port": PORT}, headers=token)
        listed = c.get(base, headers=token)
        revoked = c.delete(f"{base}/{preview['id']}", headers=token)
    for answer in (made, listed, revoked):
        assert answer.status_code == 403 and answer.json()["error"]["code"] == "forbidden", answer.text


def test_bad_ports_are_refused(gw: RunningGateway, session: dict[str, Any]) -> None:
    with gw.client() as c:
        for port in (8765, 9222, 8701, 0, 70000):
            answer = c.post(f"/v1/sessions/{session['id']}/previews", json={"port": port})
            assert answer.status_code == 422 and answer.json()["error"]["field"] == "port", answer.text


def test_nothing_listening_is_a_clear_502(gw: RunningGateway, session: dict[str, Any]) -> None:
    preview, secret = create(gw, session["id"], port=3999)
    with preview_client(gw, preview, secret) as c:
        answer = c.get("/")
    assert answer.status_code == 502, answer.text
    assert answer.json()["error"]["code"] == "nothing_listening"
    assert "connection refused on port 3999" in answer.json()["error"]["message"]


HOSTILE_HEAD = """
import socket
server = socket.create_server(("127.0.0.1", 3100))
while True:
    conn, _ = server.accept()
    conn.recv(65536)
    conn.sendall(b"HTTP/1.1 200 OK\\r\\nX" + b"\\x01" * 60000 + b": y\\r\\n\\r\\n")
    conn.close()
"""


def test_a_server_s_bad_answer_is_cut_in_the_error_and_the_log(
    gw: RunningGateway, session: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    # The agent's server answers a head h11 refuses, 60 KB of control bytes in one header line: h11's
    # message quotes the line (240 KB as its repr), and each request through the preview (the agent's
    # page can make the viewer's browser send thousands) wrote it whole to the gateway's log.
    with gw.client() as c:
        started = c.post(
            f"/v1/sessions/{session['id']}/actions",
            json={"action": {"type": "exec", "argv": ["python3", "-c", HOSTILE_HEAD], "background": True}},
        )
        assert started.status_code == 200 and started.json()["ok"], started.text
    preview, secret = create(gw, session["id"], port=3100)
    caplog.set_level("INFO", logger="corral.gateway.previews.listener")
    with preview_client(gw, preview, secret) as c:
        deadline = time.monotonic() + 20
        while (answer := c.get("/")).json()["error"]["code"] == "nothing_listening":
            assert time.monotonic() < deadline, "the hostile server did not start"
            time.sleep(0.2)
    assert answer.status_code == 502 and answer.json()["error"]["code"] == "preview_unreachable"
    assert len(answer.json()["error"]["message"]) < 1000, len(answer.json()["error"]["message"])
    logged = [r.getMessage() for r in caplog.records if r.name == "corral.gateway.previews.listener"]
    assert logged and all(len(line) < 1000 for line in logged), [len(line) for line in logged]


def test_a_body_over_the_cap_is_413(gw: RunningGateway, session: dict[str, Any]) -> None:
    preview, secret = create(gw, session["id"])
    with preview_client(gw, preview, secret) as c:
        declared = c.post("/echo", content=b"z" * ((MAX_BODY_MB << 20) + 1))

        def chunks() -> Iterator[bytes]:
            for _ in range(MAX_BODY_MB * 16 + 2):
                yield b"z" * 65536

        streamed = c.post("/echo", content=chunks())
    assert declared.status_code == 413 and declared.json()["error"]["code"] == "message_too_large"
    assert streamed.status_code == 413, streamed.text


def test_websocket_echo_and_revoke_closes_it_within_a_second(gw: RunningGateway, session: dict[str, Any]) -> None:
    preview, secret = create(gw, session["id"])

    async def scenario() -> float:
        url = f"ws://{preview['host']}:{gw.settings.preview_port}/ws"
        async with connect(
            url,
            host="127.0.0.1",
            port=gw.settings.preview_port,
            additional_headers={"x-corral-preview-token": secret},
            compression=None,
        ) as ws:
            await ws.send("ping text")
            assert await ws.recv() == "ping text"
            await ws.send(b"\x00\x01" * 40000)
            assert await ws.recv() == b"\x00\x01" * 40000
            async with httpx.AsyncClient(base_url=gw.url, headers={"Authorization": f"Bearer {KEY_A}"}) as api:
                revoked = await api.delete(f"/v1/sessions/{session['id']}/previews/{preview['id']}")
                assert revoked.status_code == 200, revoked.text
            began = time.monotonic()
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(ws.recv(), timeout=5)
            return time.monotonic() - began

    assert asyncio.run(scenario()) < 1.0
    with preview_client(gw, preview, secret) as c:
        after = c.get("/")
    assert after.status_code == 401 and after.json()["error"]["message"] == "preview revoked"


def test_an_ended_session_s_previews_are_gone(gw: RunningGateway) -> None:
    with gw.client() as c:
        made = c.post("/v1/sessions", json={}).json()
        run_server(c, made["id"])
        preview, secret = create(gw, made["id"])
        with preview_client(gw, preview, secret) as p:
            assert p.get("/").status_code == 200
        assert c.delete(f"/v1/sessions/{made['id']}").status_code == 204
    with preview_client(gw, preview, secret) as p:
        gone = p.get("/")
    assert gone.status_code == 410 and gone.json()["error"]["code"] == "preview_gone"
    assert made["id"] in gone.json()["error"]["message"]


def test_the_api_and_the_previews_are_apart(gw: RunningGateway, session: dict[str, Any]) -> None:
    preview, secret = create(gw, session["id"])
    # The API's port serves no preview, whatever the Host says.
    with httpx.Client(base_url=gw.url, headers={"host": preview["host"], "x-corral-preview-token": secret}) as c:
        assert c.get("/").status_code == 404
        assert c.get("/headers").status_code == 404
    # The preview port serves no API, even with the API key, on its own host or a preview's.
    with httpx.Client(base_url=f"http://127.0.0.1:{gw.settings.preview_port}", timeout=30) as c:
        api = c.get("/v1/sessions", headers={"Authorization": f"Bearer {KEY_A}"})
        assert api.status_code == 404 and api.json()["error"]["code"] == "not_found"
        on_preview = c.get(
            "/v1/sessions",
            headers={"host": preview["host"], "Authorization": f"Bearer {KEY_A}", "x-corral-preview-token": secret},
        )
        assert on_preview.text == "hello from the sandbox"  # the agent's server answered, not the API
    assert preview["url"].split("/")[2] != gw.url.split("/")[2]


def test_the_sandbox_cannot_reach_the_preview_listener(gw: RunningGateway, session: dict[str, Any]) -> None:
    """As the agent: the preview port on the sandbox's gateway address (the host) and on every address
    the host has on the session network refuses or times out; the tunnel only runs the other way."""
    probe = (
        "import socket, struct\n"
        "rows = [line.split() for line in open('/proc/net/route').read().splitlines()[1:]]\n"
        "hexgw = next(r[2] for r in rows if r[1] == '00000000')\n"
        "gw = socket.inet_ntoa(struct.pack('<L', int(hexgw, 16)))\n"
        "s = socket.socket(); s.settimeout(3)\n"
        "try:\n"
        f"    s.connect((gw, {gw.settings.preview_port})); print('CONNECTED', gw)\n"
        "except OSError as e:\n"
        "    print('refused', gw, e)\n"
    )
    with gw.client() as c:
        ran = c.post(
            f"/v1/sessions/{session['id']}/actions", json={"action": {"type": "exec", "argv": ["python3", "-c", probe]}}
        )
    out = ran.json()["result"]
    assert out["exit_code"] == 0 and out["stdout"].startswith("refused "), out


def test_preview_records_in_the_audit_chain(gw: RunningGateway, session: dict[str, Any], tmp_path: Path) -> None:
    preview, secret = create(gw, session["id"])
    with preview_client(gw, preview, secret) as c:
        assert c.get("/big", params={"n": "100000"}).status_code == 200
    with gw.client() as c:
        c.delete(f"/v1/sessions/{session['id']}/previews/{preview['id']}")
    deadline = time.monotonic() + 10
    while True:
        with gw.client() as c:
            log = c.get(f"/v1/sessions/{session['id']}/traffic")
        records = [json.loads(line) for line in log.text.splitlines() if line]
        mine = [r for r in records if r["event"] == "preview" and r["preview"] == preview["id"]]
        if {"created", "opened", "closed", "revoked"} <= {r["change"] for r in mine}:
            break
        assert time.monotonic() < deadline, mine
        time.sleep(0.2)
    path = tmp_path / "audit.jsonl"
    path.write_bytes(log.content)
    assert verify(path).ok
    closed = next(r for r in mine if r["change"] == "closed")
    assert closed["port"] == PORT and closed["bytes_out"] > 100000 and closed["remote"].startswith("127.0.0.1:")
    assert secret not in log.text


def raw_get(gw: RunningGateway, host: str, secret: str, path: str = "/", extra: str = "") -> socket.socket:
    """A connection to the preview listener with one keep-alive GET sent (its answer unread)."""
    sock = socket.create_connection(("127.0.0.1", gw.settings.preview_port), timeout=10)
    head = f"GET {path} HTTP/1.1\r\nHost: {host}\r\nX-Corral-Preview-Token: {secret}\r\n{extra}\r\n"
    sock.sendall(head.encode())
    return sock


def read_answer(sock: socket.socket) -> bytes:
    """One whole answer (its head, and its body by its Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0
    )
    while len(body) < length and (chunk := sock.recv(65536)):
        body += chunk
    return head + b"\r\n\r\n" + body


def test_one_connection_carries_many_requests(gw: RunningGateway, session: dict[str, Any]) -> None:
    preview, secret = create(gw, session["id"])
    with preview_client(gw, preview, secret) as c:
        answers = [c.get("/", params={"n": str(i)}) for i in range(20)]
    assert all(a.status_code == 200 and a.text == "hello from the sandbox" for a in answers)
    with gw.client() as c:
        listed = c.get(f"/v1/sessions/{session['id']}/previews").json()["previews"]
    assert next(p for p in listed if p["id"] == preview["id"])["connections"] == 1


def test_a_connection_the_server_closed_while_idle_is_reopened(gw: RunningGateway, session: dict[str, Any]) -> None:
    preview, secret = create(gw, session["id"])
    with preview_client(gw, preview, secret) as c:
        assert c.get("/bye").text == "bye"
        time.sleep(1.0)  # the server closes its end (and so the tunnel) after 0.2 s
        again = c.get("/")
    assert again.status_code == 200 and again.text == "hello from the sandbox"


def test_a_head_over_the_cap_is_431(gw: RunningGateway, session: dict[str, Any]) -> None:
    preview, secret = create(gw, session["id"])
    with preview_client(gw, preview, secret) as c:
        answer = c.get("/", headers={"x-big": "b" * (40 << 10)})
    assert answer.status_code == 431 and answer.json()["error"]["code"] == "headers_too_large"


def test_connections_per_preview_are_capped(gw: RunningGateway, session: dict[str, Any]) -> None:
    preview, secret = create(gw, session["id"])
    host = f"{preview['host']}:{gw.settings.preview_port}"
    held = [raw_get(gw, host, secret) for _ in range(MAX_CONNECTIONS)]
    try:
        assert all(read_answer(s).startswith(b"HTTP/1.1 200 ") for s in held)
        refused = read_answer(raw_get(gw, host, secret))
        assert refused.startswith(b"HTTP/1.1 429 ") and b"too_many_connections" in refused
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 5
    while read_answer(raw_get(gw, host, secret)).startswith(b"HTTP/1.1 429 "):
        assert time.monotonic() < deadline, "the closed connections were not let go"
        time.sleep(0.1)


def test_an_idle_connection_is_closed(gw: RunningGateway, session: dict[str, Any]) -> None:
    preview, secret = create(gw, session["id"])
    sock = raw_get(gw, f"{preview['host']}:{gw.settings.preview_port}", secret)
    assert read_answer(sock).startswith(b"HTTP/1.1 200 ")
    began = time.monotonic()
    sock.settimeout(IDLE_S + 10)
    assert sock.recv(1) == b""  # closed by the gateway, not by this side
    assert IDLE_S - 1 <= time.monotonic() - began <= IDLE_S + 3
    sock.close()


def test_an_expired_preview_closes_its_websocket_and_opens_nothing(gw: RunningGateway, session: dict[str, Any]) -> None:
    preview, secret = create(gw, session["id"], ttl_s=2)

    async def scenario() -> None:
        async with connect(
            f"ws://{preview['host']}:{gw.settings.preview_port}/ws",
            host="127.0.0.1",
            port=gw.settings.preview_port,
            additional_headers={"x-corral-preview-token": secret},
        ) as ws:
            await ws.send("still here")
            assert await ws.recv() == "still here"
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(ws.recv(), timeout=5)

    asyncio.run(scenario())
    with preview_client(gw, preview, secret) as c:
        after = c.get("/")
    assert after.status_code == 401 and after.json()["error"]["message"] == "preview expired"


def test_a_session_s_end_closes_its_preview_websockets(gw: RunningGateway) -> None:
    with gw.client() as c:
        made = c.post("/v1/sessions", json={}).json()
        run_server(c, made["id"])
    preview, secret = create(gw, made["id"])

    async def scenario() -> float:
        async with connect(
            f"ws://{preview['host']}:{gw.settings.preview_port}/ws",
            host="127.0.0.1",
            port=gw.settings.preview_port,
            additional_headers={"x-corral-preview-token": secret},
        ) as ws:
            await ws.send("x")
            assert await ws.recv() == "x"
            async with httpx.AsyncClient(base_url=gw.url, headers={"Authorization": f"Bearer {KEY_A}"}) as api:
                ended = await api.delete(f"/v1/sessions/{made['id']}")
                assert ended.status_code == 204
            began = time.monotonic()
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(ws.recv(), timeout=10)
            return time.monotonic() - began

    assert asyncio.run(scenario()) < 2.0


def test_a_paused_session_s_preview_waits_for_its_resume(gw: RunningGateway) -> None:
    """Paused: an open WebSocket closes, a request gets 409; resumed: the preview (kept in the
    session's record) opens again, and says plainly that nothing listens until the agent starts its
    server again (a pause ends the agent's processes)."""
    with gw.client() as c:
        made = c.post("/v1/sessions", json={}).json()
        run_server(c, made["id"])
        preview, secret = create(gw, made["id"])
        try:

            async def open_then_pause() -> None:
                async with connect(
                    f"ws://{preview['host']}:{gw.settings.preview_port}/ws",
                    host="127.0.0.1",
                    port=gw.settings.preview_port,
                    additional_headers={"x-corral-preview-token": secret},
                ) as ws:
                    await ws.send("x")
                    assert await ws.recv() == "x"
                    async with httpx.AsyncClient(
                        base_url=gw.url, headers={"Authorization": f"Bearer {KEY_A}"}, timeout=120
                    ) as api:
                        paused = await api.post(f"/v1/sessions/{made['id']}/pause")
                        assert paused.status_code == 200, paused.text
                    with pytest.raises(ConnectionClosed):
                        await asyncio.wait_for(ws.recv(), timeout=5)

            asyncio.run(open_then_pause())
            with preview_client(gw, preview, secret) as p:
                while_paused = p.get("/")
            assert while_paused.status_code == 409 and while_paused.json()["error"]["code"] == "session_paused"
            assert c.post(f"/v1/sessions/{made['id']}/resume", json={}).status_code == 200
            with preview_client(gw, preview, secret) as p:
                resumed = p.get("/")
            assert resumed.status_code == 502 and resumed.json()["error"]["code"] == "nothing_listening"
            run_server(c, made["id"])
            with preview_client(gw, preview, secret) as p:
                assert p.get("/").text == "hello from the sandbox"
        finally:
            c.delete(f"/v1/sessions/{made['id']}")
