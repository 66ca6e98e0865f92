"""Gateway lifecycle against real sandboxes: a dead sandbox ends its session at once, the gateway
reconciles networks and host-guard rules on start and leaves nothing of its pool on stop, and
credentials are checked before any body is read."""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from corral.gateway.sessions import GATEWAY_LABEL
from corral.gateway.store import session_dir
from corral.runtime import hostguard

from .dockerutil import DockerHarness
from .gateway_fixtures import KEY_A, RunningGateway, gateway

pytestmark = pytest.mark.usefixtures("desktop_image", "egress_image")


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, runtime: DockerHarness) -> Iterator[RunningGateway]:
    """One session at a time: a new one at the cap shows the dead one's slot was freed."""
    instance = f"life-{time.time_ns()}"
    # A controller silent for 15 s is dead (the default is 60): the test below waits for that verdict.
    limits = {"max_sessions": 1, "max_sessions_per_key": 1, "controller_dead_after_s": 15.0}
    with gateway(tmp_path_factory.mktemp("gw"), instance, **limits) as running:  # type: ignore[arg-type]
        yield running
    runtime.remove_all({GATEWAY_LABEL: instance})


@contextmanager
def _open_ws(session: dict[str, Any]) -> Iterator[ClientConnection]:
    with connect(f"{session['ws_url']}?token={session['token']}", compression=None, open_timeout=10) as ws:
        ws.send(json.dumps({"id": 1, "action": {"type": "cursor_position"}}))
        assert json.loads(ws.recv(timeout=10))["ok"] is True
        yield ws


def _closed(ws: ClientConnection, timeout_s: float) -> tuple[int, str, float]:
    started = time.monotonic()
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(timeout=timeout_s)
    assert closed.value.rcvd is not None, "closed without a close frame"
    return closed.value.rcvd.code, closed.value.rcvd.reason, time.monotonic() - started


def _gone_within(gw: RunningGateway, session_id: str, timeout_s: float) -> float:
    started = time.monotonic()
    with gw.client() as c:
        while c.get(f"/v1/sessions/{session_id}").status_code != 404:
            assert time.monotonic() - started < timeout_s, "the session outlived its sandbox"
            time.sleep(0.05)
    return time.monotonic() - started


def _manifest(gw: RunningGateway, session_id: str) -> dict[str, Any]:
    path = session_dir(gw.settings.data_dir / "recordings", session_id) / "manifest.json"
    deadline = time.monotonic() + 5
    while not json.loads(path.read_text()).get("ended_at"):
        assert time.monotonic() < deadline, "the recording was not closed"
        time.sleep(0.05)
    manifest: dict[str, Any] = json.loads(path.read_text())
    return manifest


def _create(gw: RunningGateway, **body: Any) -> dict[str, Any]:
    with gw.client() as c:
        reply = c.post("/v1/sessions", json=body)
    assert reply.status_code == 201, reply.text  # at the cap of one: the previous slot is free
    created: dict[str, Any] = reply.json()
    return created


def test_a_killed_sandbox_ends_its_session_at_once(gw: RunningGateway, runtime: DockerHarness) -> None:
    session = _create(gw)
    with _open_ws(session) as ws:
        killed = time.monotonic()
        runtime.kill(session["container"])
        code, reason, _ = _closed(ws, timeout_s=5)
        closed_s = time.monotonic() - killed
    assert code == 4000 and reason.startswith("session ended: sandbox_exited (exit code 137"), reason
    assert closed_s < 2.0, closed_s
    _gone_within(gw, session["id"], timeout_s=2.0)
    assert _manifest(gw, session["id"])["end_reason"] == "sandbox_exited"
    # The exited container and the session's proxy are removed, not just forgotten.
    assert runtime.find(session["container"]) is None
    assert runtime.container_states({"corral.session": session["id"]}) == {}
    print(f"killed sandbox: WebSocket closed {closed_s * 1000:.0f} ms after the kill")
    replacement = _create(gw)
    with gw.client() as c:
        assert c.delete(f"/v1/sessions/{replacement['id']}").status_code == 204


def test_filling_tmp_past_the_memory_limit_stops_at_the_mount_and_the_session_lives(
    gw: RunningGateway, runtime: DockerHarness
) -> None:
    # The attack of the report: fill the sandbox's tmpfs, as the sandbox's own user, past its memory.
    # It OOM-killed the sandbox (sandbox_exited, "out of memory"); the agent's mounts now share the
    # memory less a headroom (corral.runtime.docker), so the writer meets a full disk instead.
    session = _create(gw, resources={"memory_mb": 512, "disk_mb": 1024})
    with _open_ws(session) as ws:
        fill = ["dd", "if=/dev/zero", "of=/tmp/fill", "bs=1M", "count=1000"]
        code, out = runtime.exec(session["container"], fill)
        assert code != 0 and "No space left on device" in out, out
        ws.send(json.dumps({"id": 2, "action": {"type": "cursor_position"}}))
        assert json.loads(ws.recv(timeout=10))["ok"] is True
    with gw.client() as c:
        assert c.delete(f"/v1/sessions/{session['id']}").status_code == 204


# What the agent can write that lives in memory: every tmpfs open to its uid (the others refuse it).
_AGENT_TMPFS = ("/tmp", "/dev/shm", "/home/agent", "/workspace", "/run", "/run/user", "/home/corral")
# The controller killed as the kernel's OOM killer would, by pid, again and again for a bounded time (by
# its own uid: root in the sandbox holds no CAP_KILL).
_KILL_CONTROLLER = (
    "import os, signal, time\n"
    "end = time.monotonic() + 60\n"
    "while time.monotonic() < end:\n"
    "    for pid in filter(str.isdigit, os.listdir('/proc')):\n"
    "        try:\n"
    "            line = open(f'/proc/{pid}/cmdline', 'rb').read()\n"
    "            mine = int(pid) == os.getpid()  # its own command line names the controller too\n"
    "            if not mine and line.endswith(b'-m\\0corral.sandbox.controller\\0'):\n"
    "                os.kill(int(pid), signal.SIGKILL)\n"
    "        except OSError:\n"
    "            pass\n"
    "    time.sleep(0.3)\n"
)


def _exec(ws: ClientConnection, command: str) -> dict[str, Any]:
    """``command`` run through the controller, as the agent (its launcher: nice, OOM score and all)."""
    ws.send(json.dumps({"id": 2, "action": {"type": "exec", "command": command}}))
    answer: dict[str, Any] = json.loads(ws.recv(timeout=60))
    assert answer["ok"] is True, answer
    result: dict[str, Any] = answer["result"]
    return result


def _fill_every_tmpfs(runtime: DockerHarness, container: str) -> dict[str, int]:
    """As the agent's uid: each tmpfs it can write filled until it refuses; the MiB each took."""
    taken: dict[str, int] = {}
    for where in _AGENT_TMPFS:
        fill = f"dd if=/dev/zero of={where}/fill bs=1M count=4096 2>/dev/null; du -sm {where}/fill 2>/dev/null"
        _, out = runtime.exec(container, ["sh", "-c", fill], user="agent")
        first = out.split()[0] if out.split() else ""
        taken[where] = int(first) if first.isdigit() else 0
    return taken


def test_a_controller_that_cannot_stay_up_ends_its_session(gw: RunningGateway, runtime: DockerHarness) -> None:
    # 1 GiB of memory, 1 GiB asked for /tmp and /workspace: unbounded, the agent's files alone would
    # take the whole limit (and the kernel kill the controller, Chromium and X again and again).
    session = _create(gw, resources={"memory_mb": 1024, "disk_mb": 1024})
    container = session["container"]
    with _open_ws(session) as ws:
        taken = _fill_every_tmpfs(runtime, container)
        print(f"the agent's tmpfs fill (MiB): {taken}")
        assert taken["/run"] == taken["/run/user"] == taken["/home/corral"] == 0  # not the agent's to write
        assert sum(taken.values()) <= 1024 - 512, taken  # its mounts leave the headroom free
        # The controller, Chromium and X still answer after the fill.
        ws.send(json.dumps({"id": 3, "action": {"type": "screenshot", "format": "jpeg"}}))
        assert json.loads(ws.recv(timeout=30))["ok"] is True
        # The agent can neither kill the controller nor make its own processes safer from the OOM
        # killer than the controller is.
        mine = _exec(ws, "cat /proc/self/oom_score_adj; pgrep -u corral -f corral.sandbox.controller")
        adj, controller_pid = mine["stdout"].split()[:2]
        assert int(adj) == 1000  # the agent's processes die first
        _, theirs = runtime.exec(container, ["cat", f"/proc/{controller_pid}/oom_score_adj"], user="root")
        below = int(theirs.strip()) - 1
        lowered = _exec(ws, f"echo {below} > /proc/self/oom_score_adj")
        assert lowered["exit_code"] != 0 and "denied" in lowered["stderr"], lowered
        assert _exec(ws, f"kill -9 {controller_pid}")["exit_code"] != 0
        # Killed again and again all the same (as by the OOM killer): the session ends, the agent's
        # WebSocket closes 4000 with the reason, the recording is kept and the slot is free.
        killed = time.monotonic()
        runtime.exec(container, ["sh", "-c", f'nohup python3 -c "{_KILL_CONTROLLER}" >/dev/null 2>&1 &'], user="corral")
        closes = [_closed(ws, timeout_s=60)[:2]]
    # A controller that comes back for a moment closes the socket plainly (1000: it is back); the agent
    # reconnects, as a client does, until the verdict closes it with 4000 or the session is gone.
    deadline = time.monotonic() + 90
    while closes[-1][0] != 4000 and time.monotonic() < deadline:
        time.sleep(0.2)
        try:
            with connect(f"{session['ws_url']}?token={session['token']}", open_timeout=10) as again:
                closes.append(_closed(again, timeout_s=max(1.0, deadline - time.monotonic()))[:2])
        except InvalidStatus as refused:
            closes.append((refused.response.status_code, "refused: the session is gone"))
            break  # the verdict came between two connections: the handshake says the session is gone
    code, reason = closes[-1]
    ended_s = time.monotonic() - killed
    # Connected at the verdict: 4000 and the reason. Between two connections: the next is refused (404).
    assert (code == 4000 and reason.startswith("session ended: controller_dead")) or code == 404, closes
    _gone_within(gw, session["id"], timeout_s=10.0)
    assert _manifest(gw, session["id"])["end_reason"] == "controller_dead"
    print(f"controller killed again and again: session ended {ended_s:.1f} s after the first kill ({reason})")
    replacement = _create(gw)  # the slot is free
    with gw.client() as c:
        assert c.delete(f"/v1/sessions/{replacement['id']}").status_code == 204


def test_a_dead_sandbox_without_a_websocket_is_found_by_the_reaper(gw: RunningGateway, runtime: DockerHarness) -> None:
    session = _create(gw)
    killed = time.monotonic()
    runtime.kill(session["container"])
    gone_s = _gone_within(gw, session["id"], timeout_s=2.0)
    with gw.client() as c:
        # Before: 502 until the session timed out. Now the session is over, and says so.
        reply = c.post(f"/v1/sessions/{session['id']}/actions", json={"action": {"type": "cursor_position"}})
    assert reply.status_code == 404
    print(f"reaper: session gone {(time.monotonic() - killed) * 1000:.0f} ms after the kill ({gone_s:.2f} s polled)")
    _create(gw)  # the slot is free
    with gw.client() as c:
        for s in c.get("/v1/sessions").json():
            c.delete(f"/v1/sessions/{s['id']}")


def test_start_removes_orphan_networks_and_stale_host_guard_rules(tmp_path: Path, runtime: DockerHarness) -> None:
    instance = f"reconcile-{time.time_ns()}"
    labels = {GATEWAY_LABEL: instance, "corral.session": "ses_orphan"}
    orphan = runtime.create_session_network(f"orphan-{os.getpid()}", labels)  # corral-net-orphan-<pid>
    orphan_interface = runtime.interface(orphan.name)
    assert hostguard.install(orphan_interface)  # guarded already by the runtime: the rules are there once
    others = runtime.create_session_network(
        f"others-{os.getpid()}", {GATEWAY_LABEL: f"another-{instance}", "corral.session": "ses_x"}
    )
    stale = f"br-{secrets.token_hex(6)}"  # a bridge that is gone (no such interface), its rules left
    assert not Path("/sys/class/net", stale).exists()
    assert hostguard.install(stale)
    try:
        assert {orphan_interface, stale} <= hostguard.guarded_interfaces()
        with gateway(tmp_path, instance):
            assert runtime.session_network(orphan.name) is None
            guarded = hostguard.guarded_interfaces()
            assert orphan_interface not in guarded and stale not in guarded
            assert runtime.session_network(others.name) is not None  # another gateway's stays
    finally:
        runtime.remove_all({GATEWAY_LABEL: instance})
        runtime.remove_network(others.name)
        for interface in (orphan_interface, stale):
            hostguard.remove(interface)


def test_stopping_while_the_pool_refills_leaves_nothing(tmp_path: Path, runtime: DockerHarness) -> None:
    instance = f"refill-{time.time_ns()}"
    try:
        # Stopped at different points of the refill: network and CA, proxy and sandbox starting, ready.
        for delay_s in (0.0, 0.4, 0.8, 1.5, 3.0):
            with gateway(tmp_path, instance, pool_size=1) as g, g.client(None) as c:
                deadline = time.monotonic() + delay_s
                while time.monotonic() < deadline:
                    c.get("/v1/health")
                    time.sleep(0.05)
                counts = c.get("/v1/health").json()["sessions"]
            left = runtime.container_states({GATEWAY_LABEL: instance})
            networks = [n.name for n in runtime.session_networks({GATEWAY_LABEL: instance})]
            assert (left, networks) == ({}, []), f"stopped after {delay_s} s ({counts}): left {left}, {networks}"
    finally:
        runtime.remove_all({GATEWAY_LABEL: instance})


def _grounds(runtime: DockerHarness, data_dir: Path, instance: str, count: int, timeout_s: float = 30) -> set[str]:
    """The names of the instance's session networks made ahead and not taken, once there are ``count``
    (the gateway's markers say which are not taken: a network cannot be relabelled once claimed)."""
    deadline = time.monotonic() + timeout_s
    while True:
        marked = {f"corral-net-{m.name}" for m in (data_dir / "egress" / ".grounds").glob("ses_*")}
        names = {n.name for n in runtime.session_networks({GATEWAY_LABEL: instance})} & marked
        if len(names) >= count:
            return names
        assert time.monotonic() < deadline, f"{len(names)} grounds made ahead, not {count}"
        time.sleep(0.05)


def test_a_cold_start_takes_a_ground_made_ahead_and_a_restart_clears_what_a_kill_left(
    tmp_path: Path, runtime: DockerHarness
) -> None:
    instance = f"grounds-{time.time_ns()}"
    try:
        with gateway(tmp_path, instance, ground_pool_size=2) as g, g.client() as c:
            made = _grounds(runtime, tmp_path, instance, 2)
            # Their proxies run before anyone asks for a session (CORRAL_GROUND_PROXIES, default on).
            deadline = time.monotonic() + 30
            while True:
                states = runtime.container_states({GATEWAY_LABEL: instance})
                running = {name for name, state in states.items() if state == "running"}
                if {name.replace("corral-net-", "corral-egress-") for name in made} <= running:
                    break
                assert time.monotonic() < deadline, f"the grounds' proxies do not run: {running}"
                time.sleep(0.05)
            created = c.post("/v1/sessions", json={"allow": ["example.test"]}).json()
            assert f"corral-net-{created['id']}" in made  # its network was made before it was asked for
            # Its proxy started with nothing allowed; the session's policy was set on it (and acknowledged)
            # before the token came back.
            records = [json.loads(line) for line in (tmp_path / "egress" / created["id"] / "audit.jsonl").open()]
            assert [(r["event"], r.get("allow")) for r in records[:2]] == [("proxy", []), ("policy", ["example.test"])]
            assert records[1]["actor"].startswith("api-key:") and records[1]["generation"] == 1
            with _open_ws(created):
                pass  # the session works on it
            assert c.delete(f"/v1/sessions/{created['id']}").status_code == 204
            _grounds(runtime, tmp_path, instance, 2)  # refilled after the start
        # Stopped: nothing of the grounds is left, neither networks nor state.
        assert [n.name for n in runtime.session_networks({GATEWAY_LABEL: instance})] == []
        assert list((tmp_path / "egress" / ".grounds").glob("ses_*")) == []
        # A gateway killed while holding grounds (its stop never ran) leaves them: the next start clears them.
        killed = runtime.create_session_network("ses_killedground", {GATEWAY_LABEL: instance})
        state = tmp_path / "egress" / "ses_killedground"
        state.mkdir(parents=True)
        (tmp_path / "egress" / ".grounds" / "ses_killedground").write_text(instance)
        with gateway(tmp_path, instance, ground_pool_size=1):
            _grounds(runtime, tmp_path, instance, 1)
            assert runtime.session_network(killed.name) is None and not state.exists()
    finally:
        runtime.remove_all({GATEWAY_LABEL: instance})


def _raw_post(port: int, path: str, headers: dict[str, str], body: bytes = b"") -> tuple[int, float]:
    """Send a request's head (and ``body``, maybe just its start) and time the status line."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        started = time.monotonic()
        sock.sendall(f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\n{head}\r\n".encode() + body)
        status = sock.recv(64).split(b" ")[1]
        return int(status), time.monotonic() - started


def test_credentials_are_checked_before_a_body_is_read(gw: RunningGateway) -> None:
    announced = {"content-type": "application/json", "content-length": str(200 << 20)}
    # 200 MiB announced, 1 MiB sent: the refusal comes without waiting for (or parsing) the rest.
    status, took_s = _raw_post(gw.settings.port, "/v1/sessions", announced, b"[" * (1 << 20))
    assert status == 401 and took_s < 1.0, took_s
    status, took_s = _raw_post(gw.settings.port, "/v1/sessions", {**announced, "authorization": f"Bearer {KEY_A}"})
    assert status == 413 and took_s < 1.0, took_s
    with gw.client() as c:
        over = c.post("/v1/sessions", content=b" " * ((gw.settings.max_body_kb << 10) + 1))
    assert over.status_code == 413 and over.json()["error"]["code"] == "message_too_large"
