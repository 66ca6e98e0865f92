"""A session's CDP endpoint: its credentials (header, connect tickets), no Origin ever, the /json
answers rewritten to the gateway's addresses, the controller's refusal of an upgrade passed on."""

from __future__ import annotations

import dataclasses
import json
import warnings

import httpx
import pytest
from fastapi import FastAPI
from starlette.websockets import WebSocketDisconnect

from corral.gateway import auth
from corral.gateway.models import CreateSession
from corral.gateway.sessions import SessionManager

from ..controller_fake import SECRET, proving
from .conftest import KEY, KEY_ID_SECRET, OTHER_KEY, Client

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # starlette's note about httpx, on import
    from starlette.testclient import TestClient

VERSION = {"Browser": "Chrome/131", "webSocketDebuggerUrl": "ws://127.0.0.1:9222/devtools/browser/1f2e"}
LIST = [
    {
        "id": "A1B2",
        "type": "page",
        "devtoolsFrontendUrl": "/devtools/inspector.html?ws=127.0.0.1:9222/devtools/page/A1B2",
        "webSocketDebuggerUrl": "ws://127.0.0.1:9222/devtools/page/A1B2",
    }
]


async def _session_with_devtools(app: FastAPI) -> tuple[str, str, list[str]]:
    """A session whose (fake) controller answers /v1/cdp/json/*; the paths it was asked for."""
    manager: SessionManager = app.state.manager
    session, token = await manager.create(auth.key_id(KEY, KEY_ID_SECRET), CreateSession())
    session.sandbox = dataclasses.replace(session.sandbox, secret=SECRET)
    asked: list[str] = []

    def controller(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        return httpx.Response(200, json=VERSION if request.url.path.endswith("/version") else LIST)

    await app.state.http.aclose()
    app.state.http = httpx.AsyncClient(transport=httpx.MockTransport(proving(controller)))
    return session.id, token, asked


@pytest.mark.parametrize(
    ("suffix", "which"),
    [
        ("json/version", "version"),
        ("json/version/", "version"),
        ("json/list", "list"),
        ("json/list/", "list"),
        ("json", "list"),
        ("json/", "list"),
    ],
)
async def test_json_answers_name_the_gateway(app: FastAPI, client: Client, suffix: str, which: str) -> None:
    session_id, token, asked = await _session_with_devtools(app)
    async with client(token) as holder:
        reply = await holder.get(f"/v1/sessions/{session_id}/cdp/{suffix}")
    assert reply.status_code == 200 and asked == [f"/v1/cdp/json/{which}"]
    base = f"ws://gw/v1/sessions/{session_id}/cdp"
    if which == "version":
        assert reply.json()["webSocketDebuggerUrl"] == base
    else:
        assert reply.json() == [{"id": "A1B2", "type": "page", "webSocketDebuggerUrl": f"{base}/page/A1B2"}]


async def test_json_needs_the_sessions_credential(app: FastAPI, client: Client) -> None:
    session_id, _, asked = await _session_with_devtools(app)
    async with client() as anon:
        assert (await anon.get(f"/v1/sessions/{session_id}/cdp/json/version")).status_code == 401
    async with client(OTHER_KEY) as stranger:
        assert (await stranger.get(f"/v1/sessions/{session_id}/cdp/json/version")).status_code == 403
    async with client(KEY) as owner:
        assert (await owner.get(f"/v1/sessions/{session_id}/cdp/json/version")).status_code == 200
    assert len(asked) == 1


async def test_a_request_with_an_origin_is_refused(app: FastAPI, client: Client) -> None:
    session_id, token, asked = await _session_with_devtools(app)
    async with client(token) as holder:
        page = {"origin": "https://evil.test"}
        reply = await holder.get(f"/v1/sessions/{session_id}/cdp/json/version", headers=page)
        assert reply.status_code == 403 and reply.json()["error"]["code"] == "forbidden"
        assert (await holder.post(f"/v1/sessions/{session_id}/cdp/connect", json={}, headers=page)).status_code == 403
    assert asked == []


async def test_a_connect_ticket_opens_the_json_without_a_header(app: FastAPI, client: Client) -> None:
    session_id, token, _ = await _session_with_devtools(app)
    async with client(token) as holder:
        made = await holder.post(f"/v1/sessions/{session_id}/cdp/connect", json={"ttl_s": 30, "exclusive": True})
        assert (await holder.post(f"/v1/sessions/{session_id}/cdp/connect", json={"ttl_s": 601})).status_code == 422
    assert made.status_code == 200
    out = made.json()
    assert out["exclusive"] is True and out["url"].startswith(f"ws://gw/v1/sessions/{session_id}/cdp/t/")
    ticket = out["url"].rsplit("/", 1)[1]
    assert out["http_url"] == f"http://gw/v1/sessions/{session_id}/cdp/t/{ticket}"
    async with client() as anon:
        version = await anon.get(f"{out['http_url']}/json/version")
        assert version.status_code == 200 and version.json()["webSocketDebuggerUrl"] == out["url"]
        bad = await anon.get(f"/v1/sessions/{session_id}/cdp/t/{ticket[:-2]}xx/json/version")
        assert bad.status_code == 401
        assert (await anon.post(f"/v1/sessions/{session_id}/cdp/connect", json={})).status_code == 401


def _ws_close(client: TestClient, path: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    with client.websocket_connect(path, headers=headers or {}) as ws, pytest.raises(WebSocketDisconnect) as closed:
        ws.receive_text()
    return closed.value.code, closed.value.reason


def test_the_socket_refuses_origins_and_strangers(live: tuple[TestClient, str, str]) -> None:
    client, session_id, token = live
    path = f"/v1/sessions/{session_id}/cdp"
    bearer = {"authorization": f"Bearer {token}"}
    assert _ws_close(client, path, {**bearer, "origin": "https://evil.test"})[0] == 4403
    assert _ws_close(client, f"{path}/page/A1B2", {**bearer, "origin": "null"})[0] == 4403
    assert _ws_close(client, path)[0] == 4401
    assert _ws_close(client, path, {"authorization": f"Bearer {OTHER_KEY}"})[0] == 4403
    # Past the checks, the relay meets the (closed) sandbox port: 1011, not a refusal.
    assert _ws_close(client, path, bearer)[0] == 1011
    assert _ws_close(client, path, {"authorization": f"Bearer {KEY}"})[0] == 1011


def test_the_socket_takes_its_credential_from_the_header_only(live: tuple[TestClient, str, str]) -> None:
    """A ?token= in a CDP address would end up in clients' logs: a client that cannot set a header
    asks for a connect ticket."""
    client, session_id, token = live
    path = f"/v1/sessions/{session_id}/cdp"
    assert _ws_close(client, f"{path}?token={token}")[0] == 4401
    assert _ws_close(client, f"{path}/page/A1B2?token={token}")[0] == 4401
    assert _ws_close(client, f"{path}?token={token}", {"authorization": f"Bearer {token}"})[0] == 1011


def test_tickets_open_only_their_session(live: tuple[TestClient, str, str]) -> None:
    client, session_id, token = live
    made = client.post(
        f"/v1/sessions/{session_id}/cdp/connect", json={}, headers={"authorization": f"Bearer {token}"}
    ).json()
    ticket = made["url"].rsplit("/", 1)[1]
    other = client.post("/v1/sessions", json={}, headers={"authorization": f"Bearer {KEY}"}).json()
    assert _ws_close(client, f"/v1/sessions/{other['id']}/cdp/t/{ticket}")[0] == 4403
    assert _ws_close(client, f"/v1/sessions/{session_id}/cdp/t/nope.nope")[0] == 4401
    assert _ws_close(client, f"/v1/sessions/{session_id}/cdp/t/{ticket}", {"origin": "https://a.test"})[0] == 4403
    assert _ws_close(client, f"/v1/sessions/{session_id}/cdp/t/{ticket}")[0] == 1011
    assert _ws_close(client, f"/v1/sessions/{session_id}/cdp/t/{ticket}/page/A1B2")[0] == 1011
    assert json.dumps(made["expires_at"]).isdigit()
