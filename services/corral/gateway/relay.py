"""The agent WebSocket, relayed unchanged to the session's sandbox."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections import deque
from collections.abc import Awaitable, Callable

from fastapi import WebSocket, WebSocketDisconnect
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from corral.errors import ErrorCode, UnprovenController
from corral.gateway.controller import connect_ws
from corral.gateway.metrics import Metrics
from corral.gateway.sessions import Session
from corral.protocol import reply
from corral.protocol.envelope import MAX_FRAME_BYTES

# When each request in flight was sent, by its id's key (an agent may reuse an id: oldest first).
InFlight = dict[str, deque[float]]

CLOSE_ENDED = 4000  # the session ended (deleted, timed out); the reason says which
CLOSE_UNREACHABLE = 1011
# A reply's first key is always ``ok`` (corral.protocol.reply.encode); an event (``{"id", "event":
# "output", ...}``, sent before its request's reply) never has one.
_REPLY_START = '{"ok":'
_REPLY_START_BYTES = _REPLY_START.encode()


def is_reply(frame: str | bytes) -> bool:
    """Whether a frame from the sandbox is a request's final reply, not an event before it."""
    return frame.startswith(_REPLY_START) if isinstance(frame, str) else frame.startswith(_REPLY_START_BYTES)


# A reply starts ``{"ok":true,"id":`` or ``{"ok":false,"id":`` (corral.protocol.reply builds it so).
_REPLY_ID = re.compile(r'\{"ok":(?:true|false),"id":')
_ID_PREFIX = 4096  # enough of a reply to hold its id; a reply can be megabytes of screenshot
_DECODER = json.JSONDecoder()


def request_key(message: str | bytes) -> str:
    """The id an agent's request carries, as a key (its JSON text: ``1`` and ``"1"`` differ); ``null``
    for a frame without one or that is no JSON (the sandbox answers those with ``"id": null``)."""
    try:
        request = json.loads(message)
    except ValueError:
        return "null"
    return json.dumps(request.get("id") if isinstance(request, dict) else None, sort_keys=True)


def reply_key(frame: str | bytes) -> str:
    """The id a reply answers, as :func:`request_key` writes it, read from the reply's first bytes."""
    head = frame[:_ID_PREFIX] if isinstance(frame, str) else frame[:_ID_PREFIX].decode("utf-8", "replace")
    found = _REPLY_ID.match(head)
    try:
        if found is not None:
            return json.dumps(_DECODER.raw_decode(head, found.end())[0], sort_keys=True)
        whole = json.loads(frame)  # not as the sandbox writes replies: read it whole
        return json.dumps(whole.get("id") if isinstance(whole, dict) else None, sort_keys=True)
    except ValueError:
        return "null"


async def _open_upstream(client: WebSocket, session: Session, metrics: Metrics) -> ClientConnection | None:
    """The sandbox's WebSocket, or None once the client was told why there is none."""
    try:
        return await connect_ws(session.sandbox.ws_url, session.sandbox.secret)
    except (OSError, TimeoutError, InvalidHandshake) as exc:
        code, reason = ErrorCode.SANDBOX_UNREACHABLE, f"the sandbox did not answer: {type(exc).__name__}"
    except UnprovenController:
        code, reason = ErrorCode.CONTROLLER_UNPROVEN, "the sandbox's controller could not prove itself"
    metrics.errors.labels(code=code).inc()
    await client.close(code=CLOSE_UNREACHABLE, reason=reason)
    return None


async def _agent_to_sandbox(client: WebSocket, upstream: ClientConnection, session: Session, sent: InFlight) -> None:
    while True:
        message = await client.receive()
        if message["type"] == "websocket.disconnect":
            return
        session.touch()
        text = message.get("text")
        frame = text if text is not None else (message.get("bytes") or b"")
        if _too_large(frame):
            # uvicorn takes CDP's larger frames (corral.sandbox.cdprules); this channel keeps its limit.
            await client.close(code=1009, reason=f"a frame is at most {MAX_FRAME_BYTES} bytes")
            return
        sent.setdefault(request_key(frame), deque()).append(time.perf_counter())
        await upstream.send(frame)


def _too_large(frame: str | bytes) -> bool:
    # A character is at most 4 bytes of UTF-8: only a text that may be over the limit is encoded.
    if isinstance(frame, str) and len(frame) * 4 > MAX_FRAME_BYTES:
        return len(frame.encode()) > MAX_FRAME_BYTES
    return len(frame) > MAX_FRAME_BYTES


def _round_trip_ended(sent: InFlight, key: str, metrics: Metrics) -> None:
    """The round trip of the request ``key`` answered now (replies come in any order: a ``process_kill``
    is answered while the ``exec`` it ends still runs); a reply to nothing in flight is not measured."""
    times = sent.get(key)
    if not times:
        return
    metrics.action.labels(transport="ws").observe(time.perf_counter() - times.popleft())
    if not times:
        del sent[key]


async def _sandbox_to_agent(
    upstream: ClientConnection, client: WebSocket, session: Session, metrics: Metrics, sent: InFlight
) -> None:
    async for frame in upstream:
        if sent and is_reply(frame):  # events pass unchanged and end no round trip
            _round_trip_ended(sent, reply_key(frame), metrics)
        code = reply.error_code(frame)  # a check of the first bytes; only a failure is parsed
        if code is not None:
            metrics.errors.labels(code=code).inc()
        session.touch()
        if isinstance(frame, str):
            await client.send_text(frame)
        else:
            await client.send_bytes(frame)


async def relay(
    client: WebSocket,
    session: Session,
    metrics: Metrics,
    upstream_lost: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """``upstream_lost`` is awaited when the sandbox's side closes first: it ends the session if
    the sandbox died, so the client learns why (4000 and the reason) rather than a bare close."""
    upstream = await _open_upstream(client, session, metrics)
    if upstream is None:
        return
    sent: InFlight = {}  # when each request in flight was sent, by its id, for the round-trip metric
    from_sandbox = asyncio.create_task(_sandbox_to_agent(upstream, client, session, metrics, sent))
    tasks = {
        asyncio.create_task(_agent_to_sandbox(client, upstream, session, sent)),
        from_sandbox,
        asyncio.create_task(session.ended.wait()),
    }
    sandbox_closed = False
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        sandbox_closed = from_sandbox in done
        for task in done:
            failure = None if task.cancelled() else task.exception()
            if failure is not None and not isinstance(failure, WebSocketDisconnect | ConnectionClosed):
                raise failure
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await upstream.close()
        if sandbox_closed and upstream_lost is not None and not session.ended.is_set():
            await upstream_lost()
        with contextlib.suppress(RuntimeError, WebSocketDisconnect):
            if session.ended.is_set():
                await client.close(code=CLOSE_ENDED, reason=session.close_reason())
            else:
                await client.close()
