"""A session's environment variables (``env`` at create) on the gateway's side: given to its controller
at the claim (a pooled sandbox is already running), and the env watchdog's round that gives them
again to a controller that lost them (restarted inside its container: it keeps them in memory only).
The values live in the session record (corral.gateway.sessions.records), never in an answer."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from corral.contracts import envvars
from corral.errors import SandboxError
from corral.gateway.sessions.book import SessionBook
from corral.gateway.sessions.controllers import Controllers
from corral.gateway.sessions.records import Listing, Session
from corral.runtime import SandboxAddress

log = logging.getLogger(__name__)


class SessionEnvs:
    def __init__(self, book: SessionBook, controllers: Controllers) -> None:
        self._book, self._controllers = book, controllers

    async def give(self, sandbox: SandboxAddress, env: Mapping[str, str]) -> None:
        """``env``, a plain mapping (the create's own, or a template's with the create's over it), to the
        sandbox's controller before the session is answered; none to give costs nothing. Raises
        SandboxError."""
        if env:
            await self._controllers.put_env(sandbox, env)

    async def check(self, listing: Listing | None = None) -> None:
        """The env watchdog's round (one of the reaper's rounds; ``listing`` unused): every live session
        with env: its controller holds that set (by its digest), else it is given it again. One
        signed GET per such session a round; sessions without env cost nothing."""
        live = [s for s in self._book.ready() if s.record.env_values]
        await asyncio.gather(*(self._hold(session) for session in live))

    async def _hold(self, session: Session) -> None:
        expected = session.record.env_values
        try:
            if await self._controllers.env_digest(session.sandbox) != envvars.digest(expected):
                log.warning("session %s: its controller lost its env; putting it again", session.id)
                await self._controllers.put_env(session.sandbox, expected)
        except SandboxError as exc:
            log.debug("session %s: env not checked: %s", session.id, exc)  # next round
