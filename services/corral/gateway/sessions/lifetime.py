"""A live session's lifetime changed by its owner (``PATCH /v1/sessions/{id}`` with ``timeout_s``): its
new remaining lifetime counted from now, as E2B's ``set_timeout`` does, up to the gateway's maximum
(``CORRAL_MAX_TIMEOUT_S``); longer or shorter than before. The new expiry is in the record (the
reaper reads it each tick, a restarted gateway adopts it with the record) and in the session's audit
chain (op ``lifetime``) before it holds: a report the proxy does not take changes nothing."""

from __future__ import annotations

import time
from collections.abc import Callable

from corral.contracts.control import LifetimeEvent
from corral.errors import InvalidRequest, SessionPaused
from corral.gateway.sessions.book import SessionBook
from corral.gateway.sessions.egressport import EgressPort
from corral.gateway.sessions.records import Session


def timeout_problem(timeout_s: int, max_timeout_s: int) -> str | None:
    """Why ``timeout_s`` cannot be a session's new remaining lifetime, or None. Pure."""
    if timeout_s < 1:
        return "timeout_s is at least 1"
    if timeout_s > max_timeout_s:
        return f"timeout_s is at most {max_timeout_s} (CORRAL_MAX_TIMEOUT_S)"
    return None


class Lifetimes:
    def __init__(
        self, book: SessionBook, egress: EgressPort, max_timeout_s: int, clock: Callable[[], float] = time.time
    ) -> None:
        self._book, self._egress, self._max_timeout_s = book, egress, max_timeout_s
        self.clock = clock

    def check(self, timeout_s: int) -> None:
        """InvalidRequest (naming the maximum) when ``timeout_s`` cannot be a new lifetime: a PATCH
        asks this before it changes anything else."""
        problem = timeout_problem(timeout_s, self._max_timeout_s)
        if problem is not None:
            raise InvalidRequest(problem, field="timeout_s")

    async def set_timeout(self, session: Session, timeout_s: int, actor: str) -> float:
        """The session now ends ``timeout_s`` from now; returns its new expiry. InvalidRequest (naming
        the maximum) over ``max_timeout_s``, nothing changed; SessionNotFound for a session being ended."""
        self.check(timeout_s)
        async with session.changing:  # one change at a time, each sees the last
            self._book.still_live(session)
            if session.paused:  # paused meanwhile (the route looked before the lock): its proxy is stopped
                raise SessionPaused(f"session {session.id} is {session.state}: resume it first")
            previous = session.record.expires_at
            expires_at = self.clock() + timeout_s
            if session.egress is not None:
                await self._egress.report(session.egress, LifetimeEvent(actor, expires_at, previous))
                self._book.still_live(session)
            session.record = session.record.model_copy(update={"expires_at": expires_at})
            self._book.save(session)
        return expires_at
