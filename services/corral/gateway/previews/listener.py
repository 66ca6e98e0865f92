"""The preview listener (``CORRAL_PREVIEW_PORT``, default 8701): a server of its own beside the API's,
on its own port, serving nothing but previews (docs/previews.md, docs/design/0365-previews-on-their-own-origin.md).

Each client connection is read with h11: every request is matched to the preview its ``Host`` names
and admitted by that preview's secret (corral.gateway.previews.access), stripped of the secret
(corral.gateway.previews.wire) and forwarded through one tunnel to the agent's server (kept across
requests while both ends keep the connection alive), the answer streamed back as it comes. A
WebSocket upgrade the server accepts (101) turns the connection into a byte pipe both ways. A
connection is bound to the first preview it was admitted to (another host on it: 422 invalid_request), counted
against that preview's cap, and closed at once when the preview is revoked, expires or its
session ends or pauses, or when no byte moved either way for ``CORRAL_PREVIEW_IDLE_TIMEOUT_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import h11

from corral.errors import (
    CodedError,
    HeadersTooLarge,
    InvalidRequest,
    MessageTooLarge,
    PreviewBusy,
    PreviewUnreachable,
)
from corral.gateway.previews import wire
from corral.gateway.previews.access import Admitted, admit, check_initiator, find_host, live_session
from corral.gateway.previews.book import EXPIRED, PreviewConnection
from corral.gateway.previews.sides import ClientSide, UpstreamSide
from corral.gateway.previews.tunnel import Tunnel
from corral.gateway.routes.errors import answer_for, public_error
from corral.gateway.sessions import SessionManager
from corral.gateway.settings import GatewaySettings
from corral.streams import closed

log = logging.getLogger(__name__)

SWITCHING = 101
# A connection not admitted to a preview yet has this long from its first byte to send a whole
# request: a trickle of bytes keeps no connection open that no secret opened (the idle timeout
# restarts with every byte).
UNADMITTED_S = 30.0
# Connections the listener holds at once, all previews together (admitted or not): past it a new one
# is closed at once, so a flood of idle sockets costs the gateway a bounded number of tasks.
MAX_OPEN = 4096
# What of h11's own words an error repeats: h11 quotes the offending line whole (a 60 KB header of
# control bytes is 240 KB as its repr), and the agent's server, or a client, chooses that line.
MAX_QUOTED = 200


def _quoted(exc: h11.ProtocolError) -> str:
    text = str(exc)
    return text if len(text) <= MAX_QUOTED else text[:MAX_QUOTED] + f"... ({len(text)} characters)"


class Handler:
    """One client connection, from its first byte to its close."""

    def __init__(
        self,
        settings: GatewaySettings,
        manager: SessionManager,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self._settings, self._manager, self._writer = settings, manager, writer
        peer = writer.get_extra_info("peername")
        self._ip = str(peer[0]) if isinstance(peer, tuple) else "unknown"
        remote = f"[{self._ip}]:{peer[1]}" if ":" in self._ip else f"{self._ip}:{peer[1]}" if peer else "unknown"
        self.conn = PreviewConnection(remote)
        self._client = ClientSide(reader, writer, settings.preview_max_header_kb << 10, self.conn)
        self._upstream: UpstreamSide | None = None
        self._bound: Admitted | None = None
        self._stop = asyncio.Event()
        self._started = time.monotonic()
        self._tasks: set[asyncio.Task[Any]] = set()

    async def run(self) -> None:
        serve = self._task(self._serve())
        stop = self._task(self._stop.wait())
        idle = self._task(self._idle())
        try:
            await asyncio.wait({serve, stop, idle}, return_when=asyncio.FIRST_COMPLETED)
            if serve.done() and not serve.cancelled() and serve.exception() is not None:
                exc = serve.exception()
                if not isinstance(exc, ConnectionError | CodedError | h11.ProtocolError):
                    log.error("a preview connection failed", exc_info=exc)
        finally:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            # The client's end first: a revoke is seen at once, whatever the controller's close takes.
            self._writer.close()
            self._manager.previews.closed(self.conn)
            await closed(self._writer)  # bounded: a client that stopped reading holds no close
            if self._upstream is not None:
                await self._upstream.tunnel.close()

    def _task(self, coro: Any) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.create_task(coro)
        self._tasks.add(task)
        return task

    async def _idle(self) -> None:
        timeout = self._settings.preview_idle_timeout_s
        while True:  # a deadline that moves with every byte: re-armed, not an Event's wait
            if self._bound is None:
                left = self._started + UNADMITTED_S - time.monotonic()
            else:
                left = self.conn.last + timeout - time.monotonic()
            if left <= 0:
                return
            await asyncio.sleep(min(left, timeout))  # an admission meanwhile changes the deadline

    async def _watch(self, admitted: Admitted) -> None:
        """Until the preview is revoked (``closing``), expires, or its session ends or pauses."""
        session, book = admitted.session, self._manager.previews
        expiry = asyncio.sleep(max(admitted.preview.expires_at - book.now(), 0))
        waits = {self._task(self.conn.closing.wait()), self._task(session.ended.wait()), self._task(expiry)}
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        if not self.conn.closing.is_set() and not session.ended.is_set():
            book.expired(session.id, admitted.preview.id)
            self.conn.reason = EXPIRED
        self._stop.set()

    # -- HTTP -----------------------------------------------------------------------------------------

    async def _serve(self) -> None:
        while True:
            try:
                event = await self._client.event()
            except h11.RemoteProtocolError as exc:
                await self._protocol_error(exc)
                return
            if not isinstance(event, h11.Request):
                return  # the client closed (ConnectionClosed), or sent nothing more
            try:
                keep = await self._request(event)
            except CodedError as exc:
                await self._refuse(exc, list(event.headers))
                return
            if not keep or not self._next_cycle():
                return

    def _next_cycle(self) -> bool:
        h = self._client.h11
        if h.our_state is h11.DONE and h.their_state is h11.DONE:
            h.start_next_cycle()
            return True
        return False

    async def _request(self, request: h11.Request) -> bool:
        headers = list(request.headers)
        # h11 caps a head that arrives in pieces; one that came whole in a read is measured here.
        head = len(request.method) + len(request.target) + sum(len(k) + len(v) + 4 for k, v in headers)
        if head > self._settings.preview_max_header_kb << 10:
            raise HeadersTooLarge(
                f"the request's head exceeds {self._settings.preview_max_header_kb} KiB (CORRAL_PREVIEW_MAX_HEADER_KB)"
            )
        if request.method == b"CONNECT":
            raise InvalidRequest("CONNECT is no request for a preview")
        presented = wire.presented(request.target, headers)
        admitted = self._admit(wire.header(headers, b"host"), presented)
        check_initiator(admitted, request.method, headers, self._settings.preview_domain)
        admitted.session.touch()
        if admitted.via == "query" and request.method in (b"GET", b"HEAD"):
            await self._first_visit(admitted, presented.target)
            return False
        self._bind(admitted)
        length = wire.header(headers, b"content-length")
        max_body = self._settings.preview_max_body_mb << 20
        if length is not None and length.strip().isdigit() and int(length) > max_body:
            raise MessageTooLarge(f"the body exceeds {max_body} bytes (CORRAL_PREVIEW_MAX_BODY_MB)")
        if self._client.h11.client_is_waiting_for_100_continue:
            await self._client.send(h11.InformationalResponse(status_code=100, headers=[]))
        upstream = await self._upstream_for(admitted)
        forwarded = wire.request_headers(headers, presented.other_cookies, self._ip)
        await upstream.send(h11.Request(method=request.method, target=presented.target, headers=forwarded))
        await self._body(upstream, max_body)
        response = await self._response_head(upstream)
        if response.status_code == SWITCHING:
            await self._switch(upstream, response)
            return False
        await self._client.send(
            h11.Response(
                status_code=response.status_code,
                headers=wire.response_headers(response.headers),
                reason=response.reason,
            )
        )
        while not isinstance(event := await upstream.event(), h11.EndOfMessage):
            if isinstance(event, h11.Data):
                await self._client.send(h11.Data(data=event.data))
            else:
                raise PreviewUnreachable(f"the server on port {admitted.preview.port} ended its answer early")
        await self._client.send(h11.EndOfMessage())
        if not upstream.reusable():
            await upstream.tunnel.close()
            self._upstream = None
        return True

    def _admit(self, host: bytes | None, presented: wire.Presented) -> Admitted:
        found = find_host(host, self._settings.preview_domain)
        if self._bound is not None and (found.port, found.session_id) != (
            self._bound.preview.port,
            self._bound.session.id,
        ):
            raise InvalidRequest("this connection serves another preview: open a new one for this host")
        session = live_session(self._manager, found)
        return admit(presented, session, found.port, self._manager.previews)

    def _bind(self, admitted: Admitted) -> None:
        """The connection is the preview's from its first admitted request: counted, revocable."""
        if self._bound is not None:
            return
        book = self._manager.previews
        if book.open_connections(admitted.preview.id) >= self._settings.preview_max_connections:
            cap = self._settings.preview_max_connections
            raise PreviewBusy(
                f"preview {admitted.preview.id} has {cap} connections open (CORRAL_PREVIEW_MAX_CONNECTIONS)"
            )
        self._bound = admitted
        book.opened(self.conn, admitted.session.id, admitted.preview.id)
        self._task(self._watch(admitted))

    async def _upstream_for(self, admitted: Admitted) -> UpstreamSide:
        if self._upstream is not None and not self._upstream.tunnel.is_open:
            await self._upstream.tunnel.close()
            self._upstream = None
        if self._upstream is None:
            tunnel = await Tunnel.open(admitted.session.sandbox, admitted.preview.port)
            self._upstream = UpstreamSide(tunnel, self.conn)
        return self._upstream

    async def _body(self, upstream: UpstreamSide, max_body: int) -> None:
        sent = 0
        while True:
            event = await self._client.event()
            if isinstance(event, h11.Data):
                sent += len(event.data)
                if sent > max_body:
                    raise MessageTooLarge(f"the body exceeds {max_body} bytes (CORRAL_PREVIEW_MAX_BODY_MB)")
                try:
                    await upstream.send(h11.Data(data=event.data))
                except PreviewUnreachable:
                    return  # the server stopped reading (an early answer?): its answer, if any, is the client's
            elif isinstance(event, h11.EndOfMessage):
                await upstream.send(h11.EndOfMessage())
                return
            else:
                raise InvalidRequest("the request ended before its body")

    async def _response_head(self, upstream: UpstreamSide) -> h11.Response | h11.InformationalResponse:
        """The server's answer's head (1xx but 101 passed over); PreviewUnreachable for no HTTP."""
        while True:
            try:
                event = await upstream.event()
            except h11.RemoteProtocolError as exc:
                raise PreviewUnreachable(
                    f"the server on port {upstream.tunnel.port} answered no HTTP/1.1: {_quoted(exc)}"
                ) from None
            if isinstance(event, h11.Response):
                return event
            if isinstance(event, h11.InformationalResponse) and event.status_code == SWITCHING:
                return event
            if isinstance(event, h11.ConnectionClosed):
                raise PreviewUnreachable(f"the server on port {upstream.tunnel.port} closed without an answer")

    async def _switch(self, upstream: UpstreamSide, response: h11.InformationalResponse | h11.Response) -> None:
        """A 101 the server gave: passed on, then bytes both ways until either side ends."""
        switched = h11.InformationalResponse(
            status_code=SWITCHING,
            headers=wire.response_headers(response.headers, switching=True),
            reason=response.reason,
        )
        await self._client.send(switched)
        from_client, _ = self._client.h11.trailing_data
        from_server, _ = upstream.h11.trailing_data
        tunnel = upstream.tunnel
        if from_server:
            await self._client.write_raw(from_server)
        if from_client:
            await tunnel.write(from_client)

        async def client_to_server() -> None:
            while data := await self._client.read_raw():
                await tunnel.write(data)

        async def server_to_client() -> None:
            while data := await tunnel.read():
                await self._client.write_raw(data)
                self.conn.moved()

        pipes = {self._task(client_to_server()), self._task(server_to_client())}
        await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)

    # -- answers of the listener's own ------------------------------------------------------------------

    async def _first_visit(self, admitted: Admitted, target: bytes) -> None:
        """303 to the same address without the token, the secret in the preview's cookie."""
        max_age = int(admitted.preview.expires_at - self._manager.previews.now())
        cookie = wire.set_cookie(admitted.preview.id, admitted.secret, max_age)
        await self._client.write_raw(wire.redirect(wire.same_host(target), cookie))

    async def _refuse(self, exc: CodedError, headers: list[tuple[bytes, bytes]]) -> None:
        if self._client.answering:
            return  # the answer has begun: the connection's end is all the client can be told
        error = public_error(exc)
        status = answer_for(exc).status
        if status >= 500:
            log.info("preview %s: %s", self.conn.preview_id or "(none)", error["message"])
        with contextlib.suppress(ConnectionError):
            await self._client.write_raw(
                wire.error_answer(status, error["code"], error["message"], wire.wants_html(headers))
            )

    async def _protocol_error(self, exc: h11.RemoteProtocolError) -> None:
        if exc.error_status_hint == 431:
            cap = self._settings.preview_max_header_kb
            await self._refuse(
                HeadersTooLarge(f"the request's head exceeds {cap} KiB (CORRAL_PREVIEW_MAX_HEADER_KB)"), []
            )
        else:
            await self._refuse(InvalidRequest(f"not an HTTP/1.1 request: {_quoted(exc)}"), [])


class PreviewListener:
    """The listener's socket and its connections' handlers (kept, closed at the gateway's stop)."""

    def __init__(self, settings: GatewaySettings, manager: Callable[[], SessionManager]) -> None:
        self._settings = settings
        self._manager = manager
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[Any]] = set()

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        """Bound now: OSError (the port taken) stops the gateway's start."""
        self._server = await asyncio.start_server(self._accept, self._settings.host, self._settings.preview_port)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self._handlers) >= MAX_OPEN:
            writer.close()
            return
        self._handlers.add(task)
        try:
            await Handler(self._settings, self._manager(), reader, writer).run()
        finally:
            self._handlers.discard(task)

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()
