"""The live view: ``WS /v1/sessions/{id}/live``, the controller's ``/v1/live`` relayed after an auth step.

The credential comes as the first message, ``{"type": "auth", "credential": "..."}``, within
:data:`AUTH_TIMEOUT_S` of the upgrade, never in the URL (the viewer page holds a link's secret in
its fragment). A viewer link watches or controls as its mode says (``human:<link id>``), the owner's
API key controls (``human:<key id>``), the session's token watches as the agent. A refusal closes
4401/4403/4404 as ``/ws`` does; then every frame passes unchanged both ways. A link's stream closes
4003 ``link revoked`` the moment it is revoked, ``link expired`` at its expiry; every stream 4000
when the session ends.
"""

from __future__ import annotations

import asyncio
import json
from urllib.parse import urlencode

from fastapi import APIRouter, WebSocket

from corral.errors import CodedError, SessionNotFound, Unauthorized
from corral.gateway import controller
from corral.gateway.links import EXPIRED, LinkBook, LinkStream
from corral.gateway.relay import Stop, bridge
from corral.gateway.routes.deps import KeysDep, ManagerDep, MetricsDep, identify, note_expiry
from corral.gateway.routes.errors import close_refused
from corral.gateway.sessions import Session, SessionManager

router = APIRouter(prefix="/v1/sessions/{session_id}", tags=["live"])

AUTH_TIMEOUT_S = 5.0
CLOSE_LINK = 4003  # a viewer link revoked or expired while its stream was open
_AUTH_SHAPE = 'the first message must be {"type": "auth", "credential": "<link secret, API key or session token>"}'


@router.websocket("/live")
async def session_live(
    websocket: WebSocket, session_id: str, keys: KeysDep, manager: ManagerDep, m: MetricsDep
) -> None:
    await websocket.accept()  # the credential comes as a message, so only after the upgrade
    try:
        presented = await _credential(websocket)
        if presented is None:
            return  # the client left before it sent its credential
        who = identify(presented, keys, manager)
        note_expiry(who, manager)
        session = _session(manager, session_id)
        actor, mode = who.live_viewer(session_id, session.owner if session is not None else None)
    except CodedError as exc:
        await close_refused(websocket, exc)
        return
    assert session is not None  # live_viewer refused otherwise
    url = controller.ws_address(session.sandbox.base_url, "/v1/live?" + urlencode({"viewer": actor, "mode": mode}))
    if who.link is None:
        await bridge(websocket, session, m, url)
        return
    stream = await manager.links.opened(session.id, who.link.link_id)
    try:
        await bridge(websocket, session, m, url, stops=_link_stops(manager.links, session, stream))
    finally:
        manager.links.closed(stream)


async def _credential(websocket: WebSocket) -> str | None:
    """The auth message's credential; None when the client left first. Unauthorized for anything else."""
    try:
        message = await asyncio.wait_for(websocket.receive(), AUTH_TIMEOUT_S)
    except TimeoutError:
        raise Unauthorized(f"no auth message within {AUTH_TIMEOUT_S:g} s of the upgrade") from None
    if message["type"] == "websocket.disconnect":
        return None
    try:
        sent = json.loads(message.get("text") or "")
    except ValueError:
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
