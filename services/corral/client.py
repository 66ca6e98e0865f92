"""Clients for a sandbox's WebSocket protocol (``/v1/ws``), async and sync.

The control plane's SDK builds on these; tests and the benchmark use them directly.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
from types import TracebackType
from typing import Any, Self

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection as SyncConnection
from websockets.sync.client import connect as sync_connect

from corral.errors import ActionFailed, UnprovenController
from corral.sandbox import auth

MAX_FRAME = 64 << 20


def check_reply(reply: dict[str, Any]) -> dict[str, Any]:
    """The reply itself if it is ``ok``; raises :class:`ActionFailed` with its error if not."""
    if not reply.get("ok"):
        raise ActionFailed(reply.get("error") or {})
    return reply


def _dial(secret: str | None) -> tuple[dict[str, Any], auth.SignedRequest | None]:
    """The options of one connection (signed when straight to a controller) and what it must prove.
    No per-message compression: it costs ~17 ms per screenshot frame for little gain."""
    signed = auth.sign(secret) if secret else None
    options = {"compression": None, "max_size": MAX_FRAME, "open_timeout": 10}
    return {**options, "additional_headers": signed.headers if signed else None}, signed


def _check_proof(secret: str | None, signed: auth.SignedRequest | None, response: Any) -> None:
    """A direct connection to a controller: believe nothing until it proved the per-boot secret."""
    headers = response.headers if response is not None else {}
    if secret and signed is not None and not auth.proven(secret, signed.nonce, headers):
        raise UnprovenController("the sandbox's controller port answered without the controller's proof")


def image_bytes(reply: dict[str, Any]) -> bytes:
    """The decoded screenshot of a native reply."""
    return base64.b64decode(reply["screenshot"]["data"])


class AsyncSandboxClient:
    """One WebSocket to a sandbox; requests are answered in order.

    ``controller_secret``: for a connection straight to a sandbox's controller (tests, the bench); a
    session through the gateway carries its token in ``ws_url`` instead.
    """

    def __init__(self, ws_url: str, *, controller_secret: str | None = None) -> None:
        self._url = ws_url
        self._secret = controller_secret
        self._ws: ClientConnection | None = None
        self._ids = itertools.count(1)
        # One request at a time on the socket; a cancelled one leaves a late reply that request() skips.
        self._lock = asyncio.Lock()

    async def __aenter__(self) -> Self:
        options, signed = _dial(self._secret)
        self._ws = await connect(self._url, **options)
        try:
            _check_proof(self._secret, signed, self._ws.response)
        except UnprovenController:
            with contextlib.suppress(ConnectionClosed, OSError):  # what answered need not close cleanly
                await self._ws.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._ws is not None:
            await self._ws.close()

    async def send_raw(self, message: str | bytes) -> dict[str, Any]:
        """Send one frame as is and return the next reply (for malformed-input tests)."""
        assert self._ws is not None, "use `async with`"
        async with self._lock:
            await self._ws.send(message)
            reply: dict[str, Any] = json.loads(await self._ws.recv())
        return reply

    async def request(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Send one message and return its reply, skipping replies to requests given up on earlier."""
        assert self._ws is not None, "use `async with`"
        request_id = next(self._ids)
        async with self._lock:
            await self._ws.send(json.dumps({**payload, "id": request_id}))
            while True:
                reply: dict[str, Any] = json.loads(await self._ws.recv())
                if reply.get("id") == request_id:
                    return reply

    async def act(self, action: dict[str, Any], **envelope: Any) -> dict[str, Any]:
        """A native action; raises :class:`ActionFailed` on an error reply."""
        return check_reply(await self.request({"action": action, **envelope}))

    async def screenshot(self, fmt: str = "png", **options: Any) -> bytes:
        return image_bytes(await self.act({"type": "screenshot", "format": fmt, **options}))


class SandboxClient:
    """The blocking twin of :class:`AsyncSandboxClient`."""

    def __init__(self, ws_url: str, *, controller_secret: str | None = None) -> None:
        self._url = ws_url
        self._secret = controller_secret
        self._ws: SyncConnection | None = None
        self._stack = contextlib.ExitStack()
        self._ids = itertools.count(1)

    def __enter__(self) -> Self:
        options, signed = _dial(self._secret)
        self._ws = self._stack.enter_context(sync_connect(self._url, **options))
        try:
            _check_proof(self._secret, signed, self._ws.response)
        except UnprovenController:
            with contextlib.suppress(ConnectionClosed, OSError):  # what answered need not close cleanly
                self._stack.close()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stack.close()

    def send_raw(self, message: str | bytes) -> dict[str, Any]:
        assert self._ws is not None, "use `with`"
        self._ws.send(message)
        reply: dict[str, Any] = json.loads(self._ws.recv())
        return reply

    def request(self, payload: dict[str, Any]) -> dict[str, Any]:
        assert self._ws is not None, "use `with`"
        request_id = next(self._ids)
        self._ws.send(json.dumps({**payload, "id": request_id}))
        while True:
            reply: dict[str, Any] = json.loads(self._ws.recv())
            if reply.get("id") == request_id:
                return reply

    def act(self, action: dict[str, Any], **envelope: Any) -> dict[str, Any]:
        return check_reply(self.request({"action": action, **envelope}))

    def screenshot(self, fmt: str = "png", **options: Any) -> bytes:
        return image_bytes(self.act({"type": "screenshot", "format": fmt, **options}))
