"""A session's own channels: ``POST /v1/sessions/{id}/actions`` and the WebSocket ``/v1/sessions/{id}/ws``,
both passed to its sandbox's controller unchanged."""

from __future__ import annotations

import time
from contextlib import suppress

import httpx
from fastapi import APIRouter, Request, Response, WebSocket

from corral.bodies import read_capped
from corral.contracts.limits import MAX_FRAME_BYTES
from corral.errors import CodedError, MessageTooLarge, SandboxUnreachable
from corral.gateway import controller
from corral.gateway.relay import relay
from corral.gateway.routes.deps import (
    HttpDep,
    KeysDep,
    ManagerDep,
    MetricsDep,
    RunningSessionDep,
    caller,
    live_session,
    refuse_paused,
)
from corral.gateway.routes.errors import close_refused

router = APIRouter(prefix="/v1/sessions/{session_id}", tags=["actions"])

# The sandbox refuses a message over its own limit (1 MiB) with a structured error; this bounds what
# the gateway buffers to pass it on.
MAX_ACTION_BODY = MAX_FRAME_BYTES


@router.post("/actions")
async def session_action(request: Request, session: RunningSessionDep, m: MetricsDep, http: HttpDep) -> Response:
    body = await read_capped(request, MAX_ACTION_BODY)
    if body is None:
        raise MessageTooLarge(f"the body exceeds {MAX_ACTION_BODY} bytes")
    session.touch()
    started = time.perf_counter()
    session.in_flight += 1
    try:
        upstream = await controller.request(
            http,
            session.sandbox.base_url,
            session.sandbox.secret,
            "POST",
            "/v1/actions",
            content=body,
            headers={"content-type": "application/json"},
        )
    except httpx.HTTPError as exc:
        raise SandboxUnreachable(f"the sandbox did not answer: {exc}") from None
    finally:
        session.in_flight -= 1
    m.action.labels(transport="http").observe(time.perf_counter() - started)
    if upstream.status_code >= 400:
        with suppress(ValueError, KeyError, TypeError):
            m.errors.labels(code=upstream.json()["error"]["code"]).inc()
    session.touch()
    return Response(upstream.content, status_code=upstream.status_code, media_type="application/json")


@router.websocket("/ws")
async def session_ws(websocket: WebSocket, session_id: str, keys: KeysDep, manager: ManagerDep, m: MetricsDep) -> None:
    try:
        session = refuse_paused(live_session(session_id, caller(websocket, keys, manager), manager))
    except CodedError as exc:
        # Accept only to close with the reason (closing before accepting would surface as a bare HTTP 403).
        await websocket.accept()
        await close_refused(websocket, exc)
        return
    await websocket.accept()
    await relay(websocket, session, m, upstream_lost=lambda: manager.check_sandbox(session))
