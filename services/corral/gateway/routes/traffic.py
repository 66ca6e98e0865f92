"""Egress audit logs: ``/v1/audit`` and a session's ``traffic`` (JSON Lines, HAR, the gateway's anchors)."""

from __future__ import annotations

import asyncio
import json
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Response

from corral.errors import AuditAnchorsInvalid, AuditLogUnreadable, Forbidden, InvalidRequest, NotFound
from corral.gateway.auth import Caller
from corral.gateway.routes.deps import (
    CallerDep,
    KeyIdDep,
    ManagerDep,
    live_session,
    note_expiry,
    note_use,
    viewed_session,
)
from corral.gateway.sessions import SessionManager
from corral.proxy import traffic

router = APIRouter(tags=["traffic"])

# What the viewer page shows of an action's traffic (its connections, requests, refusals, failures
# and brokered secrets' uses, by name: the log never holds a value).
LINK_EVENTS = frozenset({"connect", "request", "block", "error", "secret"})


def audit_log(session_id: str, who: CallerDep, manager: ManagerDep) -> Path:
    return _audit_log(session_id, who, manager, viewer=False)


async def viewer_audit_log(session_id: str, who: CallerDep, manager: ManagerDep) -> Path:
    note_expiry(who, manager)
    path = _audit_log(session_id, who, manager, viewer=True)
    note_use(who, manager)
    return path


def _audit_log(session_id: str, who: Caller, manager: SessionManager, viewer: bool) -> Path:
    """The audit log of the session in the path, live or ended: for its owner's API key, or for the
    session's own token while it lives (and, for what the viewer page reads, one of its links)."""
    if manager.egress is None:
        raise NotFound("this gateway runs sessions without egress control")
    if who.key_id is None:
        # A session token (or, for the viewer, a link): only its own session, only while it lives.
        session = viewed_session(session_id, who, manager) if viewer else live_session(session_id, who, manager)
        if session.egress is None:
            raise NotFound(f"session {session_id} has no egress log")
        return session.egress.audit_path
    try:
        meta = manager.egress.meta(session_id)
    except ValueError:
        meta = None
    owner = str(meta.get("owner", "")) if meta is not None else None
    who.open_kept(owner, f"no audit log for session {session_id}")
    return manager.egress.state_dir(session_id) / "audit.jsonl"


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
async def list_audit_logs(key_id: KeyIdDep, manager: ManagerDep) -> Any:
    """The key's audit logs, live and ended (empty on a gateway without egress control)."""
    if manager.egress is None:
        return []
    return await asyncio.to_thread(manager.egress.logs, key_id)


@router.get("/v1/sessions/{session_id}/traffic")
async def session_traffic(log_path: ViewerAuditLogDep, wanted: FilterDep, who: CallerDep) -> Response:
    """The audit records, as JSON Lines exactly as the proxy wrote them (so `verify` still holds
    for an unfiltered download). A viewer link reads what its page shows: one action's traffic."""
    events = _link_events(wanted) if who.link is not None else None
    lines = await asyncio.to_thread(_filtered_lines, log_path, wanted, events)
    return Response(b"".join(lines), media_type="application/jsonl")


def _link_events(wanted: traffic.TrafficFilter) -> frozenset[str]:
    """The events a viewer link may read, for one action only (403 otherwise): never the policy,
    the secrets' setup or the links' own records that the rest of the log holds."""
    if wanted.action is None:
        raise Forbidden("a viewer link reads one action's traffic: add action=")
    if wanted.event is not None and wanted.event not in LINK_EVENTS:
        raise Forbidden(f"a viewer link reads only these events: {', '.join(sorted(LINK_EVENTS))}")
    return LINK_EVENTS


@router.get("/v1/sessions/{session_id}/traffic.anchors")
async def session_anchors(session_id: str, log_path: AuditLogDep, manager: ManagerDep) -> Response:
    """The gateway's keyed anchors of the audit chain, as stored (each one's MAC checked first), for
    `corral audit verify`: they show a log cut short or rewritten, which the chain alone cannot."""
    assert manager.egress is not None  # audit_log answered 404 otherwise
    try:
        body = await asyncio.to_thread(manager.egress.anchors.text, session_id)
    except ValueError as exc:
        raise AuditAnchorsInvalid(str(exc)) from None
    return Response(body, media_type="application/jsonl")


@router.get("/v1/sessions/{session_id}/traffic.har")
async def session_har(log_path: AuditLogDep, wanted: FilterDep) -> Any:
    records = await asyncio.to_thread(lambda: list(wanted.apply(_records(log_path))))
    return traffic.to_har(records, creator_version=_version())


def _records(path: Path) -> list[traffic.AuditRecord]:
    try:
        return list(traffic.read_records(path)) if path.exists() else []
    except ValueError as exc:
        raise AuditLogUnreadable(str(exc)) from None


def _filtered_lines(path: Path, wanted: traffic.TrafficFilter, events: frozenset[str] | None = None) -> list[bytes]:
    """The lines ``wanted`` keeps, of ``events`` only when given."""
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
                raise AuditLogUnreadable(f"{path.name}: a line is not JSON") from None
            if wanted.matches(record) and (events is None or record.get("event") in events):
                out.append(line if line.endswith(b"\n") else line + b"\n")
    return out


def _version() -> str:
    try:
        return version("corral")
    except PackageNotFoundError:
        return "0"
