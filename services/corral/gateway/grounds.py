"""A few sessions' groundwork made ahead: what a cold start needs before its containers can start
(its egress network and CA, corral.gateway.egress.Ground) taken from here instead of made on the
request's path.

The pool is refilled in the background, by one kept task, when its owner says so (after a start,
not during it: making a network is Docker's work too, and Docker is busy starting the session's
containers then). What it holds is never handed to anyone else once taken, and everything it holds
or is making is dropped when it closes; a cancelled refill waits for its thread and drops what it made.
What is no longer ``fresh`` (a ground held so long its CA might expire during a session) is never
handed out: it is dropped and made again, when met at a take and at a sweep every ``sweep_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Generic, TypeVar

from corral.gateway.threads import in_thread, settle

log = logging.getLogger(__name__)
T = TypeVar("T")


class GroundPool(Generic[T]):
    """Up to ``size`` things made by ``make`` (blocking, run in a thread), undone by ``drop``."""

    def __init__(
        self,
        make: Callable[[], T],
        drop: Callable[[T], None],
        size: int,
        retry_s: float = 5.0,
        fresh: Callable[[T], bool] = lambda item: True,
        sweep_s: float = 600.0,
    ) -> None:
        self._make, self._drop, self._size, self._retry_s = make, drop, size, retry_s
        self._fresh, self._sweep_s = fresh, sweep_s
        self._held: list[T] = []
        self._stale: list[T] = []  # taken out for being stale, to be dropped by the refill task
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
        """The oldest fresh one held, or None when there is none (the caller makes its own)."""
        while self._held:
            self.filled.clear()
            item = self._held.pop(0)
            if self._fresh(item):
                return item
            self._stale.append(item)
            self._wanted.set()  # dropped and made again by the refill task
        return None

    def retire(self, items: list[T]) -> None:
        """Take ``items`` (found broken by the owner) out of the pool: dropped and made again."""
        gone = [item for item in self._held if item in items]
        if gone:
            self._held = [item for item in self._held if item not in gone]
            self._stale += gone
            self.filled.clear()
            self._wanted.set()

    def held(self) -> list[T]:
        """What the pool holds now (not to be taken: for the owner's bookkeeping)."""
        return list(self._held)

    def refill(self) -> None:
        self._wanted.set()

    async def close(self) -> None:
        """Stop refilling (a make under way finishes and is dropped) and drop everything held."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        held, self._held = self._held + self._stale, []
        self._stale = []
        results, _ = await settle(*(in_thread(self._drop, item) for item in held))
        for result in results:
            if isinstance(result, BaseException):
                log.error("could not drop a pre-made session ground: %s", result)

    async def _fill(self) -> None:
        while True:
            # asyncio.timeout, not wait_for: 3.11's wait_for drops a cancellation that comes as the
            # event is set (a stopping gateway's last refill), and close() then waits for ever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._sweep_s):
                    await self._wanted.wait()
            self._wanted.clear()
            self._stale += [item for item in self._held if not self._fresh(item)]
            self._held = [item for item in self._held if item not in self._stale]
            if self._stale:
                self.filled.clear()  # not full until they are made again
            while self._stale:
                stale = self._stale.pop(0)
                (dropped,), cancelled = await settle(in_thread(self._drop, stale))
                if isinstance(dropped, BaseException):
                    log.error("could not drop a stale session ground: %s", dropped)
                if cancelled:
                    raise asyncio.CancelledError
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
