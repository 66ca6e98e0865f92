"""How a tool reaches the gateway: the CLI's fixed credential, or the MCP request's own bearer sent
to the gateway app in process, from the request's own base URL."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.requests import Request

from corral.errors import Unauthorized
from corral.mcp.access import FixedCredential, ForwardedBearer, bearer_of

from ..gateway.routes.conftest import KEY, OTHER_KEY, settings_for, wired


def request(authorization: str | None, host: str = "gw.example:8700") -> Request:
    headers = [(b"host", host.encode())]
    if authorization is not None:
        headers.append((b"authorization", authorization.encode()))
    return Request(
        {"type": "http", "method": "POST", "path": "/mcp", "headers": headers, "scheme": "https", "query_string": b""}
    )


def test_the_bearer_of_a_request() -> None:
    assert bearer_of(request("Bearer abc ")) == "abc"
    assert bearer_of(request("bearer abc")) == "abc"
    assert bearer_of(request("Basic abc")) is None
    assert bearer_of(request(None)) is None
    assert bearer_of(None) is None  # stdio: no HTTP request


async def test_a_fixed_credential_ignores_the_request() -> None:
    gateway = FixedCredential("http://127.0.0.1:9", "the-key").gateway(None)
    try:
        assert gateway.url == "http://127.0.0.1:9"
    finally:
        await gateway.close()


async def test_the_forwarded_bearer_calls_the_gateway_in_process_as_the_caller(tmp_path: Path) -> None:
    app = wired(settings_for(tmp_path))
    access = ForwardedBearer(app)
    mine = access.gateway(request(f"Bearer {KEY}"))
    theirs = access.gateway(request(f"Bearer {OTHER_KEY}"))
    try:
        assert mine.url == "https://gw.example:8700"  # the MCP request's own base URL
        assert await mine.sessions() == [] and await theirs.sessions() == []
    finally:
        await mine.close()
        await theirs.close()
    with pytest.raises(Unauthorized):
        access.gateway(request(None))
