"""The two ways Corral's MCP server is reached.

- :func:`serve_stdio` (:mod:`corral.mcp.stdio`, kept apart from the gateway's imports): ``corral mcp``,
  a subprocess of the MCP client speaking on stdin/stdout, which calls a gateway over HTTP with the
  CLI's URL and credential.
- :func:`mount`: ``/mcp`` on the gateway (Streamable HTTP), for the caller's own bearer (an API key
  or a session token), checked by the gateway's auth before the SDK parses a byte.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from fastapi import FastAPI
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.requests import HTTPConnection
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from corral.errors import CapacityError, MessageTooLarge
from corral.gateway.auth import Caller
from corral.gateway.routes.deps import bearer, identify
from corral.gateway.settings import GatewaySettings
from corral.mcp.access import ForwardedBearer
from corral.mcp.server import build_server
from corral.mcp.stdio import serve_stdio

PATH = "/mcp"
_LOOPBACK = ("127.0.0.1", "localhost", "[::1]")


def transport_security(settings: GatewaySettings) -> TransportSecuritySettings:
    """The SDK's DNS-rebinding guard (Host and Origin checked against an allowlist).

    A page in a browser on the gateway's host must not drive ``/mcp`` through a name it rebound to
    127.0.0.1: the loopback names (any port) are allowed, and the names in
    ``CORRAL_MCP_ALLOWED_HOSTS`` (the gateway's public names, with or without a port) beside them;
    ``*`` turns the check off, for a reverse proxy that owns the Host header. Browsers send
    ``Origin``; other clients do not, and a missing Origin passes.
    """
    names = [name.strip() for name in settings.mcp_allowed_hosts.split(",") if name.strip()]
    if "*" in names:
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    hosts = [*_LOOPBACK, *names]
    if settings.host not in ("0.0.0.0", "::", "", *_LOOPBACK):
        hosts.append(settings.host)
    allowed_hosts = [form for host in hosts for form in (host, f"{host}:*")]
    origins = [f"{scheme}://{form}" for scheme in ("http", "https") for form in allowed_hosts]
    return TransportSecuritySettings(allowed_hosts=allowed_hosts, allowed_origins=origins)


class McpEndpoint:
    """The SDK's Streamable HTTP app for the run of the gateway's lifespan under way.

    The SDK's session manager runs once per instance: each run of the lifespan builds its own server
    (a gateway's app served twice, as tests do, would otherwise fail to start the second time).
    """

    def __init__(self, app: FastAPI, settings: GatewaySettings) -> None:
        self._app = app
        self._settings = settings
        self._endpoint: ASGIApp | None = None
        self._sessions: StreamableHTTPSessionManager | None = None

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        settings = self._settings
        server = build_server(ForwardedBearer(self._app))
        endpoint = server.streamable_http_app(
            streamable_http_path=PATH,
            transport_security=transport_security(settings),
            max_request_body_size=settings.max_body_kb << 10,
            max_sessions=settings.mcp_max_sessions,
            session_idle_timeout=settings.mcp_session_idle_s,
        )
        async with server.session_manager.run():
            self._endpoint, self._sessions = endpoint, server.session_manager
            try:
                yield
            finally:
                self._endpoint = self._sessions = None

    def opened_by(self, identity: str) -> int:
        """How many of the open MCP sessions ``identity`` (:func:`identity_of`) opened."""
        if self._sessions is None:
            return 0
        # The SDK's own record of who opened each open session (the user it was given, mcp_user), kept
        # until the session ends however it ends (DELETE, idle, crash): nothing of ours to keep in step.
        owners = self._sessions._session_owners.values()
        return sum(1 for owner in owners if owner["client_id"] == identity)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._endpoint is None:
            raise RuntimeError("/mcp is served only while the gateway's lifespan runs")
        await self._endpoint(scope, receive, send)


class BearerGate:
    """``/mcp`` for a caller the gateway knows (an API key, a live session's token), else the
    gateway's own 401 before the body is read; a body declared over ``CORRAL_MAX_BODY_KB`` is its
    413 (one that grows past it as it streams is the SDK's 413); a new MCP session for a caller
    holding ``CORRAL_MCP_MAX_SESSIONS_PER_CALLER`` already is its 429 (``too_many_sessions``), so one
    credential cannot take every session the SDK allows (``CORRAL_MCP_MAX_SESSIONS``, its 503)."""

    def __init__(self, endpoint: McpEndpoint, max_body: int, per_caller: int) -> None:
        self._endpoint = endpoint
        self._max_body = max_body
        self._per_caller = per_caller
        # Sessions being opened (their opening request in flight), per caller: counted against the
        # cap with the open ones, so concurrent openings cannot overshoot it.
        self._opening: Counter[str] = Counter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        conn = HTTPConnection(scope)
        state = conn.app.state
        caller = identify(bearer(conn), state.keys, state.manager)
        caller.known()  # raises Unauthorized: the app's 401
        declared = conn.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self._max_body:
            raise MessageTooLarge(f"the body exceeds {self._max_body} bytes (CORRAL_MAX_BODY_KB)")
        # A copy: the SDK's Starlette app writes itself into the scope's "app", and the gateway's
        # error handlers read the gateway's state from it.
        forwarded = {**scope, "user": mcp_user(caller)}
        if scope["method"] != "POST" or MCP_SESSION_ID_HEADER in conn.headers:
            await self._endpoint(forwarded, receive, send)
            return
        identity = identity_of(caller)
        held = self._endpoint.opened_by(identity) + self._opening[identity]
        if held >= self._per_caller:
            raise CapacityError(
                f"this credential has {held} MCP sessions open, its limit (CORRAL_MCP_MAX_SESSIONS_PER_CALLER="
                f"{self._per_caller}): end one (DELETE /mcp with its Mcp-Session-Id) or let it go idle"
            )
        self._opening[identity] += 1
        try:
            await self._endpoint(forwarded, receive, send)
        finally:
            self._opening[identity] -= 1
            if self._opening[identity] <= 0:
                del self._opening[identity]


def identity_of(caller: Caller) -> str:
    """Who opened an MCP session, as the SDK compares it: the API key's id, or the session a token opens."""
    return f"key:{caller.key_id}" if caller.key_id is not None else f"session:{caller.session_id}"


def mcp_user(caller: Caller) -> AuthenticatedUser:
    """The SDK's user for ``caller``: the SDK ties each session to the user that opened it and answers
    any other credential's request on it (POST, GET stream, DELETE) as for a session that does not
    exist (404). The token itself is not kept: the tools forward the request's own header."""
    return AuthenticatedUser(AccessToken(token="", client_id=identity_of(caller), scopes=[]))


def mount(app: FastAPI, settings: GatewaySettings) -> None:
    """``/mcp`` on the gateway ``app``, its tools calling ``app``'s own routes in-process as the caller.

    A mounted app's lifespan never runs (the SDK's docs, "Add to an existing app"): the gateway's
    lifespan is wrapped to run the SDK's session manager for as long as the gateway runs.
    """
    endpoint = McpEndpoint(app, settings)
    gate = BearerGate(endpoint, settings.max_body_kb << 10, settings.mcp_max_sessions_per_caller)
    app.router.routes.append(Route(PATH, gate, include_in_schema=False))
    app.router.lifespan_context = _also_running(app.router.lifespan_context, endpoint.running)


def _also_running(
    lifespan: Callable[[Any], AbstractAsyncContextManager[Any]],
    also: Callable[[], AbstractAsyncContextManager[None]],
) -> Callable[[Any], AbstractAsyncContextManager[Any]]:
    @asynccontextmanager
    async def both(app: Any) -> AsyncIterator[Any]:
        async with lifespan(app) as state, also():
            yield state

    return both


__all__ = ["PATH", "BearerGate", "McpEndpoint", "mount", "serve_stdio", "transport_security"]
