"""SessionManager against a fake runtime (a narrow seam; the real one is covered by integration tests)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import socket
import threading
import time
from collections.abc import Awaitable, Mapping
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from corral.errors import EgressUnavailable, SandboxError, SessionNotFound
from corral.gateway.app import build_sessions
from corral.gateway.egress import Egress, Ground
from corral.gateway.grounds import GroundPool
from corral.gateway.models import CreateSession
from corral.gateway.sessions import (
    GATEWAY_LABEL,
    KIND_LABEL,
    SANDBOX_EXITED,
    Pair,
    Session,
    SessionManager,
    SessionRecord,
    pool,
    reaper,
)
from corral.gateway.settings import GatewaySettings
from corral.gateway.store import SessionStore
from corral.gateway.vitals import CONTROLLER_DEAD
from corral.runtime import ExitInfo, ProxyAddress, ProxySpec, SandboxAddress, SandboxSpec, SessionNetwork

from ..runtime.fake import FakeRuntime
from .controller_fake import SECRET, proving

# The managers' own reapers wait this long between ticks: the tests drive the ticks (:func:`_ticks`).
REAP_INTERVAL_S = 3600


def _manager(tmp_path: Path, runtime: FakeRuntime, fake_egress: object = None, **settings: object) -> SessionManager:
    """A manager whose reaper ticks only when a test drives it (:func:`_ticks`); with ``fake_egress``,
    its sessions' pairs start through that fake (and no grounds are made ahead)."""
    values: dict[str, object] = {
        "data_dir": tmp_path,
        "instance": "t",
        "pool_size": 0,
        "reap_interval_s": REAP_INTERVAL_S,
        "egress": False,
        "record": False,
        "ground_pool_size": 0 if fake_egress is not None else 2,
    }
    values.update(settings)
    return build_sessions(GatewaySettings(**values), runtime, SessionStore(tmp_path), egress=fake_egress)  # type: ignore[arg-type]


async def _ticks(manager: SessionManager, count: int) -> None:
    """``count`` reaper ticks, driven here one after the other, each with its controllers' probe round done."""
    for _ in range(count):
        await manager.reaper.tick()
        probe = manager.liveness.probing()
        if probe is not None:
            await probe


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
        assert SessionStore(tmp_path).load_all(dict)[0]["id"] == session.id
        runtime.fail_remove = False
        await manager.delete(session.id)
        with pytest.raises(SessionNotFound):
            manager.get(session.id)
        assert SessionStore(tmp_path).load_all(dict) == []
        await manager.stop()

    asyncio.run(scenario())


@pytest.mark.parametrize("record", [False, True])
def test_a_sandbox_records_only_for_a_gateway_that_does(tmp_path: Path, record: bool) -> None:
    runtime = FakeRuntime()

    async def scenario() -> None:
        manager = _manager(tmp_path, runtime, record=record)
        await manager.start()
        await manager.create("key-a", CreateSession())
        await manager.stop()

    asyncio.run(scenario())
    (spec,) = runtime.specs
    environment = spec.environment or {}
    assert environment.get("CORRAL_RECORD") == (None if record else "0")


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


async def test_idle_reaping_waits_for_an_action_in_flight(tmp_path: Path) -> None:
    runtime = FakeRuntime()
    manager = _manager(tmp_path, runtime)
    await manager.start()
    try:
        session, _ = await manager.create("key-a", CreateSession(idle_timeout_s=1))
        session.in_flight = 1
        session.last_activity_at -= 10
        await _ticks(manager, 2)  # a whole tick saw it idle for 10 s, with an action in flight
        assert manager.get(session.id) is session and not session.ended.is_set()
        session.in_flight = 0
        await _ticks(manager, 1)
        await asyncio.wait_for(session.removed.wait(), timeout=10)
        assert session.end_reason == "idle_timeout"
        with pytest.raises(SessionNotFound):
            manager.get(session.id)
    finally:
        await manager.stop()


class FakeEgress:
    """The egress manager's side of a start: records what was made and undone. A gated proxy start
    waits for ``release`` (a slow proxy), saying when it began (``entered``) and ended (``returned``)."""

    async def start(self) -> bool:
        return True  # the gateway's start: nothing of the fake to make

    def __init__(self, proxy_fails: bool = False, gated: bool = False) -> None:
        self.proxy_fails, self.gated = proxy_fails, gated
        self.prepared: list[str] = []
        self.discarded: list[str] = []
        self.proxies: set[str] = set()  # started and not discarded: one left here is a leak
        self.entered, self.release, self.returned = threading.Event(), threading.Event(), threading.Event()

    def prepare_blocking(self, session_id: str, *args: object) -> object:
        self.prepared.append(session_id)
        return SimpleNamespace(
            session_id=session_id,
            network=SimpleNamespace(name=f"net-{session_id}"),
            sandbox_env={},
            sandbox_files={},
            egress=None,
        )

    def start_proxy_blocking(self, prepared: object) -> object:
        self.entered.set()
        try:
            if self.gated:
                assert self.release.wait(10), "never released"
            if self.proxy_fails:
                raise RuntimeError("the proxy did not start")
            self.proxies.add(prepared.session_id)  # type: ignore[attr-defined]
            return Egress(*(["x"] * len(Egress.__dataclass_fields__)))
        finally:
            self.returned.set()

    def discard_blocking(self, prepared: object) -> None:
        self.discarded.append(prepared.session_id)  # type: ignore[attr-defined]
        self.proxies.discard(prepared.session_id)  # type: ignore[attr-defined]


class GatedRuntime(FakeRuntime):
    """Sandboxes start at once, or from the ``gate_from``-th start on only once released (a slow Docker)."""

    def __init__(self, gate_from: int | None = None) -> None:
        super().__init__()
        self.gate_from = gate_from
        self.started, self.entered, self.release, self.returned = (threading.Event() for _ in range(4))

    def start_sandbox(self, spec: SandboxSpec) -> SandboxAddress:
        if self.gate_from is not None and self._n + 1 >= self.gate_from:
            self.entered.set()
            assert self.release.wait(10), "never released"
        box = super().start_sandbox(spec)
        self.started.set()
        if self.gate_from is not None and self._n >= self.gate_from:
            self.returned.set()
        return box


def _until(event: threading.Event) -> Awaitable[bool]:
    return asyncio.to_thread(event.wait, 10)


async def test_a_failed_proxy_start_undoes_the_sandbox_and_the_network(tmp_path: Path) -> None:
    runtime = FakeRuntime()
    egress = FakeEgress(proxy_fails=True)
    manager = _manager(tmp_path, runtime, egress)
    with pytest.raises(RuntimeError, match="proxy did not start"):
        await manager.create("key-a", CreateSession())
    assert runtime.running == {} and egress.discarded == egress.prepared and len(egress.prepared) == 1
    assert manager.list() == [] and manager.counts()["starting"] == 0


async def test_a_start_cancelled_midway_leaves_nothing_running(tmp_path: Path) -> None:
    runtime = GatedRuntime()
    egress = FakeEgress(gated=True)
    manager = _manager(tmp_path, runtime, egress)
    start = asyncio.ensure_future(manager.create("key-a", CreateSession()))
    assert await _until(runtime.started) and await _until(egress.entered)  # the sandbox is up, the proxy starting
    start.cancel()
    asyncio.get_running_loop().call_soon(egress.release.set)  # once the cancellation is under way
    with pytest.raises(asyncio.CancelledError):
        await start
    assert runtime.running == {} and egress.discarded == egress.prepared and len(egress.prepared) == 1


async def test_a_start_cancelled_while_its_proxy_starts_leaves_no_proxy(tmp_path: Path) -> None:
    runtime = FakeRuntime()
    egress = FakeEgress(gated=True)
    manager = _manager(tmp_path, runtime, egress)
    start = asyncio.ensure_future(manager.create("key-a", CreateSession()))
    assert await _until(egress.entered)  # the proxy's thread is still starting it
    start.cancel()
    asyncio.get_running_loop().call_soon(egress.release.set)
    with pytest.raises(asyncio.CancelledError):
        await start
    # The cancellation waited for the thread (it has returned: it can start nothing more), then
    # removed what it made: the proxy's pair is discarded and no sandbox runs.
    assert egress.returned.is_set()
    assert egress.proxies == set() and runtime.running == {}
    assert egress.discarded == egress.prepared and len(egress.prepared) == 1


async def test_stopping_mid_refill_leaves_nothing_of_the_pool(tmp_path: Path) -> None:
    runtime = GatedRuntime(gate_from=2)
    manager = _manager(tmp_path, runtime, pool_size=2)
    await manager.start()
    assert await _until(runtime.entered)  # one pooled sandbox is ready, the second one is starting
    assert manager.counts()["pool"] == 1 and manager.counts()["starting"] == 1
    stopping = asyncio.ensure_future(manager.stop())
    asyncio.get_running_loop().call_soon(runtime.release.set)  # after the stop cancelled the refill
    await stopping
    # The refill's thread returned before the stop did: no sandbox of it can appear later.
    assert runtime.returned.is_set() and runtime.running == {}


class EndpointRuntime(GatedRuntime):
    """Docker's networks: one cannot be removed while a container is on it ("has active endpoints"),
    and a sandbox being removed is still on it until its removal returns (it is killed first); here
    that removal lasts until a network's removal was tried (or half a second)."""

    def __init__(self, gate_from: int | None = None) -> None:
        super().__init__(gate_from)
        self.on_network: dict[str, str] = {}  # sandbox id -> its session network
        self.network_removal_tried = threading.Event()

    def start_sandbox(self, spec: SandboxSpec) -> SandboxAddress:
        box = super().start_sandbox(spec)
        if spec.session_network is not None:
            self.on_network[box.id] = spec.session_network.name
        return box

    def remove(self, ident: str) -> None:
        self.network_removal_tried.wait(0.5)
        super().remove(ident)
        self.on_network.pop(ident, None)

    def remove_session_network(self, network: SessionNetwork) -> None:
        self.network_removal_tried.set()
        if network.name in self.on_network.values():
            raise SandboxError(f"network {network.name} has active endpoints")
        super().remove_session_network(network)


async def test_stopping_while_the_refill_starts_its_pair_leaves_no_network(tmp_path: Path) -> None:
    runtime = EndpointRuntime(gate_from=1)
    manager = _manager(tmp_path, runtime, egress=True, ground_pool_size=0, pool_size=1)
    await manager.start()
    assert await _until(runtime.entered)  # the pooled pair's network is made, its sandbox starting
    stopping = asyncio.ensure_future(manager.stop())
    asyncio.get_running_loop().call_soon(runtime.release.set)  # after the stop cancelled the refill
    await asyncio.wait_for(stopping, timeout=10)
    # The undone start removed its sandbox before its network: the network had no endpoint left.
    assert (runtime.running, runtime.proxies, runtime.networks) == ({}, {}, {})


class FailingProxyRuntime(FakeRuntime):
    """Every proxy fails to start; a sandbox's removal lasts until released (a slow Docker)."""

    def __init__(self) -> None:
        super().__init__()
        self.removing, self.release = threading.Event(), threading.Event()

    def start_proxy(self, spec: ProxySpec) -> ProxyAddress:
        raise SandboxError("cannot start the egress proxy")

    def remove(self, ident: str) -> None:
        self.removing.set()
        assert self.release.wait(10), "never released"
        super().remove(ident)


async def test_a_stop_while_a_failed_refill_is_undone_ends_the_refill(tmp_path: Path) -> None:
    runtime = FailingProxyRuntime()
    manager = _manager(tmp_path, runtime, egress=True, ground_pool_size=0, pool_size=1)
    await manager.start()
    assert await _until(runtime.removing)  # the pooled pair's proxy failed: its sandbox is being removed
    stopping = asyncio.ensure_future(manager.stop())
    asyncio.get_running_loop().call_soon(runtime.release.set)  # after the stop cancelled the refill
    # The cancellation came while the failed start was undone: it ends the refill loop then (it is
    # not taken for the failure, whose retry would start another pair and keep the stop waiting).
    await asyncio.wait_for(stopping, timeout=3)
    assert (runtime.running, runtime.proxies, runtime.networks) == ({}, {}, {})


async def test_a_dead_sandbox_ends_its_session_and_frees_its_slot(tmp_path: Path) -> None:
    runtime = FakeRuntime()
    manager = _manager(tmp_path, runtime, max_sessions=1)
    await manager.start()
    try:
        session, _ = await manager.create("key-a", CreateSession())
        runtime.die(session.sandbox.id, ExitInfo("exited", 137, True))
        await _ticks(manager, 1)
        await asyncio.wait_for(session.ended.wait(), timeout=2)
        assert session.end_reason == SANDBOX_EXITED
        assert "out of memory" in session.end_detail and "137" in session.end_detail
        assert session.close_reason().startswith("session ended: sandbox_exited (out of memory")
        await asyncio.wait_for(session.removed.wait(), timeout=10)
        assert manager.list() == [] and SessionStore(tmp_path).load_all(dict) == []
        assert session.sandbox.id not in runtime.running  # the exited container is removed too
        again, _ = await manager.create("key-a", CreateSession())  # the slot is free at the cap
        assert manager.get(again.id) is again
    finally:
        await manager.stop()


def _booted(runtime: FakeRuntime, boots: dict[str, str]) -> httpx.MockTransport:
    """The sandboxes' controllers, each naming the boot ``boots`` gives its host (none there: it does
    not answer, as a controller killed inside a running container)."""

    def answer(request: httpx.Request) -> httpx.Response:
        boot = boots.get(request.url.host or "")
        if boot is None:
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(200, json={"ok": True, "secrets": {}, "boot": boot})

    return httpx.MockTransport(proving(answer))


async def _watched(tmp_path: Path, runtime: FakeRuntime, boots: dict[str, str], **settings: object) -> SessionManager:
    values: dict[str, object] = {"data_dir": tmp_path, "instance": "t", "pool_size": 0, "egress": False}
    values.update({"record": False, "reap_interval_s": REAP_INTERVAL_S, **settings})
    manager = build_sessions(
        GatewaySettings(**values), runtime, SessionStore(tmp_path), controller_transport=_booted(runtime, boots)
    )
    await manager.start()
    return manager


async def _proven_session(manager: SessionManager) -> Session:
    session, _ = await manager.create("key-a", CreateSession())
    session.sandbox = dataclasses.replace(session.sandbox, secret=SECRET)
    return session


async def test_the_relay_hook_ends_a_dead_session_before_the_reaper(tmp_path: Path) -> None:
    runtime, boots = FakeRuntime(), {}
    manager = await _watched(tmp_path, runtime, boots)
    try:
        alive = await _proven_session(manager)
        boots[alive.sandbox.host] = "b2"
        await manager.check_sandbox(alive, within_s=0.2)  # a controller restarted inside, answering: no death
        assert not alive.ended.is_set() and alive.state == "ready"
        runtime.die(alive.sandbox.id, ExitInfo("exited", 0, False))
        await manager.check_sandbox(alive)
        assert alive.ended.is_set() and (alive.end_reason, alive.end_detail) == (SANDBOX_EXITED, "exit code 0")
    finally:
        await manager.stop()


async def test_a_relay_that_lost_a_controller_which_never_comes_back_ends_it_controller_dead(tmp_path: Path) -> None:
    runtime, boots = FakeRuntime(), {}
    manager = await _watched(tmp_path, runtime, boots, controller_dead_after_s=0.3)
    try:
        session = await _proven_session(manager)  # its container runs, its controller does not answer
        await asyncio.wait_for(manager.check_sandbox(session, within_s=0.1), 5)
        assert session.ended.is_set() and session.end_reason == CONTROLLER_DEAD
        assert session.end_detail.startswith("no answer for")
        assert session.close_reason().startswith("session ended: controller_dead (no answer for")
        await asyncio.wait_for(session.removed.wait(), 5)  # its slot is free
        assert manager.list() == []
    finally:
        await manager.stop()


async def test_the_reaper_ends_a_session_whose_controller_restarts_too_often(tmp_path: Path) -> None:
    runtime, boots = FakeRuntime(), {}
    manager = await _watched(tmp_path, runtime, boots, controller_max_restarts=2)
    try:
        session = await _proven_session(manager)
        steady = await _proven_session(manager)
        boots[steady.sandbox.host] = "steady"
        for n in range(4):  # each a new controller process: restarted three times
            boots[session.sandbox.host] = f"b{n}"
            await _ticks(manager, reaper.CONTROLLER_PROBE_TICKS)  # each boot seen by one probe round
        await asyncio.wait_for(session.ended.wait(), 5)
        assert (session.end_reason, session.end_detail) == (CONTROLLER_DEAD, "restarted 3 times in 300 s")
        assert not steady.ended.is_set() and steady.state == "ready"  # one that stays up lives on
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


# What Session.record() wrote before the session model was one type: the file format is unchanged.
OLD_RECORD = {
    "id": "ses_00000000000000aa",
    "container": "c1",
    "owner": "key-a",
    "token_sha256": "0" * 64,
    "created_at": 1700000000.5,
    "expires_at": 1700003600.5,
    "idle_timeout_s": 600,
    "viewport": {"width": 1024, "height": 768},
    "allow": ["example.com", "GET docs.example.com/guide/"],
    "labels": {"run": "7"},
    "from_pool": True,
    "egress": {
        "session_id": "ses_00000000000000aa",
        "network": "corral-net-ses_00000000000000aa",
        "subnet": "10.213.0.16/28",
        "gateway": "10.213.0.17",
        "interface": "br-0123456789ab",
        "proxy_id": "p1",
        "proxy_name": "corral-egress-ses_00000000000000aa",
        "proxy_address": "10.213.0.18",
        "state_dir": "/data/egress/ses_00000000000000aa",
    },
    "egress_mode": "report",
    "hermetic": False,
}
# What this code writes back: the same, less the bridge's name (the runtime owns the host guard now and
# finds it from the network, so the record no longer carries ``interface``).
WRITTEN_BACK = {**OLD_RECORD, "egress": {k: v for k, v in OLD_RECORD["egress"].items() if k != "interface"}}  # type: ignore[attr-defined]


async def test_recovery_adopts_a_session_the_old_code_recorded(tmp_path: Path) -> None:
    runtime = FakeRuntime()
    runtime.start_sandbox(SandboxSpec(name="old", labels={GATEWAY_LABEL: "t", KIND_LABEL: "session"}))
    older = {k: v for k, v in OLD_RECORD.items() if k not in ("egress_mode", "hermetic", "egress")}
    older.update(id="ses_00000000000000bb", container="c2")  # from before egress modes and hermetic replays
    runtime.start_sandbox(SandboxSpec(name="older", labels={GATEWAY_LABEL: "t", KIND_LABEL: "session"}))
    SessionStore(tmp_path).save(str(OLD_RECORD["id"]), OLD_RECORD)
    SessionStore(tmp_path).save(str(older["id"]), older)
    manager = _manager(tmp_path, runtime)
    await manager.start()
    try:
        session = manager.get("ses_00000000000000aa")
        assert session.record.to_json() == WRITTEN_BACK  # every field read back, and written back the same
        assert session.sandbox.id == "c1" and session.owner == "key-a"
        assert session.egress is not None and session.egress.audit_path == Path(
            "/data/egress/ses_00000000000000aa/audit.jsonl"
        )
        assert (session.record.viewport.width, session.record.allow[1]) == (1024, "GET docs.example.com/guide/")
        adopted = manager.get("ses_00000000000000bb").record
        assert (adopted.egress, adopted.egress_mode, adopted.hermetic) == (None, None, False)
        made, _ = await manager.create("key-a", CreateSession())
        written = json.loads((tmp_path / "sessions" / f"{made.id}.json").read_text())
        assert written.keys() == OLD_RECORD.keys()  # a new record has the old format's fields, no others
    finally:
        await manager.stop()


def test_the_manifest_holds_the_setup_only() -> None:
    record = SessionRecord.model_validate(OLD_RECORD)
    assert record.manifest() == {
        "created_at": 1700000000.5,
        "viewport": {"width": 1024, "height": 768},
        "allow": ["example.com", "GET docs.example.com/guide/"],
        "egress_mode": "report",
        "hermetic": False,
        "labels": {"run": "7"},
    }


def test_a_record_from_before_derived_proxy_tokens_is_read_and_written_without_its_token() -> None:
    egress = {**OLD_RECORD["egress"], "gateway_token": "old"}  # type: ignore[dict-item]
    assert SessionRecord.model_validate({**OLD_RECORD, "egress": egress}).to_json() == WRITTEN_BACK


async def test_a_record_that_holds_no_session_is_set_aside_not_adopted(tmp_path: Path) -> None:
    runtime = FakeRuntime()
    box = runtime.start_sandbox(SandboxSpec(name="nobody", labels={GATEWAY_LABEL: "t", KIND_LABEL: "session"}))
    broken = {**OLD_RECORD, "container": box.id, "viewport": "wide"}  # no viewport a session can have
    SessionStore(tmp_path).save(str(OLD_RECORD["id"]), broken)
    manager = _manager(tmp_path, runtime)
    await manager.start()
    try:
        assert manager.list() == [] and box.id not in runtime.running  # its sandbox is nobody's: removed
        kept = tmp_path / "sessions" / f"{OLD_RECORD['id']}.json.unreadable"
        assert json.loads(kept.read_text()) == broken  # kept for a look, not read at the next start
        assert not (tmp_path / "sessions" / f"{OLD_RECORD['id']}.json").exists()
    finally:
        await manager.stop()


# -- the pool's claim: a dead pooled sandbox is never handed out; the policy is in force first -----------


class PolicyEgress(FakeEgress):
    """FakeEgress that also takes a pooled proxy's policy (gated until ``release_policy`` is set, or
    failing) and the rest a session's start and end ask of it."""

    def __init__(self, policy_fails: bool = False) -> None:
        super().__init__()
        self.policy_fails = policy_fails
        self.allowed: dict[str, list[str]] = {}  # session id -> the allowlist its proxy started with
        self.policies: list[tuple[str, list[str], str]] = []  # (session id, allow, mode) each proxy took
        self.policy_asked, self.release_policy = asyncio.Event(), asyncio.Event()
        self.release_policy.set()
        self.torn_down: list[str] = []

    def prepare_blocking(self, session_id: str, *args: object) -> object:
        self.allowed[session_id] = list(args[0])  # type: ignore[call-overload]
        return super().prepare_blocking(session_id, *args)

    async def wait_ready(self, egress: Egress, timeout_s: float) -> None:
        return None

    async def set_policy(self, egress: Egress, allow: list[str], mode: str, actor: str) -> dict[str, object]:
        self.policy_asked.set()
        await self.release_policy.wait()
        if self.policy_fails:
            raise EgressUnavailable(f"egress proxy of {egress.session_id} not reachable")
        self.policies.append((egress.session_id, allow, mode))
        return {}

    def write_meta(self, session_id: str, **fields: object) -> None:
        return None

    def teardown_blocking(self, egress: Egress, anchor: bool = True) -> None:
        self.torn_down.append(egress.session_id)


class Answered(list[str]):
    """The hosts whose controller answered, in order; ``event`` is set at each answer."""

    def __init__(self) -> None:
        super().__init__()
        self.event = asyncio.Event()


def _controllers(runtime: FakeRuntime, answered: Answered) -> httpx.MockTransport:
    """The sandboxes' controllers: a running one answers (and proves its secret); a dead one's
    connection is refused, as Docker's network does once its container is gone."""

    def answer(request: httpx.Request) -> httpx.Response:
        alive = {box.host for box, _ in runtime.running.values() if box.id not in runtime.exited}
        if request.url.host not in alive:
            raise httpx.ConnectError("connection refused", request=request)
        answered.append(request.url.host)
        answered.event.set()
        return httpx.Response(200, json={"secrets": {}})

    return httpx.MockTransport(proving(answer))


async def _pool_manager(
    tmp_path: Path, runtime: FakeRuntime, answered: Answered, fake_egress: object = None, **settings: object
) -> SessionManager:
    values: dict[str, object] = {"data_dir": tmp_path, "instance": "t", "pool_size": 0, "egress": False}
    values.update({"record": False, "reap_interval_s": REAP_INTERVAL_S, **settings})  # the reaper does not look first
    if fake_egress is not None:
        values["ground_pool_size"] = 0
    manager = build_sessions(
        GatewaySettings(**values),
        runtime,
        SessionStore(tmp_path),
        controller_transport=_controllers(runtime, answered),
        egress=fake_egress,  # type: ignore[arg-type]
    )
    await manager.start()
    return manager


def _pooled(manager: SessionManager, runtime: FakeRuntime, egress: Egress | None = None) -> Pair:
    """A pair in the manager's pool, as its pool loop leaves one: started and found ready."""
    labels = {GATEWAY_LABEL: "t", KIND_LABEL: "pool"}
    box = dataclasses.replace(runtime.start_sandbox(SandboxSpec(name="pooled", labels=labels)), secret=SECRET)
    runtime.running[box.id] = (box, labels)
    pair = Pair(egress.session_id if egress is not None else "ses_pooled", box, egress)
    manager.pool.add(pair)
    return pair


POOLED_EGRESS = Egress("ses_pooled", *(["x"] * (len(Egress.__dataclass_fields__) - 1)))


async def test_a_pooled_sandbox_is_handed_out_once_its_controller_answered(tmp_path: Path) -> None:
    runtime, answered = FakeRuntime(), Answered()
    manager = await _pool_manager(tmp_path, runtime, answered)
    try:
        pair = _pooled(manager, runtime)
        session, _ = await manager.create("key-a", CreateSession())
        assert session.record.from_pool and session.sandbox == pair.sandbox
        assert answered == [pair.sandbox.host]  # the last look went to it, signed and proven
    finally:
        await manager.stop()


async def test_a_pooled_sandbox_that_died_is_not_handed_out(tmp_path: Path) -> None:
    runtime, answered = FakeRuntime(), Answered()
    manager = await _pool_manager(tmp_path, runtime, answered)
    try:
        pair = _pooled(manager, runtime)
        runtime.die(pair.sandbox.id, ExitInfo("exited", 137, True))  # after it joined the pool, before the reaper saw
        session, _ = await manager.create("key-a", CreateSession())
        assert not session.record.from_pool and session.sandbox.id != pair.sandbox.id  # a cold one instead
        assert pair.sandbox.id not in runtime.running and pair.sandbox.id not in runtime.exited  # removed
        assert manager.counts()["pool"] == 0 and answered == []
    finally:
        await manager.stop()


async def test_a_pooled_sandbox_whose_controller_cannot_prove_itself_is_not_handed_out(tmp_path: Path) -> None:
    runtime, answered = FakeRuntime(), Answered()
    manager = await _pool_manager(tmp_path, runtime, answered)
    try:
        pair = _pooled(manager, runtime)
        impostor = dataclasses.replace(pair.sandbox, secret="not-its-secret")  # the proof will not match
        manager.pool.replace(pair, dataclasses.replace(pair, sandbox=impostor))
        session, _ = await manager.create("key-a", CreateSession())
        assert not session.record.from_pool and pair.sandbox.id not in runtime.running
    finally:
        await manager.stop()


async def test_the_reaper_takes_a_dead_pooled_sandbox_out_of_the_pool(tmp_path: Path) -> None:
    runtime, answered = FakeRuntime(), Answered()
    manager = await _pool_manager(tmp_path, runtime, answered)
    try:
        pair, alive = _pooled(manager, runtime), _pooled(manager, runtime)
        await _ticks(manager, 2 * reaper.POOL_CHECK_TICKS)  # an idle pool is listed every POOL_CHECK_TICKS: twice
        assert manager.counts()["pool"] == 2  # alive: they stay
        runtime.die(pair.sandbox.id, ExitInfo("exited", 1, False))
        await _ticks(manager, 2 * reaper.POOL_CHECK_TICKS)  # a whole listing tick saw it dead
        assert manager.pool.pairs() == [alive] and pair.sandbox.id not in runtime.running
        assert answered == []  # no claim was needed to find it
    finally:
        await manager.stop()


async def test_a_pooled_proxy_holds_the_policy_before_the_token_is_given(tmp_path: Path) -> None:
    runtime, answered = FakeRuntime(), Answered()
    egress = PolicyEgress()
    manager = await _pool_manager(tmp_path, runtime, answered, egress)
    try:
        pair = _pooled(manager, runtime, POOLED_EGRESS)
        egress.release_policy.clear()  # a slow proxy
        creating = asyncio.ensure_future(manager.create("key-a", CreateSession(allow=["example.test"])))
        await egress.policy_asked.wait()
        await answered.event.wait()  # the controller's answer comes meanwhile (the two go side by side)
        for _ in range(20):
            await asyncio.sleep(0)
        assert not creating.done() and egress.policies == []  # no token while the proxy has not taken it
        egress.release_policy.set()
        session, token = await creating
        assert token and session.record.from_pool
        assert egress.policies == [(pair.session_id, ["example.test"], "enforce")]
    finally:
        await manager.stop()


async def test_a_pooled_pair_whose_proxy_did_not_take_the_policy_is_not_handed_out(tmp_path: Path) -> None:
    runtime, answered = FakeRuntime(), Answered()
    egress = PolicyEgress(policy_fails=True)
    manager = await _pool_manager(tmp_path, runtime, answered, egress)
    try:
        pair = _pooled(manager, runtime, POOLED_EGRESS)
        session, _ = await manager.create("key-a", CreateSession(allow=["example.test"]))
        assert not session.record.from_pool and session.sandbox.id != pair.sandbox.id
        assert pair.sandbox.id not in runtime.running and egress.torn_down == [pair.session_id]
        # The cold pair's proxy started with the session's policy: in force from its first request.
        assert egress.allowed[session.id] == ["example.test"]
    finally:
        await manager.stop()


async def test_session_grounds_are_made_ahead_and_gone_after_stop(tmp_path: Path) -> None:
    runtime = FakeRuntime()
    # A gateway killed while it held grounds left a network and an unclaimed state behind.
    left = runtime.create_session_network("ses_left", {GATEWAY_LABEL: "t", KIND_LABEL: "ground"}, "10.213.0.0/16")
    (tmp_path / "egress" / "ses_left").mkdir(parents=True)
    (tmp_path / "egress" / ".grounds").mkdir(mode=0o700)
    (tmp_path / "egress" / ".grounds" / "ses_left").write_text("t")
    manager = _manager(tmp_path, runtime, egress=True, ground_pool_size=2)
    await manager.start()
    assert manager.grounds is not None
    await asyncio.wait_for(manager.grounds.filled.wait(), 10)
    assert left.name not in runtime.networks and not (tmp_path / "egress" / "ses_left").exists()
    assert manager.egress is not None
    grounds = {f"net-{sid}" for sid in manager.egress.unclaimed_grounds()}
    assert len(grounds & set(runtime.networks)) == 2 and len(manager.grounds) == 2
    assert set(runtime.proxies) == {g.session_id for g in manager.grounds.held()}  # their proxies started ahead
    await manager.stop()
    assert runtime.networks == {} and runtime.proxies == {} and list((tmp_path / "egress").glob("ses_*")) == []


async def test_a_claimed_ground_reads_as_nobodys_ground(tmp_path: Path) -> None:
    runtime = FakeRuntime()
    manager = _manager(tmp_path, runtime, egress=True, ground_pool_size=1, start_timeout_s=0.3)
    await manager.start()
    try:
        assert manager.grounds is not None and manager.egress is not None
        await asyncio.wait_for(manager.grounds.filled.wait(), 10)
        (ground,) = manager.grounds.held()
        assert manager.egress.unclaimed_grounds() == [ground.session_id]
        taken = manager.grounds.take()
        assert taken is ground
        labels = {GATEWAY_LABEL: "t", KIND_LABEL: "session"}
        manager.egress.prepare_blocking(ground.session_id, [], "enforce", labels, None, ground)
        # Claimed: no listing calls it a ground any more, neither the markers nor a label on its network.
        assert ground.session_id not in manager.egress.unclaimed_grounds()
        assert runtime.network_labels[ground.network.name].get(KIND_LABEL) != "ground"
        assert [n for n, labels in runtime.network_labels.items() if labels.get(KIND_LABEL) == "ground"] == []
    finally:
        await manager.stop()


async def test_a_ground_whose_proxy_stopped_is_replaced_by_the_reaper(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = FakeRuntime()
    manager = _manager(tmp_path, runtime, egress=True, ground_pool_size=2)
    await manager.start()
    try:
        grounds = manager.grounds
        assert grounds is not None
        await asyncio.wait_for(grounds.filled.wait(), 10)
        dead, alive = grounds.held()
        retired = asyncio.Event()

        def retire(items: list[Ground]) -> None:
            GroundPool.retire(grounds, items)
            if dead in items:
                retired.set()

        monkeypatch.setattr(grounds, "retire", retire)
        proxy, labels, _ = runtime.proxies[dead.session_id]
        runtime.proxies[dead.session_id] = (proxy, labels, "exited")  # removed by hand, OOM-killed past its restarts
        await _ticks(manager, reaper.POOL_CHECK_TICKS)
        await asyncio.wait_for(retired.wait(), 10)  # the reaper found it
        await asyncio.wait_for(grounds.filled.wait(), 10)  # and the pool made another
        held = {g.session_id for g in grounds.held()}
        assert dead.session_id not in held and alive.session_id in held and len(held) == 2
        assert dead.session_id not in runtime.proxies and dead.network.name not in runtime.networks
        assert not dead.state_dir.exists()
    finally:
        await manager.stop()


async def test_pruning_keeps_the_state_of_grounds_held(tmp_path: Path) -> None:
    runtime = FakeRuntime()
    manager = _manager(tmp_path, runtime, egress=True, ground_pool_size=1, egress_retention_days=1e-6)
    await manager.start()
    try:
        assert manager.grounds is not None
        await asyncio.wait_for(manager.grounds.filled.wait(), 10)
        (ground,) = manager.grounds.held()
        stale = tmp_path / "egress" / "ses_leftover"  # an old pool pair's state: no metadata, nobody's
        stale.mkdir()
        an_hour_ago = time.time() - 3600
        for state in (stale, ground.state_dir):  # both older than the retention (0.09 s)
            os.utime(state, (an_hour_ago, an_hour_ago))
        await manager.reaper.archives.prune()
        assert ground.state_dir.exists() and not stale.exists()
    finally:
        await manager.stop()


# -- the reaper: what it costs a tick, and that a stop never waits on it ---------------------------------


class SlowRemoval(FakeRuntime):
    """A removal that waits for ``release`` (a slow Docker), saying when it began."""

    def __init__(self) -> None:
        super().__init__()
        self.removing, self.release = threading.Event(), threading.Event()

    def remove(self, ident: str) -> None:
        self.removing.set()
        assert self.release.wait(10), "never released"
        super().remove(ident)


async def test_a_stop_while_the_reaper_removes_a_dead_pooled_pair_ends_the_reaper(tmp_path: Path) -> None:
    runtime, answered = SlowRemoval(), Answered()
    manager = await _pool_manager(tmp_path, runtime, answered, reap_interval_s=0)  # its loop: ticks back to back
    pair = _pooled(manager, runtime)
    runtime.die(pair.sandbox.id, ExitInfo("exited", 1, False))
    assert await _until(runtime.removing)  # the reaper's tick is in the removal's thread
    stopping = asyncio.ensure_future(manager.stop())
    asyncio.get_running_loop().call_soon(runtime.release.set)  # once the stop's cancellation is under way
    # The tick waits for its removal (a thread cannot be stopped), then ends with the loop: the
    # stop returns, and no tick comes after it.
    await asyncio.wait_for(stopping, timeout=5)
    assert pair.sandbox.id not in runtime.running
    assert not manager.background_tasks()


class SlowListing(FakeRuntime):
    """A listing that waits for ``release`` (a Docker that stopped answering), saying when it began."""

    def __init__(self) -> None:
        super().__init__()
        self.listing, self.release = threading.Event(), threading.Event()

    def sandbox_states(self, labels: Mapping[str, str]) -> dict[str, str]:
        self.listing.set()
        assert self.release.wait(10), "never released"
        return super().sandbox_states(labels)


async def test_a_stop_while_a_tick_waits_on_docker_returns_at_once(tmp_path: Path) -> None:
    runtime, answered = SlowListing(), Answered()
    manager = await _pool_manager(tmp_path, runtime, answered, reap_interval_s=0)  # its loop: ticks back to back
    try:
        _pooled(manager, runtime)
        assert await _until(runtime.listing)  # the tick is in the listing's thread, which will not return
        # A listing makes nothing to undo: the stop does not wait for it.
        await asyncio.wait_for(manager.stop(), timeout=2)
        assert not manager.background_tasks()
    finally:
        runtime.release.set()


async def test_a_pooled_proxy_that_hangs_fails_the_claim_of_its_pair_within_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pool, "HAND_OUT_CHECK_S", 0.2)
    runtime, answered = FakeRuntime(), Answered()
    egress = PolicyEgress()
    manager = await _pool_manager(tmp_path, runtime, answered, egress)
    try:
        pair = _pooled(manager, runtime, POOLED_EGRESS)
        egress.release_policy.clear()  # its proxy takes the connection and does not answer (for 3 s)
        asyncio.get_running_loop().call_later(3, egress.release_policy.set)
        session, _ = await asyncio.wait_for(manager.create("key-a", CreateSession(allow=["example.test"])), 2)
        # Not handed out: removed, and the session is a cold pair whose proxy started with its policy.
        assert not session.record.from_pool and session.sandbox.id != pair.sandbox.id
        assert pair.sandbox.id not in runtime.running and egress.torn_down == [pair.session_id]
        assert egress.policies == [] and egress.allowed[session.id] == ["example.test"]
    finally:
        egress.release_policy.set()
        await manager.stop()


class CountingRuntime(FakeRuntime):
    """Counts the reaper's Docker listings; a proxy listing waits for ``release`` once ``gate`` is set
    (a session can then start between the tick's listing and its watchdog)."""

    def __init__(self) -> None:
        super().__init__()
        self.sandbox_listings = self.proxy_listings = 0
        self.gate, self.listed, self.release = threading.Event(), threading.Event(), threading.Event()

    def sandbox_states(self, labels: Mapping[str, str]) -> dict[str, str]:
        self.sandbox_listings += 1
        return super().sandbox_states(labels)

    def proxy_states(self, labels: Mapping[str, str]) -> dict[str, str]:  # type: ignore[override]
        self.proxy_listings += 1
        states = super().proxy_states(labels)
        if self.gate.is_set():
            self.gate.clear()
            self.listed.set()
            assert self.release.wait(10), "never released"
        return dict(states)


async def _egress_manager(tmp_path: Path, runtime: FakeRuntime, **settings: object) -> SessionManager:
    """A manager with the real egress manager on the fake runtime: its proxies (on loopback, at a port
    nothing listens on) never answer the watchdog, which only logs that; they count as up at start."""
    values: dict[str, object] = {"egress": True, "ground_pool_size": 0, **settings}
    manager = await _pool_manager(tmp_path, runtime, Answered(), **values)
    assert manager.egress is not None

    async def up(egress: Egress, timeout_s: float) -> None:
        return None

    manager.egress.wait_ready = up  # type: ignore[method-assign]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        manager.egress.control_port = sock.getsockname()[1]  # closed again: refused at once
    return manager


COLD = CreateSession(viewport={"width": 1000, "height": 700})  # not the pool's: a cold start


async def test_held_grounds_proxies_are_judged_from_the_ticks_one_listing(tmp_path: Path) -> None:
    runtime = CountingRuntime()
    manager = await _egress_manager(tmp_path, runtime, ground_pool_size=2)
    assert manager.egress is not None and manager.grounds is not None

    async def policy_set(egress: Egress, allow: object, mode: object, actor: object, timeout_s: float) -> None:
        return None

    manager.egress.set_start_policy = policy_set  # type: ignore[method-assign]
    try:
        await asyncio.wait_for(manager.grounds.filled.wait(), 10)
        session, _ = await manager.create("key-a", COLD)  # takes a ground, its proxy started ahead
        assert session.egress is not None
        await asyncio.wait_for(manager.grounds.filled.wait(), 10)
        await _ticks(manager, 2)
        listings, ticks = runtime.proxy_listings, manager.reaper_ticks
        await _ticks(manager, 20)
        # The grounds' proxies are in the listing the tick made for the session's: none of their own.
        assert runtime.proxy_listings - listings <= manager.reaper_ticks - ticks + 1
        # And one of them that is not running (Docker restarting it; its machine lost) is made again
        # from the next tick's listing, a tick that is not the pool's: a cold start right after the
        # loss must not take it.
        while manager.reaper_ticks % reaper.POOL_CHECK_TICKS != 0:
            await _ticks(manager, 1)
        ground = manager.grounds.held()[0]
        proxy, labels, _ = runtime.proxies[ground.session_id]
        runtime.proxies[ground.session_id] = (proxy, labels, "restarting")
        await _ticks(manager, 1)
        assert ground not in manager.grounds.held()
        await asyncio.wait_for(manager.grounds.filled.wait(), 10)  # dropped and made again
        assert ground.session_id not in runtime.proxies
    finally:
        await manager.stop()


async def test_a_ground_whose_proxy_never_answers_costs_the_start_nothing(tmp_path: Path) -> None:
    runtime = CountingRuntime()
    manager = await _egress_manager(tmp_path, runtime, ground_pool_size=2)
    assert manager.egress is not None and manager.grounds is not None
    await asyncio.wait_for(manager.grounds.filled.wait(), 10)
    lost = manager.grounds.held()[0]  # the next one taken: its proxy went with its machine, unseen yet
    asked: list[str] = []

    async def policy_set(egress: Egress, allow: object, mode: object, actor: object, timeout_s: float) -> None:
        asked.append(egress.session_id)
        if egress.session_id == lost.session_id:
            raise EgressUnavailable(f"egress proxy {egress.proxy_name} did not come up")

    manager.egress.set_start_policy = policy_set  # type: ignore[method-assign]
    try:
        session, _ = await manager.create("key-a", COLD)
        assert session.state == "ready" and session.egress is not None
        # Started again with a proxy of its own (not the next ground's: the start takes none again).
        held = {g.session_id for g in manager.grounds.held()}
        assert asked == [lost.session_id] and session.id != lost.session_id and session.id not in held
        assert session.id in runtime.proxies and session.egress.session_id == session.id
        # Nothing of the lost ground is left, and its first sandbox is gone.
        assert lost.session_id not in runtime.proxies and lost.network.name not in runtime.networks
        assert [s for s in runtime.list_sandboxes() if s.id != session.sandbox.id] == []
        assert lost.session_id not in manager.egress.unclaimed_grounds()
        assert not lost.state_dir.exists()
    finally:
        await manager.stop()


async def test_an_idle_pool_alone_is_listed_every_few_ticks(tmp_path: Path) -> None:
    runtime, answered = CountingRuntime(), Answered()
    manager = await _pool_manager(tmp_path, runtime, answered)
    try:
        _pooled(manager, runtime)
        await _ticks(manager, 2)
        listings, ticks = runtime.sandbox_listings, manager.reaper_ticks
        await _ticks(manager, 20)
        made, elapsed = runtime.sandbox_listings - listings, manager.reaper_ticks - ticks
        assert 3 <= made <= elapsed // 5 + 1  # every 5th tick: a dead pooled pair is found within 5 ticks
    finally:
        await manager.stop()


async def test_a_tick_lists_the_proxies_once_for_the_pool_and_the_watchdog(tmp_path: Path) -> None:
    runtime = CountingRuntime()
    manager = await _egress_manager(tmp_path, runtime, pool_size=1)
    try:
        session, _ = await manager.create("key-a", COLD)
        await asyncio.wait_for(manager.pool.filled.wait(), 10)
        assert manager.counts()["pool"] == 1 and session.egress is not None
        await _ticks(manager, 2)
        listings, ticks = runtime.proxy_listings, manager.reaper_ticks
        await _ticks(manager, 10)
        assert runtime.proxy_listings - listings <= manager.reaper_ticks - ticks + 1
        # Still every tick for a live session's proxy: one that stopped is restarted within a tick or two,
        # and one that is gone ends its session.
        proxy, labels, _ = runtime.proxies[session.id]
        runtime.proxies[session.id] = (proxy, labels, "exited")
        await _ticks(manager, 3)
        assert runtime.proxies[session.id][2] == "running" and session.state == "ready"
        del runtime.proxies[session.id]
        await _ticks(manager, 1)
        await asyncio.wait_for(session.ended.wait(), 1)
        assert session.end_reason == "egress_proxy_gone"
    finally:
        await manager.stop()


async def test_a_session_started_after_the_ticks_proxy_listing_is_not_taken_for_gone(tmp_path: Path) -> None:
    runtime = CountingRuntime()
    manager = await _egress_manager(tmp_path, runtime)
    try:
        first, _ = await manager.create("key-a", COLD)  # so that the tick lists the proxies
        runtime.gate.set()
        ticking = asyncio.ensure_future(manager.reaper.tick())
        assert await _until(runtime.listed)  # a tick listed them and waits
        second, _ = await manager.create("key-a", COLD)  # its proxy is not in that listing
        runtime.release.set()
        await ticking
        await _ticks(manager, 3)
        assert second.state == "ready" and first.state == "ready"
        assert manager.get(second.id) is second
    finally:
        runtime.release.set()
        await manager.stop()


async def test_a_pooled_sandbox_whose_controller_hangs_in_a_running_container_leaves_the_pool(tmp_path: Path) -> None:
    runtime, answered = CountingRuntime(), Answered()
    manager = await _pool_manager(tmp_path, runtime, answered)
    try:
        pair, alive = _pooled(manager, runtime), _pooled(manager, runtime)
        # Docker lists its container as running, but nothing answers at its controller's address.
        hung = dataclasses.replace(pair, sandbox=dataclasses.replace(pair.sandbox, host="10.99.9.9"))
        manager.pool.replace(pair, hung)
        await _ticks(manager, reaper.POOL_ANSWER_TICKS + 2)
        assert manager.pool.pairs() == [alive] and pair.sandbox.id not in runtime.running
        assert alive.sandbox.host in answered  # the live one was asked too, and stays
    finally:
        await manager.stop()


class SlowCounting(CountingRuntime):
    """CountingRuntime whose removals wait for ``release`` while ``slow`` is set; counts proxy restarts."""

    def __init__(self) -> None:
        super().__init__()
        self.slow, self.removing, self.release_removal = threading.Event(), threading.Event(), threading.Event()
        self.restarts = 0

    def remove(self, ident: str) -> None:
        if self.slow.is_set():
            self.removing.set()
            assert self.release_removal.wait(10), "never released"
        super().remove(ident)

    def restart_proxy(self, session_id: str) -> ProxyAddress:
        self.restarts += 1
        return super().restart_proxy(session_id)


async def test_after_a_slow_tick_the_watchdog_lists_the_proxies_again(tmp_path: Path) -> None:
    runtime = SlowCounting()
    manager = await _egress_manager(tmp_path, runtime)
    try:
        session, _ = await manager.create("key-a", COLD)
        pair = _pooled(manager, runtime)
        await _ticks(manager, 2)
        proxy, labels, _ = runtime.proxies[session.id]
        # One listing sees both: the session's proxy exited, the pooled sandbox dead (its removal is slow).
        runtime.slow.set()
        runtime.proxies[session.id] = (proxy, labels, "exited")
        runtime.die(pair.sandbox.id, ExitInfo("exited", 1, False))
        ticking = asyncio.ensure_future(manager.reaper.tick())
        assert await _until(runtime.removing)
        runtime.proxies[session.id] = (proxy, labels, "running")  # meanwhile Docker restarted it (on-failure)
        later = time.monotonic() + 2 * REAP_INTERVAL_S
        manager.reaper.clock = lambda: later  # the tick's listing is older than a tick now
        runtime.release_removal.set()
        await ticking
        await _ticks(manager, 3)
        assert runtime.restarts == 0  # not restarted once more from the stale listing
        assert session.state == "ready" and manager.counts()["pool"] == 0
    finally:
        runtime.release_removal.set()
        await manager.stop()
