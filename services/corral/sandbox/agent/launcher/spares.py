"""Shepherds reserved ahead of need, so that a command's way holds no launcher.

After each spawn the client reserves the next shepherd in the background (the launcher's
``reserve``), and the next spawn sends its job and stdio straight to that shepherd's child, forked
and waiting. With no spare held (the first command, or two at once) or a spare whose child died
while it waited (the OOM killer's first pick), the launcher's ``spawn`` does it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from corral.sandbox.agent.launcher.control import Control
from corral.sandbox.agent.launcher.messages import SPARE_IDLE_S

log = logging.getLogger("corral.launcher.client")  # the name the logs have always had

# Spares held: two, so that a command that follows another at once still finds one ready while the
# first one's successor is being forked (each is a shepherd and its child, copies of the launcher).
SPARES = 2


@dataclass(frozen=True, slots=True)
class Reserved:
    """A shepherd forked ahead for this controller: our end of its control channel, and of the job
    socket its child waits on. Dropping it (closing both) ends the shepherd and its child."""

    control: socket.socket
    job: socket.socket
    shepherd: int

    def close(self) -> None:
        self.job.close()
        self.control.close()


def start_on(spare: Reserved, job: bytes, stdio: tuple[int, int, int], on_exit: Callable[[], None]) -> Control | None:
    """The job and its stdio straight to a reserved shepherd's child; None if that child died while it
    waited (then the caller goes to the launcher, the spare dropped)."""
    try:
        spare.job.setblocking(False)  # a fresh socket's buffer holds a whole job: never waits
        socket.send_fds(spare.job, [job], list(stdio))
    except OSError as exc:
        log.info("the spare shepherd's child is gone (%s): the launcher starts this one", exc)
        spare.control.close()
        return None
    finally:
        spare.job.close()
    return Control(spare.control, on_exit)


class Spares:
    """Up to :data:`SPARES` reserved shepherds (``held``, oldest first), reserved one at a time by
    ``reserve``, and let go after ``idle_s`` without a command."""

    def __init__(self, reserve: Callable[[], Awaitable[Reserved]]) -> None:
        self._reserve = reserve
        self.held: list[Reserved] = []
        self.reserving: asyncio.Task[None] | None = None  # the next one, on its way
        self._letting_go: asyncio.TimerHandle | None = None
        self.idle_s = SPARE_IDLE_S
        self._closed = False

    async def take(self) -> Reserved | None:
        """The spare held (waiting for one on its way rather than going to the launcher)."""
        reserving = self.reserving
        if not self.held and reserving is not None:
            await asyncio.wait([reserving])  # never cancels it: the next command wants it too
        return self.held.pop(0) if self.held else None

    def reserve_next(self) -> None:
        """Reserve another in the background, unless enough are held or one is on its way."""
        if self._closed or len(self.held) >= SPARES or self.reserving is not None:
            return
        self.reserving = asyncio.get_running_loop().create_task(self._reserve_spare())

    async def _reserve_spare(self) -> None:
        try:
            spare = await self._reserve()
        except OSError as exc:
            log.info("no spare shepherd (%s): the next command goes through the launcher", exc)
            return
        finally:
            self.reserving = None
        if self._closed or len(self.held) >= SPARES:
            spare.close()
            return
        self.held.append(spare)
        if self._letting_go is not None:
            self._letting_go.cancel()
        self._letting_go = asyncio.get_running_loop().call_later(self.idle_s, self._let_go)
        self.reserve_next()  # until SPARES are held

    def _let_go(self) -> None:
        """Idle: the spares held are closed (each shepherd and its child end), and a reservation on its
        way is cancelled (its answer's sockets are closed as they come); none is reserved again until
        the next command."""
        self._letting_go = None
        if self.reserving is not None:
            self.reserving.cancel()
        spares, self.held = self.held, []
        for spare in spares:
            spare.close()
        if spares:
            log.info("idle for %.0f s: %d spare shepherd(s) let go", self.idle_s, len(spares))

    async def close(self) -> None:
        """No more spares: those held are dropped, the one on its way cancelled."""
        self._closed = True
        if self._letting_go is not None:
            self._letting_go.cancel()
        reserving, self.reserving = self.reserving, None
        if reserving is not None:
            reserving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reserving
        spares, self.held = self.held, []
        for spare in spares:
            spare.close()
