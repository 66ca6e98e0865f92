"""WebSockets relayed unchanged to the session's sandbox: the agent's (``/ws``) and the live view's
(``/live``, after its auth step), over one :func:`bridge`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import WebSocket, WebSocketDisconnect
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from corral.contracts.limits import MAX_FRAME_BYTES
from corral.errors import ErrorCode, UnprovenController
from corral.frames import next_frame, over_limit
from corral.gateway.controller import connect_ws
from corral.gateway.metrics import Metrics
from corral.gateway.sessions.records import Session
from corral.protocol import reply

# When each request in flight was sent, by its id's key (an agent may reuse an id: oldest first).
InFlight = dict[str, deque[float]]

CLOSE_ENDED = 4000  # the session ended (deleted, timed out); the reason says which
CLOSE_UNREACHABLE = 1011
CLOSE_WAIT_S = 1.0  # how long either side's close may take when a relay ends
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
    except (ValueError, RecursionError):  # nested past the parser's recursion: the sandbox says invalid_json
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
    except (ValueError, RecursionError):
        return "null"


async def _open_upstream(client: WebSocket, session: Session, metrics: Metrics, url: str) -> ClientConnection | None:
    """The controller's WebSocket at ``url``, or None once the client was told why there is none."""
    try:
        return await connect_ws(url, session.sandbox.secret)
    except (OSError, TimeoutError, InvalidHandshake) as exc:
        code, reason = ErrorCode.SANDBOX_UNREACHABLE, f"the sandbox did not answer: {type(exc).__name__}"
    except UnprovenController:
        code, reason = ErrorCode.CONTROLLER_UNPROVEN, "the sandbox's controller could not prove itself"
    metrics.errors.labels(code=code).inc()
    await client.close(code=CLOSE_UNREACHABLE, reason=reason)
    return None


Seen = Callable[[str | bytes], None]  # a frame as it passes, before it is sent on


def _unseen(frame: str | bytes) -> None:
    return None


@dataclass(frozen=True, slots=True)
class Stop:
    """Besides either side closing, what ends a relay (once what ``until`` starts finishes; started
    only once the relay runs) and the close the client then gets: a revoked or expired viewer link
    (4003), the session's end (4000)."""

    until: Callable[[], Awaitable[object]]
    code: int
    reason: Callable[[], str]
    code_now: Callable[[], int] | None = None  # the code as it is when the close is sent (a pause's 4009)


async def _client_to_upstream(client: WebSocket, upstream: ClientConnection, seen: Seen) -> None:
    while (frame := await next_frame(client)) is not None:
        if over_limit(frame, MAX_FRAME_BYTES):
            # uvicorn takes CDP's larger frames (corral.contracts.cdprules); this channel keeps its limit.
            await client.close(code=1009, reason=f"a frame is at most {MAX_FRAME_BYTES} bytes")
            return
        seen(frame)
        await upstream.send(frame)


async def _upstream_to_client(upstream: ClientConnection, client: WebSocket, seen: Seen) -> None:
    async for frame in upstream:
        seen(frame)
        if isinstance(frame, str):
            await client.send_text(frame)
        else:
            await client.send_bytes(frame)


def _round_trip_ended(sent: InFlight, key: str, metrics: Metrics) -> bool:
    """The round trip of the request ``key`` answered now (replies come in any order: a ``process_kill``
    is answered while the ``exec`` it ends still runs); a reply to nothing in flight is not measured
    (False)."""
    times = sent.get(key)
    if not times:
        return False
    metrics.action.labels(transport="ws").observe(time.perf_counter() - times.popleft())
    if not times:
        del sent[key]
    return True


async def relay(
    client: WebSocket,
    session: Session,
    metrics: Metrics,
    upstream_lost: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """The agent's WebSocket and the sandbox's, with the round trips and errors measured.

    ``upstream_lost`` is awaited when the sandbox's side closes first: it ends the session if
    the sandbox died, so the client learns why (4000 and the reason) rather than a bare close."""
    # When each request in flight was sent, by its id: for the round-trip metric, and each one counts
    # in the session's ``in_flight`` until answered (a long ``request_control`` wait is no idleness).
    sent: InFlight = {}

    def request_sent(frame: str | bytes) -> None:
        session.touch()
        sent.setdefault(request_key(frame), deque()).append(time.perf_counter())
        session.in_flight += 1

    def answer_came(frame: str | bytes) -> None:
        if sent and is_reply(frame) and _round_trip_ended(sent, reply_key(frame), metrics):
            session.in_flight -= 1  # events pass unchanged and end no round trip
        code = reply.error_code(frame)  # a check of the first bytes; only a failure is parsed
        if code is not None:
            metrics.errors.labels(code=code).inc()
        session.touch()

    try:
        await bridge(
            client,
            session,
            metrics,
            session.sandbox.ws_url,
            to_upstream=request_sent,
            to_client=answer_came,
            upstream_lost=upstream_lost,
        )
    finally:  # the requests never answered are no longer under way
        session.in_flight -= sum(len(times) for times in sent.values())


async def bridge(
    client: WebSocket,
    session: Session,
    metrics: Metrics,
    url: str,
    *,
    stops: Sequence[Stop] = (),
    to_upstream: Seen = _unseen,
    to_client: Seen = _unseen,
    upstream_lost: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """``client`` and the controller's WebSocket at ``url``, every frame passed on unchanged (text
    as text, binary as binary), until either side closes, the session ends (4000 and why) or one of
    ``stops`` finishes (its code and reason). ``to_upstream``/``to_client`` see each frame first."""
    upstream = await _open_upstream(client, session, metrics, url)
    if upstream is None:
        return
    from_sandbox = asyncio.create_task(_upstream_to_client(upstream, client, to_client))
    ended = Stop(session.ended.wait, CLOSE_ENDED, session.close_reason, session.close_code)
    stopping = {asyncio.ensure_future(stop.until()): stop for stop in (ended, *stops)}
    tasks = {asyncio.create_task(_client_to_upstream(client, upstream, to_upstream)), from_sandbox, *stopping}
    sandbox_closed = False
    stopped: Stop | None = None
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        sandbox_closed = from_sandbox in done
        stopped = ended if session.ended.is_set() else next((stopping[t] for t in done if t in stopping), None)
        raise_unexpected(done)
    finally:
        await cancel_all(tasks)
        if sandbox_closed:
            await _close_upstream(upstream)
            if upstream_lost is not None and not session.ended.is_set():
                await upstream_lost()
                stopped = ended if session.ended.is_set() else stopped
            await _close(client, stopped)
        else:
            # Both at once, each bounded: a client that stopped reading cannot keep the controller's
            # side (and a lease its stream holds) open while its close waits to be written.
            await asyncio.gather(_close(client, stopped), _close_upstream(upstream))


def raise_unexpected(done: Iterable[asyncio.Task[Any]]) -> None:
    """The failure of a relay's task that ended raised again, unless it is a side going away
    (the relay then just closes)."""
    for task in done:
        failure = None if task.cancelled() else task.exception()
        if failure is not None and not isinstance(failure, WebSocketDisconnect | ConnectionClosed):
            raise failure


async def cancel_all(tasks: Collection[asyncio.Task[Any]]) -> None:
    """A relay's ``tasks`` cancelled and awaited, so that none outlives it."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _close(client: WebSocket, stopped: Stop | None) -> None:
    """The client's close, given :data:`CLOSE_WAIT_S`: uvicorn writes it only once the socket drains,
    so for a client that stopped reading it is dropped and uvicorn closes the connection as the
    handler returns (an ASGI app has no hold of the transport to abort it itself)."""
    with contextlib.suppress(RuntimeError, WebSocketDisconnect, TimeoutError):
        if stopped is not None:
            code = stopped.code_now() if stopped.code_now is not None else stopped.code
            async with asyncio.timeout(CLOSE_WAIT_S):
                await client.close(code=code, reason=stopped.reason())
        else:
            async with asyncio.timeout(CLOSE_WAIT_S):
                await client.close()


async def _close_upstream(upstream: ClientConnection) -> None:
    """The controller's side closed within :data:`CLOSE_WAIT_S`, else its transport aborted."""
    try:
        async with asyncio.timeout(CLOSE_WAIT_S):
            await upstream.close()
    except TimeoutError:
        upstream.transport.abort()
