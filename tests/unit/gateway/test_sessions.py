"""SessionManager against a fake runtime (a narrow seam; the real one is covered by integration tests)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from corral.gateway.models import CreateSession
from corral.gateway.sessions import GATEWAY_LABEL, KIND_LABEL, SANDBOX_EXITED, SessionManager, SessionNotFound
from corral.gateway.settings import GatewaySettings
from corral.gateway.store import SessionStore
from corral.runtime import ExitInfo, SandboxSpec, SessionNetwork

from ..runtime.fake import FakeRuntime


def _manager(tmp_path: Path, runtime: FakeRuntime, **settings: object) -> SessionManager:
    values: dict[str, object] = {
        "data_dir": tmp_path,
        "instance": "t",
        "pool_size": 0,
        "reap_interval_s": 0.05,
        "egress": False,
        "record": False,
    }
    values.update(settings)
    return SessionManager(GatewaySettings(**values), runtime, SessionStore(tmp_path))


def test_a_failed_removal_keeps_the_session_and_its_record(tmp_path: Path) -> None:
    runtime = FakeRuntime()

    async def scenario() -> None:
        manager = _manager(tmp_path, runtime)
        await manager.start()
        session, _ = await manager.create("key-a", CreateSession())
        runtime.fail_remove = True
        with pytest.raises(RuntimeError):
            await manager.delete(session.id)
        assert manager.get(session.id) is session  # still owned, still counted
        assert SessionStore(tmp_path).load_all()[0]["id"] == session.id
        runtime.fail_remove = False
        await manager.delete(session.id)
        with pytest.raises(SessionNotFound):
            manager.get(session.id)
        assert SessionStore(tmp_path).load_all() == []
        await manager.stop()

    asyncio.run(scenario())


def test_recovery_never_hands_out_an_unowned_container(tmp_path: Path) -> None:
    runtime = FakeRuntime()
    # A pool container whose session record was lost: it may hold another key's cookies.
    used = runtime.start_sandbox(SandboxSpec(name="used", labels={GATEWAY_LABEL: "t", KIND_LABEL: "pool"}))

    async def scenario() -> None:
        manager = _manager(tmp_path, runtime)
        await manager.start()
        assert used.id not in runtime.running
        assert manager.counts()["pool"] == 0
        await manager.stop()

    asyncio.run(scenario())


def test_idle_reaping_waits_for_an_action_in_flight(tmp_path: Path) -> None:
    runtime = FakeRuntime()

    async def scenario() -> None:
        manager = _manager(tmp_path, runtime)
        await manager.start()
        session, _ = await manager.create("key-a", CreateSession(idle_timeout_s=1))
        session.in_flight = 1
        session.last_activity_at -= 10
        await asyncio.sleep(0.2)
        assert manager.get(session.id) is session
        session.in_flight = 0
        await asyncio.sleep(0.2)
        with pytest.raises(SessionNotFound):
            manager.get(session.id)
        await manager.stop()

    asyncio.run(scenario())


class FakeEgress:
    """The egress manager's side of a start: records what was made and undone."""

    def __init__(self, proxy_delay_s: float = 0.0, proxy_fails: bool = False) -> None:
        self.proxy_delay_s, self.proxy_fails = proxy_delay_s, proxy_fails
        self.discarded: list[str] = []

    def prepare_blocking(self, session_id: str, *args: object) -> object:
        from types import SimpleNamespace

        return SimpleNamespace(
            session_id=session_id, network=SimpleNamespace(name=f"net-{session_id}"), sandbox_env={}, sandbox_files={}
        )

    def start_proxy_blocking(self, prepared: object) -> object:
        import time

        time.sleep(self.proxy_delay_s)
        if self.proxy_fails:
            raise RuntimeError("the proxy did not start")
        from corral.gateway.egress import Egress

        return Egress(*(["x"] * len(Egress.__dataclass_fields__)))

    def discard_blocking(self, prepared: object) -> None:
        self.discarded.append(prepared.session_id)  # type: ignore[attr-defined]


async def test_a_failed_proxy_start_undoes_the_sandbox_and_the_network(tmp_path: Path) -> None:
    runtime = FakeRuntime()
    manager = _manager(tmp_path, runtime)
    manager.egress = FakeEgress(proxy_fails=True)  # type: ignore[assignment]
    with pytest.raises(RuntimeError, match="proxy did not start"):
        await manager._start_pair("ses_1", "session", CreateSession().viewport, None, [], "enforce", None)
    assert runtime.running == {} and manager.egress.discarded == ["ses_1"]  # type: ignore[union-attr]


async def test_a_start_cancelled_midway_leaves_nothing_running(tmp_path: Path) -> None:
    runtime = FakeRuntime()
    manager = _manager(tmp_path, runtime)
    manager.egress = FakeEgress(proxy_delay_s=0.3)  # type: ignore[assignment]
    start = asyncio.ensure_future(
        manager._start_pair("ses_2", "session", CreateSession().viewport, None, [], "enforce", None)
    )
    await asyncio.sleep(0.1)  # the sandbox is up, the proxy still starting
    start.cancel()
    with pytest.raises(asyncio.CancelledError):
        await start
    assert runtime.running == {} and manager.egress.discarded == ["ses_2"]  # type: ignore[union-attr]


class TrackingEgress(FakeEgress):
    """Also knows which proxies exist: one started after its pair was discarded is a leak."""

    def __init__(self, proxy_delay_s: float = 0.0) -> None:
        super().__init__(proxy_delay_s)
        self.proxies: set[str] = set()

    def start_proxy_blocking(self, prepared: object) -> object:
        egress = super().start_proxy_blocking(prepared)
        self.proxies.add(prepared.session_id)  # type: ignore[attr-defined]
        return egress

    def discard_blocking(self, prepared: object) -> None:
        super().discard_blocking(prepared)
        self.proxies.discard(prepared.session_id)  # type: ignore[attr-defined]


async def test_a_start_cancelled_while_its_proxy_starts_leaves_no_proxy(tmp_path: Path) -> None:
    runtime = FakeRuntime()
    manager = _manager(tmp_path, runtime)
    manager.egress = egress = TrackingEgress(proxy_delay_s=0.3)  # type: ignore[assignment]
    start = asyncio.ensure_future(
        manager._start_pair("ses_3", "pool", CreateSession().viewport, None, [], "enforce", None)
    )
    await asyncio.sleep(0.1)  # the proxy's thread is still starting it
    start.cancel()
    with pytest.raises(asyncio.CancelledError):
        await start
    # The cancellation waited for the thread, then removed what it made: nothing runs afterwards.
    await asyncio.sleep(0.4)
    assert egress.proxies == set() and runtime.running == {}


async def test_stopping_mid_refill_leaves_nothing_of_the_pool(tmp_path: Path) -> None:
    runtime = FakeRuntime(start_delay_s=0.3)
    manager = _manager(tmp_path, runtime, pool_size=2)
    await manager.start()
    await asyncio.sleep(0.4)  # one pooled sandbox is ready, the second one is starting
    assert manager.counts()["pool"] == 1 and manager.counts()["starting"] == 1
    await manager.stop()
    await asyncio.sleep(0.4)  # a thread that outlived the stop would add its sandbox by now
    assert runtime.running == {}


async def test_a_dead_sandbox_ends_its_session_and_frees_its_slot(tmp_path: Path) -> None:
    runtime = FakeRuntime()
    manager = _manager(tmp_path, runtime, max_sessions=1)
    await manager.start()
    try:
        session, _ = await manager.create("key-a", CreateSession())
        runtime.die(session.sandbox.id, ExitInfo("exited", 137, True))
        await asyncio.wait_for(session.ended.wait(), timeout=2)
        assert session.end_reason == SANDBOX_EXITED
        assert "out of memory" in session.end_detail and "137" in session.end_detail
        assert session.close_reason().startswith("session ended: sandbox_exited (out of memory")
        for _ in range(100):
            if not manager.list():
                break
            await asyncio.sleep(0.02)
        assert manager.list() == [] and SessionStore(tmp_path).load_all() == []
        assert session.sandbox.id not in runtime.running  # the exited container is removed too
        again, _ = await manager.create("key-a", CreateSession())  # the slot is free at the cap
        assert manager.get(again.id) is again
    finally:
        await manager.stop()


async def test_the_relay_hook_ends_a_dead_session_before_the_reaper(tmp_path: Path) -> None:
    runtime = FakeRuntime()
    manager = _manager(tmp_path, runtime, reap_interval_s=3600)
    await manager.start()
    try:
        alive, _ = await manager.create("key-a", CreateSession())
        await manager.check_sandbox(alive, within_s=0.2)  # a controller restarted inside: no death
        assert not alive.ended.is_set() and alive.state == "ready"
        runtime.die(alive.sandbox.id, ExitInfo("exited", 0, False))
        await manager.check_sandbox(alive)
        assert alive.ended.is_set() and (alive.end_reason, alive.end_detail) == (SANDBOX_EXITED, "exit code 0")
    finally:
        await manager.stop()


async def test_start_removes_this_instances_orphan_session_networks(tmp_path: Path) -> None:
    runtime = FakeRuntime()
    for name, instance in (("corral-net-ses_orphan", "t"), ("corral-net-ses_other", "another-gateway")):
        runtime.networks[name] = SessionNetwork(name, "10.213.0.0/28", "10.213.0.1")
        runtime.network_labels[name] = {GATEWAY_LABEL: instance}
        runtime.guarded.add(name)
    manager = _manager(tmp_path, runtime)
    await manager.start()
    await manager.stop()
    assert list(runtime.networks) == ["corral-net-ses_other"]  # another gateway's stays
    # and the orphan's host guard went with it (removing a session network removes its guard)
    assert "corral-net-ses_orphan" not in runtime.guarded and "corral-net-ses_other" in runtime.guarded
