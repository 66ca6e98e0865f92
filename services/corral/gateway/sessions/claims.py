"""A session's creation: the request admitted (its timeout, its replay, the caps), a pair claimed from
the warm pool after its last look or started cold, its secrets given, its record written, its
recording started; the session's token returned once its policy is in force."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from corral.errors import CapacityError, InvalidRequest
from corral.gateway import auth
from corral.gateway.models import CreateSession, Resources
from corral.gateway.replays import ReplayUploads
from corral.gateway.secrets import SecretSet, plan_create
from corral.gateway.sessions.book import SessionBook
from corral.gateway.sessions.brokering import SecretBroker
from corral.gateway.sessions.egressport import EgressPort
from corral.gateway.sessions.pool import WarmPool
from corral.gateway.sessions.records import Pair, Session, SessionRecord
from corral.gateway.sessions.sessionrecordings import SessionRecordings
from corral.gateway.sessions.starts import Starts
from corral.gateway.settings import GatewaySettings
from corral.gateway.threads import settle

OnClaim = Callable[[str, float], None]  # (source "pool" | "cold", seconds), for the metrics


class Claims:
    def __init__(
        self,
        settings: GatewaySettings,
        book: SessionBook,
        pool: WarmPool,
        starts: Starts,
        parts: ClaimParts,
        on_claim: OnClaim = lambda source, seconds: None,
    ) -> None:
        self._settings, self._book, self._pool, self._starts = settings, book, pool, starts
        self._parts = parts
        self._on_claim = on_claim
        self._reserved: dict[str, int] = {}  # key id -> sessions being created
        self._lock = asyncio.Lock()

    def reserved(self) -> int:
        """Sessions being created."""
        return sum(self._reserved.values())

    async def create(self, owner: str, req: CreateSession) -> tuple[Session, str]:
        secret_set = plan_create(req.secrets, list(req.allow), req.hermetic is not None)  # checked whole, first
        timeout_s, replay = self._admit(owner, req)
        pooled = await self._reserve(owner, req)
        started = time.monotonic()
        mode = req.egress_mode or self._settings.egress_mode
        actor = auth.OWNER_ACTOR  # the sandbox side reads it (audit records): never the key id
        try:
            if pooled is not None and not await self._pool.hand_out(pooled, req.allow, mode, actor):
                pooled = None
            pair = pooled or await self._starts.start(
                "session", req.viewport, req, list(req.allow), mode, replay, actor
            )
            await self._claim(pair, secret_set, actor)
        finally:
            async with self._lock:
                self._reserved[owner] -= 1
        self._on_claim("pool" if pooled else "cold", time.monotonic() - started)
        if pooled:
            self._pool.refill()
        token = auth.new_token()
        record = self._record(pair, owner, token, req, timeout_s, mode, pooled is not None, secret_set)
        session = Session(record, pair.sandbox)
        self._book.save(session)
        self._book.add(session)
        if pair.egress is not None:
            self._parts.egress.write_meta(session.id, owner=owner, created_at=record.created_at, ended_at=None)
        self._parts.recordings.start(session, req.recording_mb)
        return session, token

    def _admit(self, owner: str, req: CreateSession) -> tuple[int, Path | None]:
        """The session's wall-clock timeout and its hermetic replay's responses; or the refusal, naming
        the field to blame."""
        s = self._settings
        timeout_s = req.timeout_s or s.default_timeout_s
        if timeout_s > s.max_timeout_s:
            raise InvalidRequest(f"timeout_s is at most {s.max_timeout_s}", field="timeout_s")
        self._starts.refuse(req)  # what needs egress control, on a gateway without it
        if req.hermetic is None:
            return timeout_s, None
        return timeout_s, self._parts.replays.path_for(req.hermetic, owner)  # ReplayNotFound: not this key's upload

    async def _reserve(self, owner: str, req: CreateSession | None) -> Pair | None:
        """A slot within the caps (429 past them), held until the create ends; and a pooled pair, if one fits."""
        s = self._settings
        async with self._lock:
            # Paused sessions hold no slot: they have their own cap (corral.gateway.sessions.pausing).
            total = len(self._book.running()) + self.reserved()
            mine = len(self._book.running(owner)) + self._reserved.get(owner, 0)
            if total >= s.max_sessions:
                raise CapacityError(
                    f"the gateway runs {total} sessions, its limit (CORRAL_MAX_SESSIONS={s.max_sessions})"
                )
            if mine >= s.max_sessions_per_key:
                raise CapacityError(f"this API key has {mine} sessions, its limit ({s.max_sessions_per_key})")
            self._reserved[owner] = self._reserved.get(owner, 0) + 1
            return self._pool.take(req) if req is not None else None

    async def hold_slot(self, owner: str) -> None:
        """A resume's slot within the caps (429 past them), held until :meth:`release_slot`."""
        await self._reserve(owner, None)

    async def release_slot(self, owner: str) -> None:
        async with self._lock:
            self._reserved[owner] -= 1

    def _record(
        self,
        pair: Pair,
        owner: str,
        token: str,
        req: CreateSession,
        timeout_s: int,
        mode: str,
        from_pool: bool,
        secret_set: SecretSet,
    ) -> SessionRecord:
        now = time.time()
        return SessionRecord(
            id=pair.session_id,
            container=pair.sandbox.id,
            owner=owner,
            token_sha256=auth.digest(token),
            created_at=now,
            expires_at=now + timeout_s,
            idle_timeout_s=req.idle_timeout_s or self._settings.default_idle_timeout_s,
            viewport=req.viewport,
            allow=list(req.allow),
            labels=dict(req.labels),
            from_pool=from_pool,
            egress=pair.egress,
            egress_mode=mode if pair.egress is not None else None,
            hermetic=req.hermetic is not None,
            secrets=dict(secret_set.records),
            resources=req.resources if req.resources != Resources() else None,
            idle_action=req.idle_action,
        )

    async def _claim(self, pair: Pair, secret_set: SecretSet, actor: str) -> None:
        """Make a ready pair the session's: its secrets (its policy is in force already: a cold
        proxy starts with it, a pooled one took it in :meth:`WarmPool.hand_out`). A pair that fails
        this is removed: it is never handed out."""
        if pair.egress is None or not secret_set.records:
            return
        try:
            await self._parts.broker.give(pair, secret_set, SecretSet(), actor)
        except BaseException:
            await settle(asyncio.ensure_future(self._starts.remove(pair)))
            raise


@dataclass(frozen=True, slots=True)
class ClaimParts:
    """What a claim hands the new session to: its egress's archive, its secrets' broker, its recording,
    the hermetic replays it may answer from."""

    egress: EgressPort
    broker: SecretBroker
    recordings: SessionRecordings
    replays: ReplayUploads
