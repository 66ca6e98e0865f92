"""Sessions across the nodes of a real swarm (scripts/swarm: three engines, the gateway on the
manager with CORRAL_RUNTIME=swarm, sessions on the two workers): they run on each and each names its own; a
worker cut off mid-session ends its sessions ``node_lost`` (WebSocket 4000, recording and audit
kept) while the others go on and new ones start on the nodes left; a node paused for Corral keeps
its sessions and takes no new ones, one drained by Swarm ends its sessions ``node_drained``; a
restarted gateway finds its sessions again, each on its node. docs/design/0425."""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from corral.recording.bundle import read_bundle

from ..test_egress import PROBE
from .conftest import Swarm
from .nodes_harness import NODE_DOWN_WITHIN_S, SwarmNodes, wait_until

pytestmark = pytest.mark.swarm

SESSION_ENDS_AFTER_NODE_DOWN_S = 15.0  # the reaper's listing sees the node down within a tick or two
GROUNDS_AHEAD = 2  # the gateway's CORRAL_GROUND_POOL_SIZE, which scripts/swarm leaves at its default


@pytest.fixture(scope="module")
def nodes(swarm: Swarm) -> SwarmNodes:
    env = swarm.env
    return SwarmNodes(env["CORRAL_SWARM_NAME"], Path(env["CORRAL_SWARM_DIR"]), env["CORRAL_SWARM_VETH"])


@pytest.fixture(scope="module")
def api(swarm: Swarm) -> Iterator[httpx.Client]:
    with swarm.client() as client:
        yield client


@pytest.fixture(autouse=True)
def swarm_as_found(api: httpx.Client, nodes: SwarmNodes) -> Iterator[None]:
    """Each test leaves the swarm as it found it, whatever it failed on: every node linked, active,
    ready and guarded, and none of its sessions left (one left over would count against the key's limit of the
    next test, and a node left down or paused would take its sessions). The gateway's last lines are
    printed here, so a failure's report shows them (its log lives on the manager, gone after down)."""
    yield
    print(nodes.gateway_log())
    for host in nodes.nodes():
        nodes.mend(host)
        nodes.set_availability(host, "active")
    for host in nodes.nodes():
        nodes.await_node(host, "ready", within_s=90)
    wait_until(lambda: nodes.guarded() == set(nodes.nodes()), 120, "the host guard running on every node")
    wait_until(lambda: nodes.labelled() == set(nodes.nodes()), 120, "every node labelled guarded again")
    for session in api.get("/v1/sessions").json():
        _delete(api, session)


def _create(api: httpx.Client, **body: Any) -> dict[str, Any]:
    reply = api.post("/v1/sessions", json=body)
    assert reply.status_code == 201, reply.text
    created: dict[str, Any] = reply.json()
    assert created["node"], created  # every session on the swarm names its node
    return created


def _delete(api: httpx.Client, *sessions: dict[str, Any]) -> None:
    for session in sessions:
        assert api.delete(f"/v1/sessions/{session['id']}").status_code in (204, 404)


def _on_workers(api: httpx.Client, nodes: SwarmNodes, **body: Any) -> list[dict[str, Any]]:
    """One session with its sandbox on each worker, in the nodes' order (Swarm's spread alone once
    left a worker out): each made while the other workers are paused, so Swarm has one place for it
    (scripts/swarm's gateway places on the workers only, and keeps no pool: each sandbox starts on
    the request's path)."""
    made: list[dict[str, Any]] = []
    for host in nodes.workers():
        with _paused(nodes, *(h for h in nodes.workers() if h != host)):
            made.append(_create(api, **body))
        assert made[-1]["node"] == host, (host, made[-1]["node"])
    return made


def _apart_from(nodes: SwarmNodes, sessions: list[dict[str, Any]], host: str) -> list[dict[str, Any]]:
    """The sessions of which nothing runs on ``host``: their sandbox (the record's node: a sandbox
    from the pool carries no session label) nor their proxy."""
    return [s for s in sessions if s["node"] != host and host not in nodes.placed(s["id"])]


def _one_apart(
    api: httpx.Client, nodes: SwarmNodes, made: list[dict[str, Any]], host: str, **body: Any
) -> list[dict[str, Any]]:
    """The sessions apart from ``host``, one more made (into ``made``) when there is none: Swarm
    places a session's sandbox and its proxy each on its own, so a run may hold all of them on it.
    It is made while ``host`` is paused, so its sandbox lands elsewhere; its proxy may come from a
    ground held from before (started ahead, wherever Swarm put it), so up to GROUNDS_AHEAD + 1 are
    made: the grounds' refills after each start are placed while it is paused too."""
    apart = _apart_from(nodes, made, host)
    if apart:
        return apart
    with _paused(nodes, host):
        for _ in range(GROUNDS_AHEAD + 1):
            made.append(_create(api, **body))
            apart = _apart_from(nodes, made[-1:], host)
            if apart:
                break
    assert apart, f"every session had something on {host}"
    return apart


@contextmanager
def _paused(nodes: SwarmNodes, *hosts: str) -> Iterator[None]:
    """``hosts`` (workers) paused for Swarm, which places no new task there; active again after.
    Never the manager: its gateway joins each new session's overlay through a task on its node, which
    a paused node does not take (docs/design/0466)."""
    assert nodes.host(1) not in hosts, "the manager paused: no session could start"
    for host in hosts:
        nodes.set_availability(host, "pause")
    try:
        yield
    finally:
        for host in hosts:
            nodes.set_availability(host, "active")


@contextmanager
def _open_ws(session: dict[str, Any]) -> Iterator[ClientConnection]:
    with connect(f"{session['ws_url']}?token={session['token']}", compression=None, open_timeout=30) as ws:
        ws.send(json.dumps({"id": 1, "action": {"type": "cursor_position"}}))
        assert json.loads(ws.recv(timeout=30))["ok"] is True
        yield ws


def _closed(ws: ClientConnection, timeout_s: float) -> tuple[int, str]:
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(timeout=timeout_s)
    assert closed.value.rcvd is not None, "closed without a close frame"
    return closed.value.rcvd.code, closed.value.rcvd.reason


def _exec(api: httpx.Client, session: dict[str, Any], argv: list[str]) -> dict[str, Any]:
    reply = api.post(
        f"/v1/sessions/{session['id']}/actions", json={"action": {"type": "exec", "argv": argv, "timeout_ms": 30000}}
    )
    assert reply.status_code == 200, reply.text
    result: dict[str, Any] = reply.json()["result"]
    return result


def _manifest(api: httpx.Client, session_id: str) -> dict[str, Any]:
    """The manifest of the session's recording as the gateway serves it (a zip of its bundle)."""
    reply = api.get(f"/v1/sessions/{session_id}/recording")
    assert reply.status_code == 200, reply.text
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / f"{session_id}.zip"
        path.write_bytes(reply.content)
        return dict(read_bundle(path).manifest)


def test_sessions_run_on_every_worker_and_each_names_its_own(api: httpx.Client, nodes: SwarmNodes) -> None:
    made = _on_workers(api, nodes)
    try:
        assert {s["node"] for s in made} == set(nodes.workers())
        for session in made:
            shown = api.get(f"/v1/sessions/{session['id']}").json()
            assert shown["node"] == session["node"]
            # The node it names runs its sandbox: that node's own engine holds the container.
            held = nodes.docker(
                nodes.index(session["node"]),
                "ps",
                "-q",
                "--filter",
                f"label=com.docker.swarm.service.name={session['container']}",
            )
            assert held.strip(), f"{session['node']} runs nothing of {session['id']}"
            assert _exec(api, session, ["true"])["exit_code"] == 0
        listed = {s["id"]: s["node"] for s in api.get("/v1/sessions").json()}
        assert all(listed[s["id"]] == s["node"] for s in made)
    finally:
        _delete(api, *made)


def _fetch(api: httpx.Client, session: dict[str, Any], host: str) -> int:
    """A request from the sandbox, as its agent, through its proxy to ``host`` (a .test upstream)."""
    probe = json.dumps({"tls": True, "connect": host, "path": "/"})
    result = _exec(api, session, ["python3", "-c", PROBE, "proxied", probe])
    assert result["exit_code"] == 0, result
    return int(json.loads(result["stdout"])["status"])


def _traffic(api: httpx.Client, session_id: str, **params: str) -> list[dict[str, Any]]:
    reply = api.get(f"/v1/sessions/{session_id}/traffic", params=params)
    assert reply.status_code == 200, reply.text
    return [json.loads(line) for line in reply.text.splitlines() if line]


def test_egress_is_enforced_on_every_node_and_an_allowlist_change_reaches_a_proxy_on_a_worker(
    api: httpx.Client, nodes: SwarmNodes
) -> None:
    made = _on_workers(api, nodes, allow=["allowed.test"])
    try:
        # Its sandbox and its proxy on the workers (where the test swarm places every session).
        on_worker = next(s for s in made if nodes.host(1) not in nodes.placed(s["id"]))
        for session in made:
            assert _fetch(api, session, "allowed.test") == 200, session["node"]
            assert _fetch(api, session, "other.test") == 403, session["node"]
        patched = api.patch(f"/v1/sessions/{on_worker['id']}", json={"allow": ["allowed.test", "other.test"]})
        assert patched.status_code == 200, patched.text
        assert _fetch(api, on_worker, "other.test") == 200
        assert api.patch(f"/v1/sessions/{on_worker['id']}", json={"allow": []}).status_code == 200
        assert _fetch(api, on_worker, "allowed.test") == 403
    finally:
        _delete(api, *made)


def test_egress_is_audited_on_every_node(api: httpx.Client, nodes: SwarmNodes) -> None:
    made = _on_workers(api, nodes, allow=["allowed.test"])
    try:
        for session in made:
            assert _fetch(api, session, "allowed.test") == 200
            assert _fetch(api, session, "other.test") == 403
            assert api.patch(f"/v1/sessions/{session['id']}", json={"allow": []}).status_code == 200
            # All of it in its audit log, read through the gateway from wherever its proxy runs.
            seen = {(r.get("event"), r.get("host"), r.get("decision")) for r in _traffic(api, session["id"])}
            assert {("request", "allowed.test", "allow"), ("connect", "other.test", "deny")} <= seen, seen
            assert [r["allow"] for r in _traffic(api, session["id"], event="policy")][-1] == []
    finally:
        _delete(api, *made)


def test_a_worker_cut_off_mid_session_ends_its_sessions_node_lost_and_the_rest_go_on(
    api: httpx.Client, nodes: SwarmNodes
) -> None:
    made = _on_workers(api, nodes)
    lost_host = nodes.host(3)
    lost = next(s for s in made if s["node"] == lost_host)
    apart = _one_apart(api, nodes, made, lost_host)
    kept = [s for s in made if s is not lost]
    _exec(api, lost, ["sh", "-c", "echo before-the-cut"])  # something in its recording
    # Something in its audit log, received by the gateway (its mirror) before the cut.
    assert _fetch(api, lost, "other.test") == 403
    wait_until(
        lambda: (
            ("connect", "other.test", "deny")
            in {(r.get("event"), r.get("host"), r.get("decision")) for r in _traffic(api, lost["id"])}
        ),
        30,
        "the refused request in the gateway's copy of the audit log",
    )
    try:
        with _open_ws(lost) as ws:
            cut_at = time.monotonic()
            nodes.cut(lost_host)
            code, reason = _closed(ws, timeout_s=NODE_DOWN_WITHIN_S + SESSION_ENDS_AFTER_NODE_DOWN_S)
            closed_s = time.monotonic() - cut_at
        assert code == 4000, (code, reason)
        assert reason.startswith(f"session ended: node_lost ({lost_host}"), reason
        print(f"worker cut off: its session's WebSocket closed {closed_s:.1f} s after the cut ({reason})")
        wait_until(lambda: api.get(f"/v1/sessions/{lost['id']}").status_code == 404, 30, "the lost session gone")
        # Its recording is kept, ended with the reason (its audit up to the last record received: the
        # state part's mirror, test_egress_is_audited_on_every_node).
        assert _manifest(api, lost["id"])["end_reason"] == "node_lost"
        kept_audit = {(r.get("event"), r.get("host"), r.get("decision")) for r in _traffic(api, lost["id"])}
        assert ("connect", "other.test", "deny") in kept_audit, kept_audit
        # The ones with nothing on the lost node go on, and a new session starts on a node that is left.
        for session in apart:
            assert _exec(api, session, ["true"])["exit_code"] == 0
        fresh = _create(api)
        kept.append(fresh)
        assert fresh["node"] != lost_host
        # Nothing of the lost session is left on the manager (its services, network, secrets).
        wait_until(lambda: nodes.session_objects(lost["id"]) == [], 30, "the lost session's objects removed")
    finally:
        nodes.mend(lost_host)
        nodes.await_node(lost_host, "ready", within_s=90)
        _delete(api, *kept)
    # Back, the node runs nothing of the lost session (its engine stopped what Swarm no longer wants).
    sandbox = f"label=com.docker.swarm.service.name={lost['container']}"
    proxy = f"label=corral.session={lost['id']}"
    wait_until(
        lambda: not any(nodes.docker(3, "ps", "-q", "--filter", f).strip() for f in (sandbox, proxy)),
        60,
        "the lost session's containers gone from the node once it is back",
    )


def test_a_paused_node_keeps_its_sessions_and_takes_no_new_ones(api: httpx.Client, nodes: SwarmNodes) -> None:
    made = _on_workers(api, nodes)
    paused_host = nodes.host(2)
    on_paused = next(s for s in made if s["node"] == paused_host)
    nodes.set_availability(paused_host, "pause")
    later: list[dict[str, Any]] = []
    try:
        later = [_create(api) for _ in range(2)]
        assert paused_host not in {s["node"] for s in later}
        time.sleep(3)  # a few reaper ticks: a paused node's session is not ended
        assert api.get(f"/v1/sessions/{on_paused['id']}").json()["state"] == "ready"
        assert _exec(api, on_paused, ["true"])["exit_code"] == 0
    finally:
        nodes.set_availability(paused_host, "active")
        _delete(api, *made, *later)


def test_a_node_drained_by_swarm_ends_its_sessions_node_drained(api: httpx.Client, nodes: SwarmNodes) -> None:
    made = _on_workers(api, nodes)
    drained_host = nodes.host(2)
    drained = next(s for s in made if s["node"] == drained_host)
    apart = _one_apart(api, nodes, made, drained_host)
    kept = [s for s in made if s is not drained]
    try:
        with _open_ws(drained) as ws:
            nodes.set_availability(drained_host, "drain")
            code, reason = _closed(ws, timeout_s=60)  # Swarm stops its tasks (10 s grace at most)
        assert code == 4000 and reason.startswith(f"session ended: node_drained ({drained_host}"), reason
        # The socket closes as the ending begins; its recording is closed with the reason as it ends.
        wait_until(lambda: api.get(f"/v1/sessions/{drained['id']}").status_code == 404, 30, "the drained session gone")
        assert _manifest(api, drained["id"])["end_reason"] == "node_drained"
        for session in apart:
            assert _exec(api, session, ["true"])["exit_code"] == 0
    finally:
        nodes.set_availability(drained_host, "active")
        _delete(api, *kept)


def test_a_restarted_gateway_finds_its_sessions_on_their_nodes(api: httpx.Client, nodes: SwarmNodes) -> None:
    made = _on_workers(api, nodes)
    try:
        nodes.restart_gateway()
        wait_until(lambda: _answers(api), 120, "the gateway back")
        for session in made:
            shown = api.get(f"/v1/sessions/{session['id']}")
            assert shown.status_code == 200, shown.text
            assert (shown.json()["node"], shown.json()["state"]) == (session["node"], "ready")
            assert _exec(api, session, ["true"])["exit_code"] == 0
    finally:
        _delete(api, *made)


def _answers(api: httpx.Client) -> bool:
    try:
        return api.get("/v1/health").status_code == 200
    except httpx.HTTPError:
        return False
