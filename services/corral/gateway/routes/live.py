"""The live view: ``WS /v1/sessions/{id}/live``, the controller's ``/v1/live`` relayed after an auth step.

The credential comes as the first message, ``{"type": "auth", "credential": "..."}``, within
:data:`AUTH_TIMEOUT_S` of the upgrade, never in the URL (the viewer page holds a link's secret in
its fragment). Until it comes a socket holds one of :data:`AUTH_WAITING_MAX` places (when none is
free the oldest waiting socket is closed 1013 and the new one takes its place) and its message may
be :data:`AUTH_MAX_BYTES` long (1009); an upgrade from a page of another origin is refused (4403:
the viewer page is the gateway's own). A viewer link watches or controls as
its mode says (``human:<link id>``), the owner's API key controls (``human:owner``, never its key id), the session's
token watches as the agent. A refusal closes 4401/4403/4404 as ``/ws`` does; then every frame passes
unchanged both ways, the viewer's messages are the session's activity and an open stream that
controls keeps it from being idle. A link's stream closes 4003 ``link revoked`` the moment it is
revoked, ``link expired`` at its expiry; every stream 4000 when the session ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Iterator
from urllib.parse import urlencode, urlsplit

from fastapi import APIRouter, WebSocket
from starlette.types import Message

from corral.errors import CodedError, Forbidden, SessionNotFound, Unauthorized
from corral.gateway import controller
from corral.gateway.links import EXPIRED, LinkBook, LinkStream
from corral.gateway.metrics import Metrics
from corral.gateway.relay import Stop, bridge
from corral.gateway.routes.deps import KeysDep, ManagerDep, MetricsDep, identify, note_expiry, refuse_paused
from corral.gateway.routes.errors import close_refused
from corral.gateway.sessions import Session, SessionManager

router = APIRouter(prefix="/v1/sessions/{session_id}", tags=["live"])

AUTH_TIMEOUT_S = 5.0
AUTH_MAX_BYTES = 4096  # an auth message is a credential in a line of JSON: far less than this
AUTH_WAITING_MAX = 64  # sockets past the upgrade that have not sent their credential yet
CLOSE_LINK = 4003  # a viewer link revoked or expired while its stream was open
CLOSE_TOO_BIG = 1009
CLOSE_TRY_LATER = 1013
DROPPED: Message = {"type": "corral.live.dropped"}  # a waiting socket whose place a newer one took
_DROPPED_REASON = "too many live streams waiting to authenticate; the oldest waiting is dropped"
_AUTH_SHAPE = 'the first message must be {"type": "auth", "credential": "<link secret, API key or session token>"}'


class AuthSlots:
    """The places of sockets that have not authenticated yet. A socket always gets one: when none is
    free the oldest waiting socket loses its own (it is closed 1013), so sockets that never send
    their credential cannot keep a viewer out. They can only push each other out, and a viewer's
    credential comes right after its upgrade, long before :data:`AUTH_WAITING_MAX` newer sockets."""

    def __init__(self, size: int = AUTH_WAITING_MAX) -> None:
        self.size = size
        self.waiting: dict[int, asyncio.Event] = {}  # oldest first (dicts keep insertion order)
        self._next = 0

    @property
    def free(self) -> int:
        return self.size - len(self.waiting)

    @contextlib.contextmanager
    def held(self) -> Iterator[asyncio.Event]:
        """A place, given back on leaving; the event is set when a newer socket takes it."""
        while len(self.waiting) >= self.size:
            oldest = next(iter(self.waiting))
            self.waiting.pop(oldest).set()
        key, self._next = self._next, self._next + 1
        dropped = self.waiting[key] = asyncio.Event()
        try:
            yield dropped
        finally:
            self.waiting.pop(key, None)


@router.websocket("/live")
async def session_live(
    websocket: WebSocket, session_id: str, keys: KeysDep, manager: ManagerDep, m: MetricsDep
) -> None:
    await websocket.accept()  # the credential comes as a message, so only after the upgrade
    presented = await _first_message(websocket)
    if presented is None:
        return  # refused and closed, or the client left before it sent its credential
    try:
        who = identify(presented, keys, manager)
        note_expiry(who, manager)
        session = _session(manager, session_id)
        actor, mode = who.live_viewer(session_id, session.owner if session is not None else None)
        if session is not None:
            refuse_paused(session)
    except CodedError as exc:
        await close_refused(websocket, exc)
        return
    assert session is not None  # live_viewer refused otherwise
    url = controller.ws_address(session.sandbox.base_url, "/v1/live?" + urlencode({"viewer": actor, "mode": mode}))
    with _active(session, controls=mode == "control"):
        if who.link is None:
            await bridge(websocket, session, m, url, to_upstream=_touch(session))
        else:
            await _link_live(websocket, session, who.link.link_id, manager.links, m, url)


async def _first_message(websocket: WebSocket) -> str | None:
    """The credential of a socket that held one of the waiting places until it came; None once the
    socket is closed (no place free, a foreign origin, a refused message) or the client left."""
    slots: AuthSlots = websocket.app.state.live_auth_slots
    with slots.held() as dropped:
        try:
            _same_origin(websocket)
            message = await _auth_message(websocket, dropped)
            if message is None:
                return None  # the client left first
            if message is DROPPED:
                await websocket.close(code=CLOSE_TRY_LATER, reason=_DROPPED_REASON)
                return None
            if _size(message) > AUTH_MAX_BYTES:  # measured before any parsing
                await websocket.close(code=CLOSE_TOO_BIG, reason=f"the auth message is at most {AUTH_MAX_BYTES} bytes")
                return None
            return _credential(message.get("text"))
        except CodedError as exc:
            await close_refused(websocket, exc)
    return None


async def _link_live(
    websocket: WebSocket, session: Session, link_id: str, book: LinkBook, m: Metrics, url: str
) -> None:
    """A link's stream: counted from before its use is kept to after it closes, whatever happens."""
    stream = LinkStream(link_id)
    try:
        await book.opened(session.id, stream)
        await bridge(websocket, session, m, url, stops=_link_stops(book, session, stream), to_upstream=_touch(session))
    finally:
        book.closed(stream)


def _same_origin(websocket: WebSocket) -> None:
    """An upgrade a web page made carries its ``Origin``: only the gateway's own (the viewer page) passes."""
    origin = websocket.headers.get("origin")
    if origin is not None and urlsplit(origin).netloc != websocket.headers.get("host"):
        raise Forbidden("the live stream answers only the gateway's own viewer page (the Origin is another)")


@contextlib.contextmanager
def _active(session: Session, controls: bool) -> Iterator[None]:
    """A stream that may control counts as a request under way: a human driving is never idleness."""
    if not controls:
        yield
        return
    session.in_flight += 1
    try:
        yield
    finally:
        session.in_flight -= 1


def _touch(session: Session) -> Callable[[str | bytes], None]:
    """Each viewer message is the session's activity."""

    def seen(frame: str | bytes) -> None:
        session.touch()

    return seen


async def _auth_message(websocket: WebSocket, dropped: asyncio.Event) -> Message | None:
    """The first message, within :data:`AUTH_TIMEOUT_S` (Unauthorized after); :data:`DROPPED` when
    a newer socket took this one's place first; None when the client left."""
    receiving = asyncio.ensure_future(websocket.receive())
    pushed_out = asyncio.ensure_future(dropped.wait())
    try:
        done, _ = await asyncio.wait(
            {receiving, pushed_out}, timeout=AUTH_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        for waiting in (receiving, pushed_out):
            waiting.cancel()
        await asyncio.gather(receiving, pushed_out, return_exceptions=True)
    if receiving in done and not receiving.cancelled():
        message = receiving.result()
        return None if message["type"] == "websocket.disconnect" else message
    if pushed_out in done:
        return DROPPED
    raise Unauthorized(f"no auth message within {AUTH_TIMEOUT_S:g} s of the upgrade")


def _size(message: Message) -> int:
    """A message's length: a text's characters (a credential is ASCII), a binary message's bytes."""
    text = message.get("text")
    return len(text) if text is not None else len(message.get("bytes") or b"")


def _credential(text: str | None) -> str:
    """The auth message's credential. Unauthorized for a message of any other shape."""
    try:
        sent = json.loads(text or "")
    except (ValueError, RecursionError):  # 4 KiB of brackets nests past the parser's recursion
        raise Unauthorized(_AUTH_SHAPE) from None
    if not isinstance(sent, dict) or sent.get("type") != "auth" or not isinstance(sent.get("credential"), str):
        raise Unauthorized(_AUTH_SHAPE)
    return str(sent["credential"])


def _session(manager: SessionManager, session_id: str) -> Session | None:
    try:
        return manager.get(session_id)
    except SessionNotFound:
        return None


def _link_stops(book: LinkBook, session: Session, stream: LinkStream) -> list[Stop]:
    """A link's stream ends when the link is revoked, or at its expiry (which is then audited)."""
    link = book.get(session.id, stream.link_id)
    expires_at = link.expires_at if link is not None else 0.0

    async def expiry() -> None:
        await asyncio.sleep(max(0.0, expires_at - book.now()))
        stream.close(EXPIRED)
        book.expired(session.id, stream.link_id)

    def reason() -> str:
        return stream.reason

    return [Stop(stream.closing.wait, CLOSE_LINK, reason), Stop(expiry, CLOSE_LINK, reason)]
