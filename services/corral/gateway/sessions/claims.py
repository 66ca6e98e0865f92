"""A session's creation: the request admitted (its timeout, its replay, the caps), a pair claimed from
the warm pool after its last look or started cold, its secrets given, its record written, its
recording started; the session's token returned once its policy is in force."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from corral.contracts.control import VolumeEvent
from corral.errors import CapacityError, InvalidRequest
from corral.gateway import auth
from corral.gateway.models import CreateSession, Resources, env_secret_problem
from corral.gateway.replays import ReplayUploads
from corral.gateway.secrets import SecretSet, plan_create
from corral.gateway.sessions.book import SessionBook
from corral.gateway.sessions.brokering import SecretBroker
from corral.gateway.sessions.browserprofiles import BrowserProfiles
from corral.gateway.sessions.egressport import EgressPort
from corral.gateway.sessions.envs import SessionEnvs
from corral.gateway.sessions.pool import WarmPool
from corral.gateway.sessions.records import Pair, Session, SessionRecord
from corral.gateway.sessions.sessionrecordings import SessionRecordings
from corral.gateway.sessions.starts import Starts
from corral.gateway.sessions.templatepools import TemplatePools
from corral.gateway.settings import GatewaySettings
from corral.gateway.templates.resolver import Resolved
from corral.gateway.threads import settle
from corral.gateway.volumes import Claim, Volumes, announce

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

    @property
    def templates(self) -> TemplatePools:
        return self._parts.templates

    def reserved(self) -> int:
        """Sessions being created."""
        return sum(self._reserved.values())

    async def create(self, owner: str, req: CreateSession) -> tuple[Session, str]:
        secret_set = plan_create(req.secrets, list(req.allow), req.hermetic is not None)  # checked whole, first
        refuse_secrets_in_env(req)
        timeout_s, replay = self._admit(owner, req)
        profile = await self._profile(owner, req)
        # The check at start: the template's checked image, on the current base (404 or 409 before a slot is held).
        template = await asyncio.to_thread(self._parts.templates.resolve, req.template) if req.template else None
        image = template.image_id if template is not None else None
        pool, pooled = await self._reserve(owner, req, template)
        started = time.monotonic()
        mode = req.egress_mode or self._settings.egress_mode
        actor = auth.OWNER_ACTOR  # the sandbox side reads it (audit records): never the key id
        volume: Claim | None = None
        try:
            # A volume first (404, 409 before any start); a pooled pair never fits one (WarmPool.fits).
            volume = await self._parts.volumes.claim(owner, req.volume) if req.volume is not None else None
            if pooled is not None and not await pool.hand_out(pooled, req.allow, mode, actor):
                pooled = None
            workspace = volume.mountpoint if volume is not None else None
            pair = pooled or await self._starts.start(
                "session", req.viewport, req, list(req.allow), mode, replay, actor, workspace, image=image
            )
            # The session's own; a template's is in its image, under this one (corral.sandbox.agent.agentenv).
            env = dict(req.env)
            await self._claim(pair, secret_set, env, actor)
            await self._load_profile(pair, req, profile)
            # Within the slot: a bind (a lock, a statfs) outside it let another create past the caps.
            claimed = await self._bind(volume, pair)
        except BaseException:
            if volume is not None:  # the start removed its sandbox: nothing uses the mount
                await settle(asyncio.ensure_future(self._parts.volumes.release(volume.token)))
            raise
        finally:
            async with self._lock:
                self._reserved[owner] -= 1
        self._on_claim("pool" if pooled else "cold", time.monotonic() - started)
        if pooled:
            pool.refill()
        token = auth.new_token()
        record = self._record(pair, owner, token, req, timeout_s, mode, pooled is not None, secret_set)
        record = record.model_copy(update={"env": sorted(env), "env_values": env})
        if template is not None:  # what was asked, with its version resolved
            record = record.model_copy(update={"template": template.ref})
        session = Session(record, pair.sandbox)
        self._book.save(session)
        self._book.add(session)
        if claimed is not None and pair.egress is not None:
            await announce([claimed], functools.partial(self._parts.egress.report, pair.egress))
        if pair.egress is not None:
            self._parts.egress.write_meta(session.id, owner=owner, created_at=record.created_at, ended_at=None)
        self._parts.recordings.start(session, req.recording_mb)
        return session, token

    async def _profile(self, owner: str, req: CreateSession) -> bytes | None:
        """The saved browser profile to load, read (and decrypted) before anything starts: a missing one
        (404) or profiles off (409) refuse the create at once."""
        if req.profile is None or self._parts.profiles is None:
            return None
        return await asyncio.to_thread(self._parts.profiles.prepare, owner, req.profile)

    async def _bind(self, volume: Claim | None, pair: Pair) -> VolumeEvent | None:
        """The claimed volume now the session's, before its record (a gateway that dies between them
        releases it at start); a pair whose bind fails is removed, never left running unowned."""
        if volume is None:
            return None
        try:
            return await self._parts.volumes.bind(volume, pair.session_id)
        except BaseException:
            await settle(asyncio.ensure_future(self._starts.remove(pair)))
            raise

    async def _load_profile(self, pair: Pair, req: CreateSession, archive: bytes | None) -> None:
        """The profile into the claimed pair's browser; a pair that fails it is removed, never handed out."""
        if req.profile is None or archive is None or self._parts.profiles is None:
            return
        try:
            await self._parts.profiles.load(pair, req.profile, archive)
        except BaseException:
            await settle(asyncio.ensure_future(self._starts.remove(pair)))
            raise

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

    async def _reserve(
        self, owner: str, req: CreateSession | None, template: Resolved | None = None
    ) -> tuple[WarmPool, Pair | None]:
        """A slot within the caps (429 past them), held until the create ends; and a pooled pair, if one
        fits, from the base's pool or the template's (none for a resume, ``req`` None)."""
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
            if req is None:
                return self._pool, None
            if template is None:
                return self._pool, self._pool.take(req)
            pool = self._parts.templates.pool_for(template.ref)
            if pool is None:
                return self._pool, None
            return pool, pool.take(req, template.image_id)

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
            volume=req.volume,
            profile=req.profile,
            resources=req.resources if req.resources != Resources() else None,
            idle_action=req.idle_action,
        )

    async def _claim(self, pair: Pair, secret_set: SecretSet, env: dict[str, str], actor: str) -> None:
        """Make a ready pair the session's: its env, then its secrets (its policy is in force already:
        a cold proxy starts with it, a pooled one took it in :meth:`WarmPool.hand_out`). A pair that
        fails this is removed: it is never handed out."""
        secrets = pair.egress is not None and bool(secret_set.records)
        if not env and not secrets:
            return
        try:
            await self._parts.envs.give(pair.sandbox, env)
            if secrets:
                await self._parts.broker.give(pair, secret_set, SecretSet(), actor)
        except BaseException:
            await settle(asyncio.ensure_future(self._starts.remove(pair)))
            raise


def refuse_secrets_in_env(req: CreateSession) -> None:
    """InvalidRequest (naming the variable, never a value) when the create's env would hand the agent
    one of its brokered secrets: secrets stay brokered, env is the agent's to read."""
    values = {name: spec.value.get_secret_value() for name, spec in req.secrets.items()}
    problem = env_secret_problem(req.env, values)
    if problem is not None:
        raise InvalidRequest(problem[1], field=f"env.{problem[0]}")


@dataclass(frozen=True, slots=True)
class ClaimParts:
    """What a claim hands the new session to: its egress's archive, its secrets' broker, its recording,
    the hermetic replays it may answer from, its env's giver, the workspace volumes it may hold, the
    templates it may start from (and their pools), the browser profile it loads."""

    egress: EgressPort
    broker: SecretBroker
    recordings: SessionRecordings
    replays: ReplayUploads
    envs: SessionEnvs
    volumes: Volumes
    templates: TemplatePools
    profiles: BrowserProfiles | None = None  # saved browser profiles loaded at a create
