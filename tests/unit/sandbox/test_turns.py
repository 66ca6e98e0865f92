"""The desktop's lock tells when an action ends (corral.sandbox.turns)."""

from __future__ import annotations

import asyncio

from corral.sandbox.turns import ActionLock


async def test_ended_returns_at_once_when_no_action_runs() -> None:
    await asyncio.wait_for(ActionLock().ended(), 1)


async def test_ended_returns_when_the_running_action_releases_the_lock() -> None:
    lock = ActionLock()
    async with lock:
        waiting = asyncio.create_task(lock.ended())
        for _ in range(5):
            await asyncio.sleep(0)
        assert not waiting.done()
    await asyncio.wait_for(waiting, 1)
    async with lock:  # and again for the next action
        again = asyncio.create_task(lock.ended())
        await asyncio.sleep(0)
        assert not again.done()
    await asyncio.wait_for(again, 1)
