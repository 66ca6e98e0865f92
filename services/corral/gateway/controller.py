"""The gateway's calls to a sandbox's controller: signed with its per-boot secret, believed only once
the controller proved that secret back (corral.contracts.auth)."""

from __future__ import annotations

import contextlib
import urllib.parse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from corral.contracts import auth
from corral.contracts.limits import MAX_FRAME_BYTES
from corral.errors import UnprovenController


async def request(
    http: httpx.AsyncClient, base_url: str, secret: str, method: str, path: str, **kw: Any
) -> httpx.Response:
    """One HTTP request to the controller, read whole; see :func:`stream`."""
    async with stream(http, base_url, secret, method, path, **kw) as response:
        await response.aread()
    return response


@asynccontextmanager
async def stream(
    http: httpx.AsyncClient, base_url: str, secret: str, method: str, path: str, **kw: Any
) -> AsyncIterator[httpx.Response]:
    """One HTTP request to the controller, signed; raises :class:`UnprovenController` when the answer
    lacks the proof (whatever holds the port is not the controller this gateway started), checked on
    the headers before a byte of the body is read."""
    signed = auth.sign(secret)
    headers = {**kw.pop("headers", {}), **signed.headers}
    async with http.stream(method, f"{base_url}{path}", headers=headers, **kw) as response:
        if not auth.proven(secret, signed.nonce, response.headers):
            raise UnprovenController(f"{base_url} answered {path} without the controller's proof")
        yield response


def ws_address(base_url: str, path: str) -> str:
    """The controller's WebSocket URL for ``path`` (with its query), from its HTTP base URL."""
    return base_url.replace("http://", "ws://", 1).replace("https://", "wss://", 1) + path


class RefusedUpgrade(InvalidHandshake):
    """The controller answered a WebSocket upgrade with an HTTP error, and proved it (a CDP
    connection's ``409 control_taken``): the gateway may pass ``status`` and ``body`` on."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"the controller refused the upgrade: {status}")
        self.status = status
        self.body = body


async def connect_ws(
    ws_url: str, secret: str, path: str | None = None, max_size: int = MAX_FRAME_BYTES
) -> ClientConnection:
    """The controller's WebSocket, once its handshake carried the proof. ``path`` (with its query)
    replaces ``ws_url``'s (the agent's ``/v1/ws``): ``/v1/cdp?...``.

    An upgrade the controller refused with its proof raises :class:`RefusedUpgrade` (its status and
    body are the controller's word); one refused without it, websockets' ``InvalidStatus`` as before."""
    signed = auth.sign(secret)
    if path is not None:
        parts = urllib.parse.urlsplit(ws_url)
        ws_url = f"{parts.scheme}://{parts.netloc}{path}"
    try:
        upstream = await connect(
            ws_url,
            compression=None,
            max_size=max_size,
            open_timeout=10,
            ping_interval=None,
            additional_headers=signed.headers,
        )
    except InvalidStatus as exc:
        if auth.proven(secret, signed.nonce, exc.response.headers):
            raise RefusedUpgrade(exc.response.status_code, bytes(exc.response.body or b"")) from None
        raise
    if upstream.response is None or not auth.proven(secret, signed.nonce, upstream.response.headers):
        with contextlib.suppress(ConnectionClosed, OSError):  # what answered need not close cleanly
            await upstream.close()
        raise UnprovenController(f"{ws_url} accepted the WebSocket without the controller's proof")
    return upstream
