"""A session's port previews: revocable, expiring grants to reach one port inside its sandbox.

A preview is made by its session's owner (``POST /v1/sessions/{id}/previews``) and handed out as a
URL carrying its secret (``crl_prev_`` and 32 url-safe bytes) once. Only the secret's SHA-256 is
kept, in the session's record (:class:`corral.gateway.sessions.records.SessionRecord`), compared in
constant time against every preview of the session the host names. A preview never outlives its
session: its expiry is capped at the session's, and it dies with the session's record.

:class:`PreviewBook` is the live part, as :class:`corral.gateway.links.LinkBook` is for links: it
makes, lists and revokes previews (each change reported to the session's audit chain as op
``preview``), holds the connections each has open (a revoke closes them at once) and counts their
use in memory (:class:`Usage`), folded into the record whenever the record is written anyway (a
revoke, an expiry): a connection's open and close write no file on the event loop. A gateway
restart loses the counts since the last write; the audit chain has every connection's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from corral.contracts.control import PreviewChange, PreviewEvent
from corral.contracts.previews import ID_PREFIX, SECRET_PREFIX
from corral.errors import CodedError
from corral.gateway import grants
from corral.gateway.auth import OWNER_ACTOR
from corral.gateway.grants import GrantBook, GrantRecord

log = logging.getLogger(__name__)

DEFAULT_TTL_S = 3600
MAX_TTL_S = 86400
REVOKED = "preview revoked"
EXPIRED = "preview expired"


class PreviewRecord(GrantRecord):
    """One preview as the session's record keeps it (:class:`corral.gateway.grants.GrantRecord`): its
    port and its use."""

    REVOKED: ClassVar[str] = REVOKED
    EXPIRED: ClassVar[str] = EXPIRED
    port: int
    connections: int = 0  # opened in all, closed ones' bytes below
    bytes_in: int = 0  # from clients to the sandbox's server
    bytes_out: int = 0  # from the server to clients


def make(port: int, ttl_s: int, owner: str, session_expires_at: float, now: float) -> tuple[PreviewRecord, str]:
    """A new preview and its secret (the only time the secret exists outside the holder's URL)."""
    fields, secret = grants.issue(ID_PREFIX, SECRET_PREFIX, ttl_s, owner, session_expires_at, now)
    return PreviewRecord(**fields, port=port), secret


def match(presented: str, previews: Iterable[PreviewRecord]) -> PreviewRecord | None:
    """The preview whose secret ``presented`` is: every one compared, each in constant time."""
    return grants.match(presented, previews)


@dataclass(eq=False)
class PreviewConnection:
    """One client connection through a preview: its byte counts, and ``closing`` (with its reason)
    set when it must close now (a revoke, the session's end)."""

    remote: str
    session_id: str = ""  # set once a request through it was admitted (PreviewBook.opened)
    preview_id: str = ""
    bytes_in: int = 0  # from the client
    bytes_out: int = 0  # to the client
    last: float = field(default_factory=time.monotonic)  # the last byte either way (the idle timeout)
    closing: asyncio.Event = field(default_factory=asyncio.Event)
    reason: str = ""

    def moved(self) -> None:
        self.last = time.monotonic()

    def close(self, reason: str) -> None:
        self.reason = reason
        self.closing.set()


def preview_event(change: PreviewChange, preview: PreviewRecord, conn: PreviewConnection | None = None) -> PreviewEvent:
    """The control channel's ``preview`` message: the audit record of a preview's change or connection."""
    return PreviewEvent(
        change=change,
        preview=preview.id,
        port=preview.port,
        actor=OWNER_ACTOR if conn is None else "preview",
        expires_at=preview.expires_at,
        remote=conn.remote if conn is not None else "",
        bytes_in=conn.bytes_in if conn is not None else 0,
        bytes_out=conn.bytes_out if conn is not None else 0,
    )


@dataclass
class Usage:
    """A preview's use not yet in its record: connections opened, closed connections' bytes."""

    connections: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    last_used_at: float | None = None


SavePreviews = Callable[[str, Mapping[str, PreviewRecord]], None]
ReportPreview = Callable[[str, PreviewEvent], Awaitable[None]]


class PreviewBook(GrantBook[PreviewRecord]):
    """The gateway's previews, over the session records that keep them (``previews`` of each session).

    ``previews_of`` reads a live session's previews, ``save`` writes them back, ``report`` sends a
    change to the session's audit chain. Runtime-only: the open connections of each preview.
    """

    def __init__(
        self,
        previews_of: Callable[[str], Mapping[str, PreviewRecord]],
        save: SavePreviews,
        report: ReportPreview,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(previews_of, save, clock)
        self._report = report
        self._open: dict[str, set[PreviewConnection]] = {}
        self._usage: dict[str, Usage] = {}

    async def create(
        self, session_id: str, port: int, ttl_s: int, owner: str, session_expires_at: float
    ) -> tuple[PreviewRecord, str]:
        """A new preview, in the audit chain before it exists anywhere (a failed report makes none)."""
        preview, secret = make(port, ttl_s, owner, session_expires_at, self._clock())
        await self._report(session_id, preview_event("created", preview))
        self._put(session_id, preview)
        return preview, secret

    def open_connections(self, preview_id: str) -> int:
        return len(self._open.get(preview_id, ()))

    def current(self, preview: PreviewRecord) -> PreviewRecord:
        """``preview`` with its use so far: its record's, what is not written yet, and its open
        connections' bytes."""
        usage = self._usage.get(preview.id, Usage())
        conns = self._open.get(preview.id, ())
        return preview.model_copy(
            update={
                "connections": preview.connections + usage.connections,
                "bytes_in": preview.bytes_in + usage.bytes_in + sum(c.bytes_in for c in conns),
                "bytes_out": preview.bytes_out + usage.bytes_out + sum(c.bytes_out for c in conns),
                "last_used_at": usage.last_used_at or preview.last_used_at,
            }
        )

    async def revoke(self, session_id: str, preview_id: str) -> PreviewRecord | None:
        """Revoked at once (its connections told to close); a second revoke changes nothing. None: no such preview."""
        preview = self.get(session_id, preview_id)
        if preview is None:
            return None
        if preview.revoked_at is not None:
            return preview
        self._put(session_id, preview.model_copy(update={"revoked_at": self._clock()}))
        preview = self.get(session_id, preview_id) or preview  # as written: its use folded in
        for conn in list(self._open.get(preview_id, ())):
            conn.close(REVOKED)
        await self._tell(session_id, "revoked", preview)
        return preview

    def expired(self, session_id: str, preview_id: str) -> None:
        """Found expired: its ``expired`` audit record, once (a kept task)."""
        current = self.get(session_id, preview_id)
        if current is None or current.expiry_reported:
            return
        self._put(session_id, current.model_copy(update={"expiry_reported": True}))
        self._keep(self._tell(session_id, "expired", current))

    def opened(self, conn: PreviewConnection, session_id: str, preview_id: str) -> None:
        """A client connection admitted to the preview: held (a revoke closes it), counted, its
        ``opened`` record (with the client's address) sent by a kept task. Call it where
        :meth:`closed` follows whatever happens."""
        conn.session_id, conn.preview_id = session_id, preview_id
        self._open.setdefault(preview_id, set()).add(conn)
        usage = self._usage.setdefault(preview_id, Usage())
        usage.connections += 1
        usage.last_used_at = self._clock()
        preview = self.get(session_id, preview_id)
        if preview is not None:
            self._keep(self._tell(session_id, "opened", preview, conn))

    def closed(self, conn: PreviewConnection) -> None:
        """The connection ended: its bytes counted and its ``closed`` record sent."""
        if not conn.preview_id:
            return  # never admitted: nothing of a preview's to count
        held = self._open.get(conn.preview_id)
        if held is not None:
            held.discard(conn)
            if not held:
                del self._open[conn.preview_id]
        usage = self._usage.setdefault(conn.preview_id, Usage())
        usage.bytes_in += conn.bytes_in
        usage.bytes_out += conn.bytes_out
        usage.last_used_at = self._clock()
        try:
            preview = self.get(conn.session_id, conn.preview_id)
        except CodedError:
            preview = None  # the session ended meanwhile: its record is gone
        if preview is None:
            self._usage.pop(conn.preview_id, None)
            return
        self._keep(self._tell(conn.session_id, "closed", preview, conn))

    def close_session(self, session_id: str, reason: str) -> None:
        """Every connection of ``session_id``'s previews told to close (its end or pause)."""
        for conns in list(self._open.values()):
            for conn in list(conns):
                if conn.session_id == session_id:
                    conn.close(reason)

    def _put(self, session_id: str, preview: PreviewRecord) -> None:
        """The record written, with the use counted since its last write."""
        usage = self._usage.pop(preview.id, None)
        if usage is not None:
            preview = preview.model_copy(
                update={
                    "connections": preview.connections + usage.connections,
                    "bytes_in": preview.bytes_in + usage.bytes_in,
                    "bytes_out": preview.bytes_out + usage.bytes_out,
                    "last_used_at": usage.last_used_at or preview.last_used_at,
                }
            )
        self._store(session_id, preview)

    async def _tell(
        self, session_id: str, change: PreviewChange, preview: PreviewRecord, conn: PreviewConnection | None = None
    ) -> None:
        """A change already made: its audit record is sent, and a failure to send is logged (a revoke
        is never held back by an unreachable proxy)."""
        try:
            await self._report(session_id, preview_event(change, preview, conn))
        except CodedError:
            log.exception(
                "session %s: the audit record of preview %s %s was not written", session_id, preview.id, change
            )
