"""The gateway's HTTP and WebSocket API (default http://127.0.0.1:8700). Thin routes over SessionManager."""

from __future__ import annotations

import asyncio
import json
import logging
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Annotated, Any, TypeVar
from urllib.parse import quote

import httpx
from fastapi import Depends, FastAPI, Request, Response, WebSocket
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import FileResponse, JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import HTTPConnection

from corral.bodies import read_capped
from corral.errors import CorralError, ErrorCode, SandboxError, UnprovenController
from corral.gateway import auth, controller
from corral.gateway.egress import EgressUnavailable, ReplayUnreadable
from corral.gateway.metrics import Metrics
from corral.gateway.models import CreatedSession, CreateSession, ReplayResponsesOut, SessionOut, UpdateSession
from corral.gateway.recording import RecordingManager
from corral.gateway.relay import relay
from corral.gateway.replays import ReplayNotFound
from corral.gateway.sessions import CapacityError, HermeticUnavailable, Session, SessionManager, SessionNotFound
from corral.gateway.settings import GatewaySettings
from corral.gateway.store import SessionStore
from corral.gateway.viewer import VIEWER_HEADERS, viewer_page
from corral.proxy import traffic
from corral.runtime import SandboxRuntime, open_runtime

log = logging.getLogger(__name__)
ModelT = TypeVar("ModelT", bound=BaseModel)


MAX_ACTION_BODY = 16 << 20  # the sandbox refuses above 1 MiB with a structured error; this bounds buffering


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field


def _body(code: str, message: str, field: str | None = None) -> dict[str, Any]:
    error = {"code": code, "message": message}
    if field:
        error["field"] = field
    return {"error": error}


# -- dependencies --------------------------------------------------------------------------------------


def _manager(conn: HTTPConnection) -> SessionManager:
    manager: SessionManager = conn.app.state.manager
    return manager


def _metrics(conn: HTTPConnection) -> Metrics:
    metrics: Metrics = conn.app.state.metrics
    return metrics


def _presented(conn: HTTPConnection) -> str | None:
    """The credential of the ``Authorization`` header: the only place one is read from, but for
    the session token of a WebSocket upgrade (:func:`_ws_query_token`)."""
    header = conn.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip()
    return None


def _ws_query_token(conn: HTTPConnection) -> str | None:
    """``?token=`` on a WebSocket upgrade, the one request a browser cannot put a header on.

    A session token only: an address ends up in logs, histories and proxies, and a session token
    opens one session for its lifetime, where an API key opens every session of its owner for good.
    """
    if conn.scope["type"] != "websocket":
        return None
    token = conn.query_params.get("token")
    if token and conn.app.state.keys.check(token) is not None:
        raise ApiError(401, "unauthorized", "?token= takes a session token; send an API key as a header")
    return token


def api_key(conn: HTTPConnection) -> auth.Principal:
    presented = _presented(conn)
    if not presented:
        raise ApiError(401, "unauthorized", "send an API key as 'Authorization: Bearer <key>'")
    ident = conn.app.state.keys.check(presented)
    if ident is None:
        raise ApiError(401, "unauthorized", "that API key is not valid")
    return auth.Principal(key_id=ident)


def session_access(conn: HTTPConnection) -> Session:
    """The session in the path, for its owner's API key or its own session token."""
    return _session_for(conn, _presented(conn) or _ws_query_token(conn))


def _session_for(conn: HTTPConnection, presented: str | None) -> Session:
    manager = _manager(conn)
    session_id = conn.path_params["session_id"]
    if not presented:
        raise ApiError(401, "unauthorized", "send an API key or the session token as 'Authorization: Bearer ...'")
    ident = conn.app.state.keys.check(presented)
    try:
        session = manager.get(session_id)
    except SessionNotFound:
        if ident is None and not any(auth.token_matches(presented, s.token_sha256) for s in manager.list()):
            raise ApiError(401, "unauthorized", "that API key or token is not valid") from None
        raise ApiError(404, "not_found", f"no session {session_id}") from None
    if ident is not None:
        if ident != session.owner:
            raise ApiError(403, "forbidden", "this session belongs to another API key")
        return session
    if auth.token_matches(presented, session.token_sha256):
        return session
    if any(auth.token_matches(presented, s.token_sha256) for s in manager.list()):
        raise ApiError(403, "forbidden", "a session token only opens its own session")
    raise ApiError(401, "unauthorized", "that API key or token is not valid")


def audit_log(conn: HTTPConnection) -> Path:
    """The audit log of the session in the path, live or ended: for its owner's API key, or for the
    session's own token while it lives."""
    manager = _manager(conn)
    session_id = conn.path_params["session_id"]
    if manager.egress is None:
        raise ApiError(404, "not_found", "this gateway runs sessions without egress control")
    presented = _presented(conn)
    ident = conn.app.state.keys.check(presented) if presented else None
    if ident is None:
        session = session_access(conn)  # a session token: only its own, only while it lives
        if session.egress is None:
            raise ApiError(404, "not_found", f"session {session_id} has no egress log")
        return session.egress.audit_path
    try:
        meta = manager.egress.meta(session_id)
    except ValueError:
        meta = None
    if meta is None:
        raise ApiError(404, "not_found", f"no audit log for session {session_id}")
    if meta.get("owner") != ident:
        raise ApiError(403, "forbidden", "this session belongs to another API key")
    return manager.egress.state_dir(session_id) / "audit.jsonl"


async def json_body(request: Request, model: type[ModelT]) -> ModelT:
    """The request's JSON body as ``model``: read only after the route's credential was checked
    (its dependencies run first), and never more than ``CORRAL_MAX_BODY_KB`` of it (Content-Length
    first, then as it streams), so an unauthenticated or oversized body costs no parsing at all."""
    limit = request.app.state.max_body
    body = await read_capped(request, limit)
    if body is None:
        raise ApiError(413, ErrorCode.MESSAGE_TOO_LARGE, f"the body exceeds {limit} bytes (CORRAL_MAX_BODY_KB)")
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors(include_url=False)) from None


def traffic_filter(
    host: str | None = None,
    decision: str | None = None,
    event: str | None = None,
    action: str | None = None,
    since: str | None = None,
    until: str | None = None,
) -> traffic.TrafficFilter:
    try:
        return traffic.TrafficFilter.parse(
            host=host, decision=decision, event=event, action=action, since=since, until=until
        )
    except ValueError as exc:
        raise ApiError(422, "invalid_request", str(exc)) from None


ManagerDep = Annotated[SessionManager, Depends(_manager)]
MetricsDep = Annotated[Metrics, Depends(_metrics)]
KeyDep = Annotated[auth.Principal, Depends(api_key)]
SessionDep = Annotated[Session, Depends(session_access)]
AuditLogDep = Annotated[Path, Depends(audit_log)]
FilterDep = Annotated[traffic.TrafficFilter, Depends(traffic_filter)]


def _out(conn: HTTPConnection, session: Session) -> dict[str, Any]:
    base = str(conn.base_url).rstrip("/")
    ws_base = base.replace("http://", "ws://", 1).replace("https://", "wss://", 1)
    return {
        "id": session.id,
        "state": session.state,
        "created_at": session.created_at,
        "expires_at": session.expires_at,
        "idle_timeout_s": session.idle_timeout_s,
        "last_activity_at": session.last_activity_at,
        "viewport": session.viewport.model_dump(),
        "allow": session.allow,
        "labels": session.labels,
        "from_pool": session.from_pool,
        "container": session.sandbox.name,
        "egress_mode": session.egress_mode,
        "hermetic": session.hermetic,
        "ws_url": f"{ws_base}/v1/sessions/{session.id}/ws",
        "actions_url": f"{base}/v1/sessions/{session.id}/actions",
        "traffic_url": f"{base}/v1/sessions/{session.id}/traffic",
    }


def create_app(settings: GatewaySettings | None = None, runtime: SandboxRuntime | None = None) -> FastAPI:
    settings = settings or GatewaySettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        keys = settings.api_keys() or [auth.load_or_create_key(settings.data_dir)]
        app.state.keys = auth.KeyRing(keys)
        app.state.max_body = settings.max_body_kb << 10
        app.state.metrics = Metrics()
        chosen = runtime
        if chosen is None:  # the driver CORRAL_RUNTIME names; an unknown one stops the start here
            chosen = await asyncio.to_thread(open_runtime, settings.runtime, proxy_uid=settings.egress_uid)
        app.state.manager = SessionManager(
            settings, chosen, SessionStore(settings.data_dir), on_claim=app.state.metrics.claimed
        )
        app.state.http = httpx.AsyncClient(timeout=httpx.Timeout(660.0, connect=10.0))
        await app.state.manager.start()
        try:
            yield
        finally:
            await app.state.manager.stop()
            await app.state.http.aclose()

    app = FastAPI(title="Corral gateway", version="1", lifespan=lifespan)
    _document_bodies(app, {"create_session": CreateSession, "update_session": UpdateSession})

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        request.app.state.metrics.errors.labels(code=exc.code).inc()
        # A refused request's body stays unread: closing the connection after the answer stops the
        # server from taking in (and the client from sending) the rest of it.
        unread = exc.status in (401, 403, 413) and _declares_body(request)
        headers = {"connection": "close"} if unread else None
        return JSONResponse(_body(exc.code, exc.message, exc.field), status_code=exc.status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        loc = [str(part) for part in first.get("loc", ()) if part != "body"]
        request.app.state.metrics.errors.labels(code="invalid_request").inc()
        return JSONResponse(_body("invalid_request", str(first.get("msg")), ".".join(loc) or None), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return JSONResponse(_body(code, str(exc.detail)), status_code=exc.status_code)

    @app.get("/v1/health")
    async def health(manager: ManagerDep) -> dict[str, Any]:
        return {
            "ok": True,
            "sessions": manager.counts(),
            "pool_target": settings.pool_size,
            "host_guard": manager.host_guarded,
            "limits": manager.limits.health(),
            "egress": {
                "enabled": manager.egress is not None,
                "mode": settings.egress_mode,
                "network": settings.egress_network,
            }
            if manager.egress is not None
            else {"enabled": False},
        }

    @app.get("/metrics")
    async def metrics(manager: ManagerDep, m: MetricsDep) -> Response:
        return Response(m.render(manager.counts()), media_type="text/plain; version=0.0.4")

    @app.post("/v1/sessions", status_code=201, response_model=CreatedSession)
    async def create_session(request: Request, key: KeyDep, manager: ManagerDep) -> Any:
        assert key.key_id is not None
        body = await json_body(request, CreateSession)
        try:
            session, token = await manager.create(key.key_id, body)
        except CapacityError as exc:
            raise ApiError(429, "too_many_sessions", str(exc)) from None
        except HermeticUnavailable as exc:
            raise ApiError(409, "egress_off", str(exc), "hermetic") from None
        except ReplayNotFound as exc:
            raise ApiError(404, "not_found", str(exc), "hermetic") from None
        except ReplayUnreadable as exc:
            raise ApiError(422, "replay_unreadable", str(exc), "hermetic") from None
        except ValueError as exc:
            raise ApiError(422, "invalid_request", str(exc), "timeout_s") from None
        except SandboxError as exc:
            log.error("sandbox start failed: %s", exc)
            raise ApiError(503, "sandbox_start_failed", "the sandbox did not start; see the gateway log") from None
        return {**_out(request, session), "token": token}

    @app.get("/v1/sessions", response_model=list[SessionOut])
    async def list_sessions(request: Request, key: KeyDep, manager: ManagerDep) -> Any:
        return [_out(request, s) for s in manager.list(key.key_id)]

    @app.get("/v1/sessions/{session_id}", response_model=SessionOut)
    async def get_session(request: Request, session: SessionDep) -> Any:
        return _out(request, session)

    @app.delete("/v1/sessions/{session_id}", status_code=204)
    async def delete_session(session: SessionDep, manager: ManagerDep) -> Response:
        try:
            await manager.delete(session.id)
        except SessionNotFound:
            raise ApiError(404, "not_found", f"no session {session.id}") from None
        return Response(status_code=204)

    @app.patch("/v1/sessions/{session_id}", response_model=SessionOut)
    async def update_session(request: Request, session: SessionDep, manager: ManagerDep) -> Any:
        # The owner's API key only: a session token is what the agent holds, and it must not widen its own egress.
        ident = request.app.state.keys.check(_presented(request) or "")
        if ident is None:
            raise ApiError(403, "forbidden", "changing a session's egress needs its owner's API key")
        body = await json_body(request, UpdateSession)
        actor = f"api-key:{ident}"
        try:
            await manager.update_egress(session, body.allow, body.egress_mode, actor)
        except EgressUnavailable as exc:
            raise ApiError(503, "egress_unavailable", str(exc)) from None
        return _out(request, session)

    @app.get("/v1/audit")
    async def list_audit_logs(key: KeyDep, manager: ManagerDep) -> Any:
        if manager.egress is None:
            return []
        return await asyncio.to_thread(manager.egress.logs, key.key_id or "")

    @app.get("/v1/recordings")
    async def list_recordings(key: KeyDep, manager: ManagerDep) -> Any:
        if manager.recordings is None:
            return []
        return await asyncio.to_thread(manager.recordings.listing, key.key_id or "")

    @app.get("/v1/sessions/{session_id}/recording")
    async def session_recording(request: Request, session_id: str, manager: ManagerDep) -> Response:
        """The session's recording bundle as a .zip (live or ended; docs/recording.md)."""
        recordings = _recording_access(request, session_id, manager)
        # Built in a temporary file, not in memory: a long session's bundle can be large.
        spool = tempfile.NamedTemporaryFile(prefix="corral-bundle-", suffix=".zip", delete=False)  # noqa: SIM115
        try:
            with spool:
                await asyncio.to_thread(recordings.zip, session_id, spool)
        except BaseException as exc:
            await asyncio.shield(asyncio.to_thread(Path(spool.name).unlink, missing_ok=True))
            if isinstance(exc, OSError | ValueError):
                raise ApiError(404, "not_found", f"no recording of session {session_id}") from None
            raise
        return FileResponse(
            spool.name,
            media_type="application/zip",
            filename=f"{session_id}.zip",
            background=BackgroundTask(Path(spool.name).unlink, missing_ok=True),
        )

    @app.post("/v1/replay-responses", status_code=201, response_model=ReplayResponsesOut)
    async def upload_replay_responses(request: Request, key: KeyDep, manager: ManagerDep) -> Any:
        """A recording's responses.mitm, for hermetic sessions (``"hermetic": "<id>"`` at create)."""
        assert key.key_id is not None
        uploads = manager.replays
        upload_id, part = uploads.begin()
        size = 0
        try:
            with part.open("wb") as out:
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > uploads.max_bytes:
                        raise ApiError(
                            413, "too_large", f"recorded responses are limited to {uploads.max_bytes >> 20} MiB"
                        )
                    await asyncio.to_thread(out.write, chunk)
            checked = await asyncio.to_thread(uploads.finish, upload_id, part, key.key_id)
        except ValueError as exc:
            raise ApiError(422, "invalid_request", f"this is {exc}; send a recording's responses.mitm") from None
        finally:
            part.unlink(missing_ok=True)
        return {"id": upload_id, "flows": checked.flows, "bytes": checked.complete, "torn": checked.torn}

    @app.delete("/v1/replay-responses/{upload_id}", status_code=204)
    async def delete_replay_responses(upload_id: str, key: KeyDep, manager: ManagerDep) -> Response:
        try:
            await asyncio.to_thread(manager.replays.delete, upload_id, key.key_id or "")
        except (ReplayNotFound, ValueError):
            raise ApiError(404, "not_found", f"no replay responses {upload_id}") from None
        return Response(status_code=204)

    @app.get("/v1/sessions/{session_id}/recording/events")
    async def recording_events(request: Request, session_id: str, manager: ManagerDep, after: str = "0") -> Any:
        """``{"events": [...], "ended": bool}``: the events with ``seq > after``, and whether more can come."""
        recordings = _recording_access(request, session_id, manager)
        return await asyncio.to_thread(recordings.events, session_id, _after_seq(after))

    @app.get("/v1/sessions/{session_id}/recording/frames/{name}")
    async def recording_frame(request: Request, session_id: str, name: str, manager: ManagerDep) -> Response:
        recordings = _recording_access(request, session_id, manager)
        try:
            data = await asyncio.to_thread(recordings.frame, session_id, name)
        except (OSError, ValueError):
            raise ApiError(404, "not_found", f"no frame {name}") from None
        # The viewer sends its credential as a header, so the browser's cache must key on it too.
        headers = {"cache-control": "private, max-age=3600", "vary": "authorization"}
        return Response(data, media_type="image/webp", headers=headers)

    @app.get("/v1/sessions/{session_id}/viewer")
    async def recording_viewer(request: Request, session_id: str, manager: ManagerDep) -> Response:
        """A page to watch a session, live or recorded: timeline, actions, their network requests.

        Opened as ``viewer#token=<key or token>``: a browser sends no credential when it navigates,
        so the page is served to anyone (it holds nothing but the session id) and reads the
        recording with the fragment's credential as a header. A credential that does come (an old
        ``?token=`` link, a header) is checked here, and an old link is sent on to the fragment form.
        """
        if manager.recordings is None:
            raise ApiError(404, "not_found", "this gateway does not record sessions")
        try:
            manager.recordings.directory(session_id)  # a well-formed id: nothing else reaches the page
        except ValueError:
            raise ApiError(404, "not_found", f"no session {session_id}") from None
        token = request.query_params.get("token")
        if _presented(request) or token:
            # An old link's credential is checked (a refusal says so), but opens nothing here: the
            # page holds no data, and the redirect moves the credential where no server sees it.
            _recording_access(request, session_id, manager, presented=_presented(request) or token)
        if token:
            # Out of the address bar, the history and every later Referer (the fragment is never sent).
            location = f"/v1/sessions/{session_id}/viewer#token={quote(token, safe='')}"
            return Response(status_code=303, headers={"location": location, **VIEWER_HEADERS})
        page = viewer_page(session_id)
        return Response(page.body, media_type="text/html; charset=utf-8", headers=page.headers)

    @app.get("/v1/sessions/{session_id}/traffic")
    async def session_traffic(log_path: AuditLogDep, wanted: FilterDep) -> Response:
        """The audit records, as JSON Lines exactly as the proxy wrote them (so `verify` still holds
        for an unfiltered download)."""
        lines = await asyncio.to_thread(_filtered_lines, log_path, wanted)
        return Response(b"".join(lines), media_type="application/jsonl")

    @app.get("/v1/sessions/{session_id}/traffic.anchors")
    async def session_anchors(session_id: str, log_path: AuditLogDep, manager: ManagerDep) -> Response:
        """The gateway's keyed anchors of the audit chain, as stored (each one's MAC checked first), for
        `corral audit verify`: they show a log cut short or rewritten, which the chain alone cannot."""
        assert manager.egress is not None  # audit_log answered 404 otherwise
        try:
            body = await asyncio.to_thread(manager.egress.anchors.text, session_id)
        except ValueError as exc:
            raise ApiError(500, "audit_anchors_invalid", str(exc)) from None
        return Response(body, media_type="application/jsonl")

    @app.get("/v1/sessions/{session_id}/traffic.har")
    async def session_har(log_path: AuditLogDep, wanted: FilterDep) -> Any:
        records = await asyncio.to_thread(lambda: list(wanted.apply(_records(log_path))))
        return traffic.to_har(records, creator_version=_version())

    @app.post("/v1/sessions/{session_id}/actions")
    async def session_action(request: Request, session: SessionDep, m: MetricsDep) -> Response:
        body = await read_capped(request, MAX_ACTION_BODY)
        if body is None:
            raise ApiError(413, "message_too_large", f"the body exceeds {MAX_ACTION_BODY} bytes")
        session.touch()
        started = time.perf_counter()
        session.in_flight += 1
        try:
            upstream = await controller.request(
                request.app.state.http,
                session.sandbox.base_url,
                session.sandbox.secret,
                "POST",
                "/v1/actions",
                content=body,
                headers={"content-type": "application/json"},
            )
        except httpx.HTTPError as exc:
            raise ApiError(502, "sandbox_unreachable", f"the sandbox did not answer: {exc}") from None
        except UnprovenController as exc:
            raise ApiError(502, "controller_unproven", str(exc)) from None
        finally:
            session.in_flight -= 1
        m.action.labels(transport="http").observe(time.perf_counter() - started)
        if upstream.status_code >= 400:
            with suppress(ValueError, KeyError, TypeError):
                m.errors.labels(code=upstream.json()["error"]["code"]).inc()
        session.touch()
        return Response(upstream.content, status_code=upstream.status_code, media_type="application/json")

    @app.websocket("/v1/sessions/{session_id}/ws")
    async def session_ws(websocket: WebSocket, manager: ManagerDep, m: MetricsDep) -> None:
        try:
            session = session_access(websocket)
        except ApiError as exc:
            # Accept only to close with the reason: 4401/4403/4404 mirror the HTTP codes
            # (closing before accepting would surface as a bare HTTP 403).
            m.errors.labels(code=exc.code).inc()
            await websocket.accept()
            await websocket.close(code=4000 + exc.status, reason=exc.message[:120])
            return
        await websocket.accept()
        await relay(websocket, session, m, upstream_lost=lambda: manager.check_sandbox(session))

    return app


def _recording_access(
    request: Request, session_id: str, manager: SessionManager, presented: str | None = None
) -> RecordingManager:
    """The recordings, if this caller may read this session's: its owner's key, or its live token."""
    recordings = manager.recordings
    if recordings is None:
        raise ApiError(404, "not_found", "this gateway does not record sessions")
    presented = presented or _presented(request)
    ident = request.app.state.keys.check(presented or "")
    if ident is None:
        _session_for(request, presented)  # a live session's own token
        return recordings
    try:
        owner = recordings.owner(session_id)
    except ValueError:
        owner = None
    if owner is None:
        raise ApiError(404, "not_found", f"no recording of session {session_id}")
    if owner != ident:
        raise ApiError(403, "forbidden", "this session belongs to another API key")
    return recordings


def _declares_body(request: Request) -> bool:
    length = request.headers.get("content-length", "")
    return (length.isdigit() and int(length) > 0) or "transfer-encoding" in request.headers


def _document_bodies(app: FastAPI, bodies: dict[str, type[BaseModel]]) -> None:
    """The OpenAPI description of the bodies routes read themselves (after auth, capped)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for path_item in schema.get("paths", {}).values():
            for operation in path_item.values():
                model = bodies.get(str(operation.get("operationId", "")).split("_v1_")[0])
                if model is None:
                    continue
                model_schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(model_schema.pop("$defs", {}))
                components[model.__name__] = model_schema
                operation["requestBody"] = {
                    "required": True,
                    "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
                }
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def _after_seq(value: str) -> int:
    """``?after=``: a non-negative integer in plain digits (``int`` alone would take "+1", " 1", "1_0")."""
    if not (value.isascii() and value.isdigit() and len(value) <= 18):
        raise ApiError(400, "invalid_request", "after must be a non-negative integer (an event's seq)", "after")
    return int(value)


def _records(path: Path) -> list[dict[str, Any]]:
    try:
        return list(traffic.read_records(path)) if path.exists() else []
    except ValueError as exc:
        raise ApiError(500, "audit_log_unreadable", str(exc)) from None


def _filtered_lines(path: Path, wanted: traffic.TrafficFilter) -> list[bytes]:
    if not path.exists():
        return []
    out = []
    with path.open("rb") as log_file:
        for line in log_file:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                raise ApiError(500, "audit_log_unreadable", f"{path.name}: a line is not JSON") from None
            if wanted.matches(record):
                out.append(line if line.endswith(b"\n") else line + b"\n")
    return out


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("corral")
    except PackageNotFoundError:
        return "0"


__all__ = ["CorralError", "create_app"]
