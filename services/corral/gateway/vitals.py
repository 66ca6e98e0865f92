"""Whether a session's controller stays up, for the reaper: a sandbox whose container runs but whose
controller the init keeps restarting (killed again and again, OOM-killed as the agent fills memory)
serves no one, and would hold its slot until its timeout. Every few reaper ticks
(corral.gateway.sessions.reaper.CONTROLLER_PROBE_TICKS) the reaper asks every live session's
controller who it is (``GET /v1/secrets`` names its process's ``boot``); a controller that restarted
more than ``max_restarts`` times within ``window_s`` (its boot changed), or that has not answered for
``dead_after_s`` (the same process twice: one that answers once and dies again does not count as up),
is dead: the reaper ends its session with ``controller_dead``.

Judged from the gateway's side, where the agent cannot lie about it: it can neither make a dead
controller answer nor hide a restart (each process draws its own boot id).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field

import httpx

from corral.errors import UnprovenController
from corral.gateway import controller
from corral.runtime import SandboxAddress

CONTROLLER_DEAD = "controller_dead"  # the end reason of a session whose controller cannot stay up
PROBE_TIMEOUT_S = 2.0
PROBE_PATH = "/v1/secrets"


@dataclass
class _Seen:
    answered_at: float  # when it last answered (or was first watched)
    boot: str | None = None
    restarts: deque[float] = field(default_factory=deque)  # when each new boot was first seen


class ControllerWatch:
    """What the reaper saw of each session's controller, and its verdict."""

    def __init__(self, max_restarts: int, window_s: float, dead_after_s: float) -> None:
        self._max_restarts, self._window_s, self._dead_after_s = max_restarts, window_s, dead_after_s
        self._seen: dict[str, _Seen] = {}

    def saw(self, session_id: str, boot: str | None, now: float) -> str | None:
        """One look at ``session_id``'s controller: ``boot`` as it answered ("" for a controller that
        names none), None when it did not answer. Returns why it is dead, or None while it is not."""
        seen = self._seen.setdefault(session_id, _Seen(answered_at=now))
        if boot is None:
            silent = now - seen.answered_at
            return f"no answer for {silent:.0f} s" if silent >= self._dead_after_s else None
        if boot and seen.boot and boot != seen.boot:
            # A new process: counted, but not yet up (one killed again before the next look never
            # resets the silence, else a controller that flickers up now and then would escape both).
            seen.restarts.append(now)
        else:
            seen.answered_at = now
        if boot:
            seen.boot = boot
        while seen.restarts and now - seen.restarts[0] > self._window_s:
            seen.restarts.popleft()
        if len(seen.restarts) > self._max_restarts:
            return f"restarted {len(seen.restarts)} times in {self._window_s:.0f} s"
        return None

    def keep_only(self, session_ids: Collection[str]) -> None:
        """Forget the sessions no longer watched (ended, or not ready)."""
        for gone in self._seen.keys() - set(session_ids):
            del self._seen[gone]


async def controller_boot(http: httpx.AsyncClient, sandbox: SandboxAddress) -> str | None:
    """The boot id the controller names (signed and proven, like every call to it): "" when it answers
    without one (an older image), None when it does not answer well."""
    try:
        response = await controller.request(
            http, sandbox.base_url, sandbox.secret, "GET", PROBE_PATH, timeout=PROBE_TIMEOUT_S
        )
        if response.status_code != 200:
            return None
        boot = response.json().get("boot", "")
    except (httpx.HTTPError, UnprovenController, ValueError, AttributeError):
        return None  # an unproven answer is no answer from this controller
    return boot if isinstance(boot, str) else ""


__all__ = ["CONTROLLER_DEAD", "ControllerWatch", "controller_boot"]
