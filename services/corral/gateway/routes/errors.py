"""The gateway's one table from exceptions to HTTP answers, and the handlers that answer with it.

Routes and the code under them raise what went wrong (corral.errors); only here does a class become
a status. Every answer has the one error body (:func:`corral.errors.error_body`), and a WebSocket
refused before it relays closes with ``4000 + status``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Final

from fastapi import FastAPI, Request, WebSocket
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from corral.errors import (
    AuditAnchorsInvalid,
    AuditLogUnreadable,
    CapacityError,
    CodedError,
    DownloadNotFound,
    DownloadTooLarge,
    DownloadUnavailable,
    EgressOff,
    EgressUnavailable,
    ErrorCode,
    ErrorDetail,
    FileAccessDenied,
    FileRefused,
    Forbidden,
    HeadersTooLarge,
    HermeticUnavailable,
    InvalidCursor,
    InvalidPath,
    InvalidRequest,
    IsADirectory,
    MessageTooLarge,
    NoSpace,
    NoSuchFile,
    NotADirectory,
    NotFound,
    NothingListening,
    NotOnThisRuntime,
    PausedCapacityError,
    PreviewBusy,
    PreviewGone,
    PreviewUnreachable,
    ProfileRefused,
    ProfilesOff,
    ProfileTooLarge,
    ProfileUnreadable,
    ReplayUnreadable,
    SandboxError,
    SandboxStartFailed,
    SandboxUnreachable,
    SecretsMissing,
    SessionNotPaused,
    SessionPaused,
    TemplateBuildFailed,
    TemplateInvalid,
    TemplateRefused,
    TemplateStale,
    TicketKeyUnusable,
    TooManyVolumes,
    Unauthorized,
    UnprovenController,
    UploadTooLarge,
    VolumeExists,
    VolumeInUse,
    error_body,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class HttpAnswer:
    status: int
    # Said instead of the exception's own text, which then goes to the gateway's log only.
    public_message: str | None = None


# Looked up along the exception's classes, the nearest first: a subclass answers as its own row says,
# else as its base's. The code is always the exception's (CodedError.code).
STATUS: Final[dict[type[CodedError], HttpAnswer]] = {
    InvalidCursor: HttpAnswer(400),
    InvalidPath: HttpAnswer(400),
    Unauthorized: HttpAnswer(401),
    Forbidden: HttpAnswer(403),
    FileAccessDenied: HttpAnswer(403),
    NotFound: HttpAnswer(404),
    NoSuchFile: HttpAnswer(404),
    HermeticUnavailable: HttpAnswer(409),
    EgressOff: HttpAnswer(409),
    VolumeInUse: HttpAnswer(409),
    VolumeExists: HttpAnswer(409),
    ProfilesOff: HttpAnswer(409),
    SessionPaused: HttpAnswer(409),
    SessionNotPaused: HttpAnswer(409),
    SecretsMissing: HttpAnswer(409),
    PausedCapacityError: HttpAnswer(429),
    NotADirectory: HttpAnswer(409),
    IsADirectory: HttpAnswer(409),
    MessageTooLarge: HttpAnswer(413),
    UploadTooLarge: HttpAnswer(413),
    DownloadTooLarge: HttpAnswer(413),
    ProfileTooLarge: HttpAnswer(413),
    InvalidRequest: HttpAnswer(422),
    ReplayUnreadable: HttpAnswer(422),
    TemplateInvalid: HttpAnswer(422),
    TemplateBuildFailed: HttpAnswer(422),
    TemplateRefused: HttpAnswer(422),
    TemplateStale: HttpAnswer(409),
    ProfileRefused: HttpAnswer(422),
    CapacityError: HttpAnswer(429),
    PreviewBusy: HttpAnswer(429),
    PreviewGone: HttpAnswer(410),
    DownloadNotFound: HttpAnswer(404),
    DownloadUnavailable: HttpAnswer(409),
    HeadersTooLarge: HttpAnswer(431),
    NothingListening: HttpAnswer(502),
    PreviewUnreachable: HttpAnswer(502),
    TooManyVolumes: HttpAnswer(429),
    AuditLogUnreadable: HttpAnswer(500),
    AuditAnchorsInvalid: HttpAnswer(500),
    ProfileUnreadable: HttpAnswer(500),
    FileRefused: HttpAnswer(500),
    TicketKeyUnusable: HttpAnswer(500, "the gateway cannot sign CDP tickets; see the gateway log"),
    SandboxUnreachable: HttpAnswer(502),
    NotOnThisRuntime: HttpAnswer(501),
    UnprovenController: HttpAnswer(502),
    EgressUnavailable: HttpAnswer(503),
    SandboxStartFailed: HttpAnswer(503, "the sandbox did not start; see the gateway log"),
    NoSpace: HttpAnswer(507),
    SandboxError: HttpAnswer(500, "the sandbox runtime failed; see the gateway log"),
    CodedError: HttpAnswer(500),
}
# A refusal of these leaves the request's body unread (credentials and size come first).
_UNREAD = frozenset({401, 403, 413})
_HTTP_CODES: Final[dict[int, ErrorCode]] = {404: ErrorCode.NOT_FOUND, 405: ErrorCode.METHOD_NOT_ALLOWED}


def answer_for(exc: CodedError) -> HttpAnswer:
    for cls in type(exc).__mro__:
        answer = STATUS.get(cls)
        if answer is not None:
            return answer
    return STATUS[CodedError]


def public_error(exc: CodedError) -> ErrorDetail:
    """The ``error`` member the caller sees (the exception's, or the table's words instead)."""
    answer = answer_for(exc)
    if answer.public_message is None:
        return exc.to_dict()
    log.error("%s: %s", type(exc).__name__, exc)
    return {"code": str(exc.code), "message": answer.public_message}


async def close_refused(websocket: WebSocket, exc: CodedError) -> None:
    """Close an accepted WebSocket that was refused before it relayed: ``4000 + status``, the error's
    message as the reason (4401/4403/4404 mirror the HTTP codes), counted as an error."""
    error = public_error(exc)
    websocket.app.state.metrics.errors.labels(code=error["code"]).inc()
    await websocket.close(code=4000 + answer_for(exc).status, reason=error["message"][:120])


async def _coded(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, CodedError)
    status = answer_for(exc).status
    error = public_error(exc)
    request.app.state.metrics.errors.labels(code=error["code"]).inc()
    # A refused request's body stays unread: closing the connection after the answer stops the
    # server from taking in (and the client from sending) the rest of it.
    headers = {"connection": "close"} if status in _UNREAD and _declares_body(request) else None
    return JSONResponse(
        error_body(error["code"], error["message"], error.get("field")), status_code=status, headers=headers
    )


async def _invalid(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0]
    # "[key]": pydantic's mark of a dict's key (a secret's name) that failed, after the key itself.
    loc = [str(part) for part in first.get("loc", ()) if part not in ("body", "[key]")]
    request.app.state.metrics.errors.labels(code=ErrorCode.INVALID_REQUEST).inc()
    body = error_body(ErrorCode.INVALID_REQUEST, str(first.get("msg")), ".".join(loc) or None)
    return JSONResponse(body, status_code=422)


async def _http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = _HTTP_CODES.get(exc.status_code, ErrorCode.HTTP_ERROR)
    return JSONResponse(error_body(code, str(exc.detail)), status_code=exc.status_code)


def install(app: FastAPI) -> None:
    """Answer every error of ``app`` from the table (and FastAPI's own: validation, routing)."""
    app.add_exception_handler(CodedError, _coded)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(StarletteHTTPException, _http)


def _declares_body(request: Request) -> bool:
    length = request.headers.get("content-length", "")
    return (length.isdigit() and int(length) > 0) or "transfer-encoding" in request.headers
