"""GroundPool: filled ahead, taken oldest first, refilled when told, everything dropped at close."""

from __future__ import annotations

import asyncio
import threading

from corral.gateway.grounds import GroundPool


class Maker:
    """Makes numbered things; fails the first ``failures`` times; a gated make waits for ``release``."""

    def __init__(self, failures: int = 0, gate_from: int | None = None) -> None:
        self.made: list[int] = []
        self.dropped: list[int] = []
        self.failures, self.gate_from = failures, gate_from
        self.entered, self.release = threading.Event(), threading.Event()

    def make(self) -> int:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("Docker said no")
        n = len(self.made) + 1
        if self.gate_from is not None and n >= self.gate_from:
            self.entered.set()
            assert self.release.wait(10), "never released"
        self.made.append(n)
        return n

    def drop(self, n: int) -> None:
        self.dropped.append(n)


async def test_the_pool_fills_ahead_and_hands_out_the_oldest_first() -> None:
    maker = Maker()
    pool = GroundPool(maker.make, maker.drop, size=2)
    pool.start()
    await asyncio.wait_for(pool.filled.wait(), 10)
    assert len(pool) == 2 and maker.made == [1, 2]
    assert pool.take() == 1 and len(pool) == 1
    assert maker.made == [1, 2]  # no refill until the owner asks (after its start)
    pool.refill()
    await asyncio.wait_for(pool.filled.wait(), 10)
    assert pool.take() == 2 and pool.take() == 3 and pool.take() is None
    await pool.close()
    assert maker.dropped == []  # nothing was held at close


async def test_closing_drops_what_no_one_took() -> None:
    maker = Maker()
    pool = GroundPool(maker.make, maker.drop, size=3)
    pool.start()
    await asyncio.wait_for(pool.filled.wait(), 10)
    taken = pool.take()
    await pool.close()
    assert sorted(maker.dropped) == [2, 3] and taken == 1 and len(pool) == 0
    assert pool.take() is None


async def test_closing_mid_make_waits_for_it_and_drops_what_it_made() -> None:
    maker = Maker(gate_from=2)
    pool = GroundPool(maker.make, maker.drop, size=2)
    pool.start()
    assert await asyncio.to_thread(maker.entered.wait, 10)  # one held, the second one being made
    closing = asyncio.ensure_future(pool.close())
    asyncio.get_running_loop().call_soon(maker.release.set)  # after the close cancelled the refill
    await closing
    # The make's thread returned before the close did: nothing of it can appear later.
    assert maker.made == [1, 2] and sorted(maker.dropped) == [1, 2]


async def test_a_failed_make_is_tried_again() -> None:
    maker = Maker(failures=2)
    pool = GroundPool(maker.make, maker.drop, size=1, retry_s=0)
    pool.start()
    await asyncio.wait_for(pool.filled.wait(), 10)
    assert pool.take() == 1
    await pool.close()


async def test_a_pool_of_size_zero_makes_nothing() -> None:
    maker = Maker()
    pool = GroundPool(maker.make, maker.drop, size=0)
    pool.start()
    assert pool.take() is None and maker.made == []
    await pool.close()


async def test_a_stale_one_is_never_handed_out_but_dropped_and_made_again() -> None:
    maker = Maker()
    stale: set[int] = set()
    pool = GroundPool(maker.make, maker.drop, size=2, fresh=lambda n: n not in stale)
    pool.start()
    await asyncio.wait_for(pool.filled.wait(), 10)
    stale.add(1)  # held too long: its CA might expire during a session
    assert pool.take() == 2  # the next fresh one
    await asyncio.wait_for(pool.filled.wait(), 10)
    assert maker.dropped == [1] and pool.held() == [3, 4]
    await pool.close()


async def test_the_sweep_drops_stale_ones_nobody_asked_for() -> None:
    maker = Maker(gate_from=2)
    stale: set[int] = set()
    pool = GroundPool(maker.make, maker.drop, size=1, fresh=lambda n: n not in stale, sweep_s=0.05)
    pool.start()
    await asyncio.wait_for(pool.filled.wait(), 10)
    stale.add(1)
    assert await asyncio.to_thread(maker.entered.wait, 10)  # the sweep found it: the next one is being made
    assert maker.dropped == [1] and pool.held() == [] and not pool.filled.is_set()
    maker.release.set()
    await asyncio.wait_for(pool.filled.wait(), 10)
    assert pool.held() == [2] and maker.dropped == [1]
    await pool.close()


async def test_closing_as_a_refill_is_asked_for_still_closes() -> None:
    # A stopping gateway's last start asks for a refill as the close cancels the refill task: the
    # cancellation must not be lost (the close would wait for ever, and the grounds outlive the gateway).
    maker = Maker()
    pool = GroundPool(maker.make, maker.drop, size=1)
    pool.start()
    await asyncio.wait_for(pool.filled.wait(), 10)
    await asyncio.sleep(0)  # the refill task waits for the next ask
    pool.refill()
    await asyncio.wait_for(pool.close(), 5)
    assert maker.dropped == [1]
