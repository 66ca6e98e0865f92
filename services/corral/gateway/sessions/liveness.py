"""Whether a live session's sandbox and controller still live: a dead sandbox ends its session with
``sandbox_exited`` (``node_lost`` or ``node_drained`` when its machine went or was drained), a
controller that cannot stay up (corral.gateway.vitals) with ``controller_dead``.
Asked by the reaper every tick and by a relay that lost its sandbox connection."""

from __future__ import annotations

import asyncio
import logging
import time

from corral.gateway.sessions.book import SessionBook
from corral.gateway.sessions.controllers import Controllers
from corral.gateway.sessions.endings import Endings
from corral.gateway.sessions.records import Session, describe_exit, end_reason_of
from corral.gateway.vitals import CONTROLLER_DEAD, ControllerWatch
from corral.runtime import SandboxRuntime

log = logging.getLogger(__name__)
CONTROLLER_LOOK_S = 0.25  # how often a relay that lost its controller looks whether it is back
SANDBOX_LOOK_S = 0.1  # how often a relay that lost its sandbox looks whether Docker marked it exited


class Liveness:
    def __init__(
        self,
        book: SessionBook,
        runtime: SandboxRuntime,
        endings: Endings,
        controllers: Controllers,
        vitals: ControllerWatch,
        dead_after_s: float,
    ) -> None:
        self._book, self._runtime, self._endings, self._controllers = book, runtime, endings, controllers
        self.vitals = vitals
        self._dead_after_s = dead_after_s
        self._probe: asyncio.Task[None] | None = None  # the reaper's round of controller probes

    async def end_if_dead(self, session: Session) -> bool:
        info = await asyncio.to_thread(self._runtime.exit_info, session.sandbox.id)
        if info is None or session.state != "ready":
            return False
        reason, detail = end_reason_of(info), describe_exit(info)
        log.warning("session %s: its sandbox %s ended, %s (%s)", session.id, session.sandbox.name, reason, detail)
        # Nothing left to drain from a dead or unreachable controller: the bundle closes at once.
        self._endings.end_soon(session, reason, detail, drain_s=0.0)
        return True

    def probe(self) -> None:
        """One round of :meth:`check_controllers` at a time, as a kept task (cancelled by :meth:`close`)."""
        if self._probe is None or self._probe.done():
            self._probe = asyncio.create_task(self._check_controllers_logged())

    def probing(self) -> asyncio.Task[None] | None:
        """The round under way, if any (a test awaits it; the stop cancels it)."""
        return self._probe if self._probe is not None and not self._probe.done() else None

    async def close(self) -> None:
        probe = self.probing()
        if probe is not None:
            probe.cancel()
            await asyncio.gather(probe, return_exceptions=True)

    async def _check_controllers_logged(self) -> None:
        try:
            await self.check_controllers()
        except Exception:
            log.exception("controller liveness check failed")

    async def check_controllers(self) -> None:
        """Every live session's controller asked who it is (all at once); one that cannot stay up
        (corral.gateway.vitals) ends its session with controller_dead, its recording kept as it stands."""
        if not self._controllers.opened:
            return
        live = self._book.ready()
        self.vitals.keep_only([s.id for s in live])
        boots = await asyncio.gather(*(self._controllers.boot(s.sandbox) for s in live))
        now = time.monotonic()
        for session, boot in zip(live, boots, strict=True):
            why = self.vitals.saw(session.id, boot, now)
            if why is not None and session.state == "ready":
                self._controller_dead(session, why)

    def _controller_dead(self, session: Session, why: str) -> None:
        log.warning("session %s: its controller cannot stay up (%s); ending it", session.id, why)
        self._endings.end_soon(session, CONTROLLER_DEAD, why, drain_s=0.0)

    async def check_sandbox(self, session: Session, within_s: float = 1.0) -> None:
        """The relay lost its sandbox connection: if the container died, the session ends now (the
        relay then closes with 4000 and the reason). Docker marks a container exited a moment after
        its processes die, so this looks a few times. A controller restarted inside a running
        container is no death: this then waits until it answers again (the client's reconnect then
        finds it) or is judged dead (:meth:`_await_controller`), and the session lives on or not."""
        deadline = time.monotonic() + within_s
        while session.state == "ready":
            try:
                if await self.end_if_dead(session):
                    return
            except Exception:
                log.exception("cannot inspect the sandbox of session %s", session.id)
                return
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(SANDBOX_LOOK_S)
        await self._await_controller(session)

    async def _await_controller(self, session: Session) -> None:
        """Until the session's controller answers, or the watch (corral.gateway.vitals) finds it
        cannot stay up and the session ends with controller_dead, looked at every
        CONTROLLER_LOOK_S; at most controller_dead_after_s and a look more."""
        if not self._controllers.opened:
            return
        deadline = time.monotonic() + self._dead_after_s + CONTROLLER_LOOK_S
        while session.state == "ready" and time.monotonic() < deadline:
            boot = await self._controllers.boot(session.sandbox)
            if session.state != "ready":
                return
            why = self.vitals.saw(session.id, boot, time.monotonic())
            if why is not None:
                self._controller_dead(session, why)
                return
            if boot is not None:
                return
            await asyncio.sleep(CONTROLLER_LOOK_S)
