"""The controller's door, in front of a stand-in app: browsers, missing or replayed secrets and
non-JSON bodies are refused before any route runs; every authenticated answer carries the proof."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route, WebSocketRoute
from starlette.testclient import TestClient
from starlette.websockets import WebSocket, WebSocketDisconnect

from corral.contracts import auth
from corral.sandbox.guard import ControllerGuard

SECRET = auth.new_secret()


def _app(calls: list[str]) -> TestClient:
    async def actions(request: Request) -> JSONResponse:
        calls.append("actions")
        return JSONResponse({"ok": True})

    async def files(request: Request) -> JSONResponse:
        calls.append("files")
        return JSONResponse({"ok": True, "size": len(await request.body())})

    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"ok": True})

    async def ws(websocket: WebSocket) -> None:
        calls.append("ws")
        await websocket.accept()
        await websocket.send_text(await websocket.receive_text())
        await websocket.close()

    app = Starlette(
        routes=[
            Route("/v1/actions", actions, methods=["POST", "GET", "PUT"]),
            Route("/v1/files", files, methods=["PUT", "GET", "POST"]),
            Route("/healthz", healthz),
            WebSocketRoute("/v1/ws", ws),
        ]
    )
    verifier = auth.RequestVerifier(SECRET)
    app.add_middleware(ControllerGuard, verifier=lambda: verifier)
    return TestClient(app)


def _json(headers: dict[str, str] | None = None) -> dict[str, str]:
    return {"content-type": "application/json", **(headers or {})}


@pytest.mark.parametrize(
    "marks",
    [
        {"origin": "http://allowed.test"},
        {"origin": "null"},
        {"sec-fetch-mode": "no-cors"},
        {"sec-fetch-site": "cross-site", "sec-fetch-dest": "empty"},
    ],
)
def test_browsers_are_refused_even_with_the_secret(marks: dict[str, str]) -> None:
    calls: list[str] = []
    client = _app(calls)
    signed = auth.sign(SECRET)
    response = client.post("/v1/actions", content=b"{}", headers=_json({**signed.headers, **marks}))
    assert response.status_code == 403 and response.json()["error"]["code"] == "forbidden"
    assert client.get("/healthz", headers=marks).status_code == 403
    assert calls == []


def test_no_secret_no_route_but_healthz() -> None:
    calls: list[str] = []
    client = _app(calls)
    response = client.post("/v1/actions", content=b"{}", headers=_json())
    assert response.status_code == 401 and response.json()["error"]["code"] == "unauthorized"
    forged = auth.sign(auth.new_secret())
    response = client.post("/v1/actions", content=b"{}", headers=_json(forged.headers))
    assert response.status_code == 401 and "does not match" in response.json()["error"]["message"]
    health = client.get("/healthz")
    assert health.status_code == 200 and auth.PROOF_HEADER not in health.headers
    assert calls == []


def test_a_signed_request_runs_once_and_is_answered_with_the_proof() -> None:
    calls: list[str] = []
    client = _app(calls)
    signed = auth.sign(SECRET)
    response = client.post("/v1/actions", content=b"{}", headers=_json(signed.headers))
    assert response.status_code == 200 and auth.proven(SECRET, signed.nonce, response.headers)
    replayed = client.post("/v1/actions", content=b"{}", headers=_json(signed.headers))
    assert replayed.status_code == 401 and "used before" in replayed.json()["error"]["message"]
    assert calls == ["actions"]
    health = auth.sign(SECRET)
    assert auth.proven(SECRET, health.nonce, client.get("/healthz", headers=health.headers).headers)


@pytest.mark.parametrize("media", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data", ""])
def test_posts_must_be_declared_json(media: str) -> None:
    calls: list[str] = []
    client = _app(calls)
    headers = {**auth.sign(SECRET).headers, "content-type": media} if media else auth.sign(SECRET).headers
    response = client.post("/v1/actions", content=b"{}", headers=headers)
    assert response.status_code == 415 and response.json()["error"]["code"] == "unsupported_media_type"
    assert calls == []
    ok = client.post(
        "/v1/actions",
        content=b"{}",
        headers=_json(auth.sign(SECRET).headers) | {"content-type": "application/json; charset=utf-8"},
    )
    assert ok.status_code == 200


def test_websocket_needs_the_secret_and_no_browser() -> None:
    calls: list[str] = []
    client = _app(calls)
    for headers in ({}, {**auth.sign(SECRET).headers, "origin": "http://allowed.test"}):
        with pytest.raises(WebSocketDisconnect), client.websocket_connect("/v1/ws", headers=headers):
            pass
    assert calls == []
    signed = auth.sign(SECRET)
    with client.websocket_connect("/v1/ws", headers=signed.headers) as ws:
        ws.send_text("ping")
        assert ws.receive_text() == "ping"
    assert calls == ["ws"]


def test_raw_bytes_pass_only_as_a_put_to_v1_files_and_every_other_check_still_holds() -> None:
    calls: list[str] = []
    client = _app(calls)
    raw = {"content-type": "application/octet-stream"}
    ok = client.put("/v1/files?path=/workspace/a", content=b"\x00\xff", headers=auth.sign(SECRET).headers | raw)
    assert ok.status_code == 200 and ok.json()["size"] == 2
    # The same bytes elsewhere, by another method, or declared as anything else: refused unread.
    refused = [
        client.post("/v1/files", content=b"x", headers=auth.sign(SECRET).headers | raw),
        client.put("/v1/actions", content=b"x", headers=auth.sign(SECRET).headers | raw),
        client.put("/v1/files", content=b"x", headers=_json(auth.sign(SECRET).headers)),
        client.put("/v1/files", content=b"x", headers=auth.sign(SECRET).headers | {"content-type": "text/plain"}),
        client.put("/v1/files", content=b"x", headers=auth.sign(SECRET).headers),
    ]
    assert [r.status_code for r in refused] == [415] * 5
    assert refused[0].json()["error"]["message"] == "the body must be application/json"
    assert refused[3].json()["error"]["message"] == "the body must be application/octet-stream"
    # No secret, or a browser's marks: refused as before, whatever the type.
    assert client.put("/v1/files", content=b"x", headers=raw).status_code == 401
    browser = auth.sign(SECRET).headers | raw | {"origin": "http://page.test"}
    assert client.put("/v1/files", content=b"x", headers=browser).status_code == 403
    assert calls == ["files"]
