"""Who a request to the preview listener reaches, if anyone: the preview its ``Host`` names, opened
by the secret it presents (query parameter, header or cookie), each check's refusal a coded error
(corral.errors) the listener answers with its status (corral.gateway.routes.errors)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from corral.contracts.previews import PreviewHost, parse_host
from corral.errors import NotFound, PreviewGone, SessionNotFound, SessionPaused, Unauthorized
from corral.gateway.previews.book import EXPIRED, PreviewBook, PreviewRecord, match
from corral.gateway.previews.wire import Presented
from corral.gateway.sessions import Session, SessionManager

Via = Literal["query", "header", "cookie"]
NO_SECRET = (
    "this preview needs its secret: open the URL its create answered (with ?corral_preview_token=), "
    "or send the X-Corral-Preview-Token header"
)
WRONG_SECRET = "that is not this preview's secret"


@dataclass(frozen=True, slots=True)
class Admitted:
    session: Session
    preview: PreviewRecord
    secret: str
    via: Via


def find_host(host_header: bytes | None, domain: str) -> PreviewHost:
    if not host_header:
        raise NotFound("a preview is found by its Host header, and this request has none")
    text = host_header.decode("latin-1")
    found = parse_host(text, domain)
    if found is None:
        raise NotFound(f"no preview at {text[:100]!r}: a preview's host is {{port}}-{{session hex}}.{domain}")
    return found


def live_session(manager: SessionManager, host: PreviewHost) -> Session:
    try:
        session = manager.get(host.session_id)
    except SessionNotFound:
        raise PreviewGone(
            f"session {host.session_id} is not running (it ended, or never was): its previews are closed"
        ) from None
    if session.state != "ready":
        if session.paused:
            raise SessionPaused(f"session {session.id} is {session.state}: its previews answer once it is resumed")
        raise PreviewGone(f"session {session.id} is ending: its previews are closed")
    return session


def _candidates(
    presented: Presented, previews: dict[str, PreviewRecord]
) -> Iterable[tuple[str, Via, list[PreviewRecord]]]:
    every = list(previews.values())
    if presented.query_token:
        yield presented.query_token, "query", every
    if presented.header_token:
        yield presented.header_token, "header", every
    for preview_id, value in presented.cookies.items():
        held = previews.get(preview_id)
        yield value, "cookie", [held] if held is not None else []


def admit(presented: Presented, session: Session, port: int, book: PreviewBook) -> Admitted:
    """The preview of ``port`` that the first good secret presented opens; Unauthorized (revoked,
    expired, wrong, none) otherwise. Every secret is compared in constant time."""
    previews = {p.id: p for p in book.listing(session.id) if p.port == port}
    refusal = NO_SECRET
    now = book.now()
    for secret, via, among in _candidates(presented, previews):
        found = match(secret, among)
        if found is None:
            refusal = WRONG_SECRET if refusal == NO_SECRET else refusal
            continue
        problem = found.problem(now)
        if problem is None:
            return Admitted(session, found, secret, via)
        if problem == EXPIRED:
            book.expired(session.id, found.id)
        refusal = problem
    raise Unauthorized(refusal)
