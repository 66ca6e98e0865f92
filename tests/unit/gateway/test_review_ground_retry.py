"""Review of 949e69b (GroundProxyLost): what the retry does when the first attempt's removal fails."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from corral.errors import EgressUnavailable
from corral.gateway.egress import Egress

from .test_sessions import COLD, CountingRuntime, _egress_manager


class LeakyRuntime(CountingRuntime):
    """The lost ground's proxy cannot be removed (its node is gone: the manager says no)."""

    lost = ""

    def remove_egress(self, session_id: str, *, drain: bool = False) -> None:
        if session_id == self.lost:
            raise RuntimeError("the manager said no")
        super().remove_egress(session_id, drain=drain)


async def test_a_lost_grounds_removal_that_fails_is_said_before_the_session_starts_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    runtime = LeakyRuntime()
    manager = await _egress_manager(tmp_path, runtime, ground_pool_size=2)
    assert manager.egress is not None and manager.grounds is not None
    await asyncio.wait_for(manager.grounds.filled.wait(), 10)
    lost = manager.grounds.held()[0]
    runtime.lost = lost.session_id

    async def policy_set(egress: Egress, allow: object, mode: object, actor: object, timeout_s: float) -> None:
        if egress.session_id == lost.session_id:
            raise EgressUnavailable(f"egress proxy {egress.proxy_name} did not come up")

    manager.egress.set_start_policy = policy_set  # type: ignore[method-assign]
    try:
        with caplog.at_level(logging.WARNING):
            session, _ = await manager.create("key-a", COLD)
        assert session.state == "ready"
        # The lost ground's proxy and network are still there, and its state directory: a leftover
        # nothing said (the start's own undo logs the same failure: starts._start_pair).
        assert lost.session_id in runtime.proxies
        said = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert any(lost.session_id in m for m in said), said
        # And a proxy known not to answer is not asked for a final anchor of a chain about to be deleted.
        assert not [r for r in caplog.records if "no final audit anchor" in r.getMessage()]
    finally:
        await manager.stop()
