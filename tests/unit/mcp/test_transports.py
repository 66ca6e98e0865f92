"""``/mcp`` on the gateway: the gateway's own 401 and 413 before the SDK reads a byte, the SDK's
DNS-rebinding guard set from the settings, and the SDK's session manager running for as long as the
gateway's lifespan (a mounted app's own lifespan never runs)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from fastapi import FastAPI

from corral.gateway import server
from corral.gateway.server import add_mcp, build_app
from corral.gateway.settings import GatewaySettings
from corral.mcp.transports import transport_security

from ..gateway.routes.conftest import KEY, OTHER_KEY, LoopbackRuntime, client_for, settings_for, wired
from .handshake import INITIALIZE, MCP_HEADERS

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # starlette's note about httpx, on import
    from starlette.testclient import TestClient


def served(settings: GatewaySettings) -> FastAPI:
    """:func:`wired`'s app with ``/mcp``, as the server's assembly mounts it."""
    app = wired(settings)
    add_mcp(app, settings)
    return app


async def test_no_credential_or_a_wrong_one_is_the_gateways_401(tmp_path: Path) -> None:
    app = served(settings_for(tmp_path))
    for credential in (None, "wrong"):
        async with client_for(app, credential) as http:
            answer = await http.post("/mcp", content=json.dumps(INITIALIZE), headers=MCP_HEADERS)
        assert answer.status_code == 401
        assert answer.json() == {
            "ok": False,
            "error": {"code": "unauthorized", "message": answer.json()["error"]["message"]},
        }
        assert answer.headers.get("connection") == "close"  # the body stays unread


async def test_a_body_over_the_cap_is_the_gateways_413(tmp_path: Path) -> None:
    app = served(settings_for(tmp_path, max_body_kb=1))
    async with client_for(app, KEY) as http:
        answer = await http.post("/mcp", content=b"x" * 1025, headers=MCP_HEADERS)
    assert answer.status_code == 413 and answer.json()["error"]["code"] == "message_too_large"


def test_the_session_manager_runs_with_the_gateways_lifespan(tmp_path: Path) -> None:
    app = build_app(settings_for(tmp_path), runtime=LoopbackRuntime())
    with TestClient(app, base_url="http://127.0.0.1:8700") as http:
        answer = http.post("/mcp", json=INITIALIZE, headers={**MCP_HEADERS, "authorization": f"Bearer {KEY}"})
        assert answer.status_code == 200, answer.text
        assert "mcp-session-id" in answer.headers
        # A name the guard does not know is refused before the SDK reads the message.
        foreign = http.post(
            "/mcp", json=INITIALIZE, headers={**MCP_HEADERS, "authorization": f"Bearer {KEY}", "host": "evil.test"}
        )
        assert foreign.status_code == 421


def test_the_guard_allows_loopback_and_the_named_hosts(tmp_path: Path) -> None:
    default = transport_security(settings_for(tmp_path))
    assert default.enable_dns_rebinding_protection
    assert {"127.0.0.1:*", "localhost:*", "[::1]:*", "localhost"} <= set(default.allowed_hosts)
    assert "http://localhost:*" in default.allowed_origins and "http://evil.test" not in default.allowed_origins

    named = transport_security(settings_for(tmp_path, host="10.0.0.5", mcp_allowed_hosts="corral.example, gw:8700"))
    assert {"corral.example", "corral.example:*", "gw:8700", "10.0.0.5:*"} <= set(named.allowed_hosts)
    assert "https://corral.example" in named.allowed_origins

    assert not transport_security(settings_for(tmp_path, mcp_allowed_hosts="*")).enable_dns_rebinding_protection


def test_a_gateway_without_the_mcp_extra_serves_no_mcp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def paths() -> set[str]:
        app = build_app(settings_for(tmp_path), runtime=LoopbackRuntime())
        return {str(getattr(route, "path", "")) for route in app.routes}

    assert "/mcp" in paths()
    monkeypatch.setattr(server, "MCP_INSTALLED", False)  # as found at import without the mcp package
    assert "/mcp" not in paths()


def test_the_app_serves_mcp_through_a_second_lifespan(tmp_path: Path) -> None:
    """The SDK's session manager runs once per instance: each lifespan has its own."""
    app = build_app(settings_for(tmp_path), runtime=LoopbackRuntime())
    for _ in range(2):
        with TestClient(app, base_url="http://127.0.0.1:8700") as http:
            answer = http.post("/mcp", json=INITIALIZE, headers={**MCP_HEADERS, "authorization": f"Bearer {KEY}"})
            assert answer.status_code == 200, answer.text


def test_an_mcp_session_is_refused_to_another_credential(tmp_path: Path) -> None:
    """The SDK ties a session to the user that opened it: another key (or a session's token) that
    learned the id gets the SDK's 404 for a POST, a GET stream and a DELETE; the opener goes on."""
    app = build_app(settings_for(tmp_path), runtime=LoopbackRuntime())
    with TestClient(app, base_url="http://127.0.0.1:8700") as http:
        opened = http.post("/mcp", json=INITIALIZE, headers={**MCP_HEADERS, "authorization": f"Bearer {KEY}"})
        session = {"mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
        other = {**MCP_HEADERS, **session, "authorization": f"Bearer {OTHER_KEY}"}
        assert http.post("/mcp", json=listing, headers=other).status_code == 404
        assert http.get("/mcp", headers={**other, "accept": "text/event-stream"}).status_code == 404
        assert http.delete("/mcp", headers=other).status_code == 404
        own = {**MCP_HEADERS, **session, "authorization": f"Bearer {KEY}"}
        assert http.post("/mcp", json=listing, headers=own).status_code == 200
        assert http.delete("/mcp", headers=own).status_code == 200


def test_one_credential_cannot_take_every_mcp_session(tmp_path: Path) -> None:
    """Past CORRAL_MCP_MAX_SESSIONS_PER_CALLER a caller's new session is the gateway's 429; other
    callers open theirs, and ending one makes room again. CORRAL_MCP_MAX_SESSIONS is the SDK's 503."""
    settings = settings_for(tmp_path, mcp_max_sessions=3, mcp_max_sessions_per_caller=2, mcp_session_idle_s=30)
    app = build_app(settings, runtime=LoopbackRuntime())

    def headers(credential: str, **more: str) -> dict[str, str]:
        return {**MCP_HEADERS, "authorization": f"Bearer {credential}", **more}

    with TestClient(app, base_url="http://127.0.0.1:8700") as http:
        mine = [http.post("/mcp", json=INITIALIZE, headers=headers(KEY)) for _ in range(2)]
        assert [answer.status_code for answer in mine] == [200, 200]
        refused = http.post("/mcp", json=INITIALIZE, headers=headers(KEY))
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "too_many_sessions"
        assert "CORRAL_MCP_MAX_SESSIONS_PER_CALLER=2" in refused.json()["error"]["message"]

        assert http.post("/mcp", json=INITIALIZE, headers=headers(OTHER_KEY)).status_code == 200
        assert http.post("/mcp", json=INITIALIZE, headers=headers(OTHER_KEY)).status_code == 503  # 3 open

        first = mine[0].headers["mcp-session-id"]
        ended = http.delete("/mcp", headers=headers(KEY, **{"mcp-session-id": first}))
        assert ended.status_code == 200
        assert http.post("/mcp", json=INITIALIZE, headers=headers(KEY)).status_code == 200
