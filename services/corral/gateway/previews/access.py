"""Who a request to the preview listener reaches, if anyone: the preview its ``Host`` names, opened
by the secret it presents (query parameter, header or cookie), each check's refusal a coded error
(corral.errors) the listener answers with its status (corral.gateway.routes.errors)."""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from corral.contracts.previews import PreviewHost, parse_host
from corral.errors import Forbidden, NotFound, PreviewGone, SessionNotFound, SessionPaused, Unauthorized
from corral.gateway.previews.book import EXPIRED, PreviewBook, PreviewRecord, match
from corral.gateway.previews.wire import Presented, header
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


STRANGER = (
    "this preview's cookie is not sent on for a page of another site: another session's preview, or "
    "another server under the same domain, is another site here (open the preview's own address)"
)


def _initiator(headers: Sequence[tuple[bytes, bytes]], domain: str) -> PreviewHost | None:
    """The preview whose page made the request (its ``Origin``, else its ``Referer``), or None."""
    for name in (b"origin", b"referer"):
        value = header(headers, name)
        if value:
            netloc = urllib.parse.urlsplit(value.decode("latin-1")).netloc
            return parse_host(netloc, domain) if netloc else None
    return None


def check_initiator(admitted: Admitted, method: bytes, headers: Sequence[tuple[bytes, bytes]], domain: str) -> None:
    """Forbidden for a request a page of another site made with the preview's cookie.

    Under an operator's domain (``preview.example.com``) every preview, and any other server under
    the registrable domain, is one site to the browser: ``SameSite=Lax`` keeps no page of another
    session's preview from having the browser send this preview's cookie (a WebSocket, a form
    posted, a fetch, a frame). Chromium takes each ``*.localhost`` name for a site of its own. The
    browser says where a request comes from (``Sec-Fetch-Site``, then ``Origin`` or ``Referer``):
    from another site than this session's previews, the cookie counts only as ``SameSite=Lax`` lets
    it count across sites, for a top-level GET or HEAD navigation.
    The secret in the query or the header is presented by whoever holds it, and is not checked here."""
    site = header(headers, b"sec-fetch-site")
    if admitted.via != "cookie" or site not in (b"same-site", None):
        return  # same-origin, a typed address (none), or cross-site (Lax kept the cookie back)
    if site is None:  # a browser without Fetch Metadata, or none: only an Origin that names a stranger
        origin = header(headers, b"origin")
        netloc = urllib.parse.urlsplit(origin.decode("latin-1")).netloc if origin else ""
        found = parse_host(netloc, domain) if netloc else None
        if found is None or found.session_id == admitted.session.id:
            return
        raise Forbidden(STRANGER)  # sent with a form's POST or a fetch, never with a link's GET
    initiator = _initiator(headers, domain)
    if initiator is not None and initiator.session_id == admitted.session.id:
        return  # another port of the same session's: one agent's servers, one site
    navigation = header(headers, b"sec-fetch-mode") == b"navigate" and header(headers, b"sec-fetch-dest") == b"document"
    if method in (b"GET", b"HEAD") and navigation:
        return
    raise Forbidden(STRANGER)
