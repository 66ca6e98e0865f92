"""Viewer links: revocable, expiring grants to watch (``view``) or step into (``control``) one session.

A link is made by its session's owner (``POST /v1/sessions/{id}/links``) and handed to a person as a
URL whose secret (``crl_link_`` and 32 url-safe bytes) rides in the fragment. Only the secret's
SHA-256 is kept, in the session's record (:class:`corral.gateway.sessions.records.SessionRecord`), so a
restarted gateway still knows its links; presented secrets are compared in constant time against
every link of every live session, as session tokens are. A link never outlives its session: its
expiry is capped at the session's, and it dies with the session's record.

:class:`LinkBook` is the live part: it makes, lists and revokes links (each change written to the
record and reported to the session's audit chain as op ``link``), and keeps the streams each link
has open, so a revoke closes them at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from corral.contracts.control import LinkEvent
from corral.errors import CodedError
from corral.gateway import grants
from corral.gateway.auth import OWNER_ACTOR, LinkGrant, LinkMode
from corral.gateway.grants import GrantBook, GrantRecord

__all__ = ["LinkBook", "LinkGrant", "LinkMode", "LinkRecord", "LinkStream", "match"]

log = logging.getLogger(__name__)

LINK_PREFIX = "crl_link_"
ID_PREFIX = "lnk_"
DEFAULT_TTL_S = 3600
MAX_TTL_S = 86400
USE_REPORTED_EVERY_S = 60.0  # a link's HTTP reads (the viewer page polls) report its use this often at most
LinkChange = Literal["created", "used", "revoked", "expired"]
# Why a link no longer opens anything: the words of the 401 and of the stream's close (4003).
REVOKED = "link revoked"
EXPIRED = "link expired"


class LinkRecord(GrantRecord):
    """One link as the session's record keeps it (:class:`corral.gateway.grants.GrantRecord`) and its mode."""

    REVOKED: ClassVar[str] = REVOKED
    EXPIRED: ClassVar[str] = EXPIRED
    mode: LinkMode

    def grant(self, session_id: str) -> LinkGrant:
        return LinkGrant(session_id, self.id, self.mode)


def new_secret() -> str:
    return grants.new_secret(LINK_PREFIX)


def looks_like_link(presented: str) -> bool:
    return presented.startswith(LINK_PREFIX)


def make(mode: LinkMode, ttl_s: int, owner: str, session_expires_at: float, now: float) -> tuple[LinkRecord, str]:
    """A new link and its secret (the only time the secret exists outside the holder's URL)."""
    fields, secret = grants.issue(ID_PREFIX, LINK_PREFIX, ttl_s, owner, session_expires_at, now)
    return LinkRecord(**fields, mode=mode), secret


def match(presented: str, links: Iterable[LinkRecord]) -> LinkRecord | None:
    """The link whose secret ``presented`` is: every link compared, each in constant time."""
    return grants.match(presented, links)


def link_event(change: LinkChange, link: LinkRecord) -> LinkEvent:
    """The control channel's ``link`` message: the audit record of a link's change."""
    # The agent reads the audit log: the owner (OWNER_ACTOR) is named, never its key id.
    return LinkEvent(change, link.id, link.mode, OWNER_ACTOR, link.expires_at)


@dataclass(eq=False)
class LinkStream:
    """One open live stream of a link: set ``closing`` (with its reason) and the stream closes."""

    link_id: str
    closing: asyncio.Event = field(default_factory=asyncio.Event)
    reason: str = ""

    def close(self, reason: str) -> None:
        self.reason = reason
        self.closing.set()


# (session id, its links after the change): writes the session's record.
SaveLinks = Callable[[str, Mapping[str, LinkRecord]], None]
# (session id, the link message): its audit record, through the session's proxy; raises when it fails.
ReportLink = Callable[[str, LinkEvent], Awaitable[None]]


class LinkBook(GrantBook[LinkRecord]):
    """The gateway's links, over the session records that keep them (``links`` of each session id).

    ``links_of`` reads a live session's links (from its record), ``save`` writes them back, ``report``
    sends a change to the session's audit chain. Runtime-only: the open streams of each link.
    """

    def __init__(
        self,
        links_of: Callable[[str], Mapping[str, LinkRecord]],
        save: SaveLinks,
        report: ReportLink,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(links_of, save, clock)
        self._report = report
        self._streams: dict[str, set[LinkStream]] = {}
        self._use_reported: dict[str, float] = {}  # when each link's last ``used`` was reported

    async def create(
        self, session_id: str, mode: LinkMode, ttl_s: int, owner: str, session_expires_at: float
    ) -> tuple[LinkRecord, str]:
        """A new link, in the audit chain before it exists anywhere (a failed report makes none)."""
        link, secret = make(mode, ttl_s, owner, session_expires_at, self._clock())
        await self._report(session_id, link_event("created", link))
        self._store(session_id, link)
        return link, secret

    def streams(self, link_id: str) -> int:
        return len(self._streams.get(link_id, ()))

    async def revoke(self, session_id: str, link_id: str) -> LinkRecord | None:
        """Revoked at once (its streams told to close); a second revoke changes nothing. None: no such link."""
        link = self.get(session_id, link_id)
        if link is None:
            return None
        if link.revoked_at is not None:
            return link
        link = link.model_copy(update={"revoked_at": self._clock()})
        self._store(session_id, link)
        for stream in list(self._streams.get(link_id, ())):
            stream.close(REVOKED)
        await self._tell(session_id, "revoked", link)
        return link

    def expired(self, session_id: str, link_id: str) -> None:
        """The link was found expired (presented, or its stream reached the expiry): its ``expired``
        audit record, once, sent by a kept task (a presentation is checked where nothing is awaited)."""
        current = self.get(session_id, link_id)
        if current is None or current.expiry_reported:
            return
        self._store(session_id, current.model_copy(update={"expiry_reported": True}))
        self._keep(self._tell(session_id, "expired", current))

    async def opened(self, session_id: str, stream: LinkStream) -> None:
        """A live stream opened with the link: counted (its revoke closes it from now on), its use
        kept and reported (``used``). Call it where :meth:`closed` follows whatever happens."""
        self._streams.setdefault(stream.link_id, set()).add(stream)
        link = self._used(session_id, stream.link_id)
        if link is not None:
            await self._tell(session_id, "used", link)

    def read(self, session_id: str, link_id: str) -> None:
        """The link read something over HTTP (what the viewer page fetches): its use kept and reported
        (``used``, by a kept task), at most once every :data:`USE_REPORTED_EVERY_S` for a link."""
        if self._clock() - self._use_reported.get(link_id, -USE_REPORTED_EVERY_S) < USE_REPORTED_EVERY_S:
            return
        link = self._used(session_id, link_id)
        if link is not None:
            self._keep(self._tell(session_id, "used", link))

    def _used(self, session_id: str, link_id: str) -> LinkRecord | None:
        link = self.get(session_id, link_id)
        if link is None:
            return None
        now = self._clock()
        self._use_reported[link_id] = now
        self._store(session_id, link.model_copy(update={"last_used_at": now}))
        return link

    def closed(self, stream: LinkStream) -> None:
        open_streams = self._streams.get(stream.link_id)
        if open_streams is not None:
            open_streams.discard(stream)
            if not open_streams:
                del self._streams[stream.link_id]

    async def _tell(self, session_id: str, change: LinkChange, link: LinkRecord) -> None:
        """A change already made: its audit record is sent, and a failure to send is logged (a
        revoke is never held back by an unreachable proxy)."""
        try:
            await self._report(session_id, link_event(change, link))
        except CodedError:
            log.exception("session %s: the audit record of link %s %s was not written", session_id, link.id, change)
