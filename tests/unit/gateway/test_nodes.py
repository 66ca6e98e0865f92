"""The gateway's side of a runtime of several machines, against the fake runtime's nodes: a session
names its node, a lost node ends its sessions with ``node_lost`` and a drained one with
``node_drained`` (the others go on), the pool's pairs on a node that takes no new sessions are
replaced elsewhere, and a restarted gateway closes what it finds lost with the node's reason."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import httpx
import pytest
from starlette.requests import HTTPConnection

from corral.gateway.app import build_sessions
from corral.gateway.models import CreateSession
from corral.gateway.routes.sessions import session_out
from corral.gateway.sessions import (
    NODE_DRAINED_REASON,
    NODE_LOST_REASON,
    SANDBOX_EXITED,
    SessionManager,
    describe_exit,
    end_reason_of,
    reaper,
)
from corral.gateway.settings import GatewaySettings
from corral.gateway.store import SessionStore
from corral.runtime import NODE_DRAINED, NODE_LOST, ExitInfo, NodeInfo, SandboxAddress, SandboxSpec

from ..runtime.fake import FakeRuntime
from .controller_fake import SECRET, proving

REAP_INTERVAL_S = 3600  # the tests drive the ticks
NODES = ("node-1", "node-2", "node-3")


class SecretRuntime(FakeRuntime):
    """Its sandboxes' controllers hold the secret the fake controllers prove (a claim's last look)."""

    def start_sandbox(self, spec: SandboxSpec) -> SandboxAddress:
        box = dataclasses.replace(super().start_sandbox(spec), secret=SECRET)
        self.running[box.id] = (box, self.running[box.id][1])
        return box


def _runtime() -> FakeRuntime:
    runtime = SecretRuntime()
    runtime.node_list = [NodeInfo(name, True, "active") for name in NODES]
    return runtime


def _answering(runtime: FakeRuntime) -> httpx.MockTransport:
    """The controllers of the sandboxes that still run answer; a dead one's connection is refused."""

    def answer(request: httpx.Request) -> httpx.Response:
        alive = {box.host for box, _ in runtime.running.values() if box.id not in runtime.exited}
        if request.url.host not in alive:
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(200, json={"secrets": {}})

    return httpx.MockTransport(proving(answer))


async def _manager(tmp_path: Path, runtime: FakeRuntime, **settings: object) -> SessionManager:
    values: dict[str, object] = {"data_dir": tmp_path, "instance": "t", "pool_size": 0, "egress": False}
    values.update({"record": False, "reap_interval_s": REAP_INTERVAL_S, **settings})
    manager = build_sessions(
        GatewaySettings(**values), runtime, SessionStore(tmp_path), controller_transport=_answering(runtime)
    )
    await manager.start()
    return manager


async def _ticks(manager: SessionManager, count: int) -> None:
    for _ in range(count):
        await manager.reaper.tick()
        probe = manager.liveness.probing()
        if probe is not None:
            await probe


def _conn() -> HTTPConnection:
    return cast(HTTPConnection, SimpleNamespace(base_url="http://gateway.test/"))


async def test_sessions_spread_over_the_nodes_and_each_names_its_own(tmp_path: Path) -> None:
    runtime = _runtime()
    manager = await _manager(tmp_path, runtime)
    try:
        sessions = [(await manager.create("key-a", CreateSession()))[0] for _ in NODES]
        assert sorted(s.sandbox.node for s in sessions) == list(NODES)
        shown = [session_out(_conn(), s) for s in sessions]
        assert [out.node for out in shown] == [s.sandbox.node for s in sessions]
        assert json.loads(shown[0].model_dump_json())["node"] == sessions[0].sandbox.node
    finally:
        await manager.stop()


async def test_a_single_host_session_names_no_node(tmp_path: Path) -> None:
    runtime = FakeRuntime()  # no nodes listed: one machine
    manager = await _manager(tmp_path, runtime)
    try:
        session, _ = await manager.create("key-a", CreateSession())
        assert session_out(_conn(), session).node == ""
    finally:
        await manager.stop()


async def test_a_lost_node_ends_its_sessions_node_lost_and_leaves_the_others(tmp_path: Path) -> None:
    runtime = _runtime()
    manager = await _manager(tmp_path, runtime)
    try:
        sessions = [(await manager.create("key-a", CreateSession()))[0] for _ in NODES]
        lost = next(s for s in sessions if s.sandbox.node == "node-2")
        runtime.lose_node("node-2")
        await _ticks(manager, 1)
        await asyncio.wait_for(lost.removed.wait(), timeout=5)
        assert (lost.end_reason, lost.end_detail) == (NODE_LOST_REASON, "node-2 is down or cut off from the cluster")
        # Its WebSockets close with 4000 and the reason, naming the node.
        assert lost.close_code() == 4000
        assert lost.close_reason() == "session ended: node_lost (node-2 is down or cut off from the cluster)"
        assert lost.sandbox.id not in runtime.running  # its sandbox removed (the runtime's to do on the node)
        others = [s for s in sessions if s is not lost]
        assert all(s.state == "ready" and not s.ended.is_set() for s in others)
        assert {s.id for s in manager.list("key-a")} == {s.id for s in others}
        # A new session lands on a node that is left.
        again, _ = await manager.create("key-a", CreateSession())
        assert again.sandbox.node in ("node-1", "node-3")
    finally:
        await manager.stop()


async def test_a_drained_node_ends_its_sessions_node_drained(tmp_path: Path) -> None:
    runtime = _runtime()
    manager = await _manager(tmp_path, runtime)
    try:
        sessions = [(await manager.create("key-a", CreateSession()))[0] for _ in NODES]
        drained = next(s for s in sessions if s.sandbox.node == "node-3")
        runtime.drain_node("node-3")
        await _ticks(manager, 1)
        await asyncio.wait_for(drained.removed.wait(), timeout=5)
        assert drained.end_reason == NODE_DRAINED_REASON
        assert drained.close_reason() == "session ended: node_drained (node-3 was drained: its sandboxes were stopped)"
        assert sum(s.state == "ready" for s in sessions) == 2
    finally:
        await manager.stop()


async def test_the_relay_losing_its_sandbox_on_a_lost_node_ends_the_session_at_once(tmp_path: Path) -> None:
    runtime = _runtime()
    manager = await _manager(tmp_path, runtime)
    try:
        session, _ = await manager.create("key-a", CreateSession())
        runtime.lose_node(session.sandbox.node)
        await manager.check_sandbox(session)  # no reaper tick: the relay's own look
        assert session.ended.is_set() and session.end_reason == NODE_LOST_REASON
    finally:
        await manager.stop()


async def test_a_paused_node_keeps_its_sessions_and_takes_no_new_ones(tmp_path: Path) -> None:
    runtime = _runtime()
    manager = await _manager(tmp_path, runtime)
    try:
        first, _ = await manager.create("key-a", CreateSession())
        paused = first.sandbox.node
        runtime.node_list = [
            NodeInfo(n.name, True, "pause" if n.name == paused else "active") for n in runtime.node_list
        ]
        await _ticks(manager, reaper.POOL_CHECK_TICKS)
        assert first.state == "ready" and not first.ended.is_set()  # running ones go on
        later = [(await manager.create("key-a", CreateSession()))[0] for _ in range(4)]
        assert paused not in {s.sandbox.node for s in later}
    finally:
        await manager.stop()


async def _filled(manager: SessionManager, size: int) -> None:
    while len(manager.pool) + manager.pool.starting < size or manager.pool.starting:
        manager.pool.filled.clear()
        await asyncio.wait_for(manager.pool.filled.wait(), timeout=5)


@pytest.mark.parametrize("closing", ["pause", "drain", "lost"])
async def test_pooled_pairs_on_a_node_that_takes_no_new_sessions_are_replaced_on_the_others(
    tmp_path: Path, closing: str
) -> None:
    runtime = _runtime()
    manager = await _manager(tmp_path, runtime, pool_size=3)
    try:
        await _filled(manager, 3)
        assert sorted(p.sandbox.node for p in manager.pool.pairs()) == list(NODES)  # one on each
        if closing == "pause":
            runtime.node_list = [NodeInfo(name, True, "pause" if name == "node-2" else "active") for name in NODES]
        elif closing == "drain":
            runtime.drain_node("node-2")
        else:
            runtime.lose_node("node-2")
        gone = next(p for p in manager.pool.pairs() if p.sandbox.node == "node-2")
        await _ticks(manager, reaper.POOL_CHECK_TICKS)  # an idle pool is looked at every POOL_CHECK_TICKS
        await _filled(manager, 3)
        assert gone not in manager.pool.pairs() and gone.sandbox.id not in runtime.running  # removed
        nodes = [p.sandbox.node for p in manager.pool.pairs()]
        assert len(nodes) == 3 and "node-2" not in nodes
        # A claim now gets a pooled sandbox on a node that takes sessions.
        session, _ = await manager.create("key-a", CreateSession())
        assert session.record.from_pool and session.sandbox.node != "node-2"
    finally:
        await manager.stop()


async def test_a_node_listing_that_fails_does_not_stop_the_pools_own_check(tmp_path: Path) -> None:
    class Unlisted(FakeRuntime):
        def nodes(self) -> list[NodeInfo]:
            raise RuntimeError("the manager did not answer")

    runtime = Unlisted()
    manager = await _manager(tmp_path, runtime, pool_size=2)
    try:
        await _filled(manager, 2)
        dead = manager.pool.pairs()[0]
        runtime.die(dead.sandbox.id, ExitInfo("exited", 1, False))
        await _ticks(manager, reaper.POOL_CHECK_TICKS)
        await _filled(manager, 2)
        assert dead not in manager.pool.pairs() and len(manager.pool) == 2
    finally:
        await manager.stop()


async def test_an_idle_gateway_still_looks_at_its_nodes_every_few_ticks(tmp_path: Path) -> None:
    """No session, no pool: nothing lists the sandboxes, and the nodes are looked at all the same
    (the swarm runtime's look keeps each node's guard label true: a node back from down is labelled
    again though no session started meanwhile)."""

    class Counted(FakeRuntime):
        looks = 0

        def nodes(self) -> list[NodeInfo]:
            self.looks += 1
            return super().nodes()

    runtime = Counted()
    manager = await _manager(tmp_path, runtime)
    try:
        await _ticks(manager, reaper.POOL_CHECK_TICKS - 1)
        before = runtime.looks
        await _ticks(manager, 1)
        assert runtime.looks == before + 1
        await _ticks(manager, reaper.POOL_CHECK_TICKS * 2)
        assert runtime.looks == before + 3  # once every POOL_CHECK_TICKS ticks, no more
    finally:
        await manager.stop()


async def test_a_restarted_gateway_closes_a_session_lost_with_its_node_as_node_lost(tmp_path: Path) -> None:
    runtime = _runtime()
    manager = await _manager(tmp_path, runtime)
    kept, _ = await manager.create("key-a", CreateSession())
    lost, _ = await manager.create("key-a", CreateSession())
    await manager.stop()  # the gateway goes; its sessions run on
    runtime.lose_node(lost.sandbox.node)
    closed: list[tuple[str, str]] = []
    again = await _manager_closing(tmp_path, runtime, closed)
    try:
        assert [s.id for s in again.list("key-a")] == [kept.id]
        assert again.get(kept.id).sandbox.node == kept.sandbox.node  # found again where it runs
        assert closed == [(lost.id, NODE_LOST_REASON)]
        assert lost.sandbox.id not in runtime.running  # what the lost node ran is removed, not adopted
    finally:
        await again.stop()


async def _manager_closing(tmp_path: Path, runtime: FakeRuntime, closed: list[tuple[str, str]]) -> SessionManager:
    """A manager whose recovery reports each session it closes as lost (id, reason)."""
    values: dict[str, object] = {"data_dir": tmp_path, "instance": "t", "pool_size": 0, "egress": False}
    values.update({"record": False, "reap_interval_s": REAP_INTERVAL_S})
    manager = build_sessions(
        GatewaySettings(**values), runtime, SessionStore(tmp_path), controller_transport=_answering(runtime)
    )
    recordings = manager.parts.recordings
    recordings.close_lost = lambda session_id, had_egress, reason="lost": closed.append((session_id, reason))  # type: ignore[method-assign]
    await manager.start()
    return manager


@pytest.mark.parametrize(
    ("info", "reason", "detail"),
    [
        (ExitInfo(NODE_LOST, None, False, node="w2"), NODE_LOST_REASON, "w2 is down or cut off from the cluster"),
        (ExitInfo(NODE_LOST, None, False), NODE_LOST_REASON, "its node is down or cut off from the cluster"),
        (
            ExitInfo(NODE_DRAINED, 137, False, node="w3"),
            NODE_DRAINED_REASON,
            "w3 was drained: its sandboxes were stopped",
        ),
        (ExitInfo("exited", 137, True, node="w2"), SANDBOX_EXITED, "out of memory (OOM-killed), exit code 137"),
        (ExitInfo("gone", None, False), SANDBOX_EXITED, "its container was removed"),
    ],
)
def test_an_exit_gives_the_end_reason_and_its_words(info: ExitInfo, reason: str, detail: str) -> None:
    assert (end_reason_of(info), describe_exit(info)) == (reason, detail)


async def test_an_end_retried_after_a_failed_teardown_keeps_its_first_reason(tmp_path: Path) -> None:
    runtime = _runtime()
    manager = await _manager(tmp_path, runtime)
    try:
        session, _ = await manager.create("key-a", CreateSession())
        runtime.drain_node(session.sandbox.node)
        runtime.fail_remove = True  # the first teardown fails (Swarm still holds the network)
        await _ticks(manager, 1)
        await manager.parts.endings.settled()
        assert session.state == "ready" and session.end_reason == NODE_DRAINED_REASON  # kept for the retry
        runtime.fail_remove = False
        runtime.die(session.sandbox.id, ExitInfo("gone", None, False))  # the service went meanwhile
        await _ticks(manager, 1)
        await asyncio.wait_for(session.removed.wait(), timeout=5)
        assert (session.end_reason, session.close_reason()) == (
            NODE_DRAINED_REASON,
            "session ended: node_drained (node-1 was drained: its sandboxes were stopped)",
        )
    finally:
        await manager.stop()
