"""What routes are given (FastAPI dependencies): the app's state, the settings, the :class:`Caller`,
the session in the path, and a request's JSON body read only after its credential passed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Generic, TypeVar

import httpx
from fastapi import Depends, Request
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.requests import HTTPConnection

from corral.bodies import read_capped
from corral.errors import MessageTooLarge, SessionNotFound, SessionPaused, Unauthorized
from corral.gateway import auth, links
from corral.gateway.auth import Caller, KeyRing
from corral.gateway.egress import EgressManager
from corral.gateway.metrics import Metrics
from corral.gateway.sessions import Session, SessionManager
from corral.gateway.settings import GatewaySettings

ModelT = TypeVar("ModelT", bound=BaseModel)


def _state(name: str) -> Callable[[HTTPConnection], Any]:
    """A dependency that gives the app's ``state.<name>``, as ``create_app`` and its lifespan set it."""

    def given(conn: HTTPConnection) -> Any:
        return getattr(conn.app.state, name)

    given.__name__ = f"state_{name}"
    return given


SettingsDep = Annotated[GatewaySettings, Depends(_state("settings"))]
ManagerDep = Annotated[SessionManager, Depends(_state("manager"))]
MetricsDep = Annotated[Metrics, Depends(_state("metrics"))]
KeysDep = Annotated[KeyRing, Depends(_state("keys"))]
HttpDep = Annotated[httpx.AsyncClient, Depends(_state("http"))]


def egress_archive(manager: ManagerDep) -> EgressManager | None:
    """The egress manager, whose archive (audit logs, anchors) the traffic routes read; None on a
    gateway without egress control (its sessions' egress is corral.gateway.sessions.egressport.NullEgress)."""
    egress = manager.egress
    return egress if isinstance(egress, EgressManager) else None


EgressArchiveDep = Annotated[EgressManager | None, Depends(egress_archive)]


def bearer(conn: HTTPConnection) -> str | None:
    """The credential of the ``Authorization`` header: the only place one is read from, but for the
    session token of a WebSocket upgrade (:func:`_ws_query_token`) and an old viewer link."""
    header = conn.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip()
    return None


def _ws_query_token(conn: HTTPConnection, keys: KeyRing) -> str | None:
    """``?token=`` on a WebSocket upgrade, the one request a browser cannot put a header on.

    A session token only: an address ends up in logs, histories and proxies, and a session token
    opens one session for its lifetime, where an API key opens every session of its owner for good.
    """
    if conn.scope["type"] != "websocket":
        return None
    token = conn.query_params.get("token")
    if token and keys.check(token) is not None:
        raise Unauthorized("?token= takes a session token; send an API key as a header")
    return token


def identify(presented: str | None, keys: KeyRing, manager: SessionManager) -> Caller:
    """Who ``presented`` is: an API key, a live session's token or viewer link, or nobody (every
    token or link compared)."""
    if not presented:
        return Caller()
    key_id = keys.check(presented)
    if key_id is not None:
        return Caller(key_id=key_id, presented=True)
    if links.looks_like_link(presented):
        return _link_caller(presented, manager)
    holders = [s.id for s in manager.list() if auth.token_matches(presented, s.record.token_sha256)]
    return Caller(session_id=holders[0] if holders else None, presented=True)


def _link_caller(presented: str, manager: SessionManager) -> Caller:
    """A viewer link's grant, and why it opens nothing when it does not (revoked, expired)."""
    found = [(s.id, link) for s in manager.list() if (link := links.match(presented, s.record.links.values()))]
    if not found:
        return Caller(presented=True)
    session_id, link = found[0]
    return Caller(presented=True, link=link.grant(session_id), link_refused=link.problem(manager.links.now()))


def note_expiry(who: Caller, manager: SessionManager) -> None:
    """An expired link presented: its ``expired`` audit record, the first time (on the event loop,
    where the report's task is kept: :func:`caller` itself may run in a worker thread)."""
    if who.link is not None and who.link_refused == links.EXPIRED:
        manager.links.expired(who.link.session_id, who.link.link_id)


def note_use(who: Caller, manager: SessionManager) -> None:
    """A link that was let read something: its use kept and reported (throttled; on the event loop,
    as :func:`note_expiry`)."""
    if who.link is not None and who.link_refused is None:
        manager.links.read(who.link.session_id, who.link.link_id)


def caller(conn: HTTPConnection, keys: KeysDep, manager: ManagerDep) -> Caller:
    """The request's caller; refused only by what it then asks for (see :class:`Caller`)."""
    return identify(bearer(conn) or _ws_query_token(conn, keys), keys, manager)


CallerDep = Annotated[Caller, Depends(caller)]


def api_key_id(who: CallerDep) -> str:
    return who.api_key()


def _opened(session_id: str, manager: SessionManager, opens: Callable[[str, str | None], None]) -> Session:
    """The live session ``session_id`` once ``opens`` (a :class:`Caller` check, given its owner or
    None when there is none) let the caller in."""
    try:
        session: Session | None = manager.get(session_id)
    except SessionNotFound:
        session = None
    opens(session_id, session.owner if session is not None else None)
    assert session is not None  # the check refused otherwise
    return session


def live_session(session_id: str, who: CallerDep, manager: ManagerDep) -> Session:
    """The live session in the path, for its owner's API key or its own session token."""
    return _opened(session_id, manager, who.open_live)


def viewed_session(session_id: str, who: CallerDep, manager: ManagerDep) -> Session:
    """The live session in the path, for what its viewer page reads: its owner's key, its own token
    or one of its viewer links (:meth:`Caller.open_view`)."""
    return _opened(session_id, manager, who.open_view)


def running_session(session_id: str, who: CallerDep, manager: ManagerDep) -> Session:
    """The live session in the path, as :func:`live_session`, with its sandbox: a paused one (or one
    pausing or resuming) is refused with SessionPaused (409)."""
    return refuse_paused(live_session(session_id, who, manager))


def refuse_paused(session: Session) -> Session:
    if session.paused:
        raise SessionPaused(
            f"session {session.id} is {session.state}: resume it first (POST /v1/sessions/{session.id}/resume)"
        )
    return session


KeyIdDep = Annotated[str, Depends(api_key_id)]
RunningSessionDep = Annotated[Session, Depends(running_session)]
LiveSessionDep = Annotated[Session, Depends(live_session)]
ViewedSessionDep = Annotated[Session, Depends(viewed_session)]


async def _json_body(request: Request, model: type[ModelT]) -> ModelT:
    """The request's JSON body as ``model``, never more than ``CORRAL_MAX_BODY_KB`` of it
    (Content-Length first, then as it streams)."""
    settings: GatewaySettings = request.app.state.settings
    limit = settings.max_body_kb << 10
    body = await read_capped(request, limit)
    if body is None:
        raise MessageTooLarge(f"the body exceeds {limit} bytes (CORRAL_MAX_BODY_KB)")
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        # Without the input: a refused body may hold a secret's value, and nothing here may keep it.
        raise RequestValidationError(exc.errors(include_url=False, include_input=False)) from None


class JsonBody(Generic[ModelT]):
    """A route's JSON body, not read yet: the route reads it (:meth:`read`) once its credential and
    its own checks passed, so an unauthenticated, refused or oversized body costs no parsing at all."""

    def __init__(self, request: Request, model: type[ModelT]) -> None:
        self._request = request
        self._model = model

    async def read(self) -> ModelT:
        return await _json_body(self._request, self._model)


class BodyOf(Generic[ModelT]):
    """The dependency that gives a route its :class:`JsonBody` of ``model``: the one way a route reads
    a JSON body, and where the OpenAPI description finds the body's schema (``create_app``)."""

    def __init__(self, model: type[ModelT]) -> None:
        self.model = model

    def __call__(self, request: Request) -> JsonBody[ModelT]:
        return JsonBody(request, self.model)


def body_of(model: type[ModelT]) -> Any:
    """``Depends`` on :class:`BodyOf` ``model``, for ``Annotated[JsonBody[Model], body_of(Model)]``."""
    return Depends(BodyOf(model))


def body_model(dependant: Dependant) -> type[BaseModel] | None:
    """The model of the JSON body a route (its ``dependant``) reads through :class:`BodyOf`, if any."""
    if isinstance(dependant.call, BodyOf):
        model: type[BaseModel] = dependant.call.model
        return model
    found = (body_model(sub) for sub in dependant.dependencies)
    return next((model for model in found if model is not None), None)
