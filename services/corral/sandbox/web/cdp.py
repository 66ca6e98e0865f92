"""The CDP relay: a framework's DevTools connection (through the gateway) to the sandbox's Chromium.

``WS /v1/cdp?conn=<id>&exclusive=0|1&target=<targetId>`` relays to Chromium's browser socket (the
one ``/json/version`` names, pinned to the DevTools address as the controller's own Playwright is)
or to a page's. Every client message is read and checked before it goes on
(corral.contracts.cdprules): refused commands and lease-gated ones sent while another holds the lease
are answered here and never reach Chromium. Chromium's messages pass unchanged.

An exclusive connection holds the control lease while it is open (the agent's actions get
``control_taken``); it takes the lease at the upgrade, or the upgrade is refused with 409.

While a person holds the lease every other connection gets nothing of the person's turn
(corral.sandbox.web.cdpturn): its events are cut at the take, its commands refused, its sessions
detached and its browser-level settings switched off, then set up again at the hand-back. A page
socket, whose session cannot be detached, is closed with 4409 at the take.

A screenshot of a tab behind another brings that tab to the front first (headful Chromium draws no
frame for a hidden tab; cdprules.BROUGHT_FORWARD), where the connection may act.

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
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.datastructures import QueryParams
from starlette.responses import JSONResponse
from starlette.websockets import WebSocket, WebSocketDisconnect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from corral.contracts import cdprules
from corral.contracts.actors import AGENT, CDP_PREFIX, is_human
from corral.contracts.limits import CDP_MAX_FRAME_BYTES
from corral.errors import ActionError, ControlTaken, ErrorCode
from corral.frames import next_frame
from corral.sandbox.control.lease import Change, ControlLease
from corral.sandbox.egress import ActionReporter
from corral.sandbox.recorder import Recorder
from corral.sandbox.web import cdpturn, devtools
from corral.sandbox.web.downloadbook import Acts
from corral.sandbox.web.driver import pinned_endpoint
from corral.sandbox.web.tabs import LastPage, page_targets

if TYPE_CHECKING:
    from websockets.asyncio.client import ClientConnection

log = logging.getLogger(__name__)

WINDOW_S = 1.0  # an activity window ends this long after the connection's last response
LONGEST_WINDOW_S = 30.0  # ... and at the latest this long after its first command
CLOSE_WAIT_S = 5.0  # how long the controller's shutdown waits for its CDP connections to end
CLOSE_TOO_BIG = 1009  # RFC 6455: a message too big to process
CLOSE_CONTROL_TAKEN = 4409  # a page socket at a person's take: 4000 + control_taken's HTTP status
_DECODE_ON_LOOP = 1 << 20  # larger client frames are decoded in a thread
_CLOSING = frozenset({"Target.closeTarget", "Page.close"})  # what may close Chromium's last page (and so it)
JSON_PATHS = frozenset({"version", "list"})
_CONN_ID = re.compile(r"[A-Za-z0-9_]{1,32}")
_TARGET_ID = re.compile(r"[A-Za-z0-9-]{1,64}")
# The relay's own answer to a client's command (corral.contracts.cdprules' replies: an id, a session,
# a JSON-RPC error), only sent on: read-only here.
Reply = Mapping[str, object]


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


async def devtools_json(cdp_url: str, which: str) -> devtools.Answer:
    """Chromium's ``/json/<which>`` answer, unchanged (the gateway rewrites its addresses)."""
    return await devtools.get(cdp_url, f"/json/{which}", 5.0)


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


# A command, as its response names it: (sessionId, id).
Pending = tuple[str | None, int]
# Chromium writes a response as {"id":N,...}, a flat session's with ,"sessionId":"S"} appended last;
# its events start with "method". Only the frame's ends are read (a screenshot is megabytes).
_RESPONSE_HEAD = re.compile(r'\{"id":(\d+)[,}]')
_SESSION_TAIL = re.compile(r'"sessionId":"([^"\\]*)"\}\s*\Z')
_ENDS = 160


def response_of(frame: str | bytes) -> Pending | None:
    """The command a frame of Chromium's answers, or None for an event."""
    head, tail = frame[:_ENDS], frame[-_ENDS:]
    if isinstance(head, bytes) and isinstance(tail, bytes):
        head, tail = head.decode(errors="replace"), tail.decode(errors="replace")
    assert isinstance(head, str) and isinstance(tail, str)
    started = _RESPONSE_HEAD.match(head)
    if started is None:
        return None
    session = _SESSION_TAIL.search(tail)
    return (session.group(1) if session else None, int(started.group(1)))


class ActivityWindow:
    """One connection's open action for the egress audit: opened by a command, ended :data:`WINDOW_S`
    after the last response once none of its commands waits for one; never longer than
    :data:`LONGEST_WINDOW_S` (a command Chromium never answers would keep it open for good)."""

    def __init__(
        self,
        reporter: ActionReporter | None,
        conn: str,
        actor: str,
        quiet_s: float = WINDOW_S,
        longest_s: float = LONGEST_WINDOW_S,
    ) -> None:
        self._reporter, self._conn, self._actor = reporter, conn, actor
        self._quiet_s, self._longest_s = quiet_s, longest_s
        self._count = 0
        self._open: str | None = None
        self._pending: set[Pending] = set()
        self._opened = self._last = 0.0
        self._answered = asyncio.Event()
        self._closer: asyncio.Task[None] | None = None

    @property
    def action_id(self) -> str | None:
        return self._open

    async def command(self, sent: Pending) -> None:
        """A command is about to go to Chromium: the proxy knows its action before any request."""
        self._pending.add(sent)
        self._last = asyncio.get_running_loop().time()
        if self._open is not None or self._reporter is None:
            return
        self._count += 1
        self._open = f"c{self._count}.{self._conn}"
        self._opened = self._last
        await self._reporter.started(self._open, self._actor)
        self._closer = asyncio.create_task(self._close_when_quiet())

    def response(self, answered: Pending) -> None:
        """Chromium answered a command (one of this window's, or one it no longer waits for)."""
        if answered in self._pending:
            self._pending.discard(answered)
            self._last = asyncio.get_running_loop().time()
            self._answered.set()

    async def _close_when_quiet(self) -> None:
        loop = asyncio.get_running_loop()
        cap = self._opened + self._longest_s
        while True:
            now = loop.time()
            until = cap if self._pending else min(cap, self._last + self._quiet_s)
            if now >= until:
                break
            self._answered.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(until - now):
                    await self._answered.wait()
        await self._end()

    async def _end(self) -> None:
        ended, self._open, self._closer = self._open, None, None
        self._pending.clear()  # answers still to come belong to no window
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
        last_page: LastPage | None = None,
        acts: Acts | None = None,
    ) -> None:
        self._client, self._query, self._lease, self._recorder = client, query, lease, recorder
        self._last_page = last_page
        self._acts = acts
        self._window = window or ActivityWindow(reporter, query.conn, query.actor)
        self._sending = asyncio.Lock()
        self._stopping = asyncio.Event()
        self._closing_code = 1000  # CLOSE_TOO_BIG after a command over cdprules.CDP_MAX_COMMAND_BYTES
        self._turn = cdpturn.Turn()
        # The person's take and hand-back, in order, for _follow_lease (the lease calls listeners
        # synchronously; what the relay sends for them is sent on its own task).
        self._turns: asyncio.Queue[tuple[bool, list[cdpturn.Pending], list[cdpturn.Own]]] = asyncio.Queue()

    def _note(self, change: str, **more: Any) -> None:
        if self._recorder is not None:
            event = {"event": "cdp", "change": change, "conn": self._query.conn, "exclusive": self._query.exclusive}
            self._recorder.note({**event, **more})

    def stop(self) -> None:
        """End the relay (the controller's shutdown): :meth:`serve` returns once both sides are closed."""
        self._stopping.set()

    async def serve(self, upstream: ClientConnection) -> None:
        """Relay until either side closes or :meth:`stop`; the caller took the lease (exclusive) and
        detaches it."""
        self._note("connected", **({"target": self._query.target} if self._query.target else {}))
        if is_human(self._lease.holder.who):
            self._turn.begin()  # opened during a person's turn: muzzled from its first frame
        unsubscribe = self._lease.subscribe(self._lease_changed)
        tasks = {
            asyncio.create_task(self._from_client(upstream)),
            asyncio.create_task(self._from_browser(upstream)),
            asyncio.create_task(self._follow_lease(upstream)),
            asyncio.create_task(self._stopping.wait()),
        }
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            unsubscribe()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._window.close()
            with contextlib.suppress(ConnectionClosed, OSError):
                await upstream.close()
            with contextlib.suppress(RuntimeError, WebSocketDisconnect):
                await self._client.close(self._closing_code)
            self._note("disconnected")

    async def _from_client(self, upstream: ClientConnection) -> None:
        while (frame := await next_frame(self._client)) is not None:
            if isinstance(frame, bytes):
                await self._reply(cdprules.invalid_reply(None, "a CDP message is a text frame"))
                continue
            if len(frame) > cdprules.CDP_MAX_COMMAND_BYTES:
                self._closing_code = CLOSE_TOO_BIG
                return
            checked = await _decoded(frame)
            if isinstance(checked, cdprules.Command) and checked.method in cdprules.ENDS_CONNECTION:
                # Even in a person's turn: it lets go of everything and touches no page.
                await self._reply(cdprules.ok_reply(checked.id, checked.session_id))
                self._note("closed", method=checked.method)
                return
            answer = self._answer_here(checked) if isinstance(checked, cdprules.Command) else checked
            if answer is None and isinstance(checked, cdprules.Command):
                answer = await self._making_way(checked)
            if answer is not None:
                await self._reply(answer)
                continue
            assert isinstance(checked, cdprules.Command)
            checked = cdpturn.downloads_in_place(checked)  # a client's download path: Corral's place
            self._turn.sent(checked)
            await self._window.command((checked.session_id, checked.id))
            if self._acts is not None:  # a download that begins now is this connection's
                self._acts.cdp_command(self._query.actor, self._window.action_id)
            if not self._turn.goes(checked):
                continue  # a person took the lease meanwhile: answered control_taken, never sent
            if checked.method in cdprules.BROUGHT_FORWARD and self._may_act():
                # Its tab to the front first (a no-op for the front tab), in the same session so it is
                # done before the command; its answer is the relay's own, dropped.
                await self._send_own(upstream, [cdpturn.Own("Page.bringToFront", {}, checked.session_id)])
            # What was checked is what goes: never the client's bytes (a repeated key, odd spacing).
            await upstream.send(json.dumps(checked.wire(), separators=(",", ":")))

    def _answer_here(self, command: cdprules.Command) -> cdprules.CdpErrorReply | None:
        """The relay's own answer to ``command`` (refused, or lease-gated while another holds the
        lease), or None when it goes to Chromium."""
        rule = cdprules.refusal(command.method, command.params)
        if rule is not None:
            log.warning("refused %s from %s (rule %s)", command.method, self._query.actor, rule.name)
            self._note("refused", method=command.method, rule=rule.name)
            return cdprules.refused_reply(command.id, command.session_id, command.method, rule)
        holder = self._lease.holder
        if is_human(holder.who):
            taken = not cdprules.allowed_in_persons_turn(command.method)
        else:
            taken = holder.who not in (AGENT, self._query.actor) and cdprules.needs_lease(
                command.method, command.params
            )
        if taken:
            return cdprules.control_taken_reply(command.id, command.session_id, holder.who, holder.since)
        return None

    def _may_act(self) -> bool:
        """Whether this connection may act on the browser now (the agent's lease, or its own)."""
        return self._lease.holder.who in (AGENT, self._query.actor)

    def _lease_changed(self, change: Change) -> None:
        """The lease's listener (synchronous, so nothing of the turn passes after it): muzzled from a
        person's take to the hand-back."""
        persons = is_human(change.state.holder.who)
        if persons == self._turn.muzzled:
            return
        if not persons:
            self._turns.put_nowait((False, [], self._turn.end()))
            return
        cut = self._turn.begin()
        if self._query.target is not None:
            # A page socket's own session cannot be detached: the connection ends (Chromium then
            # drops everything it set up).
            self._closing_code = CLOSE_CONTROL_TAKEN
            self.stop()
            return
        self._turns.put_nowait((True, cut, self._turn.let_go()))

    async def _follow_lease(self, upstream: ClientConnection) -> None:
        """Sends what a take or a hand-back asks for: at the take ``control_taken`` for each command
        in flight and the letting go; at the hand-back the set up again (unless taken once more)."""
        while True:
            taken, cut, commands = await self._turns.get()
            if taken:
                holder = self._lease.holder
                for session_id, message_id in cut:
                    await self._reply(cdprules.control_taken_reply(message_id, session_id, holder.who, holder.since))
            elif self._turn.muzzled:
                continue  # taken again before the set up went: the next hand-back sets it up
            await self._send_own(upstream, commands)

    async def _send_own(self, upstream: ClientConnection, commands: list[cdpturn.Own]) -> None:
        for own in commands:
            await upstream.send(self._turn.own_wire(own))

    async def _making_way(self, command: cdprules.Command) -> cdprules.CdpErrorReply | None:
        """For a command that may close Chromium's last page (so Chromium): a blank tab opened first
        (:meth:`LastPage.make_way`), then None (it goes on); its refusal when that cannot be done."""
        if self._last_page is None or command.method not in _CLOSING:
            return None
        if command.method == "Target.closeTarget":
            target = (command.params or {}).get("targetId")
            named = target if isinstance(target, str) else None
        elif command.session_id is not None:  # Page.close in a flat session: the page it is attached to
            named = self._turn.target_of(command.session_id)
        else:  # Page.close on a page's own socket
            named = self._query.target
        if await self._last_page.make_way(named):
            return None
        rule = cdprules.BROWSER_LIFECYCLE
        self._note("refused", method=command.method, rule=rule.name)
        return cdprules.refused_reply(command.id, command.session_id, command.method, rule)

    async def _from_browser(self, upstream: ClientConnection) -> None:
        async for frame in upstream:
            answered = response_of(frame)
            if answered is not None:
                self._window.response(answered)
                if not self._turn.answered(answered):
                    continue
            else:
                passes, then = self._turn.event(frame)
                if then:
                    await self._send_own(upstream, then)
                if not passes:
                    continue
            await self._send(frame)

    async def _reply(self, answer: cdprules.CdpErrorReply | cdprules.CdpOkReply) -> None:
        await self._send(json.dumps(answer, separators=(",", ":")))

    async def _send(self, frame: str | bytes) -> None:
        async with self._sending:
            if isinstance(frame, str):
                await self._client.send_text(frame)
            else:
                await self._client.send_bytes(frame)


async def _decoded(text: str) -> cdprules.Command | cdprules.CdpErrorReply:
    """A client's frame as a command, or the relay's answer saying why it is none. A large frame is
    decoded off the event loop (tens of milliseconds for megabytes)."""
    try:
        if len(text) > _DECODE_ON_LOOP:
            message = await asyncio.to_thread(cdprules.loads, text)
        else:
            message = cdprules.loads(text)
    except ValueError as exc:
        return cdprules.invalid_reply(_id_in(text), f"a CDP message is JSON without repeated keys ({exc})")
    command = cdprules.parse(message)
    return cdprules.invalid_reply(cdprules.id_of(message), command) if isinstance(command, str) else command


def _id_in(text: str) -> int | None:
    """The id of a frame that is JSON but no CDP message (a key given twice), for its answer: a
    client waits for its id. Only for small frames (this one is decoded on the loop)."""
    if len(text) > _DECODE_ON_LOOP:
        return None
    try:
        return cdprules.id_of(json.loads(text))
    except (ValueError, RecursionError):
        return None


class Relays:
    """The controller's open CDP connections. Its shutdown ends them (an exclusive one detaches its
    lease) before the lease's log stops listening, so that detach is recorded and audited."""

    def __init__(self, last_page: LastPage | None = None, acts: Acts | None = None) -> None:
        self._open: dict[CdpRelay, asyncio.Event] = {}
        self._closed = False
        self.last_page = last_page
        self.acts = acts  # who acts on the browser, for the downloads' causes

    @property
    def closed(self) -> bool:
        return self._closed

    @contextlib.contextmanager
    def tracking(self, relay: CdpRelay) -> Iterator[None]:
        """``relay``'s whole life, its lease's detach included."""
        gone = asyncio.Event()
        self._open[relay] = gone
        if self._closed:
            relay.stop()
        try:
            yield
        finally:
            del self._open[relay]
            gone.set()

    async def close(self, timeout_s: float = CLOSE_WAIT_S) -> None:
        self._closed = True
        for relay in self._open:
            relay.stop()
        waiting = [asyncio.create_task(gone.wait()) for gone in self._open.values()]
        if waiting:
            _, late = await asyncio.wait(waiting, timeout=timeout_s)
            for task in late:
                task.cancel()
            if late:
                log.warning("%d CDP connections did not end within %.1f s of shutdown", len(late), timeout_s)


async def _deny(client: WebSocket, exc: ActionError, status: int) -> None:
    # The one error body; control_taken's names the holder and since when.
    await client.send_denial_response(JSONResponse({"ok": False, "error": exc.to_dict()}, status_code=status))


async def serve(
    client: WebSocket,
    cdp_url: str,
    lease: ControlLease,
    reporter: ActionReporter | None,
    recorder: Recorder | None,
    relays: Relays,
) -> None:
    """The ``WS /v1/cdp`` route: the upgrade checked (query, lease, Chromium) before it is accepted,
    then relayed (tracked by ``relays`` until its lease is detached)."""
    try:
        query = CdpQuery.of(client.query_params)
    except ActionError as exc:
        await _deny(client, exc, 400)
        return
    if relays.closed:
        await _deny(client, ActionError(ErrorCode.BROWSER_UNAVAILABLE, "the controller is shutting down"), 503)
        return
    relay = CdpRelay(client, query, lease, reporter, recorder, last_page=relays.last_page, acts=relays.acts)
    with relays.tracking(relay):
        if query.exclusive:
            try:
                lease.take(query.actor)
            except ControlTaken as exc:
                await _deny(client, exc, 409)
                return
        try:
            await _relay(client, relay, cdp_url, query.target)
        finally:
            if query.exclusive:
                lease.detach(query.actor)


async def _relay(client: WebSocket, relay: CdpRelay, cdp_url: str, target: str | None) -> None:
    # Imported on the first CDP client, not at boot: about 11 ms of every cold start's controller.
    from websockets.asyncio.client import connect

    try:
        upstream = await connect(
            await upstream_url(cdp_url, target),
            compression=None,
            max_size=CDP_MAX_FRAME_BYTES,
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
    await relay.serve(upstream)


__all__ = [
    "LONGEST_WINDOW_S",
    "WINDOW_S",
    "ActivityWindow",
    "CdpQuery",
    "CdpRelay",
    "LastPage",
    "Relays",
    "devtools_json",
    "page_targets",
    "response_of",
    "serve",
    "upstream_url",
]
