"""The gateway app's front door, with a fake runtime: credentials before bodies, capped bodies,
``?token=`` only on the WebSocket and never an API key."""

from __future__ import annotations

import json
import socket
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.websockets import WebSocketDisconnect

from corral.gateway import auth
from corral.gateway.app import create_app
from corral.gateway.metrics import Metrics
from corral.gateway.models import CreateSession
from corral.gateway.sessions import SessionManager
from corral.gateway.settings import GatewaySettings
from corral.gateway.store import SessionStore
from corral.runtime import SandboxAddress, SandboxSpec

from ..runtime.fake import FakeRuntime

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # starlette's note about httpx, on import
    from starlette.testclient import TestClient

KEY = "unit-key"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LoopbackRuntime(FakeRuntime):
    """Sandboxes "at" a closed loopback port: a relay that gets past auth fails to connect, harmlessly."""

    def start_sandbox(self, spec: SandboxSpec) -> SandboxAddress:
        box = super().start_sandbox(spec)
        moved = SandboxAddress(box.id, box.name, "127.0.0.1", _closed_port())
        self.running[box.id] = (moved, self.running[box.id][1])
        return moved


@pytest.fixture()
def app(tmp_path: Path) -> FastAPI:
    """The app with its state set by hand (no lifespan, no Docker)."""
    settings = GatewaySettings(data_dir=tmp_path, api_key=KEY, egress=False, record=False, max_body_kb=64)
    app = create_app(settings, runtime=LoopbackRuntime())
    app.state.keys = auth.KeyRing([KEY])
    app.state.metrics = Metrics()
    app.state.max_body = settings.max_body_kb << 10
    app.state.manager = SessionManager(settings, LoopbackRuntime(), SessionStore(tmp_path))
    return app


class CountingBody:
    """A request body that counts what the server pulled of it."""

    def __init__(self, chunks: int, size: int = 1 << 20) -> None:
        self.chunks, self.size, self.pulled = chunks, size, 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for _ in range(self.chunks):
            self.pulled += 1
            yield b" " * self.size


def _client(app: FastAPI, key: str | None = None) -> httpx.AsyncClient:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw", headers=headers)


async def test_an_unauthenticated_body_is_refused_unread(app: FastAPI) -> None:
    body = CountingBody(200)  # 200 MiB, announced
    async with _client(app) as anon:
        reply = await anon.post("/v1/sessions", content=body, headers={"content-length": str(200 << 20)})
    assert reply.status_code == 401 and reply.json()["error"]["code"] == "unauthorized"
    assert body.pulled == 0
    assert reply.headers["connection"] == "close"  # and the server takes in none of the rest


async def test_an_authenticated_body_over_the_cap_is_refused_before_parsing(app: FastAPI) -> None:
    announced = CountingBody(200)
    async with _client(app, KEY) as owner:
        reply = await owner.post("/v1/sessions", content=announced, headers={"content-length": str(200 << 20)})
        assert reply.status_code == 413 and reply.json()["error"]["code"] == "message_too_large"
        assert announced.pulled == 0  # the Content-Length said enough
        streamed = CountingBody(200, size=16 << 10)  # chunked, no length: cut once past 64 KiB
        reply = await owner.post("/v1/sessions", content=streamed)
        assert reply.status_code == 413 and streamed.pulled == 5
        assert app.state.manager.list() == []


async def test_bodies_under_the_cap_still_validate_with_their_field(app: FastAPI) -> None:
    async with _client(app, KEY) as owner:
        bad = await owner.post("/v1/sessions", json={"viewport": {"width": 10}})
        assert bad.status_code == 422 and bad.json()["error"]["field"] == "viewport.width"
        assert (await owner.post("/v1/sessions", content=b"{nope")).status_code == 422
        created = await owner.post("/v1/sessions", json={"labels": {"a": "b"}})
        assert created.status_code == 201 and created.json()["labels"] == {"a": "b"}
        patched = await owner.patch(f"/v1/sessions/{created.json()['id']}", json={"colour": "red"})
        assert patched.status_code == 422 and patched.json()["error"]["field"] == "colour"


async def test_the_openapi_description_keeps_the_bodies(app: FastAPI) -> None:
    async with _client(app) as anon:
        schema = (await anon.get("/openapi.json")).json()
    body = schema["paths"]["/v1/sessions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/CreateSession"}
    assert "Viewport" in schema["components"]["schemas"]


async def test_query_tokens_open_nothing_over_http(app: FastAPI) -> None:
    manager: SessionManager = app.state.manager
    session, token = await manager.create(auth.key_id(KEY), CreateSession())
    async with _client(app) as anon:
        assert (await anon.get("/v1/sessions", params={"token": KEY})).status_code == 401
        assert (await anon.get(f"/v1/sessions/{session.id}", params={"token": token})).status_code == 401
        reply = await anon.post(f"/v1/sessions/{session.id}/actions", params={"token": KEY}, json={"action": {}})
        assert reply.status_code == 401
    async with _client(app, token) as holder:
        assert (await holder.get(f"/v1/sessions/{session.id}")).status_code == 200  # as a header, it opens


def _ws_close(client: TestClient, path: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    with client.websocket_connect(path, headers=headers or {}) as ws, pytest.raises(WebSocketDisconnect) as closed:
        ws.receive_text()
    return closed.value.code, closed.value.reason


@pytest.fixture()
def live(app: FastAPI) -> Iterator[tuple[TestClient, str, str]]:
    """A session made through the API (TestClient runs the app's lifespan with the fake runtime)."""
    with TestClient(app) as client:
        created = client.post("/v1/sessions", json={}, headers={"authorization": f"Bearer {KEY}"}).json()
        yield client, created["id"], created["token"]


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


def test_health_shows_the_limits(live: tuple[TestClient, str, str]) -> None:
    client, _, _ = live
    limits: dict[str, Any] = client.get("/v1/health").json()["limits"]
    assert {"default_cpus", "default_memory_mb", "fits_host", "warnings"} <= limits.keys()
    assert json.dumps(limits)
