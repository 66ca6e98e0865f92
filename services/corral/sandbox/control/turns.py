"""The desktop's lock, which also says when an action ends.

Actions on the screen take turns under one :class:`ActionLock` (``Desktop.lock``). The live view
(corral.sandbox.control.live) waits for an action to end rather than polling the lock: :meth:`ActionLock.ended`
returns at the next release.
"""

from __future__ import annotations

import asyncio


class ActionLock(asyncio.Lock):
    """An :class:`asyncio.Lock` whose :meth:`ended` waits for the holder's release."""

    def __init__(self) -> None:
        super().__init__()
        # Set and replaced at each release: waiters wake and wait on the new one.
        self._released = asyncio.Event()

    @property
    def waiting(self) -> bool:
        """Whether a task waits to take the lock now."""
        return bool(self._waiters)

    def release(self) -> None:
        super().release()
        released, self._released = self._released, asyncio.Event()
        released.set()

    async def ended(self) -> None:
        """Returns once the action holding the lock ends (at once when none holds it)."""
        if self.locked():
            await self._released.wait()
