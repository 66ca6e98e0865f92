"""``WS /v1/tunnel/{port}``: a port preview's bytes (docs/previews.md), the controller's side.

The gateway opens one tunnel per client connection; the controller connects, as itself, to
``127.0.0.1:{port}`` (``::1`` when nothing listens on IPv4) inside the sandbox and carries raw bytes
both ways as binary frames of at most :data:`TUNNEL_CHUNK_BYTES` (256 KiB). Backpressure both ways: a frame
is read from the gateway only once the last one is written to the server (uvicorn reads the socket
again only when a frame was taken), and the server is read again only once the frame went out.
Nothing listening: the WebSocket closes with 4502 and ``connection refused on port N``; a reserved
port (the controller's, DevTools', the in-sandbox preview listener's) is never connected to (4403),
nor a port whose listener is not the agent's uid alone (4403: the controller connects as itself,
which the sandbox's firewall does not fence, so it must never lend its uid to reach a server of
root's, the browser's or its own: the same rule as the in-sandbox door, corral.sandbox.previewdoor).
Either side's end ends the tunnel (HTTP has no use for half a connection here).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from starlette.websockets import WebSocket, WebSocketDisconnect

from corral.contracts.previews import (
    CLOSE_BAD_PORT,
    CLOSE_NOTHING_LISTENS,
    CLOSE_RESERVED_PORT,
    RESERVED_PORTS,
    TUNNEL_CHUNK_BYTES,
    port_problem,
)
from corral.sandbox.previewdoor import listener_problem, listening
from corral.streams import closed

log = logging.getLogger(__name__)

Listeners = Callable[[int], set[int]]

CONNECT_TIMEOUT_S = 5.0
LOOPBACKS = ("127.0.0.1", "::1")


async def open_local(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to ``port`` on the sandbox's loopback, IPv4 first, then IPv6's; the first
    failure otherwise (ConnectionRefusedError when nothing listens on IPv4 and none is made on
    IPv6, whatever IPv6 said: a sandbox may have no ::1 at all)."""
    failures: list[OSError] = []
    for host in LOOPBACKS:
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                return await asyncio.open_connection(host, port, limit=TUNNEL_CHUNK_BYTES)
        except TimeoutError:
            failures.append(OSError(f"port {port} did not accept a connection within {CONNECT_TIMEOUT_S:g} s"))
        except OSError as exc:
            failures.append(exc)
    raise failures[0]


def refusal(port: int, exc: OSError) -> str:
    """The close reason for a connection that could not be made (at most 123 bytes, as a close allows)."""
    if isinstance(exc, ConnectionRefusedError):
        return f"connection refused on port {port}"
    return f"no connection to port {port}: {exc.strerror or exc}"[:120]


async def serve(websocket: WebSocket, port_text: str, agent_uid: int, listeners: Listeners = listening) -> None:
    """One tunnel to ``port_text`` for the agent's server there (``listeners(port)``: the uids that
    listen on it, :func:`corral.sandbox.previewdoor.listening`)."""
    await websocket.accept()
    port = int(port_text) if port_text.isdigit() and len(port_text) <= 5 else 0
    problem = port_problem(port)
    if problem is not None:
        code = CLOSE_RESERVED_PORT if port in RESERVED_PORTS else CLOSE_BAD_PORT
        await websocket.close(code=code, reason=problem[:120])
        return
    foreign = listener_problem(port, await asyncio.to_thread(listeners, port), agent_uid)
    if foreign is not None and foreign.status != 502:  # nothing listening: the connect below says so
        await websocket.close(code=CLOSE_RESERVED_PORT, reason=foreign.reason[:120])
        return
    try:
        reader, writer = await open_local(port)
    except OSError as exc:
        await websocket.close(code=CLOSE_NOTHING_LISTENS, reason=refusal(port, exc))
        return
    try:
        await _pump(websocket, reader, writer)
    finally:
        await closed(writer)  # bounded: the agent's server may have stopped reading


async def _to_server(websocket: WebSocket, writer: asyncio.StreamWriter) -> None:
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            return
        data = message.get("bytes") or (message.get("text") or "").encode()
        writer.write(data)
        await writer.drain()


async def _to_gateway(reader: asyncio.StreamReader, websocket: WebSocket) -> None:
    while data := await reader.read(TUNNEL_CHUNK_BYTES):
        await websocket.send_bytes(data)


async def _pump(websocket: WebSocket, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    tasks = {
        asyncio.create_task(_to_server(websocket, writer)),
        asyncio.create_task(_to_gateway(reader, websocket)),
    }
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    failed = [t.exception() for t in done if not t.cancelled() and t.exception() is not None]
    for exc in failed:
        if not isinstance(exc, OSError | WebSocketDisconnect | RuntimeError):
            log.error("tunnel to a preview's port failed", exc_info=exc)
    with contextlib.suppress(RuntimeError, WebSocketDisconnect, OSError):
        await websocket.close(code=1000)
