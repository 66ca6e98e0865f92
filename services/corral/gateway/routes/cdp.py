"""A session's CDP endpoint for the browser frameworks (docs/cdp.md): ``GET .../cdp/json/version``,
``/json/list`` and ``/json``, ``WS .../cdp`` and ``.../cdp/page/{target}``, and the same under a
signed connect ticket (``POST .../cdp/connect``, then ``.../cdp/t/{ticket}/...``).

No web page may drive CDP: any request or upgrade with an ``Origin`` header is refused.
"""

from __future__ import annotations

import secrets
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Annotated

import httpx
from fastapi import APIRouter, Depends, Request, Response, WebSocket
from fastapi.responses import JSONResponse
from starlette.requests import HTTPConnection
from websockets.exceptions import InvalidHandshake

from corral.contracts.limits import CDP_MAX_FRAME_BYTES
from corral.errors import CodedError, ErrorCode, Forbidden, SandboxUnreachable, UnprovenController
from corral.gateway import cdp, controller
from corral.gateway.auth import KeyRing
from corral.gateway.metrics import Metrics
from corral.gateway.models import CdpConnect
from corral.gateway.relay import CLOSE_UNREACHABLE
from corral.gateway.routes.deps import (
    HttpDep,
    JsonBody,
    KeysDep,
    ManagerDep,
    MetricsDep,
    RunningSessionDep,
    bearer,
    body_of,
    identify,
    refuse_paused,
)
from corral.gateway.routes.deps import live_session as live_session_of
from corral.gateway.routes.errors import close_refused
from corral.gateway.sessions import Session, SessionManager
from corral.gateway.tickets import Ticket, TicketSigner


def refuse_browsers(conn: HTTPConnection) -> None:
    """A request a web page made (it carries an ``Origin``) never reaches CDP."""
    if "origin" in conn.headers:
        raise Forbidden("CDP does not answer web pages (the request has an Origin header)")


router = APIRouter(prefix="/v1/sessions/{session_id}/cdp", tags=["cdp"])


def _tickets(conn: HTTPConnection) -> TicketSigner:
    signer: TicketSigner = conn.app.state.cdp_tickets
    return signer


TicketsDep = Annotated[TicketSigner, Depends(_tickets)]


def _ticket_session(
    session_id: str, ticket: str, signer: TicketSigner, manager: SessionManager
) -> tuple[Session, Ticket]:
    """The live session a connect ticket opens, and the ticket (:class:`Unauthorized`,
    :class:`Forbidden`, :class:`SessionNotFound`)."""
    signed = signer.check(ticket, session_id)
    return manager.get(session_id), signed


async def _json(
    request: Request, session: Session, which: str, http: httpx.AsyncClient, ticket: str | None
) -> Response:
    try:
        upstream = await controller.request(
            http, session.sandbox.base_url, session.sandbox.secret, "GET", f"/v1/cdp/json/{which}"
        )
    except httpx.HTTPError as exc:
        raise SandboxUnreachable(f"the sandbox did not answer: {exc}") from None
    try:
        answer = upstream.json()
    except ValueError:
        answer = None
    if upstream.status_code != 200 or answer is None:
        # The controller's own error, or what Chromium said when it was no JSON: passed on as it is.
        return Response(upstream.content, status_code=upstream.status_code, media_type="application/json")
    host = request.headers.get("host") or request.url.netloc
    base = cdp.ws_base(request.url.scheme, host, session.id, ticket)
    return JSONResponse(cdp.rewrite(answer, base))


def _json_endpoints(which: str) -> tuple[Callable[..., Awaitable[Response]], Callable[..., Awaitable[Response]]]:
    """The two endpoints of Chromium's ``/json/<which>``: with the session's credential, with a ticket."""

    async def with_credential(request: Request, session: RunningSessionDep, http: HttpDep) -> Response:
        return await _json(request, session, which, http, None)

    async def with_ticket(
        request: Request, session_id: str, ticket: str, signer: TicketsDep, manager: ManagerDep, http: HttpDep
    ) -> Response:
        session, _ = _ticket_session(session_id, ticket, signer, manager)
        return await _json(request, session, which, http, ticket)

    return with_credential, with_ticket


# Clients ask for /json/version/ (Playwright), /json/version, /json/list and /json (Chromium's alias).
for _suffix in ("json", "json/", *(f"json/{p}" for p in cdp.JSON_PATHS)):
    _credential, _ticket = _json_endpoints(cdp.JSON_PATHS.get(_suffix.removeprefix("json/"), "list"))
    router.add_api_route(f"/{_suffix}", _credential, methods=["GET"], dependencies=[Depends(refuse_browsers)])
    router.add_api_route(f"/t/{{ticket}}/{_suffix}", _ticket, methods=["GET"], dependencies=[Depends(refuse_browsers)])


@router.post("/connect", dependencies=[Depends(refuse_browsers)])
async def cdp_connect(
    request: Request,
    session: RunningSessionDep,
    signer: TicketsDep,
    reading: Annotated[JsonBody[CdpConnect], body_of(CdpConnect)],
) -> JSONResponse:
    """A signed connect address for clients that cannot set a header (session token or owner's key)."""
    body = await reading.read()
    ticket, signed = signer.issue(session.id, body.ttl_s, body.exclusive)
    host = request.headers.get("host") or request.url.netloc
    http_scheme = "https" if request.url.scheme == "https" else "http"
    return JSONResponse(
        {
            "url": cdp.ws_base(request.url.scheme, host, session.id, ticket),
            "http_url": f"{http_scheme}://{host}/v1/sessions/{session.id}/cdp/t/{ticket}",
            "expires_at": signed.expires_at,
            "exclusive": signed.exclusive,
        }
    )


async def _refuse(websocket: WebSocket, exc: CodedError) -> None:
    # Accepted only to close with the reason, as /ws and /live do (4401/4403/4404).
    await websocket.accept()
    await close_refused(websocket, exc)


async def _unreachable(websocket: WebSocket, code: ErrorCode, reason: str, metrics: Metrics) -> None:
    # Past auth, as the agent's relay: 1011 and why.
    metrics.errors.labels(code=code).inc()
    await websocket.accept()
    await websocket.close(code=CLOSE_UNREACHABLE, reason=reason)


async def _open(websocket: WebSocket, session: Session, exclusive: bool, target: str | None, metrics: Metrics) -> None:
    """Relay to the controller's ``/v1/cdp`` for a new connection; its refusal of the upgrade (409
    ``control_taken`` for an exclusive connection while another holds the lease) is passed on."""
    query = {"conn": "cdp_" + secrets.token_hex(4), "exclusive": "1" if exclusive else "0"}
    if target is not None:
        query["target"] = target
    path = "/v1/cdp?" + urllib.parse.urlencode(query)
    try:
        upstream = await controller.connect_ws(
            session.sandbox.ws_url, session.sandbox.secret, path, CDP_MAX_FRAME_BYTES
        )
    except controller.RefusedUpgrade as refused:
        await websocket.send_denial_response(
            Response(refused.body, status_code=refused.status, media_type="application/json")
        )
        return
    except (OSError, TimeoutError, InvalidHandshake) as exc:
        await _unreachable(
            websocket, ErrorCode.SANDBOX_UNREACHABLE, f"the sandbox did not answer: {type(exc).__name__}", metrics
        )
        return
    except UnprovenController:
        await _unreachable(
            websocket, ErrorCode.CONTROLLER_UNPROVEN, "the sandbox's controller could not prove itself", metrics
        )
        return
    session.touch()
    await websocket.accept()
    await cdp.relay(websocket, upstream, session)


async def _with_credential(
    websocket: WebSocket, session_id: str, target: str | None, keys: KeyRing, manager: SessionManager, m: Metrics
) -> None:
    try:
        refuse_browsers(websocket)
        # The Authorization header only: a ?token= in a CDP address would end up in clients' logs
        # (a client that cannot set a header asks for a connect ticket).
        session = refuse_paused(live_session_of(session_id, identify(bearer(websocket), keys, manager), manager))
    except CodedError as exc:
        await _refuse(websocket, exc)
        return
    await _open(websocket, session, websocket.query_params.get("exclusive") == "1", target, m)


async def _with_ticket(
    websocket: WebSocket,
    session_id: str,
    ticket: str,
    target: str | None,
    signer: TicketSigner,
    manager: SessionManager,
    m: Metrics,
) -> None:
    try:
        refuse_browsers(websocket)
        session, signed = _ticket_session(session_id, ticket, signer, manager)
        refuse_paused(session)
    except CodedError as exc:
        await _refuse(websocket, exc)
        return
    await _open(websocket, session, signed.exclusive, target, m)


@router.websocket("")
async def cdp_browser(websocket: WebSocket, session_id: str, keys: KeysDep, manager: ManagerDep, m: MetricsDep) -> None:
    await _with_credential(websocket, session_id, None, keys, manager, m)


@router.websocket("/page/{target}")
async def cdp_page(
    websocket: WebSocket, session_id: str, target: str, keys: KeysDep, manager: ManagerDep, m: MetricsDep
) -> None:
    await _with_credential(websocket, session_id, target, keys, manager, m)


@router.websocket("/t/{ticket}")
async def cdp_browser_ticket(
    websocket: WebSocket, session_id: str, ticket: str, signer: TicketsDep, manager: ManagerDep, m: MetricsDep
) -> None:
    await _with_ticket(websocket, session_id, ticket, None, signer, manager, m)


@router.websocket("/t/{ticket}/page/{target}")
async def cdp_page_ticket(
    websocket: WebSocket,
    session_id: str,
    ticket: str,
    target: str,
    signer: TicketsDep,
    manager: ManagerDep,
    m: MetricsDep,
) -> None:
    await _with_ticket(websocket, session_id, ticket, target, signer, manager, m)
