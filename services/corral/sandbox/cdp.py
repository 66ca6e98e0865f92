"""The CDP relay: a framework's DevTools connection (through the gateway) to the sandbox's Chromium.

``WS /v1/cdp?conn=<id>&exclusive=0|1&target=<targetId>`` relays to Chromium's browser socket (the
one ``/json/version`` names, pinned to the DevTools address as the controller's own Playwright is)
or to a page's. Every client message is read and checked before it goes on
(corral.sandbox.cdprules): refused commands and lease-gated ones sent while another holds the lease
are answered here and never reach Chromium. Chromium's messages pass unchanged.

An exclusive connection holds the control lease while it is open (the agent's actions get
``control_taken``); it takes the lease at the upgrade, or the upgrade is refused with 409.

Attribution: the commands of one connection open an activity window, reported to the egress proxy
as one action ``c<n>.<conn>`` of actor ``cdp:<conn>``, that ends :data:`WINDOW_S` after the last
response (so a navigation's subresources are charged to it). The recording gets ``cdp`` events:
connected, disconnected, refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import secrets
import urllib.parse
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi import WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse
from starlette.datastructures import QueryParams
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from corral.errors import ActionError, ControlTaken, ErrorCode
from corral.sandbox import cdprules
from corral.sandbox.browser import pinned_endpoint
from corral.sandbox.egress import ActionReporter
from corral.sandbox.lease import AGENT, CDP_PREFIX, ControlLease
from corral.sandbox.recorder import Recorder

log = logging.getLogger(__name__)

WINDOW_S = 1.0  # an activity window ends this long after the connection's last response
JSON_PATHS = frozenset({"version", "list"})
_CONN_ID = re.compile(r"[A-Za-z0-9_]{1,32}")
_TARGET_ID = re.compile(r"[A-Za-z0-9-]{1,64}")
# Chromium writes a command's response starting with its id; its events start with "method".
_RESPONSE_START, _RESPONSE_START_BYTES = '{"id":', b'{"id":'


@dataclass(frozen=True, slots=True)
class CdpQuery:
    """What the gateway asked for on the upgrade (trusted: the controller's door checked its signature)."""

    conn: str
    exclusive: bool
    target: str | None

    @property
    def actor(self) -> str:
        return CDP_PREFIX + self.conn

    @classmethod
    def of(cls, query: QueryParams) -> CdpQuery:
        conn = query.get("conn") or "cdp_" + secrets.token_hex(4)
        if not _CONN_ID.fullmatch(conn):
            raise ActionError(ErrorCode.INVALID_FIELD, "conn is 1 to 32 letters, digits or _", "conn")
        exclusive = query.get("exclusive", "0")
        if exclusive not in ("0", "1"):
            raise ActionError(ErrorCode.INVALID_FIELD, "exclusive is 0 or 1", "exclusive")
        target = query.get("target") or None
        if target is not None and not _TARGET_ID.fullmatch(target):
            raise ActionError(ErrorCode.INVALID_FIELD, "target is a DevTools target id", "target")
        return cls(conn, exclusive == "1", target)


async def devtools_json(cdp_url: str, which: str) -> httpx.Response:
    """Chromium's ``/json/<which>`` answer, unchanged (the gateway rewrites its addresses)."""
    async with httpx.AsyncClient(timeout=5.0) as http:
        try:
            return await http.get(f"{cdp_url}/json/{which}")
        except httpx.HTTPError as exc:
            raise ActionError(ErrorCode.BROWSER_UNAVAILABLE, f"Chromium's DevTools did not answer: {exc!r}") from None


async def upstream_url(cdp_url: str, target: str | None) -> str:
    """The DevTools socket to relay to: the browser's (pinned to the DevTools address), or a page's."""
    if target is not None:
        address = urllib.parse.urlsplit(cdp_url)
        return f"ws://{address.hostname}:{address.port}/devtools/page/{target}"
    try:
        named = (await devtools_json(cdp_url, "version")).json().get("webSocketDebuggerUrl")
    except (ValueError, AttributeError):
        named = None
    endpoint = pinned_endpoint(cdp_url, named)
    if endpoint is None:
        raise ActionError(ErrorCode.BROWSER_UNAVAILABLE, "Chromium's DevTools named no browser endpoint of its own")
    return endpoint


class ActivityWindow:
    """One connection's open action for the egress audit: opened by a command, ended :data:`WINDOW_S`
    after the last response once no command is in flight."""

    def __init__(self, reporter: ActionReporter | None, conn: str, actor: str, quiet_s: float = WINDOW_S) -> None:
        self._reporter, self._conn, self._actor = reporter, conn, actor
        self._quiet_s = quiet_s
        self._count = 0
        self._open: str | None = None
        self._in_flight = 0
        self._last = 0.0
        self._closer: asyncio.Task[None] | None = None

    @property
    def action_id(self) -> str | None:
        return self._open

    async def command(self) -> None:
        """A command is about to go to Chromium: the proxy knows its action before any request."""
        self._in_flight += 1
        self._last = asyncio.get_running_loop().time()
        if self._open is not None or self._reporter is None:
            return
        self._count += 1
        self._open = f"c{self._count}.{self._conn}"
        await self._reporter.started(self._open, self._actor)
        self._closer = asyncio.create_task(self._close_when_quiet())

    def response(self) -> None:
        self._in_flight = max(0, self._in_flight - 1)
        self._last = asyncio.get_running_loop().time()

    async def _close_when_quiet(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            left = self._last + self._quiet_s - loop.time()
            if self._in_flight == 0 and left <= 0:
                break
            await asyncio.sleep(max(left, 0.05) if self._in_flight == 0 else self._quiet_s)
        await self._end()

    async def _end(self) -> None:
        ended, self._open, self._closer = self._open, None, None
        if ended is not None and self._reporter is not None:
            await self._reporter.ended(ended, self._actor)

    async def close(self) -> None:
        closer = self._closer
        if closer is not None:
            closer.cancel()
            await asyncio.gather(closer, return_exceptions=True)
        await self._end()


class CdpRelay:
    """One client connection, relayed to Chromium once accepted (see the module's docstring)."""

    def __init__(
        self,
        client: WebSocket,
        query: CdpQuery,
        lease: ControlLease,
        reporter: ActionReporter | None,
        recorder: Recorder | None,
        window: ActivityWindow | None = None,
    ) -> None:
        self._client, self._query, self._lease, self._recorder = client, query, lease, recorder
        self._window = window or ActivityWindow(reporter, query.conn, query.actor)
        self._sending = asyncio.Lock()

    def _note(self, change: str, **more: Any) -> None:
        if self._recorder is not None:
            event = {"event": "cdp", "change": change, "conn": self._query.conn, "exclusive": self._query.exclusive}
            self._recorder.note({**event, **more})

    async def serve(self, upstream: ClientConnection) -> None:
        """Relay until either side closes; the caller took the lease (exclusive) and detaches it."""
        self._note("connected", **({"target": self._query.target} if self._query.target else {}))
        tasks = {asyncio.create_task(self._from_client(upstream)), asyncio.create_task(self._from_browser(upstream))}
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._window.close()
            with contextlib.suppress(ConnectionClosed, OSError):
                await upstream.close()
            with contextlib.suppress(RuntimeError, WebSocketDisconnect):
                await self._client.close()
            self._note("disconnected")

    async def _from_client(self, upstream: ClientConnection) -> None:
        while True:
            message = await self._client.receive()
            if message["type"] == "websocket.disconnect":
                return
            raw = message.get("text")
            frame: str | bytes = raw if raw is not None else (message.get("bytes") or b"")
            answer = self._answer_here(frame)
            if answer is not None:
                await self._send(json.dumps(answer, separators=(",", ":")))
                continue
            await self._window.command()
            await upstream.send(frame)

    def _answer_here(self, frame: str | bytes) -> dict[str, Any] | None:
        """The relay's own answer to ``frame`` (refused, or lease-gated while another holds the
        lease), or None when it goes to Chromium."""
        try:
            command = cdprules.parse(json.loads(frame))
        except ValueError:
            return cdprules.invalid_reply(None, "a CDP message is JSON")
        if isinstance(command, str):
            return cdprules.invalid_reply(None, command)
        rule = cdprules.refusal(command.method, command.params)
        if rule is not None:
            log.warning("refused %s from %s (rule %s)", command.method, self._query.actor, rule.name)
            self._note("refused", method=command.method, rule=rule.name)
            return cdprules.refused_reply(command.id, command.session_id, command.method, rule)
        holder = self._lease.holder
        if cdprules.needs_lease(command.method) and holder.who not in (AGENT, self._query.actor):
            return cdprules.control_taken_reply(command.id, command.session_id, holder.who, holder.since)
        return None

    async def _from_browser(self, upstream: ClientConnection) -> None:
        async for frame in upstream:
            response = (
                frame.startswith(_RESPONSE_START) if isinstance(frame, str) else frame.startswith(_RESPONSE_START_BYTES)
            )
            if response:
                self._window.response()
            await self._send(frame)

    async def _send(self, frame: str | bytes) -> None:
        async with self._sending:
            if isinstance(frame, str):
                await self._client.send_text(frame)
            else:
                await self._client.send_bytes(frame)


async def _deny(client: WebSocket, exc: ActionError, status: int) -> None:
    # The one error body; control_taken's names the holder and since when.
    await client.send_denial_response(JSONResponse({"ok": False, "error": exc.to_dict()}, status_code=status))


async def serve(
    client: WebSocket, cdp_url: str, lease: ControlLease, reporter: ActionReporter | None, recorder: Recorder | None
) -> None:
    """The ``WS /v1/cdp`` route: the upgrade checked (query, lease, Chromium) before it is accepted,
    then relayed."""
    try:
        query = CdpQuery.of(client.query_params)
    except ActionError as exc:
        await _deny(client, exc, 400)
        return
    if query.exclusive:
        try:
            lease.take(query.actor)
        except ControlTaken as exc:
            await _deny(client, exc, 409)
            return
    try:
        try:
            upstream = await connect(
                await upstream_url(cdp_url, query.target),
                compression=None,
                max_size=cdprules.CDP_MAX_FRAME_BYTES,
                open_timeout=10,
                ping_interval=None,
            )
        except (OSError, TimeoutError, InvalidHandshake) as exc:
            await _deny(client, ActionError(ErrorCode.BROWSER_UNAVAILABLE, f"Chromium refused: {exc!r}"), 503)
            return
        except ActionError as exc:
            await _deny(client, exc, 503)
            return
        await client.accept()
        await CdpRelay(client, query, lease, reporter, recorder).serve(upstream)
    finally:
        if query.exclusive:
            lease.detach(query.actor)


__all__ = ["WINDOW_S", "ActivityWindow", "CdpQuery", "CdpRelay", "devtools_json", "serve", "upstream_url"]
