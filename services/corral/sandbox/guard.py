"""The controller's door: an ASGI middleware in front of every route.

A web page the agent opens can reach the sandbox's loopback (Chromium counts a page served through
the proxy as a private-network origin), and ``fetch(..., {mode: "no-cors"})`` needs no CORS consent
to *send*. So, in this order:

1. anything a browser sends (an ``Origin`` or any ``Sec-Fetch-*`` header) is refused, 403;
2. a request without a valid ``x-corral-auth`` (see :mod:`corral.contracts.auth`) is refused, 401,
   except ``GET /healthz``, which reveals nothing and serves Docker's health check;
3. a request with a body (POST, PUT, PATCH) not declared ``application/json`` is refused, 415 (no
   "simple" request of a form or a no-cors fetch can declare it); the one route that takes raw bytes,
   ``PUT /v1/files``, must declare ``application/octet-stream`` instead (not a type a form or a
   no-cors fetch sends either, and PUT needs a CORS preflight that nothing here answers);
4. every answer to an authenticated request carries the controller's proof for its nonce.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from corral.contracts.auth import AUTH_HEADER, PROOF_HEADER, RequestVerifier, prove
from corral.errors import ErrorCode, error_body

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/healthz"})
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
# (method, path) → the media type its body must have, where it is not JSON.
RAW_BODY_ROUTES = {("PUT", "/v1/files"): "application/octet-stream"}


def browser_marks(headers: dict[str, str]) -> list[str]:
    """The headers that say a browser sent this request (empty for the gateway's own clients)."""
    return sorted(name for name in headers if name == "origin" or name.startswith("sec-fetch-"))


def required_media(method: str, path: str) -> str | None:
    """The media type a request's body must declare (None: a request without a body)."""
    if method not in BODY_METHODS:
        return None
    return RAW_BODY_ROUTES.get((method, path), "application/json")


def _media(value: str) -> str:
    return value.split(";", 1)[0].strip().lower()


class ControllerGuard:
    def __init__(self, app: ASGIApp, verifier: Callable[[], RequestVerifier | None]) -> None:
        self._app = app
        # A callable: the secret is read when the app starts, after the middleware is built.
        self._verifier = verifier

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self._app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        marks = browser_marks(headers)
        if marks:
            log.warning("refused a browser's request to %s (%s)", scope.get("path"), ", ".join(marks))
            await _refuse(scope, send, 403, ErrorCode.FORBIDDEN, "the controller does not answer browsers")
            return
        verifier = self._verifier()
        nonce: str | None = None
        value = headers.get(AUTH_HEADER)
        if value is not None and verifier is not None:
            try:
                nonce = verifier.verify(value)
            except ValueError as exc:
                await _refuse(scope, send, 401, ErrorCode.UNAUTHORIZED, str(exc))
                return
        if nonce is None and scope.get("path") not in OPEN_PATHS:
            reason = "no controller secret was loaded" if verifier is None else f"{AUTH_HEADER} is required"
            await _refuse(scope, send, 401, ErrorCode.UNAUTHORIZED, reason)
            return
        media = required_media(scope.get("method", ""), scope.get("path", "")) if scope["type"] == "http" else None
        if media is not None and _media(headers.get("content-type", "")) != media:
            await _refuse(scope, send, 415, ErrorCode.UNSUPPORTED_MEDIA_TYPE, f"the body must be {media}")
            return
        if nonce is None or verifier is None:
            await self._app(scope, receive, send)
            return
        proof = (PROOF_HEADER.encode(), prove(verifier.secret, nonce).encode())

        async def send_with_proof(message: Message) -> None:
            # A refused upgrade (websocket.http.response.start) proves itself too: the gateway passes
            # a CDP connection's 409 on only when it is the controller's.
            if message["type"] in ("http.response.start", "websocket.accept", "websocket.http.response.start"):
                message = {**message, "headers": [*message.get("headers", []), proof]}
            await send(message)

        await self._app(scope, receive, send_with_proof)


async def _refuse(scope: Scope, send: Send, status: int, code: ErrorCode, message: str) -> None:
    body = json.dumps(error_body(code, message)).encode()
    if scope["type"] == "websocket":
        if "websocket.http.response" not in scope.get("extensions", {}):
            await send({"type": "websocket.close", "code": 1008, "reason": message[:120]})  # the server says 403
            return
        # Before the handshake is accepted: the server answers the upgrade with an HTTP error.
        await send({"type": "websocket.http.response.start", "status": status, "headers": _json_headers(body)})
        await send({"type": "websocket.http.response.body", "body": body})
        return
    await send({"type": "http.response.start", "status": status, "headers": _json_headers(body)})
    await send({"type": "http.response.body", "body": body})


def _json_headers(body: bytes) -> list[tuple[bytes, bytes]]:
    return [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
