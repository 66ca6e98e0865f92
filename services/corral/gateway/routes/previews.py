"""A session's port previews (corral.gateway.previews, docs/previews.md):
``/v1/sessions/{id}/previews``, its owner's API key only (its token: 403)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter

from corral.contracts.previews import TOKEN_PARAM, host_name
from corral.errors import NotFound
from corral.gateway.models import CreatedPreview, CreatePreview, PreviewListing, PreviewOut, RevokedPreview
from corral.gateway.previews.book import PreviewBook, PreviewRecord
from corral.gateway.routes.deps import CallerDep, JsonBody, LiveSessionDep, ManagerDep, SettingsDep, body_of
from corral.gateway.settings import GatewaySettings

router = APIRouter(prefix="/v1/sessions/{session_id}/previews", tags=["previews"])


def _on(settings: GatewaySettings) -> None:
    if not settings.preview_port:
        raise NotFound("port previews are off on this gateway (CORRAL_PREVIEW_PORT is 0)")


def origin(settings: GatewaySettings, port: int, session_id: str) -> tuple[str, str]:
    """A preview's host name and its origin (``http://host:preview port``)."""
    host = host_name(port, session_id, settings.preview_domain)
    return host, f"http://{host}:{settings.preview_port}"


@router.post("", status_code=201, response_model=CreatedPreview)
async def create_preview(
    session: LiveSessionDep,
    who: CallerDep,
    manager: ManagerDep,
    settings: SettingsDep,
    reading: Annotated[JsonBody[CreatePreview], body_of(CreatePreview)],
) -> CreatedPreview:
    """A new preview of ``port``, in the audit chain before it works (503 ``egress_unavailable``
    when the proxy did not take its record: none is made). Nothing need listen on the port yet."""
    owner = who.grant_previews()
    _on(settings)
    body = await reading.read()
    preview, secret = await manager.previews.create(session.id, body.port, body.ttl_s, owner, session.record.expires_at)
    host, base = origin(settings, preview.port, session.id)
    return CreatedPreview(
        id=preview.id,
        port=preview.port,
        host=host,
        created_at=preview.created_at,
        expires_at=preview.expires_at,
        url=f"{base}/?{TOKEN_PARAM}={secret}",
    )


@router.get("", response_model=PreviewListing)
async def list_previews(
    session: LiveSessionDep, who: CallerDep, manager: ManagerDep, settings: SettingsDep
) -> PreviewListing:
    who.grant_previews()
    book = manager.previews
    return PreviewListing(previews=[_out(p, session.id, book, settings) for p in book.listing(session.id)])


@router.delete("/{preview_id}", response_model=RevokedPreview)
async def revoke_preview(
    preview_id: str, session: LiveSessionDep, who: CallerDep, manager: ManagerDep
) -> RevokedPreview:
    """Revoked at once: its open connections (WebSockets too) close; revoking twice is the same answer."""
    who.grant_previews()
    preview = await manager.previews.revoke(session.id, preview_id)
    if preview is None:
        raise NotFound(f"no preview {preview_id} in session {session.id}")
    assert preview.revoked_at is not None  # revoke() answers a revoked preview or none
    return RevokedPreview(id=preview.id, revoked_at=preview.revoked_at)


def _out(record: PreviewRecord, session_id: str, book: PreviewBook, settings: GatewaySettings) -> PreviewOut:
    preview = book.current(record)
    return PreviewOut(
        id=preview.id,
        port=preview.port,
        host=host_name(preview.port, session_id, settings.preview_domain),
        created_at=preview.created_at,
        expires_at=preview.expires_at,
        revoked_at=preview.revoked_at,
        last_used_at=preview.last_used_at,
        connections=preview.connections,
        open_connections=book.open_connections(preview.id),
        bytes_in=preview.bytes_in,
        bytes_out=preview.bytes_out,
    )
