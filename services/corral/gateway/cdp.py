"""CDP through the gateway (docs/cdp.md): Chromium's ``/json`` answers with the gateway's addresses
in them, and the relay of a client's DevTools WebSocket to the sandbox's controller (which checks
each command: corral.sandbox.web.cdp)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from fastapi import WebSocket, WebSocketDisconnect
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from corral.contracts.cdprules import CDP_MAX_COMMAND_BYTES
from corral.gateway.relay import cancel_all, raise_unexpected
from corral.gateway.sessions.records import Session

CLOSE_TOO_BIG = 1009  # RFC 6455: a message too big to process

# Chromium's links to its own DevTools front end: they name Chromium's address, not the gateway's.
_FRONTEND_KEYS = ("devtoolsFrontendUrl", "devtoolsFrontendUrlCompat")
# What the gateway answers for each ``/json`` path (Chromium's ``/json`` is its ``/json/list``).
JSON_PATHS: dict[str, str] = {"version": "version", "version/": "version", "list": "list", "list/": "list"}


def ws_base(scheme: str, host: str, session_id: str, ticket: str | None = None) -> str:
    """The gateway's address of a session's CDP browser socket, as the client reached the gateway
    (``scheme`` and ``host`` of its request; https means wss)."""
    ws_scheme = "wss" if scheme in ("https", "wss") else "ws"
    path = f"/v1/sessions/{session_id}/cdp" + (f"/t/{ticket}" if ticket else "")
    return f"{ws_scheme}://{host}{path}"


def _rewritten(entry: dict[str, Any], base: str, browser: bool) -> dict[str, Any]:
    out = {k: v for k, v in entry.items() if k not in _FRONTEND_KEYS}
    if "webSocketDebuggerUrl" in out:
        target = out.get("id")
        out["webSocketDebuggerUrl"] = base if browser or not isinstance(target, str) else f"{base}/page/{target}"
    return out


def rewrite(answer: Any, base: str) -> Any:
    """Chromium's ``/json/version`` (an object: the browser's socket) or ``/json/list`` (a list of
    targets: pages' sockets) with every address the gateway's (``base``: :func:`ws_base`) and the
    DevTools front-end links removed."""
    if isinstance(answer, dict):
        return _rewritten(answer, base, browser=True)
    if isinstance(answer, list):
        return [_rewritten(e, base, browser=False) if isinstance(e, dict) else e for e in answer]
    return answer


async def _client_to_sandbox(client: WebSocket, upstream: ClientConnection, session: Session) -> bool:
    """Relays the client's frames until it goes (False) or sends one over the cap (True: the relay
    closes with 1009; the controller would refuse it too, so it is not sent on)."""
    while True:
        message = await client.receive()
        if message["type"] == "websocket.disconnect":
            return False
        session.touch()
        frame: str | bytes = message.get("text") or message.get("bytes") or b""
        if len(frame) > CDP_MAX_COMMAND_BYTES:
            return True
        await upstream.send(frame)


def _passed_on(code: int | None) -> int:
    """The controller's close code as the client's (1009 for a command too big), where one may be sent."""
    sendable = code is not None and (1000 <= code <= 1003 or 1007 <= code <= 1014 or 3000 <= code <= 4999)
    return code if sendable and code is not None else 1000


async def _sandbox_to_client(upstream: ClientConnection, client: WebSocket, session: Session) -> None:
    async for frame in upstream:
        session.touch()
        if isinstance(frame, str):
            await client.send_text(frame)
        else:
            await client.send_bytes(frame)


def _returned_true(task: asyncio.Task[bool]) -> bool:
    """Whether ``task`` (done) returned True rather than False, a failure or a cancel."""
    return not task.cancelled() and task.exception() is None and task.result()


async def relay(client: WebSocket, upstream: ClientConnection, session: Session) -> None:
    """Both ways unchanged until either side closes or the session ends (then 4000 and the reason)."""
    from_client = asyncio.create_task(_client_to_sandbox(client, upstream, session))
    tasks: set[asyncio.Task[Any]] = {
        from_client,
        asyncio.create_task(_sandbox_to_client(upstream, client, session)),
        asyncio.create_task(session.ended.wait()),
    }
    too_big = False
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        too_big = from_client in done and _returned_true(from_client)
        raise_unexpected(done)
    finally:
        await cancel_all(tasks)
        with contextlib.suppress(ConnectionClosed, OSError):
            await upstream.close()
        with contextlib.suppress(RuntimeError, WebSocketDisconnect):
            if session.ended.is_set():
                await client.close(code=session.close_code(), reason=session.close_reason())
            elif too_big:
                await client.close(code=CLOSE_TOO_BIG, reason="a CDP command is at most 16 MiB")
            else:
                await client.close(code=_passed_on(upstream.close_code), reason=upstream.close_reason or "")


__all__ = ["JSON_PATHS", "relay", "rewrite", "ws_base"]
