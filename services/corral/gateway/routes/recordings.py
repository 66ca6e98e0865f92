"""Recordings: ``/v1/recordings``, a session's bundle, its events and frames, and the viewer page."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import FileResponse
from starlette.background import BackgroundTask

from corral.errors import InvalidCursor, NotFound
from corral.gateway.auth import Caller
from corral.gateway.recording import RecordingManager
from corral.gateway.routes.deps import (
    CallerDep,
    KeyIdDep,
    KeysDep,
    ManagerDep,
    bearer,
    identify,
    live_session,
    note_expiry,
    note_use,
    viewed_session,
)
from corral.gateway.sessions import SessionManager
from corral.gateway.viewer import VIEWER_HEADERS, viewer_page

router = APIRouter(tags=["recordings"])


def _recordings(manager: SessionManager) -> RecordingManager:
    if manager.recordings is None:
        raise NotFound("this gateway does not record sessions")
    return manager.recordings


def _open_recording(session_id: str, who: Caller, manager: SessionManager, viewer: bool = False) -> RecordingManager:
    """The recordings, if this caller may read this session's: its owner's key, or its live token;
    for what the viewer page reads (``viewer``), one of the live session's viewer links too."""
    recordings = _recordings(manager)
    if viewer and who.link is not None:
        viewed_session(session_id, who, manager)
        return recordings
    if who.key_id is None:
        live_session(session_id, who, manager)  # a live session's own token
        return recordings
    try:
        owner = recordings.owner(session_id)
    except ValueError:
        owner = None
    who.open_kept(owner, f"no recording of session {session_id}")
    return recordings


def session_recordings(session_id: str, who: CallerDep, manager: ManagerDep) -> RecordingManager:
    return _open_recording(session_id, who, manager)


async def viewer_recordings(session_id: str, who: CallerDep, manager: ManagerDep) -> RecordingManager:
    note_expiry(who, manager)
    recordings = _open_recording(session_id, who, manager, viewer=True)
    note_use(who, manager)
    return recordings


RecordingsDep = Annotated[RecordingManager, Depends(session_recordings)]
# What the viewer page reads (events, frames): a viewer link of the live session opens them too.
ViewerRecordingsDep = Annotated[RecordingManager, Depends(viewer_recordings)]


@router.get("/v1/recordings")
async def list_recordings(key_id: KeyIdDep, manager: ManagerDep) -> Any:
    """The key's recordings, live and ended (read from their manifests, not their events)."""
    recordings = manager.recordings
    return [] if recordings is None else await asyncio.to_thread(recordings.listing, key_id)


@router.get("/v1/sessions/{session_id}/recording")
async def session_recording(session_id: str, recordings: RecordingsDep) -> Response:
    """The session's recording bundle as a .zip (live or ended; docs/recording.md)."""
    # Built in a temporary file, not in memory: a long session's bundle can be large.
    spool = tempfile.NamedTemporaryFile(prefix="corral-bundle-", suffix=".zip", delete=False)  # noqa: SIM115
    try:
        with spool:
            await asyncio.to_thread(recordings.zip, session_id, spool)
    except BaseException as exc:
        await asyncio.shield(asyncio.to_thread(Path(spool.name).unlink, missing_ok=True))
        if isinstance(exc, OSError | ValueError):
            raise NotFound(f"no recording of session {session_id}") from None
        raise
    return FileResponse(
        spool.name,
        media_type="application/zip",
        filename=f"{session_id}.zip",
        background=BackgroundTask(Path(spool.name).unlink, missing_ok=True),
    )


@router.get("/v1/sessions/{session_id}/recording/events")
async def recording_events(session_id: str, recordings: ViewerRecordingsDep, after: str = "0") -> Any:
    """``{"events": [...], "ended": bool}``: the events with ``seq > after``, and whether more can come."""
    return await asyncio.to_thread(recordings.events, session_id, _after_seq(after))


@router.get("/v1/sessions/{session_id}/recording/frames/{name}")
async def recording_frame(session_id: str, name: str, recordings: ViewerRecordingsDep) -> Response:
    try:
        data = await asyncio.to_thread(recordings.frame, session_id, name)
    except (OSError, ValueError):
        raise NotFound(f"no frame {name}") from None
    # The viewer sends its credential as a header, so the browser's cache must key on it too.
    headers = {"cache-control": "private, max-age=3600", "vary": "authorization"}
    return Response(data, media_type="image/webp", headers=headers)


@router.get("/v1/sessions/{session_id}/viewer")
async def recording_viewer(request: Request, session_id: str, keys: KeysDep, manager: ManagerDep) -> Response:
    """A page to watch a session, live or recorded: timeline, actions, their network requests.

    Opened as ``viewer#token=<key or token>``: a browser sends no credential when it navigates,
    so the page is served to anyone (it holds nothing but the session id) and reads the
    recording with the fragment's credential as a header. A credential that does come (an old
    ``?token=`` link, a header) is checked here, and an old link is sent on to the fragment form.
    """
    try:
        _recordings(manager).directory(session_id)  # a well-formed id: nothing else reaches the page
    except ValueError:
        raise NotFound(f"no session {session_id}") from None
    token = request.query_params.get("token")
    presented = bearer(request) or token
    if presented:
        # An old link's credential is checked (a refusal says so), but opens nothing here: the
        # page holds no data, and the redirect moves the credential where no server sees it.
        who = identify(presented, keys, manager)
        note_expiry(who, manager)
        _open_recording(session_id, who, manager, viewer=True)
    if token:
        # Out of the address bar, the history and every later Referer (the fragment is never sent).
        location = f"/v1/sessions/{session_id}/viewer#token={quote(token, safe='')}"
        return Response(status_code=303, headers={"location": location, **VIEWER_HEADERS})
    page = viewer_page(session_id)
    return Response(page.body, media_type="text/html; charset=utf-8", headers=page.headers)


def _after_seq(value: str) -> int:
    """``?after=``: a non-negative integer in plain digits (``int`` alone would take "+1", " 1", "1_0")."""
    if not (value.isascii() and value.isdigit() and len(value) <= 18):
        raise InvalidCursor("after must be a non-negative integer (an event's seq)", field="after")
    return int(value)
