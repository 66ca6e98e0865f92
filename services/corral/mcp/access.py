"""How a tool reaches the gateway as its caller: MCP adds no privilege, every tool is one call of the
gateway's HTTP API (corral.gateway_client) with the caller's own credential, checked by the
gateway's own auth.

- :class:`FixedCredential` (``corral mcp``, stdio): the gateway at a URL, with the API key (or a
  session token) the CLI's configuration gives.
- :class:`ForwardedBearer` (``/mcp`` on the gateway): the bearer of the MCP request itself, sent to
  the gateway's own routes in-process (ASGI), never over a socket: the gateway may listen on an
  address it cannot reach itself (0.0.0.0 behind a proxy, TLS terminated elsewhere), and the
  routes' answers (``ws_url``...) are built from the MCP request's own base URL.
"""

from __future__ import annotations

from typing import Any, Protocol

import httpx
from starlette.requests import Request
from starlette.types import ASGIApp

from corral.errors import Unauthorized
from corral.gateway_client import AsyncGateway


class GatewayAccess(Protocol):
    """The gateway client for one tool call (closed by the caller), as the MCP request's caller."""

    def gateway(self, request: Any) -> AsyncGateway: ...


class FixedCredential:
    """One gateway and one credential for every call (stdio: the MCP client is the user's own)."""

    def __init__(self, url: str, credential: str) -> None:
        self.url = url
        self._credential = credential

    def gateway(self, request: Any) -> AsyncGateway:
        return AsyncGateway(self.url, self._credential)


def bearer_of(request: Any) -> str | None:
    """The ``Authorization: Bearer`` credential of an HTTP request (None: not HTTP, or none sent)."""
    if not isinstance(request, Request):
        return None
    header = request.headers.get("authorization", "")
    return header[7:].strip() or None if header.lower().startswith("bearer ") else None


class ForwardedBearer:
    """The MCP request's own bearer, to the gateway app ``app`` in-process."""

    def __init__(self, app: ASGIApp) -> None:
        self._transport = httpx.ASGITransport(app=app)

    def gateway(self, request: Any) -> AsyncGateway:
        credential = bearer_of(request)
        if credential is None:  # the /mcp gate refused such a request before the SDK saw it
            raise Unauthorized("send an API key or a session token as 'Authorization: Bearer ...'")
        assert isinstance(request, Request)
        return AsyncGateway(str(request.base_url).rstrip("/"), credential, transport=self._transport)


__all__ = ["FixedCredential", "ForwardedBearer", "GatewayAccess", "bearer_of"]
