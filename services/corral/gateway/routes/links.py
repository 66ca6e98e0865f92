"""A session's viewer links (corral.gateway.links): ``/v1/sessions/{id}/links``, its owner's API key only."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Request

from corral.errors import NotFound
from corral.gateway.links import LinkRecord
from corral.gateway.models import CreatedLink, CreateLink, LinkOut, RevokedLink
from corral.gateway.routes.deps import CallerDep, JsonBody, LiveSessionDep, ManagerDep, body_of
from corral.gateway.sessions import SessionManager

router = APIRouter(prefix="/v1/sessions/{session_id}/links", tags=["links"])


@router.post("", status_code=201, response_model=CreatedLink)
async def create_link(
    request: Request,
    session: LiveSessionDep,
    who: CallerDep,
    manager: ManagerDep,
    reading: Annotated[JsonBody[CreateLink], body_of(CreateLink)],
) -> CreatedLink:
    """A new link, in the audit chain before it works (503 ``egress_unavailable`` when the proxy did
    not take its record: no link is made)."""
    owner = who.grant_links()
    body = await reading.read()
    link, secret = await manager.links.create(session.id, body.mode, body.ttl_s, owner, session.record.expires_at)
    base = str(request.base_url).rstrip("/")
    return CreatedLink(
        id=link.id,
        mode=link.mode,
        created_at=link.created_at,
        expires_at=link.expires_at,
        url=f"{base}/v1/sessions/{session.id}/viewer#link={secret}",
    )


@router.get("", response_model=list[LinkOut])
async def list_links(session: LiveSessionDep, who: CallerDep, manager: ManagerDep) -> list[LinkOut]:
    who.grant_links()
    return [_out(link, manager) for link in manager.links.listing(session.id)]


@router.delete("/{link_id}", response_model=RevokedLink)
async def revoke_link(link_id: str, session: LiveSessionDep, who: CallerDep, manager: ManagerDep) -> RevokedLink:
    """Revoked at once: its open streams close (4003 ``link revoked``); revoking twice is the same answer."""
    who.grant_links()
    link = await manager.links.revoke(session.id, link_id)
    if link is None:
        raise NotFound(f"no link {link_id} in session {session.id}")
    assert link.revoked_at is not None  # revoke() answers a revoked link or none
    return RevokedLink(id=link.id, revoked_at=link.revoked_at)


def _out(link: LinkRecord, manager: SessionManager) -> LinkOut:
    return LinkOut(
        id=link.id,
        mode=link.mode,
        created_at=link.created_at,
        expires_at=link.expires_at,
        revoked_at=link.revoked_at,
        last_used_at=link.last_used_at,
        streams=manager.links.streams(link.id),
    )
