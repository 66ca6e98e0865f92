"""A session's end: marked ended at once (its WebSockets close with 4000 and the reason), then its
browser profile saved (when it asked), its recording closed, its sandbox and proxy removed, its egress
log marked ended, its record deleted.
Ended on request (``DELETE``) or from the background (the reaper, a relay that lost its sandbox),
by a kept task, so one slow removal never holds up the reaper."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from corral.errors import ProfileUnreadable, SessionNotFound
from corral.gateway.sessions.book import SessionBook
from corral.gateway.sessions.browserprofiles import BrowserProfiles
from corral.gateway.sessions.egressport import EgressPort
from corral.gateway.sessions.records import SANDBOX_GONE_REASONS, Session
from corral.gateway.sessions.sessionrecordings import SessionRecordings
from corral.gateway.volumes import Volumes, announce
from corral.runtime import SandboxRuntime

log = logging.getLogger(__name__)


class Endings:
    def __init__(
        self,
        book: SessionBook,
        runtime: SandboxRuntime,
        egress: EgressPort,
        recordings: SessionRecordings,
        volumes: Volumes | None = None,
        profiles: BrowserProfiles | None = None,
    ) -> None:
        self._book, self._runtime, self._egress, self._recordings = book, runtime, egress, recordings
        self._volumes = volumes
        self._profiles = profiles  # a session that asked for it saves its browser profile before it goes
        self._ends: set[asyncio.Task[None]] = set()  # sessions being ended in the background
        # A paused session's saved state removed at its end (the wiring sets Pauses.discard here).
        self.discard_saved: Callable[[str], None] = lambda session_id: None
        # ... and its browser's state as its pause exported it (a profile it saves at its end is that).
        self.paused_browser_state: Callable[[str], bytes | None] = lambda session_id: None

    async def delete(self, session_id: str, reason: str = "deleted") -> None:
        session = self._book.find(session_id)
        if session is None or session.state == "stopping":
            raise SessionNotFound(f"no session {session_id}")
        self.mark_ended(session, reason)
        await self._end(session)

    @staticmethod
    def mark_ended(session: Session, reason: str, detail: str = "") -> None:
        """From here the session is over for its clients: its WebSockets close (4000) at once. A
        session whose teardown failed keeps the reason it ended for (its clients were told it; the
        retry, by the reaper or a DELETE, would otherwise say ``sandbox_exited`` of a sandbox a lost
        or drained node took with it)."""
        session.state = "stopping"
        if not session.end_reason:
            session.end_reason, session.end_detail = reason, detail
        session.ended.set()

    def end_soon(self, session: Session, reason: str, detail: str = "", drain_s: float = 5.0) -> None:
        """End a session from the background: marked ended now, removed by a kept task."""
        if session.state == "stopping":
            return
        self.mark_ended(session, reason, detail)

        async def end() -> None:
            try:
                await self._end(session, drain_s)
            except Exception:
                log.exception("could not end session %s", session.id)

        task = asyncio.create_task(end())
        self._ends.add(task)
        task.add_done_callback(self._ends.discard)

    async def settled(self) -> None:
        """Sessions being ended finish ending: their sandboxes are gone or going, their records must go too."""
        await asyncio.gather(*self._ends, return_exceptions=True)

    async def _end(self, session: Session, drain_s: float = 5.0) -> None:
        # A change under way finishes first (it sees the session ending and keeps nothing): nothing is
        # set on a proxy, kept in the vault or written to the store after the teardown.
        async with session.changing:
            await self._teardown(session, drain_s)

    async def _teardown(self, session: Session, drain_s: float) -> None:
        session_id, reason = session.id, session.end_reason
        if self._profiles is not None and reason not in SANDBOX_GONE_REASONS:
            await self._profiles.save_at_end(session, self._paused_state(session))
        if session.record.paused is None:
            # Where the runtime shares no directory with the proxy: its audit so far, for the recording.
            await self._egress.mirror_now(session_id, session.egress)
        await self._recordings.stop(session_id, reason, drain_s)
        try:
            await asyncio.to_thread(self._runtime.remove, session.sandbox.id)
            if self._volumes is not None:  # its sandbox is gone: nothing uses the mount now
                released = await self._volumes.release(session_id)
                if session.egress is not None:  # its proxy still runs: the release goes into its chain
                    await announce(released, functools.partial(self._egress.report, session.egress))
            if session.egress is not None:
                await self._end_egress(session)
        except Exception:
            # Keep the record: the reaper tries again, and a used sandbox never looks unowned.
            session.state = "ready"
            raise
        self._book.remove(session_id)
        self.discard_saved(session_id)
        session.removed.set()
        log.info("session %s ended: %s", session_id, reason)

    def _paused_state(self, session: Session) -> bytes | None:
        """A paused session's browser state as its pause exported it, opened only for a profile it saves
        at its end (live credentials: not decrypted for nothing). One that no longer opens (sealed
        under another CORRAL_PROFILE_KEY since, or damaged) is None: that profile is not saved
        (save_at_end logs it), and nothing stands in the way of the end."""
        ref = session.record.profile
        if session.record.paused is None or ref is None or not ref.save:
            return None
        try:
            return self.paused_browser_state(session.id)
        except (ProfileUnreadable, OSError) as exc:
            log.warning("session %s: its paused browser state does not open: %s", session.id, exc)
            return None

    async def _end_egress(self, session: Session) -> None:
        assert session.egress is not None
        # A paused session's proxy is stopped: its chain's head was anchored as it paused.
        await asyncio.to_thread(self._egress.teardown_blocking, session.egress, session.record.paused is None)
        ended: dict[str, Any] = {"ended_at": time.time(), "end_reason": session.end_reason}
        if session.end_detail:
            ended["end_detail"] = session.end_detail
        if session.sandbox.node:  # where it ran: an audit of a multi-node gateway names the machine
            ended["node"] = session.sandbox.node
        self._egress.write_meta(session.id, **ended)
        await self._recordings.attach_responses(session)
