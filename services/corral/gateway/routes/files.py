"""A session's files over HTTP: ``PUT`` and ``GET /v1/sessions/{id}/files?path=...``, streamed through
to its controller's ``/v1/files`` (written and read there as the agent).

Neither way is buffered whole: the upload is passed on chunk by chunk as it arrives (the server stops
reading from the client while the controller is slow), the download likewise, so the gateway's memory
stays flat whatever the size. An upload over ``CORRAL_MAX_UPLOAD_BYTES`` is refused with 413: at once
when its Content-Length says so (the controller is never called), else the moment the stream passes
the cap, by cutting the body to the controller short; the controller keeps a file only once a whole
body came (it writes a temporary file and renames it at the end), so nothing is left behind.

A download over ``CORRAL_MAX_DOWNLOAD_BYTES`` is refused with 413 by the controller when its size is
known (a file's apparent size, a directory's by ``du``: sparse files whole, hard links once), and,
since the sandbox may lie or the files grow meanwhile, the gateway counts the bytes it relays: past the
cap it aborts the stream (no clean end: the client sees it cut) having sent no more than the cap. The
answer names the cap in ``X-Corral-Max-Download-Bytes``, so a client that meets the cut knows it for
the cap's (``too_large``) and keeps nothing.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Final

import httpx
from fastapi import APIRouter, Request, Response
from starlette.requests import ClientDisconnect

from corral.bodies import ClosingStream
from corral.errors import (
    CodedError,
    DownloadTooLarge,
    ErrorCode,
    FileAccessDenied,
    FileRefused,
    InvalidPath,
    InvalidRequest,
    IsADirectory,
    NoSpace,
    NoSuchFile,
    NotADirectory,
    SandboxUnreachable,
    StreamAborted,
    UploadTooLarge,
)
from corral.gateway import controller
from corral.gateway.routes.deps import HttpDep, RunningSessionDep, SettingsDep
from corral.gateway.sessions.records import Session

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/sessions/{session_id}", tags=["files"])

CONTROLLER_FILES = "/v1/files"
# The answer's header that names the download cap: a stream cut after this many bytes was cut for it.
MAX_DOWNLOAD_HEADER = "x-corral-max-download-bytes"
# What of the controller's answer to a download is passed on (the rest is hop-by-hop or its own proof).
_PASSED_HEADERS: Final = ("content-type", "content-length", "content-disposition", "last-modified")
# The controller's refusal, by its code, as the gateway's own (its status from the one table).
_REFUSALS: Final[dict[str, type[CodedError]]] = {
    ErrorCode.NO_SUCH_FILE: NoSuchFile,
    ErrorCode.PERMISSION_DENIED: FileAccessDenied,
    ErrorCode.NOT_A_DIRECTORY: NotADirectory,
    ErrorCode.IS_A_DIRECTORY: IsADirectory,
    ErrorCode.INVALID_FIELD: InvalidPath,
    ErrorCode.NO_SPACE: NoSpace,
    ErrorCode.TOO_LARGE: UploadTooLarge,
    ErrorCode.FILE_FAILED: FileRefused,
}


def refusal(status: int, body: bytes, too_large: type[CodedError] = UploadTooLarge) -> CodedError:
    """The controller's error answer (the one error body) as the gateway's exception, by its code
    (``too_large`` as the direction's own class)."""
    try:
        error = json.loads(body)["error"]
        code, message, field = str(error["code"]), str(error["message"]), error.get("field")
    except (ValueError, KeyError, TypeError):
        return FileRefused(f"the sandbox answered {status} without an error body")
    cls = too_large if code == ErrorCode.TOO_LARGE else _REFUSALS.get(code)
    if cls is None:
        return FileRefused(f"{code}: {message}", field)
    return cls(message, field)


def passed_on(status: int, body: bytes) -> Response | None:
    """The controller's ``control_taken`` (409: a human holds the session; it names the holder and
    since when) passed on as it answered, as the actions route passes it on; None for anything else."""
    try:
        code = json.loads(body)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None
    if status != 409 or code != ErrorCode.CONTROL_TAKEN:
        return None
    return Response(body, status_code=status, media_type="application/json")


def controller_params(query: Mapping[str, str]) -> dict[str, str]:
    """The query the controller is given (it checks each): ``path`` or ``path_base64`` (a name that is
    not UTF-8), and ``make_dirs``, ``mode`` and ``wait_for_control_ms`` where present."""
    names = ("path", "path_base64", "make_dirs", "mode", "wait_for_control_ms")
    params = {name: query[name] for name in names if name in query}
    if "path" not in params and "path_base64" not in params:
        raise InvalidRequest("give ?path= (or ?path_base64=)", field="path")
    return params


def declared_length(request: Request) -> int | None:
    value = request.headers.get("content-length", "")
    return int(value) if value.isascii() and value.isdigit() else None


async def _capped(request: Request, limit: int, too_large: UploadTooLarge) -> AsyncIterator[bytes]:
    """The request's body as it arrives; raises ``too_large`` once it passes ``limit`` (out of the
    controller's request, which is then cut short)."""
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        if chunk:
            yield chunk


def _download_too_large(limit: int) -> DownloadTooLarge:
    return DownloadTooLarge(f"a download is limited to {limit} bytes (CORRAL_MAX_DOWNLOAD_BYTES)", "path")


async def _counted(chunks: AsyncIterator[bytes], limit: int, session_id: str) -> AsyncIterator[bytes]:
    """``chunks`` passed on as they come, counted: the bytes up to ``limit`` are sent, then the stream
    is aborted (raised out of the response, which then never sends its clean end; the response's close
    then drops the controller's connection, so the sandbox stops at once)."""
    sent = 0
    async for chunk in chunks:
        room = limit - sent
        if len(chunk) > room:
            if room:
                yield chunk[:room]
            log.warning("session %s: a download passed the cap of %d bytes; cut", session_id, limit)
            # Not a CodedError: the answer has begun, so no error body can follow; the server aborts it.
            raise StreamAborted(f"the download passed the cap of {limit} bytes (CORRAL_MAX_DOWNLOAD_BYTES)")
        sent += len(chunk)
        yield chunk


@contextlib.asynccontextmanager
async def _in_flight(session: Session) -> AsyncIterator[None]:
    """A transfer is activity, however long it takes (the idle reaper skips sessions in flight)."""
    session.touch()
    session.in_flight += 1
    try:
        yield
    finally:
        session.in_flight -= 1
        session.touch()


@router.put("/files")
async def upload_file(
    request: Request, session: RunningSessionDep, settings: SettingsDep, http: HttpDep, path: str | None = None
) -> Response:
    """The raw body written to ``path`` in the sandbox (``make_dirs=1``, ``mode=0644`` optional).
    (``path`` is named here for the API's description; the query goes to the controller, which checks it.)"""
    params = controller_params(request.query_params)
    limit = settings.max_upload_bytes
    too_large = UploadTooLarge(f"an upload is limited to {limit} bytes (CORRAL_MAX_UPLOAD_BYTES)")
    length = declared_length(request)
    if length is not None and length > limit:
        raise too_large
    headers = {"content-type": "application/octet-stream"}
    if length is not None:  # the controller then knows a body cut short for what it is
        headers["content-length"] = str(length)
    async with _in_flight(session):
        try:
            upstream = await controller.request(
                http,
                session.sandbox.base_url,
                session.sandbox.secret,
                "PUT",
                CONTROLLER_FILES,
                params=params,
                content=_capped(request, limit, too_large),
                headers=headers,
            )
        except httpx.HTTPError as exc:
            raise SandboxUnreachable(f"the sandbox did not answer: {exc}") from None
        except ClientDisconnect:
            # The client left mid-upload: the controller's body was cut short with it (so nothing is
            # kept there), and no one is left to read an answer.
            return Response(status_code=400)
    if upstream.status_code >= 400:
        taken = passed_on(upstream.status_code, upstream.content)
        if taken is not None:
            return taken
        raise refusal(upstream.status_code, upstream.content)
    return Response(upstream.content, status_code=upstream.status_code, media_type="application/json")


@router.get("/files")
async def download_file(
    request: Request, session: RunningSessionDep, settings: SettingsDep, http: HttpDep, path: str | None = None
) -> Response:
    """The file's bytes, or a directory as a tar stream, as the controller sends them, up to
    ``CORRAL_MAX_DOWNLOAD_BYTES`` (refused over it when the size is known, else cut there)."""
    limit = settings.max_download_bytes
    params = {**controller_params(request.query_params), "max_bytes": str(limit)}
    stack = contextlib.AsyncExitStack()
    await stack.enter_async_context(_in_flight(session))
    try:
        upstream = await stack.enter_async_context(
            controller.stream(
                http,
                session.sandbox.base_url,
                session.sandbox.secret,
                "GET",
                CONTROLLER_FILES,
                params=params,
            )
        )
        if upstream.status_code >= 400:
            answer = await upstream.aread()
            taken = passed_on(upstream.status_code, answer)
            if taken is not None:
                await stack.aclose()
                return taken
            raise refusal(upstream.status_code, answer, DownloadTooLarge)
        length = upstream.headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:  # a controller that did not check: nothing sent
            raise _download_too_large(limit)
    except httpx.HTTPError as exc:
        await stack.aclose()
        raise SandboxUnreachable(f"the sandbox did not answer: {exc}") from None
    except BaseException:
        await stack.aclose()
        raise
    headers = {name: upstream.headers[name] for name in _PASSED_HEADERS if name in upstream.headers}
    headers[MAX_DOWNLOAD_HEADER] = str(limit)
    body = _counted(upstream.aiter_raw(), limit, session.id)
    return ClosingStream(body, stack.aclose, status_code=upstream.status_code, headers=headers)


__all__ = ["MAX_DOWNLOAD_HEADER", "refusal", "router"]
