"""The runtime seam is whole: the gateway runs sessions, egress pairs included, on a runtime that
has the Protocol's operations and nothing else (fake.py, checked against the Protocol by mypy), it
imports no driver, and the driver is the one CORRAL_RUNTIME names."""

from __future__ import annotations

import ast
import asyncio
import inspect
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import corral.gateway
from corral.errors import SandboxError
from corral.gateway.app import build_sessions, create_app
from corral.gateway.models import CreateSession
from corral.gateway.settings import GatewaySettings
from corral.gateway.store import SessionStore
from corral.proxy import audit, control
from corral.runtime import DRIVERS, SandboxRuntime, open_runtime

from ..gateway.proxy_fake import FakeControlProxy
from .fake import FakeRuntime, as_runtime

TEST_CONTROLS = {"die", "lose_node", "drain_node"}  # what tests do to the fake; never called by the gateway


def _operations(cls: type) -> set[str]:
    return {name for name, member in vars(cls).items() if inspect.isfunction(member) and not name.startswith("_")}


def test_the_fake_has_the_protocols_operations_and_nothing_else() -> None:
    assert _operations(FakeRuntime) - TEST_CONTROLS == _operations(SandboxRuntime)


def test_the_gateway_imports_no_driver() -> None:
    """Only the seam (``corral.runtime``): no driver module, no host guard, no Docker SDK."""
    modules: set[str] = set()
    for path in Path(corral.gateway.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                modules.add(node.module)
            elif isinstance(node, ast.Import):
                modules |= {alias.name for alias in node.names}
    assert "corral.runtime" in modules
    assert {m for m in modules if m.startswith(("corral.runtime.", "docker"))} == set()


def test_an_unknown_driver_is_refused_by_name() -> None:
    with pytest.raises(
        SandboxError, match=r"CORRAL_RUNTIME='kubernetes': no such runtime driver \(there is docker, swarm\)"
    ):
        open_runtime("kubernetes")
    assert DRIVERS == ("docker", "swarm")


def test_docker_is_opened_with_the_proxies_uid(monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[int | None] = []

    class Opened(FakeRuntime):
        def __init__(self, *, proxy_uid: int | None = None, handover_dir: Path | None = None) -> None:
            super().__init__()
            opened.append(proxy_uid)

    monkeypatch.setattr("corral.runtime.docker.DockerRuntime", Opened)
    assert isinstance(open_runtime("docker", proxy_uid=4321), Opened) and opened == [4321]


async def test_a_gateway_with_an_unknown_driver_does_not_start(tmp_path: Path) -> None:
    app = create_app(GatewaySettings(data_dir=tmp_path, api_key="seam-key-Qm3Zr8Tx5Vw2Ny7Kb4Hc9Pd6Lf", runtime="nomad"))
    with pytest.raises(SandboxError, match="CORRAL_RUNTIME='nomad'"):
        async with app.router.lifespan_context(app):
            pass


async def _answer_status(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A proxy's control channel at generation 0 with an empty chain, for any session."""
    await reader.readline()
    writer.write(control.encode({"ok": True, "role": "gateway"}))
    message = json.loads(await reader.readline())
    assert message["op"] == "status"
    state = {"allow": [], "mode": "enforce", "generation": 0, "head": {"seq": 0, "hash": audit.GENESIS}}
    writer.write(control.encode({"ok": True, **state}))
    await writer.drain()
    writer.close()


@pytest.fixture
async def proxies() -> AsyncIterator[int]:
    server = await asyncio.start_server(_answer_status, "127.0.0.1", 0)
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        server.close()


async def test_a_session_with_its_egress_pair_runs_on_the_protocol_alone(tmp_path: Path, proxies: int) -> None:
    fake = FakeRuntime()
    runtime: SandboxRuntime = as_runtime(fake)
    settings = GatewaySettings(
        data_dir=tmp_path, instance="seam", pool_size=0, ground_pool_size=0, record=False, reap_interval_s=3600
    )
    manager = build_sessions(settings, runtime, SessionStore(tmp_path))
    assert manager.egress is not None
    manager.egress.control_port = proxies
    await manager.start()
    try:
        assert manager.host_guarded and {settings.network, settings.egress_network} <= fake.guarded
        session, _ = await manager.create("key-a", CreateSession(allow=["example.test"]))
        egress = session.egress
        assert egress is not None and session.sandbox.id in fake.running
        assert fake.proxy_states({"corral.gateway": "seam"}) == {session.id: "running"}
        assert egress.network in fake.guarded and [n.name for n in fake.session_networks({})] == [egress.network]
        state = Path(egress.state_dir)
        assert json.loads((state / "policy.json").read_text())["allow"] == ["example.test"]
        await manager.delete(session.id)
        assert fake.running == {} and fake.proxies == {} and fake.networks == {}
        assert egress.network not in fake.guarded
        assert (state / "ca").is_dir()  # the audit state outlives the pair
    finally:
        await manager.stop()


@pytest.mark.parametrize("ground_proxies", [True, False])
async def test_a_cold_start_takes_a_network_and_ca_made_ahead(tmp_path: Path, ground_proxies: bool) -> None:
    fake, control_proxy = FakeRuntime(), FakeControlProxy()
    settings = GatewaySettings(
        data_dir=tmp_path,
        instance="seam",
        pool_size=0,
        ground_pool_size=1,
        ground_proxies=ground_proxies,
        record=False,
        reap_interval_s=3600,
    )
    manager = build_sessions(settings, as_runtime(fake), SessionStore(tmp_path))
    assert manager.egress is not None and manager.grounds is not None
    await control_proxy.start()
    manager.egress.control_port = control_proxy.port
    await manager.start()
    try:
        await asyncio.wait_for(manager.grounds.filled.wait(), 10)
        (made,) = fake.session_networks({"corral.gateway": "seam"})
        (ground,) = manager.grounds.held()
        # With ground proxies, the ground's proxy runs before anyone asks for a session.
        assert set(fake.proxies) == ({ground.session_id} if ground_proxies else set())
        session, _ = await manager.create("key-a", CreateSession(allow=["example.test"]))
        assert session.egress is not None and session.egress.network == made.name  # no network made on its path
        assert session.id == ground.session_id
        state = Path(session.egress.state_dir)
        assert (state / "ca").is_dir()
        if ground_proxies:
            # Its policy was set on the running proxy before the token was returned (the real proxy
            # persists it itself), as the first change after its start.
            proxy_state = control_proxy.state(manager.egress.token(session.id))
            assert (proxy_state.allow, proxy_state.mode, proxy_state.generation) == (["example.test"], "enforce", 1)
            assert [m["actor"] for m in proxy_state.messages] == ["api-key:owner"]
        else:
            assert json.loads((state / "policy.json").read_text())["allow"] == ["example.test"]
        await asyncio.wait_for(manager.grounds.filled.wait(), 10)  # refilled once the start was done
        (again,) = [n for n in fake.session_networks({"corral.gateway": "seam"}) if n.name != made.name]
        await manager.delete(session.id)
        assert [n.name for n in fake.session_networks({})] == [again.name]
    finally:
        await manager.stop()
        control_proxy.close()
    assert fake.networks == {} and fake.proxies == {}
