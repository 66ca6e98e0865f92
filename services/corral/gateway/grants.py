"""What a viewer link (corral.gateway.links) and a port preview (corral.gateway.previews.book) share:
a revocable, expiring grant made by a session's owner and handed out once as a secret, of which the
session's record keeps only the SHA-256, compared in constant time against every grant it could be.
Its expiry is capped at the session's; it dies with the session's record."""

from __future__ import annotations

import asyncio
import base64
import hmac
import secrets
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any, ClassVar, Generic, TypedDict, TypeVar

from pydantic import BaseModel, ConfigDict

from corral.gateway.auth import digest


class GrantRecord(BaseModel):
    """One grant as the session's record keeps it: never its secret, only the secret's SHA-256."""

    model_config = ConfigDict(frozen=True, extra="ignore")
    REVOKED: ClassVar[str]  # the words of a refusal once revoked ("link revoked"), set by each kind
    EXPIRED: ClassVar[str]

    id: str
    secret_sha256: str
    created_by: str  # the owner's key id
    created_at: float
    expires_at: float
    revoked_at: float | None = None
    last_used_at: float | None = None
    expiry_reported: bool = False  # its ``expired`` audit record is written (once)

    def problem(self, now: float) -> str | None:
        """Why it opens nothing at ``now`` (its kind's ``REVOKED`` or ``EXPIRED``), or None while good."""
        if self.revoked_at is not None:
            return self.REVOKED
        if now >= self.expires_at:
            return self.EXPIRED
        return None


class Issued(TypedDict):
    """A new grant's common fields (:func:`issue`), to which each kind adds its own."""

    id: str
    secret_sha256: str
    created_by: str
    created_at: float
    expires_at: float


def new_id(prefix: str) -> str:
    """``prefix`` and 12 lowercase base32 characters (60 random bits)."""
    return prefix + base64.b32encode(secrets.token_bytes(10)).decode().lower()[:12]


def new_secret(prefix: str) -> str:
    return prefix + secrets.token_urlsafe(32)


def issue(
    id_prefix: str, secret_prefix: str, ttl_s: int, owner: str, session_expires_at: float, now: float
) -> tuple[Issued, str]:
    """A new grant's fields and its secret (the only time the secret exists outside the holder's URL)."""
    secret = new_secret(secret_prefix)
    fields = Issued(
        id=new_id(id_prefix),
        secret_sha256=digest(secret),
        created_by=owner,
        created_at=now,
        expires_at=min(now + ttl_s, session_expires_at),
    )
    return fields, secret


G = TypeVar("G", bound=GrantRecord)


def match(presented: str, grants: Iterable[G]) -> G | None:
    """The grant whose secret ``presented`` is: every one compared (no early exit), each in constant time."""
    candidate = digest(presented)
    found = None
    for grant in grants:
        if hmac.compare_digest(candidate, grant.secret_sha256):
            found = grant
    return found


class GrantBook(Generic[G]):
    """What a book of grants does alike (:class:`corral.gateway.links.LinkBook`,
    :class:`corral.gateway.previews.book.PreviewBook`): over the session records that keep them
    (``records_of`` reads a live session's, ``save`` writes them back), their listing and lookup,
    and the audit reports sent by kept tasks."""

    def __init__(
        self,
        records_of: Callable[[str], Mapping[str, G]],
        save: Callable[[str, Mapping[str, G]], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._records_of = records_of
        self._save = save
        self._clock = clock
        self._tasks: set[asyncio.Task[None]] = set()

    def now(self) -> float:
        return self._clock()

    def listing(self, session_id: str) -> list[G]:
        return sorted(self._records_of(session_id).values(), key=lambda grant: grant.created_at)

    def get(self, session_id: str, grant_id: str) -> G | None:
        return self._records_of(session_id).get(grant_id)

    def _store(self, session_id: str, grant: G) -> None:
        self._save(session_id, {**self._records_of(session_id), grant.id: grant})

    def _keep(self, report: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(report)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self) -> None:
        """Wait for the audit records still being sent (a stopping gateway, a test)."""
        await asyncio.gather(*self._tasks, return_exceptions=True)
