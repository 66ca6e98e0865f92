"""A session's browser downloads (docs/downloads.md): ``GET /v1/sessions/{id}/downloads`` (every
download: corral.protocol.downloads.DownloadList) and ``GET .../downloads/{download_id}`` (its bytes,
streamed), with the owner's API key or the session's token.

The controller's answers are the sandbox's word: the list is read bounded and validated whole
against the model (names made safe, counts bounded) before it is passed on; the bytes are counted
and cut at the length the controller announced and at ``CORRAL_DOWNLOAD_MAX_FILE_MB``. The answer's
``Content-Type`` is the listed MIME type, its ``Content-Disposition`` always an attachment under a
safe name, with ``nosniff`` and a sandboxing CSP, so no browser renders a sandbox-made file as the
gateway's page. Each fetch is a ``download`` record (``fetched``) in the session's audit chain.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Final

import httpx
from fastapi import APIRouter, Response
from pydantic import ValidationError

from corral.bodies import ClosingStream
from corral.contracts.actors import AGENT
from corral.contracts.control import DownloadEvent
from corral.contracts.downloads import content_disposition, id_problem
from corral.errors import (
    CodedError,
    CorralError,
    DownloadNotFound,
    DownloadUnavailable,
    ErrorCode,
    SandboxError,
    SandboxUnreachable,
)
from corral.gateway import controller
from corral.gateway.auth import OWNER_ACTOR
from corral.gateway.routes.deps import CallerDep, HttpDep, ManagerDep, RunningSessionDep, SettingsDep
from corral.gateway.routes.files import _counted, _in_flight, passed_on
from corral.gateway.sessions.egressport import EgressPort
from corral.gateway.sessions.records import Session
from corral.protocol.downloads import Download, DownloadList

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/sessions/{session_id}", tags=["downloads"])

CONTROLLER_DOWNLOADS = "/v1/downloads"
MAX_LIST_BYTES: Final = 8 << 20  # a thousand records at their bounds fit well within this
_REFUSALS: Final[dict[str, type[CodedError]]] = {
    ErrorCode.NO_SUCH_DOWNLOAD: DownloadNotFound,
    ErrorCode.DOWNLOAD_UNAVAILABLE: DownloadUnavailable,
}


def refusal(status: int, body: bytes) -> CodedError:
    """The controller's error answer as the gateway's exception, by its code."""
    try:
        error = json.loads(body)["error"]
        code, message, field = str(error["code"]), str(error["message"])[:1024], error.get("field")
    except (ValueError, KeyError, TypeError):
        return SandboxError(f"the sandbox answered {status} without an error body")
    cls = _REFUSALS.get(code)
    return cls(message, field) if cls is not None else SandboxError(f"{code}: {message}")


def listing_of(body: bytes) -> DownloadList:
    """The controller's list, validated whole (``ok`` aside); anything else is the sandbox's fault."""
    if len(body) > MAX_LIST_BYTES:
        raise SandboxError(f"the sandbox's list of downloads is over {MAX_LIST_BYTES} bytes")
    try:
        given = json.loads(body)
        if not isinstance(given, dict):
            raise ValueError("not an object")
        given.pop("ok", None)
        return DownloadList.model_validate(given)
    except (ValueError, ValidationError) as exc:
        raise SandboxError(f"the sandbox's list of downloads does not read: {str(exc)[:300]}") from None


@router.get("/downloads")
async def list_downloads(session: RunningSessionDep, http: HttpDep) -> DownloadList:
    """Every download of the session's browser, oldest first, with the caps (the owner's key or the
    session's token)."""
    try:
        answer = await controller.request(
            http, session.sandbox.base_url, session.sandbox.secret, "GET", CONTROLLER_DOWNLOADS
        )
    except httpx.HTTPError as exc:
        raise SandboxUnreachable(f"the sandbox did not answer: {exc}") from None
    if answer.status_code >= 400:
        raise refusal(answer.status_code, answer.content)
    return listing_of(answer.content)


@router.get("/downloads/{download_id}")
async def get_download(
    download_id: str,
    session: RunningSessionDep,
    who: CallerDep,
    manager: ManagerDep,
    settings: SettingsDep,
    http: HttpDep,
) -> Response:
    """One download's bytes (it must be ``completed``): ``no_such_download`` (404) for an id the session
    has not, ``download_unavailable`` (409) for one with no whole file."""
    problem = id_problem(download_id)
    if problem is not None:
        raise DownloadNotFound(problem)
    stack = contextlib.AsyncExitStack()
    await stack.enter_async_context(_in_flight(session))
    try:
        record = await _record(http, session, download_id)
        upstream = await stack.enter_async_context(
            controller.stream(
                http, session.sandbox.base_url, session.sandbox.secret, "GET", f"{CONTROLLER_DOWNLOADS}/{download_id}"
            )
        )
        if upstream.status_code >= 400:
            answer = await upstream.aread()
            taken = passed_on(upstream.status_code, answer)
            if taken is not None:
                await stack.aclose()
                return taken
            raise refusal(upstream.status_code, answer)
        length = upstream.headers.get("content-length", "")
        if not length.isdigit():
            raise SandboxError("the sandbox sent a download without its length")
    except httpx.HTTPError as exc:
        await stack.aclose()
        raise SandboxUnreachable(f"the sandbox did not answer: {exc}") from None
    except BaseException:
        await stack.aclose()
        raise
    # The least of what the controller announced, what the record counted and the cap: never more.
    size = min(int(length), record.size, settings.download_max_file_mb << 20)
    fetch = Fetch(manager.egress, session, record, OWNER_ACTOR if who.key_id is not None else AGENT)
    stack.push_async_callback(fetch.report)
    headers = {
        "content-length": str(size),
        "content-disposition": content_disposition(record.name),
        "x-content-type-options": "nosniff",
        "content-security-policy": "sandbox; default-src 'none'",
        "cache-control": "no-store",
    }
    body = fetch.counted(_counted(upstream.aiter_raw(), size, session.id))
    return ClosingStream(body, stack.aclose, media_type=_media(record.mime_type), headers=headers)


async def _record(http: httpx.AsyncClient, session: Session, download_id: str) -> Download:
    """The download's record as the list names it (its name and type are the list's, validated, never
    the controller's headers)."""
    answer = await controller.request(
        http, session.sandbox.base_url, session.sandbox.secret, "GET", CONTROLLER_DOWNLOADS
    )
    if answer.status_code >= 400:
        raise refusal(answer.status_code, answer.content)
    for record in listing_of(answer.content).downloads:
        if record.id == download_id:
            return record
    raise DownloadNotFound(f"no download {download_id!r} in session {session.id}")


def _media(mime: str) -> str:
    """A MIME type fit for the header (a listed one is type/subtype of token characters; else bytes)."""
    kind, _, sub = mime.partition("/")
    fits = bool(kind and sub) and all(ch.isalnum() or ch in "!#$&^_.+-" for ch in kind + sub)
    return mime if fits else "application/octet-stream"


class Fetch:
    """One fetch's bytes as they go, and its audit record once the response ends (however it ends)."""

    def __init__(self, egress: EgressPort, session: Session, record: Download, actor: str) -> None:
        self._egress, self._session, self._record, self._actor = egress, session, record, actor
        self.sent = 0

    async def counted(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        async for chunk in chunks:
            self.sent += len(chunk)
            yield chunk

    async def report(self) -> None:
        """``download`` ``fetched`` in the session's audit chain (none without egress control); a lost
        report is logged, the fetch already happened."""
        if self._session.egress is None:
            return
        record = self._record
        event = DownloadEvent("fetched", record.id, record.name, record.url[:4096], self.sent, self._actor)
        try:
            await self._egress.report(self._session.egress, event)
        except CorralError as exc:
            log.warning("session %s: the fetch of download %s was not audited: %s", self._session.id, record.id, exc)


__all__ = ["Fetch", "listing_of", "refusal", "router"]
