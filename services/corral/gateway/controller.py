"""The gateway's calls to a sandbox's controller: signed with its per-boot secret, believed only once
the controller proved that secret back (corral.sandbox.auth)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from corral.errors import UnprovenController
from corral.protocol.envelope import MAX_FRAME_BYTES
from corral.sandbox import auth


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


async def connect_ws(ws_url: str, secret: str, max_size: int = MAX_FRAME_BYTES) -> ClientConnection:
    """The controller's WebSocket at ``ws_url`` (:func:`ws_address` makes one for a path), once its
    handshake carried the proof."""
    signed = auth.sign(secret)
    upstream = await connect(
        ws_url,
        compression=None,
        max_size=max_size,
        open_timeout=10,
        ping_interval=None,
        additional_headers=signed.headers,
    )
    if upstream.response is None or not auth.proven(secret, signed.nonce, upstream.response.headers):
        with contextlib.suppress(ConnectionClosed, OSError):  # what answered need not close cleanly
            await upstream.close()
        raise UnprovenController(f"{ws_url} accepted the WebSocket without the controller's proof")
    return upstream
