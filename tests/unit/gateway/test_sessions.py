"""SessionManager against a fake runtime (a narrow seam; the real one is covered by integration tests)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path

import pytest

from corral.gateway.models import CreateSession
from corral.gateway.sessions import GATEWAY_LABEL, KIND_LABEL, SessionManager, SessionNotFound
from corral.gateway.settings import GatewaySettings
from corral.gateway.store import SessionStore
from corral.runtime.docker import SandboxContainer, SandboxInfo, SandboxSpec


class FakeRuntime:
    def __init__(self) -> None:
        self.running: dict[str, tuple[SandboxContainer, dict[str, str]]] = {}
        self.fail_remove = False
        self._n = 0

    def ensure_network(self, name: str) -> None:
        pass

    def bridge(self, name: str) -> tuple[str, str]:
        return "br-fake", "10.99.0.1"

    def start_sandbox(self, spec: SandboxSpec) -> SandboxContainer:
        self._n += 1
        box = SandboxContainer(f"c{self._n}", spec.name or f"c{self._n}", f"10.99.0.{self._n + 1}", 8765)
        self.running[box.id] = (box, dict(spec.labels or {}))
        return box

    def wait_ready(self, sandbox: SandboxContainer, timeout_s: float = 60.0) -> float:
        return 0.0

    def list_sandboxes(self, labels: Mapping[str, str] | None = None) -> list[SandboxInfo]:
        wanted = dict(labels or {})
        return [
            SandboxInfo(box.id, box.name, lab, True, box)
            for box, lab in self.running.values()
            if all(lab.get(k) == v for k, v in wanted.items())
        ]

    def remove(self, ident: str) -> None:
        if self.fail_remove:
            raise RuntimeError("docker said no")
        self.running.pop(ident, None)


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
    return SessionManager(GatewaySettings(**values), runtime, SessionStore(tmp_path))  # type: ignore[arg-type]


def test_a_failed_removal_keeps_the_session_and_its_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("corral.runtime.hostguard.install", lambda interface: True)
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


def test_recovery_never_hands_out_an_unowned_container(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("corral.runtime.hostguard.install", lambda interface: True)
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


def test_idle_reaping_waits_for_an_action_in_flight(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("corral.runtime.hostguard.install", lambda interface: True)
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
