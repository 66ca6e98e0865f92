"""A few sessions' groundwork made ahead: what a cold start needs before its containers can start
(its egress network and CA, corral.gateway.egress.Ground) taken from here instead of made on the
request's path.

The pool is refilled in the background, by one kept task, when its owner says so (after a start,
not during it: making a network is Docker's work too, and Docker is busy starting the session's
containers then). What it holds is never handed to anyone else once taken, and everything it holds
or is making is dropped when it closes; a cancelled refill waits for its thread and drops what it made.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Generic, TypeVar

from corral.gateway.threads import in_thread, settle

log = logging.getLogger(__name__)
T = TypeVar("T")


class GroundPool(Generic[T]):
    """Up to ``size`` things made by ``make`` (blocking, run in a thread), undone by ``drop``."""

    def __init__(self, make: Callable[[], T], drop: Callable[[T], None], size: int, retry_s: float = 5.0) -> None:
        self._make, self._drop, self._size, self._retry_s = make, drop, size, retry_s
        self._held: list[T] = []
        self._wanted = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.filled = asyncio.Event()  # set whenever the pool is full (tests and the bench wait on it)

    def __len__(self) -> int:
        return len(self._held)

    def start(self) -> None:
        if self._task is None and self._size > 0:
            self._task = asyncio.create_task(self._fill())
            self.refill()

    def take(self) -> T | None:
        """The oldest one held, or None when the pool is empty (the caller makes its own)."""
        if not self._held:
            return None
        self.filled.clear()
        return self._held.pop(0)

    def refill(self) -> None:
        self._wanted.set()

    async def close(self) -> None:
        """Stop refilling (a make under way finishes and is dropped) and drop everything held."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        held, self._held = self._held, []
        results, _ = await settle(*(in_thread(self._drop, item) for item in held))
        for result in results:
            if isinstance(result, BaseException):
                log.error("could not drop a pre-made session ground: %s", result)

    async def _fill(self) -> None:
        while True:
            await self._wanted.wait()
            self._wanted.clear()
            while len(self._held) < self._size:
                (made,), cancelled = await settle(in_thread(self._make))
                if cancelled:
                    if not isinstance(made, BaseException):
                        await settle(in_thread(self._drop, made))
                    raise asyncio.CancelledError
                if isinstance(made, BaseException):
                    log.error("could not make a session ground ahead; retrying in %.0f s: %s", self._retry_s, made)
                    await asyncio.sleep(self._retry_s)
                    continue
                self._held.append(made)
            self.filled.set()
