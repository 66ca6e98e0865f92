"""Raw CDP over a WebSocket client, through the gateway: a session's browser socket, one command's
answer, and how a socket was closed. For what Playwright never sends (the CDP and red-team tests)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from corral.sdk import Sandbox

from .gateway_fixtures import RunningGateway


def bearer(sb: Sandbox) -> dict[str, str]:
    """The session's token as the header a CDP client sends."""
    return {"Authorization": f"Bearer {sb.info.token}"}


def cdp_socket(gw: RunningGateway, sb: Sandbox, path: str = "", **headers: str) -> ClientConnection:
    """The session's CDP browser socket (``path``: a ``/page/<id>`` or a ``?query`` after it)."""
    url = f"{gw.ws}/v1/sessions/{sb.id}/cdp{path}"
    return connect(url, additional_headers={**bearer(sb), **headers}, max_size=None, open_timeout=20)


def cdp_answer(ws: ClientConnection, id: Any, timeout_s: float = 20) -> dict[str, Any]:
    """The answer to the command ``id`` (events and other answers before it are skipped)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        message = json.loads(ws.recv(timeout=timeout_s))
        if message.get("id") == id:
            return dict(message)
    raise AssertionError(f"no answer to {id}")


def cdp_call(
    ws: ClientConnection, id: int, method: str, params: dict[str, Any] | None = None, **more: Any
) -> dict[str, Any]:
    """One CDP command (``more``: its other keys, a ``sessionId``) and its answer."""
    ws.send(json.dumps({"id": id, "method": method, "params": params or {}, **more}))
    return cdp_answer(ws, id)


def closed_with(ws: ClientConnection, timeout_s: float = 10, *, after_messages: bool = False) -> int:
    """The code ``ws`` is closed with: the next thing it receives is the close, or, ``after_messages``,
    what comes before the close is read and passed over."""
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(timeout=timeout_s)
        while after_messages:
            ws.recv(timeout=timeout_s)
    assert closed.value.rcvd is not None
    return closed.value.rcvd.code
