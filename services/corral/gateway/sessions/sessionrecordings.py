"""The sessions' recordings (corral.gateway.recording) wired to their lives: started with a session (or
carried on for an adopted one), stopped before its sandbox goes, its proxy's recorded responses joined
to the bundle once the proxy is gone. Nothing here when the gateway does not record (``CORRAL_RECORD=0``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from corral.gateway.recording import RecordingManager, close_manifest
from corral.gateway.sessions.controllers import Controllers
from corral.gateway.sessions.egressport import EgressPort
from corral.gateway.sessions.pausedstate import PausedState
from corral.gateway.sessions.records import Session
from corral.recording.bundle import EventFields

log = logging.getLogger(__name__)


class SessionRecordings:
    def __init__(self, recordings: RecordingManager | None, egress: EgressPort, controllers: Controllers) -> None:
        self.recordings = recordings  # None: the gateway records nothing
        self._egress = egress
        self._controllers = controllers

    def start(self, session: Session, budget_mb: int | None = None) -> None:
        """Record the session's screen and actions (a new one, or an adopted one's bundle carried on)."""
        if self.recordings is None or not self._controllers.opened:
            return
        egress = session.egress
        audit = egress.audit_path if egress is not None else None
        has_responses = egress is not None and not session.record.hermetic
        responses = self._egress.responses_path(session.id) if has_responses else None
        try:
            self.recordings.start(
                session.id,
                session.sandbox.base_url,
                audit,
                self._controllers.http,
                session.record.manifest(),
                session.owner,
                responses,
                budget_mb,
                secret=session.sandbox.secret,
            )
        except OSError as exc:
            log.error("cannot record session %s: %s", session.id, exc)

    async def pause(self, session_id: str, state: PausedState) -> None:
        """Its recorder stopped with a ``pause`` marker (what was saved, the tabs), its bundle open."""
        if self.recordings is not None:
            marker: EventFields = {"event": "pause", "time": state.paused_at, "saved": dict(state.archives)}
            marker["tabs"] = len(state.tabs)
            with contextlib.suppress(Exception):
                await self.recordings.pause(session_id, marker)

    def resume(self, session: Session, state: PausedState) -> None:
        """Its bundle carried on: a ``resume`` marker, then the new controller's events."""
        self.start(session)
        recorder = self.recordings.live(session.id) if self.recordings is not None else None
        if recorder is not None:
            recorder.note(
                {"event": "resume", "time": time.time(), "saved": dict(state.archives), "tabs": len(state.tabs)}
            )

    def close_lost(self, session_id: str, had_egress: bool, reason: str = "lost") -> None:
        """A session that died while the gateway was down: its bundle ends where it stopped (``reason``:
        ``lost``, or ``node_lost`` / ``node_drained`` when the runtime says its machine went)."""
        if self.recordings is None:
            return
        responses = self._egress.responses_path(session_id) if had_egress else None
        with contextlib.suppress(OSError, ValueError):
            self.recordings.close_ended(session_id, reason, responses)

    async def stop(self, session_id: str, reason: str, drain_s: float) -> None:
        """Before the sandbox goes: the recorder takes the events its controller still holds (and
        closes the bundle even when that takes too long)."""
        if self.recordings is not None:
            with contextlib.suppress(Exception):
                if self.recordings.live(session_id) is None:  # paused: no recorder, the bundle still open
                    close_manifest(self.recordings.directory(session_id), reason)
                await self.recordings.stop(session_id, reason, drain_s=drain_s)

    async def attach_responses(self, session: Session) -> None:
        """The session's proxy is gone, so its responses file is complete: it joins the bundle."""
        if self.recordings is None or session.record.hermetic:
            return
        responses = self._egress.responses_path(session.id)
        if responses is not None:
            with contextlib.suppress(OSError):
                await asyncio.to_thread(self.recordings.attach_responses, session.id, responses)

    async def stop_all(self) -> None:
        if self.recordings is not None:
            await self.recordings.stop_all()

    async def prune(self, retention_s: float) -> None:
        if self.recordings is not None:
            await asyncio.to_thread(self.recordings.prune, retention_s)
