"""The desktop's lock tells when an action ends (corral.sandbox.control.turns)."""

from __future__ import annotations

import asyncio

import pytest

from corral.sandbox.control.turns import ActionLock


def test_ended_returns_at_once_when_no_action_runs() -> None:
    lock = ActionLock()
    waiting = lock.ended()
    # At once: the coroutine finishes on its first step, without suspending even for one loop turn.
    with pytest.raises(StopIteration):
        waiting.send(None)
    assert not lock.locked()


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
