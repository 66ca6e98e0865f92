"""A gateway app over a fake runtime (no Docker, no lifespan): its state wired as ``create_app``'s
lifespan wires it, and clients that speak to it in process."""

from __future__ import annotations

import socket
import warnings
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from corral.gateway import auth
from corral.gateway.app import build_sessions, create_app
from corral.gateway.metrics import Metrics
from corral.gateway.settings import GatewaySettings
from corral.gateway.store import SessionStore
from corral.runtime import SandboxAddress, SandboxSpec

from ...runtime.fake import FakeRuntime

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # starlette's note about httpx, on import
    from starlette.testclient import TestClient

KEY = "unit-key-Qm3Zr8Tx5Vw2Ny7Kb4Hc9Pd6Lf"  # strong enough for the gateway to hold (keystrength)
OTHER_KEY = "unit-key-b-Zt5Wq8Rm2Xn7Lc4Vj9Hs3Gd6Pf"
KEY_ID_SECRET = bytes(range(32))  # the data dir's key-id-key, put there first: tests name owners by it
Client = Callable[..., httpx.AsyncClient]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LoopbackRuntime(FakeRuntime):
    """Sandboxes "at" a closed loopback port: a relay or action that gets past auth fails to connect, harmlessly."""

    def start_sandbox(self, spec: SandboxSpec) -> SandboxAddress:
        box = super().start_sandbox(spec)
        moved = SandboxAddress(box.id, box.name, "127.0.0.1", closed_port())
        self.running[box.id] = (moved, self.running[box.id][1])
        return moved


def settings_for(tmp_path: Path, **overrides: object) -> GatewaySettings:
    secret = tmp_path / auth.KEY_ID_KEY_FILE
    if not secret.exists():
        tmp_path.mkdir(parents=True, exist_ok=True)
        secret.write_bytes(KEY_ID_SECRET)
    values: dict[str, object] = {
        "data_dir": tmp_path,
        "api_key": f"{KEY},{OTHER_KEY}",
        "egress": False,
        "record": False,
        "max_body_kb": 64,
        "instance": "unit",
        "preview_port": closed_port(),  # a served app's preview listener: a port of its own, never 8701
    }
    values.update(overrides)
    return GatewaySettings(**values)


def wired(settings: GatewaySettings) -> FastAPI:
    """The app with the state its lifespan would give it, over a loopback fake runtime."""
    app = create_app(settings, runtime=LoopbackRuntime())
    app.state.keys = auth.KeyRing.for_gateway(settings)
    app.state.metrics = Metrics()
    app.state.manager = build_sessions(settings, LoopbackRuntime(), SessionStore(settings.data_dir))
    app.state.http = httpx.AsyncClient(timeout=5)
    return app


@pytest.fixture()
async def app(tmp_path: Path) -> AsyncIterator[FastAPI]:
    app = wired(settings_for(tmp_path))
    yield app
    await app.state.http.aclose()


def client_for(app: FastAPI, credential: str | None = None) -> httpx.AsyncClient:
    """An in-process client, with ``Authorization: Bearer <credential>`` when given."""
    headers = {"authorization": f"Bearer {credential}"} if credential else {}
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw", headers=headers)


@pytest.fixture()
def client(app: FastAPI) -> Client:
    """``client(credential)``: :func:`client_for` the fixture's app."""
    return lambda credential=None: client_for(app, credential)


@pytest.fixture()
def live(tmp_path: Path) -> Iterator[tuple[TestClient, str, str]]:
    """A session made through the API, with the app's own lifespan over the fake runtime."""
    app = create_app(settings_for(tmp_path), runtime=LoopbackRuntime())
    with TestClient(app) as test_client:
        created = test_client.post("/v1/sessions", json={}, headers={"authorization": f"Bearer {KEY}"}).json()
        yield test_client, created["id"], created["token"]
