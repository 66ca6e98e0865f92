"""A session's actions and WebSocket: ``?token=`` only on the WebSocket and never an API key, capped
bodies, and a sandbox that does not answer."""

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
from corral.gateway.routes.actions import MAX_ACTION_BODY
from corral.gateway.sessions import SessionManager

from ..controller_fake import SECRET, proving
from .conftest import KEY, KEY_ID_SECRET, Client

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # starlette's note about httpx, on import
    from starlette.testclient import TestClient


async def test_query_tokens_open_nothing_over_http(app: FastAPI, client: Client) -> None:
    manager: SessionManager = app.state.manager
    session, token = await manager.create(auth.key_id(KEY, KEY_ID_SECRET), CreateSession())
    async with client() as anon:
        assert (await anon.get("/v1/sessions", params={"token": KEY})).status_code == 401
        assert (await anon.get(f"/v1/sessions/{session.id}", params={"token": token})).status_code == 401
        reply = await anon.post(f"/v1/sessions/{session.id}/actions", params={"token": KEY}, json={"action": {}})
        assert reply.status_code == 401
    async with client(token) as holder:
        assert (await holder.get(f"/v1/sessions/{session.id}")).status_code == 200  # as a header, it opens


async def test_an_action_body_over_the_cap_is_refused(app: FastAPI, client: Client) -> None:
    manager: SessionManager = app.state.manager
    session, token = await manager.create(auth.key_id(KEY, KEY_ID_SECRET), CreateSession())
    async with client(token) as holder:
        reply = await holder.post(
            f"/v1/sessions/{session.id}/actions",
            content=b"x",
            headers={"content-length": str(MAX_ACTION_BODY + 1), "content-type": "application/json"},
        )
    assert reply.status_code == 413 and reply.json()["error"]["code"] == "message_too_large"
    assert reply.headers["connection"] == "close"


async def test_a_sandbox_that_does_not_answer_is_502(app: FastAPI, client: Client) -> None:
    manager: SessionManager = app.state.manager
    session, token = await manager.create(auth.key_id(KEY, KEY_ID_SECRET), CreateSession())
    async with client(token) as holder:
        reply = await holder.post(f"/v1/sessions/{session.id}/actions", json={"action": {"type": "wait"}})
    assert reply.status_code == 502
    assert reply.json()["ok"] is False and reply.json()["error"]["code"] == "sandbox_unreachable"
    assert session.in_flight == 0  # the failed action no longer counts as activity


# A vendor tool call and its failure as a controller answers it (captured from a real one): Corral's
# error and the vendor's own error form, side by side.
TOOL_USE = {
    "type": "tool_use",
    "id": "toolu_02C",
    "name": "str_replace_based_edit_tool",
    "input": {"command": "str_replace", "path": "/workspace/app.py", "old_str": "return 9", "new_str": "return 3"},
}
NO_MATCH = "No replacement was performed, old_str `return 9` did not appear verbatim in /workspace/app.py."
VENDOR_FAILURE = {
    "ok": False,
    "id": 32,
    "error": {"code": "no_match", "message": NO_MATCH, "field": "action.old_str"},
    "result": {
        "tool_result": {
            "type": "tool_result",
            "tool_use_id": "toolu_02C",
            "content": [{"type": "text", "text": NO_MATCH}],
            "is_error": True,
        }
    },
}


async def test_a_vendor_call_and_its_failure_with_the_vendor_result_pass_unchanged(
    app: FastAPI, client: Client
) -> None:
    manager: SessionManager = app.state.manager
    session, token = await manager.create(auth.key_id(KEY, KEY_ID_SECRET), CreateSession())
    session.sandbox = dataclasses.replace(session.sandbox, secret=SECRET)
    body = json.dumps(VENDOR_FAILURE).encode()
    received: list[bytes] = []

    def controller(request: httpx.Request) -> httpx.Response:
        received.append(request.content)
        return httpx.Response(400, content=body, headers={"content-type": "application/json"})

    await app.state.http.aclose()
    app.state.http = httpx.AsyncClient(transport=httpx.MockTransport(proving(controller)))
    request = json.dumps({"id": 32, "anthropic": TOOL_USE, "display": {"width": 1024, "height": 640}}).encode()
    async with client(token) as holder:
        reply = await holder.post(
            f"/v1/sessions/{session.id}/actions", content=request, headers={"content-type": "application/json"}
        )
    assert received == [request]  # the block goes to the sandbox as the agent sent it
    assert (reply.status_code, reply.content) == (400, body)  # the error and the tool_result come back as they were


def _ws_close(client: TestClient, path: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    with client.websocket_connect(path, headers=headers or {}) as ws, pytest.raises(WebSocketDisconnect) as closed:
        ws.receive_text()
    return closed.value.code, closed.value.reason


def test_the_websocket_takes_a_session_token_in_the_query_never_an_api_key(
    live: tuple[TestClient, str, str],
) -> None:
    client, session_id, token = live
    path = f"/v1/sessions/{session_id}/ws"
    code, reason = _ws_close(client, f"{path}?token={KEY}")
    assert code == 4401 and "session token" in reason
    # Past auth, the relay meets the (closed) sandbox port: 1011, not a refusal.
    assert _ws_close(client, f"{path}?token={token}")[0] == 1011
    assert _ws_close(client, path, headers={"authorization": f"Bearer {KEY}"})[0] == 1011
    assert _ws_close(client, f"{path}?token=nope")[0] == 4401


def test_the_websocket_refusals_mirror_the_http_statuses(live: tuple[TestClient, str, str]) -> None:
    client, _, token = live
    missing = _ws_close(client, "/v1/sessions/ses_0000000000000000/ws", {"authorization": f"Bearer {KEY}"})
    assert missing == (4404, "no session ses_0000000000000000")
    other = client.post("/v1/sessions", json={}, headers={"authorization": f"Bearer {KEY}"}).json()
    assert _ws_close(client, f"/v1/sessions/{other['id']}/ws?token={token}")[0] == 4403
