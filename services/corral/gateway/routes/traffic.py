"""Egress audit logs: ``/v1/audit`` and a session's ``traffic`` (JSON Lines, HAR, the gateway's anchors)."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Annotated, Any, cast

from fastapi import APIRouter, Depends, Response
from fastapi.responses import StreamingResponse

from corral.errors import AuditAnchorsInvalid, AuditLogUnreadable, Forbidden, InvalidRequest, NotFound
from corral.gateway.auth import Caller
from corral.gateway.egress import EgressManager
from corral.gateway.routes.deps import (
    CallerDep,
    EgressArchiveDep,
    KeyIdDep,
    ManagerDep,
    live_session,
    note_expiry,
    note_use,
    viewed_session,
)
from corral.gateway.sessions import SessionManager
from corral.proxy import traffic
from corral.proxy.audit import bounded_lines

router = APIRouter(tags=["traffic"])

# A response is sent in pieces of about this size: the gateway holds one piece, never the log.
CHUNK_BYTES = 64 << 10
# What the viewer page shows of an action's traffic (its connections, requests, refusals, failures
# and brokered secrets' uses, by name: the log never holds a value).
LINK_EVENTS = frozenset({"connect", "request", "block", "error", "secret"})


async def audit_log(session_id: str, who: CallerDep, manager: ManagerDep, egress: EgressArchiveDep) -> Path:
    path = _audit_log(session_id, who, manager, egress, viewer=False)
    await _mirrored(session_id, manager, egress)
    return path


async def viewer_audit_log(session_id: str, who: CallerDep, manager: ManagerDep, egress: EgressArchiveDep) -> Path:
    note_expiry(who, manager)
    path = _audit_log(session_id, who, manager, egress, viewer=True)
    note_use(who, manager)
    await _mirrored(session_id, manager, egress)
    return path


async def _mirrored(session_id: str, manager: SessionManager, egress: EgressManager | None) -> None:
    """A live session's proxy state copied in first, where the runtime shares none with its proxy
    (egress.mirror): the log read is the proxy's as of this request."""
    session = manager.book.find(session_id)
    if egress is not None and session is not None:
        await egress.mirror_now(session_id, session.egress)


def _audit_log(
    session_id: str, who: Caller, manager: SessionManager, egress: EgressManager | None, viewer: bool
) -> Path:
    """The audit log of the session in the path, live or ended: for its owner's API key, or for the
    session's own token while it lives (and, for what the viewer page reads, one of its links)."""
    if egress is None:
        raise NotFound("this gateway runs sessions without egress control")
    if who.key_id is None:
        # A session token (or, for the viewer, a link): only its own session, only while it lives.
        session = viewed_session(session_id, who, manager) if viewer else live_session(session_id, who, manager)
        if session.egress is None:
            raise NotFound(f"session {session_id} has no egress log")
        return session.egress.audit_path
    try:
        meta = egress.meta(session_id)
    except ValueError:
        meta = None
    owner = str(meta.get("owner", "")) if meta is not None else None
    who.open_kept(owner, f"no audit log for session {session_id}")
    return egress.state_dir(session_id) / "audit.jsonl"


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
        raise InvalidRequest(str(exc)) from None


AuditLogDep = Annotated[Path, Depends(audit_log)]
# The traffic the viewer page shows: a viewer link of the live session reads it too.
ViewerAuditLogDep = Annotated[Path, Depends(viewer_audit_log)]
FilterDep = Annotated[traffic.TrafficFilter, Depends(traffic_filter)]


@router.get("/v1/audit")
async def list_audit_logs(key_id: KeyIdDep, egress: EgressArchiveDep) -> Any:
    """The key's audit logs, live and ended (empty on a gateway without egress control)."""
    if egress is None:
        return []
    return await asyncio.to_thread(egress.logs, key_id)


@router.get("/v1/sessions/{session_id}/traffic")
async def session_traffic(log_path: ViewerAuditLogDep, wanted: FilterDep, who: CallerDep) -> Response:
    """The audit records, as JSON Lines exactly as the proxy wrote them (so `verify` still holds
    for an unfiltered download), streamed. A viewer link reads what its page shows: one action's traffic."""
    events = _link_events(wanted) if who.link is not None else None
    return await _streamed(_filtered_chunks(log_path, wanted, events), "application/jsonl")


async def _streamed(chunks: Iterator[bytes], media_type: str) -> StreamingResponse:
    """``chunks`` streamed (read in a worker thread, one piece held at a time). The first piece is read
    before the answer starts, so a log unreadable there is an error answer; one found unreadable
    later ends the stream short (the client sees an incomplete body, never a well-formed cut one)."""
    first = await asyncio.to_thread(next, chunks, b"")
    return StreamingResponse(itertools.chain([first], chunks), media_type=media_type)


def _link_events(wanted: traffic.TrafficFilter) -> frozenset[str]:
    """The events a viewer link may read, for one action only (403 otherwise): never the policy,
    the secrets' setup or the links' own records that the rest of the log holds."""
    if wanted.action is None:
        raise Forbidden("a viewer link reads one action's traffic: add action=")
    if wanted.event is not None and wanted.event not in LINK_EVENTS:
        raise Forbidden(f"a viewer link reads only these events: {', '.join(sorted(LINK_EVENTS))}")
    return LINK_EVENTS


@router.get("/v1/sessions/{session_id}/traffic.anchors")
async def session_anchors(session_id: str, log_path: AuditLogDep, egress: EgressArchiveDep) -> Response:
    """The gateway's keyed anchors of the audit chain, as stored (each one's MAC checked first), for
    `corral audit verify`: they show a log cut short or rewritten, which the chain alone cannot."""
    assert egress is not None  # audit_log answered 404 otherwise
    try:
        body = await asyncio.to_thread(egress.anchors.text, session_id)
    except ValueError as exc:
        raise AuditAnchorsInvalid(str(exc)) from None
    return Response(body, media_type="application/jsonl")


@router.get("/v1/sessions/{session_id}/traffic.har")
async def session_har(log_path: AuditLogDep, wanted: FilterDep) -> Response:
    """HAR 1.2 of the filtered records, written as the log is read (corral.proxy.traffic.har_chunks)."""
    records = wanted.apply(_records(log_path))
    pieces = (piece.encode() for piece in traffic.har_chunks(records, creator_version=_version()))
    return await _streamed(_batched(pieces), "application/json")


def _log_lines(path: Path) -> Iterator[bytes]:
    """The log's lines as far as it reached when the reading began (a live log grows meanwhile),
    none longer than an audit record can be (AuditLogUnreadable otherwise)."""
    try:
        log_file = path.open("rb")
    except FileNotFoundError:
        return
    with log_file:
        size = os.fstat(log_file.fileno()).st_size
        try:
            yield from bounded_lines(log_file, size=size)
        except ValueError as exc:
            raise AuditLogUnreadable(f"{path.name}: {exc}") from None


def _records(path: Path) -> Iterator[traffic.AuditRecord]:
    try:
        yield from traffic.parse_records(_log_lines(path), source=path.name)
    except ValueError as exc:
        raise AuditLogUnreadable(str(exc)) from None


def _batched(pieces: Iterator[bytes]) -> Iterator[bytes]:
    """``pieces`` joined into chunks of about CHUNK_BYTES (the last one may be empty)."""
    batch: list[bytes] = []
    held = 0
    for piece in pieces:
        batch.append(piece)
        held += len(piece)
        if held >= CHUNK_BYTES:
            yield b"".join(batch)
            batch, held = [], 0
    yield b"".join(batch)


def _filtered_chunks(
    path: Path, wanted: traffic.TrafficFilter, events: frozenset[str] | None = None
) -> Iterator[bytes]:
    """The lines ``wanted`` keeps, of ``events`` only when given, in chunks."""
    return _batched(_filtered_lines(path, wanted, events))


def _filtered_lines(path: Path, wanted: traffic.TrafficFilter, events: frozenset[str] | None = None) -> Iterator[bytes]:
    for line in _log_lines(path):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            raise AuditLogUnreadable(f"{path.name}: a line is not JSON") from None
        if not isinstance(record, dict):
            raise AuditLogUnreadable(f"{path.name}: a line is not an audit record")
        if wanted.matches(cast(traffic.AuditRecord, record)) and (events is None or record.get("event") in events):
            yield line if line.endswith(b"\n") else line + b"\n"


def _version() -> str:
    try:
        return version("corral")
    except PackageNotFoundError:
        return "0"
