"""Session lifecycle, assembled: :class:`SessionManager` starts and stops the session side's parts
(wired by corral.gateway.app's ``build_sessions``) and is what routes ask: create (``claims``), get and
list (``book``), change egress and secrets (``brokering``), change the lifetime (``lifetime``), end
(``endings``), a relay's lost sandbox (``liveness``), each a module of corral.gateway.sessions.

Runtime calls block, so they run in threads; every background task is kept and cancelled on stop.
Stopping leaves sessions' sandboxes running (a restarted gateway adopts them again: ``recovery``) and
removes everything else it started: pooled pairs (``pool``), and a pair half-started by a refill.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from corral.gateway.egress import Ground
from corral.gateway.grounds import GroundPool
from corral.gateway.limits import Limits
from corral.gateway.links import LinkBook
from corral.gateway.models import CreateSession, ResumeSession, UpdateSecrets
from corral.gateway.previews.book import PreviewBook
from corral.gateway.recording import RecordingManager
from corral.gateway.replays import ReplayUploads
from corral.gateway.sessions.book import SessionBook
from corral.gateway.sessions.brokering import SecretBroker
from corral.gateway.sessions.browserprofiles import BrowserProfiles
from corral.gateway.sessions.claims import Claims
from corral.gateway.sessions.controllers import Controllers
from corral.gateway.sessions.egressport import EgressPort
from corral.gateway.sessions.endings import Endings
from corral.gateway.sessions.lifetime import Lifetimes
from corral.gateway.sessions.liveness import Liveness
from corral.gateway.sessions.pausing import Pauses
from corral.gateway.sessions.pool import WarmPool
from corral.gateway.sessions.reaper import Reaper
from corral.gateway.sessions.records import Session
from corral.gateway.sessions.recovery import Recovery
from corral.gateway.sessions.sessionrecordings import SessionRecordings
from corral.gateway.sessions.starts import Starts
from corral.gateway.sessions.templatepools import TemplatePools
from corral.gateway.vitals import ControllerWatch
from corral.gateway.volumes import Volumes
from corral.runtime import SandboxRuntime

__all__ = ["SessionManager", "SessionParts"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SessionParts:
    """The session side's collaborators, one job each (built together by corral.gateway.app)."""

    runtime: SandboxRuntime
    network: str  # the sandboxes' shared network, ensured at start
    reap_interval_s: float
    limits: Limits
    book: SessionBook
    egress: EgressPort
    grounds: GroundPool[Ground] | None  # None without egress control: a sandbox alone needs none
    starts: Starts
    pool: WarmPool
    claims: Claims
    broker: SecretBroker
    endings: Endings
    liveness: Liveness
    recovery: Recovery
    reaper: Reaper
    controllers: Controllers
    recordings: SessionRecordings
    replays: ReplayUploads
    links: LinkBook
    previews: PreviewBook
    lifetimes: Lifetimes
    volumes: Volumes
    profiles: BrowserProfiles | None = None  # saved browser profiles (corral.gateway.sessions.browserprofiles)
    pauses: Pauses | None = None  # pause and resume (corral.gateway.sessions.pausing)


class SessionManager:
    def __init__(self, parts: SessionParts) -> None:
        self.parts = parts
        self.book, self.egress, self.grounds, self.pool = parts.book, parts.egress, parts.grounds, parts.pool
        self.limits, self.links, self.replays, self.reaper = parts.limits, parts.links, parts.replays, parts.reaper
        self.liveness, self.broker, self.endings = parts.liveness, parts.broker, parts.endings
        self.volumes = parts.volumes
        self.profiles = parts.profiles
        self.previews = parts.previews
        self.host_guarded = False
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def templates(self) -> TemplatePools:
        return self.parts.claims.templates

    @property
    def recordings(self) -> RecordingManager | None:
        return self.parts.recordings.recordings

    @property
    def vitals(self) -> ControllerWatch:
        return self.liveness.vitals

    @property
    def reaper_ticks(self) -> int:
        return self.reaper.ticks

    # -- lifecycle -------------------------------------------------------------------------------------

    async def start(self) -> None:
        p = self.parts
        for warning in self.limits.warnings:
            log.warning("limits: %s", warning)
        self.host_guarded = await asyncio.to_thread(p.runtime.ensure_sandbox_network, p.network)
        self.host_guarded &= await p.egress.start()
        p.controllers.open()
        await p.recovery.run()
        if p.pauses is not None:
            p.pauses.sweep()
        for session in self.book.running():
            p.recordings.start(session)  # adopted sessions: their bundles carry on (a paused one's at its resume)
        p.starts.open()  # after the orphan networks went: its networks are no orphans
        pools = [self.pool, *self.templates.pools()]  # the base's, and one per template in CORRAL_POOL
        for coro in (self.reaper.run(p.reap_interval_s), *(pool.run() for pool in pools)):
            task = asyncio.create_task(coro)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        for pool in pools:
            pool.refill()

    async def stop(self) -> None:
        p = self.parts
        # A refill under way is cancelled; the starts wait for their threads and remove what they
        # started before the cancellation ends them.
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.liveness.close()
        await self.endings.settled()
        if p.pauses is not None:
            await p.pauses.settled()
        # Pooled pairs are never adopted by the next start (a used sandbox must never reach another
        # key), so they go now rather than run on unowned.
        await self.pool.close()
        for pool in self.templates.pools():
            await pool.close()
        await p.starts.close()  # no session took the grounds: their networks and state go
        await p.recordings.stop_all()
        await p.controllers.close()

    def background_tasks(self) -> list[asyncio.Task[None]]:
        """Its loops and the controllers' probe round, while they run (none once stopped)."""
        probe = self.liveness.probing()
        return [*self._tasks, *([probe] if probe is not None else [])]

    # -- what routes ask -------------------------------------------------------------------------------

    def get(self, session_id: str) -> Session:
        return self.book.get(session_id)

    def list(self, owner: str | None = None) -> list[Session]:
        return self.book.sessions(owner)

    def counts(self) -> dict[str, int]:
        running = len(self.book.running())
        return {
            "ready": running,
            "paused": len(self.book) - running,
            "pool": len(self.pool) + len(self.templates),
            "starting": self.parts.claims.reserved() + self.pool.starting + self.templates.starting,
        }

    def grounds_held(self) -> int:
        """Cold starts' groundwork made ahead and held now (corral.gateway.grounds)."""
        return len(self.parts.starts.held_grounds())

    async def create(self, owner: str, req: CreateSession) -> tuple[Session, str]:
        return await self.parts.claims.create(owner, req)

    async def pause(self, session: Session) -> None:
        assert self.parts.pauses is not None, "wired by build_sessions"
        await self.parts.pauses.pause(session)

    async def resume(self, session: Session, body: ResumeSession) -> None:
        assert self.parts.pauses is not None, "wired by build_sessions"
        await self.parts.pauses.resume(session, body)

    async def delete(self, session_id: str, reason: str = "deleted") -> None:
        await self.endings.delete(session_id, reason)

    async def update_egress(
        self,
        session: Session,
        allow: Sequence[str] | None,
        mode: str | None,
        actor: str,
        secret_changes: UpdateSecrets | None = None,
    ) -> None:
        await self.broker.update(session, allow, mode, actor, secret_changes)

    def check_timeout(self, timeout_s: int) -> None:
        self.parts.lifetimes.check(timeout_s)

    async def set_timeout(self, session: Session, timeout_s: int, actor: str) -> float:
        return await self.parts.lifetimes.set_timeout(session, timeout_s, actor)

    async def check_sandbox(self, session: Session, within_s: float = 1.0) -> None:
        await self.liveness.check_sandbox(session, within_s)
