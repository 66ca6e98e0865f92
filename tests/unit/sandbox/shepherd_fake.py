"""What the fake shepherd channels of the process and shell tests share: their events come from a queue."""

from __future__ import annotations

import asyncio

from corral.sandbox.agent.launcher import ShepherdEvent


class QueuedEvents:
    """A shepherd channel's events, from a queue the test (or a watcher) fills; the end (None) stays for
    every later reader, as the real channel's does."""

    def __init__(self) -> None:
        self.events: asyncio.Queue[ShepherdEvent | None] = asyncio.Queue()

    async def next_event(self) -> ShepherdEvent | None:
        event = await self.events.get()
        if event is None:
            self.events.put_nowait(None)
        return event
