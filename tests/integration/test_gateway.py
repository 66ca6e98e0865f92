"""The control plane end to end: the real gateway, real sandboxes, the SDK."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from corral import AsyncSandbox, Sandbox
from corral.contracts import auth
from corral.runtime import SandboxSpec
from corral.runtime.docker import agent_tmpfs_mib

from .conftest import html_url
from .dockerutil import DockerHarness
from .gateway_fixtures import KEY_A, KEY_B, RunningGateway, gateway

pytestmark = pytest.mark.usefixtures("desktop_image")

# The title says how far input got when a test fails: "ready" (no click arrived), "clicked" (the
# click, but no key), else what was typed.
INPUT_JS = (
    "const i = document.getElementById('i'); i.addEventListener('input', () => document.title = i.value);"
    "addEventListener('mousedown', () => { if (!i.value) document.title = 'clicked'; }, true);"
)
# The input fills the page, so a click anywhere below the toolbar focuses it.
INPUT_PAGE = html_url("<input id=i style='position:fixed;inset:0;width:100vw;height:100vh'>", INPUT_JS)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, runtime: DockerHarness) -> Iterator[RunningGateway]:
    instance = f"it-{time.time_ns()}"
    with gateway(tmp_path_factory.mktemp("gw"), instance, pool_size=1) as running:
        yield running
    runtime.remove_all({"corral.gateway": instance})  # sandboxes, proxies, session networks


def _wait_title(sb: Sandbox, expected: str, timeout_s: float = 5) -> str:
    deadline = time.monotonic() + timeout_s
    while (title := sb.page_info().title) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return str(title)


def test_create_act_screenshot_delete_with_the_sdk(gw: RunningGateway, runtime: DockerHarness) -> None:
    with Sandbox.create(allow=["example.test"], url=gw.url, api_key=KEY_A, labels={"suite": "it"}) as sb:
        assert sb.info.allow == ["example.test"] and sb.info.labels == {"suite": "it"}
        sb.navigate(INPUT_PAGE)
        sb.click(640, 500, screenshot=True, wait_for="stable")
        sb.type("through the gateway")
        assert _wait_title(sb, "through the gateway") == "through the gateway"
        png = sb.screenshot()
        assert png.startswith(b"\x89PNG")
        content = sb.run_anthropic({"action": "screenshot"})
        assert content[0]["type"] == "image"
        output = sb.run_openai([{"type": "move", "x": 10, "y": 10}, {"type": "screenshot"}])
        assert output["type"] == "computer_screenshot"
        session_id = sb.id
        with gw.client() as c:
            assert c.get(f"/v1/sessions/{session_id}").json()["id"] == session_id
    with gw.client() as c:
        assert c.get(f"/v1/sessions/{session_id}").status_code == 404
    assert runtime.find(sb.info.container) is None


def test_async_sdk(gw: RunningGateway) -> None:
    async def scenario() -> str:
        async with await AsyncSandbox.create(url=gw.url, api_key=KEY_A) as sb:
            await sb.navigate(INPUT_PAGE)
            await sb.click(640, 500, screenshot=True, wait_for="stable")
            await sb.type("async")
            for _ in range(100):
                if (await sb.page_info()).title == "async":
                    break
                await asyncio.sleep(0.05)
            return str((await sb.page_info()).title)

    assert asyncio.run(scenario()) == "async"


def test_http_action_and_metrics(gw: RunningGateway) -> None:
    with gw.client() as c:
        created = c.post("/v1/sessions", json={}).json()
        reply = c.post(f"/v1/sessions/{created['id']}/actions", json={"action": {"type": "cursor_position"}})
        assert reply.status_code == 200 and reply.json()["ok"] is True
        bad = c.post(f"/v1/sessions/{created['id']}/actions", content=b"{nope")
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"
        text = c.get("/metrics").text
        assert 'corral_sessions{state="ready"}' in text
        assert "corral_session_claim_seconds_bucket" in text
        assert 'corral_action_seconds_count{transport="http"}' in text
        assert 'corral_errors_total{code="invalid_json"}' in text
        assert c.delete(f"/v1/sessions/{created['id']}").status_code == 204


def test_auth_failures(gw: RunningGateway) -> None:
    with gw.client(KEY_A) as a, gw.client(KEY_B) as b, gw.client(None) as anon, gw.client("wrong") as wrong:
        assert anon.post("/v1/sessions", json={}).status_code == 401
        assert anon.post("/v1/sessions", json={}).json()["error"]["code"] == "unauthorized"
        assert wrong.get("/v1/sessions").status_code == 401
        mine = a.post("/v1/sessions", json={}).json()
        theirs = b.post("/v1/sessions", json={}).json()
        try:
            assert b.get(f"/v1/sessions/{mine['id']}").status_code == 403
            assert b.delete(f"/v1/sessions/{mine['id']}").status_code == 403
            assert [s["id"] for s in b.get("/v1/sessions").json()] == [theirs["id"]]
            with gw.client(mine["token"]) as token:
                assert token.get(f"/v1/sessions/{mine['id']}").status_code == 200
                assert token.get(f"/v1/sessions/{theirs['id']}").status_code == 403
                assert token.post("/v1/sessions", json={}).status_code == 401  # a token is no API key
            for bad_token, status in (("nope", 4401), (theirs["token"], 4403)):
                with (
                    connect(f"{mine['ws_url']}?token={bad_token}", open_timeout=10) as ws,
                    pytest.raises(ConnectionClosed) as closed,
                ):
                    ws.recv(timeout=5)
                assert closed.value.rcvd is not None and closed.value.rcvd.code == status
            with connect(f"{mine['ws_url']}?token={mine['token']}", compression=None) as ws:
                ws.send(json.dumps({"id": 1, "action": {"type": "cursor_position"}}))
                assert json.loads(ws.recv(timeout=10))["ok"] is True
        finally:
            a.delete(f"/v1/sessions/{mine['id']}")
            b.delete(f"/v1/sessions/{theirs['id']}")


@pytest.mark.parametrize("depth", [1000, 100_000])
def test_deeply_nested_json_on_the_agent_s_websocket_gets_invalid_json_and_the_relay_survives(
    gw: RunningGateway, depth: int
) -> None:
    """The relay reads each request's id (for its round-trip metric) with Python's json, which raised
    RecursionError past ~1000 levels: the relay died and the agent's connection with it."""
    with gw.client(KEY_A) as a:
        session = a.post("/v1/sessions", json={}).json()
        try:
            with connect(f"{session['ws_url']}?token={session['token']}", compression=None) as ws:
                ws.send('{"id": 7, "x": ' + "[" * depth + "]" * depth + "}")
                refused = json.loads(ws.recv(timeout=20))
                assert refused["ok"] is False and refused["error"]["code"] == "invalid_json", refused
                ws.send(json.dumps({"id": 8, "action": {"type": "cursor_position"}}))
                after = json.loads(ws.recv(timeout=20))
                assert after["ok"] is True and after["id"] == 8, after
        finally:
            a.delete(f"/v1/sessions/{session['id']}")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"colour": "red"}, "colour"),
        ({"viewport": {"width": 10, "height": 800}}, "viewport.width"),
        ({"timeout_s": "soon"}, "timeout_s"),
        ({"allow": ["bad host!"]}, "allow.0"),
        ({"timeout_s": 10**9}, "timeout_s"),
    ],
)
def test_bad_session_bodies(gw: RunningGateway, body: dict[str, object], field: str) -> None:
    with gw.client() as c:
        reply = c.post("/v1/sessions", json=body)
        assert reply.status_code == 422
        assert reply.json()["error"]["code"] == "invalid_request"
        assert reply.json()["error"]["field"] == field
        assert (
            c.post("/v1/sessions", content=b"not json", headers={"content-type": "application/json"}).status_code == 422
        )


def test_pool_claim_and_refill(gw: RunningGateway) -> None:
    gw.wait_pool(1)
    with gw.client() as c:
        started = time.monotonic()
        created = c.post("/v1/sessions", json={}).json()
        claim_s = time.monotonic() - started
        assert created["from_pool"] is True
        assert claim_s < 2.0  # a claim is a hand-over, not a start (the budget lives in bench/)
        gw.wait_pool(1)  # refilled in the background
        custom = c.post("/v1/sessions", json={"viewport": {"width": 1024, "height": 768}}).json()
        assert custom["from_pool"] is False
        with Sandbox.attach(custom["id"], custom["token"], url=gw.url) as sb:
            assert sb.screenshot("jpeg")[:3] == b"\xff\xd8\xff"
            shot = sb.act({"type": "screenshot"})["screenshot"]
            assert (shot["width"], shot["height"]) == (1024, 768)
        c.delete(f"/v1/sessions/{created['id']}")


def test_wall_clock_and_idle_timeouts_are_enforced(gw: RunningGateway, runtime: DockerHarness) -> None:
    with gw.client() as c:
        idle = c.post("/v1/sessions", json={"idle_timeout_s": 3, "timeout_s": 600}).json()
        short = c.post("/v1/sessions", json={"timeout_s": 4}).json()
        # Opened at once, before anything slow: the close must come from the timeout, not a refusal.
        with connect(f"{short['ws_url']}?token={short['token']}", compression=None) as ws:
            busy = c.post("/v1/sessions", json={"idle_timeout_s": 4, "timeout_s": 600}).json()

            def gone(session: dict[str, Any]) -> bool:
                return c.get(f"/v1/sessions/{session['id']}").status_code == 404

            # This one kept active past everyone's limit (7 s at least), until the other two have ended:
            # an ended session is gone once its teardown is done (its recording drained, its sandbox
            # and proxy removed), which takes seconds of its own on a loaded host.
            started, deadline = time.monotonic(), time.monotonic() + 60
            while time.monotonic() < started + 7 or not (gone(short) and gone(idle)):
                assert time.monotonic() < deadline, "the expired sessions did not end"
                c.post(f"/v1/sessions/{busy['id']}/actions", json={"action": {"type": "cursor_position"}})
                time.sleep(0.5)
            assert c.get(f"/v1/sessions/{busy['id']}").status_code == 200
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=5)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4000
        assert "timeout" in closed.value.rcvd.reason
        # The expired sessions' containers are gone, not just forgotten.
        assert runtime.find(short["container"]) is None
        assert runtime.find(idle["container"]) is None
        assert runtime.find(busy["container"]) is not None
        c.delete(f"/v1/sessions/{busy['id']}")


def test_capacity_is_answered_with_429(tmp_path: Path, runtime: DockerHarness) -> None:
    instance = f"cap-{time.time_ns()}"
    try:
        with (
            gateway(tmp_path, instance, max_sessions=3, max_sessions_per_key=2) as g,
            g.client(KEY_A) as a,
            g.client(KEY_B) as b,
        ):
            assert a.post("/v1/sessions", json={}).status_code == 201
            assert a.post("/v1/sessions", json={}).status_code == 201
            refused = a.post("/v1/sessions", json={})
            assert refused.status_code == 429 and "this API key" in refused.json()["error"]["message"]
            assert b.post("/v1/sessions", json={}).status_code == 201
            full = b.post("/v1/sessions", json={})
            assert full.status_code == 429 and "CORRAL_MAX_SESSIONS" in full.json()["error"]["message"]
    finally:
        runtime.remove_all({"corral.gateway": instance})


def test_restart_finds_live_sessions_and_reaps_orphans(tmp_path: Path, runtime: DockerHarness) -> None:
    instance = f"restart-{time.time_ns()}"
    try:
        with gateway(tmp_path, instance) as first, first.client() as c:
            kept = c.post("/v1/sessions", json={}).json()
            sb = Sandbox.attach(kept["id"], kept["token"], url=first.url)
            sb.navigate(INPUT_PAGE)
            sb.close()  # the session lives on
            network = first.settings.network
        # A sandbox of this gateway with no session record: an orphan from a crash.
        from corral.runtime import SandboxSpec

        orphan = runtime.start_sandbox(
            SandboxSpec(
                name=f"corral-orphan-{instance}",
                network=network,
                labels={"corral.gateway": instance, "corral.kind": "session"},
            )
        )
        with gateway(tmp_path, instance, network=network) as second, second.client() as c:
            listed = [s["id"] for s in c.get("/v1/sessions").json()]
            assert listed == [kept["id"]]
            session = c.get(f"/v1/sessions/{kept['id']}").json()
            with connect(session["ws_url"] + f"?token={kept['token']}", compression=None) as ws:
                ws.send(json.dumps({"id": 1, "action": {"type": "page_info"}}))
                reply = json.loads(ws.recv(timeout=10))
            assert reply["ok"] and reply["result"]["url"] == INPUT_PAGE  # the same browser, not a new one
            alive = {info.id for info in runtime.list_sandboxes({"corral.gateway": instance})}
            assert orphan.id not in alive
            assert c.delete(f"/v1/sessions/{kept['id']}").status_code == 204
    finally:
        runtime.remove_all({"corral.gateway": instance})


def test_eight_sessions_at_once_are_isolated(gw: RunningGateway) -> None:
    def one(index: int) -> tuple[int, str, str]:
        with Sandbox.create(url=gw.url, api_key=KEY_A) as sb:
            sb.navigate(INPUT_PAGE)
            sb.click(640, 500, screenshot=True, wait_for="stable")
            text = f"session-{index}-only"
            sb.type(text)
            seen = _wait_title(sb, text)
            time.sleep(1.0)  # let every other session type too before looking again
            return index, seen, str(sb.page_info().title)

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(one, range(8)))
    for index, seen, later in results:
        assert seen == later == f"session-{index}-only"


PROBE = """
import socket, sys
s = socket.socket(); s.settimeout(2)
try:
    s.connect((sys.argv[1], int(sys.argv[2]))); print("open")
except socket.timeout:
    print("timeout")
except OSError as e:
    print("refused" if e.errno == 111 else f"error {e.errno}")
"""


def test_a_sandbox_reaches_neither_the_host_nor_other_sessions(gw: RunningGateway, runtime: DockerHarness) -> None:
    import socket

    listener = socket.socket()
    listener.bind(("0.0.0.0", 0))  # a host service on every address, the case Docker leaves open
    listener.listen(8)
    host_port = listener.getsockname()[1]
    try:
        with gw.client() as c:
            assert c.get("/v1/health").json()["host_guard"] is True
            a = c.post("/v1/sessions", json={}).json()
            b = c.post("/v1/sessions", json={}).json()
            b_ip = runtime.find(b["container"])
            assert b_ip is not None
            _, gateway_ip = runtime.bridge(gw.settings.network)

            def probe(host: str, port: int) -> str:
                code, out = runtime.exec(a["container"], ["python", "-c", PROBE, host, str(port)])
                assert code == 0, out
                return out.strip()

            assert probe("127.0.0.1", 8765) == "open"  # the probe itself works: its own controller
            assert probe(b_ip.host, 8765) != "open"  # another session
            assert probe(gateway_ip, gw.settings.port) != "open"  # the gateway's API
            assert probe(gateway_ip, host_port) != "open"  # any host service
            code, _ = runtime.exec(a["container"], ["test", "-e", "/var/run/docker.sock"])
            assert code != 0  # no Docker socket inside
            c.delete(f"/v1/sessions/{a['id']}")
            c.delete(f"/v1/sessions/{b['id']}")
    finally:
        listener.close()


def test_cli_sessions_do_and_screenshot(gw: RunningGateway, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from corral.cli import app

    runner = CliRunner()
    env = {"CORRAL_URL": gw.url, "CORRAL_API_KEY": KEY_A}
    created = runner.invoke(
        app, ["session", "create", "--json", "--label", "via=cli", "--allow", "example.test"], env=env
    )
    assert created.exit_code == 0, created.output
    session = json.loads(created.stdout)
    assert session["labels"] == {"via": "cli"} and session["allow"] == ["example.test"]
    listed = runner.invoke(app, ["session", "ls", "--json"], env=env)
    assert session["id"] in [s["id"] for s in json.loads(listed.stdout)]
    table = runner.invoke(app, ["session", "ls"], env=env)
    assert session["id"] in table.stdout
    done = runner.invoke(app, ["do", session["id"], '{"type": "cursor_position"}'], env=env)
    assert done.exit_code == 0 and json.loads(done.stdout)["result"] == {"x": 640, "y": 400}
    bad = runner.invoke(app, ["do", session["id"], '{"type": "teleport"}'], env=env)
    assert bad.exit_code == 1 and json.loads(bad.stdout)["error"]["code"] == "unknown_action"
    shot = tmp_path / "shot.png"
    assert runner.invoke(app, ["screenshot", session["id"], "-o", str(shot)], env=env).exit_code == 0
    assert shot.read_bytes().startswith(b"\x89PNG")
    assert runner.invoke(app, ["session", "rm", session["id"]], env=env).exit_code == 0
    gone = runner.invoke(app, ["session", "show", session["id"]], env=env)
    assert gone.exit_code == 1 and "not_found" in gone.output


def test_limits_and_hardening_are_applied(gw: RunningGateway, runtime: DockerHarness) -> None:
    import docker

    with gw.client() as c:
        created = c.post("/v1/sessions", json={"resources": {"cpus": 1.5, "memory_mb": 1024, "disk_mb": 512}}).json()
        try:
            attrs = docker.from_env().containers.get(created["container"]).attrs
            host = attrs["HostConfig"]
            assert host["NanoCpus"] == 1_500_000_000
            assert host["Memory"] == host["MemorySwap"] == 1024 * 1024 * 1024  # swap equal: none extra
            assert host["PidsLimit"] == gw.settings.default_pids
            assert host["ShmSize"] == min(gw.settings.default_shm_mb, 256) * 1024 * 1024
            # The agent's tmpfs mounts share the memory less its headroom (corral.runtime.docker).
            sizes = agent_tmpfs_mib(
                SandboxSpec(memory="1024m", tmp_size="512m", workspace_size=gw.settings.workspace_size)
            )
            assert f"size={sizes['/tmp']}m," in host["Tmpfs"]["/tmp"] and sizes["/tmp"] < 512
            assert f"size={sizes['/workspace']}m," in host["Tmpfs"]["/workspace"]
            assert host["ReadonlyRootfs"] is True
            # Only what the boot stage needs to set the firewall, hand the secret to corral and drop; every
            # process then runs with all-zero capability sets but the supervisor's (test_egress checks each).
            assert host["CapDrop"] == ["ALL"]
            assert sorted(host["CapAdd"]) == ["CHOWN", "NET_ADMIN", "NET_RAW", "SETGID", "SETPCAP", "SETUID"]
            # No secret in the container's environment, which every `docker exec` inherits: the one name
            # with SECRET in it is boot's flag that the controller's secret is a mounted file (0435).
            env = [e for e in attrs["Config"]["Env"] if e != "CORRAL_SECRET_GIVEN=1"]
            assert not [e for e in env if "TOKEN" in e or "SECRET" in e], attrs["Config"]["Env"]
            assert str(auth.SECRET_FILE) in {m["Destination"] for m in attrs["Mounts"]}
            assert "no-new-privileges" in host["SecurityOpt"]
            assert host["Privileged"] is False
            assert not host.get("PortBindings")  # nothing published on the host
            assert not any("docker.sock" in (m.get("Source") or "") for m in attrs["Mounts"])
            assert attrs["Config"]["User"] == "root"  # the boot stage; it becomes corral before anything else runs
            _, out = runtime.exec(created["container"], ["ps", "-o", "user=", "-p", "1"])
            assert out.strip() == "corral"
            # Capped, not trusted: a request above the gateway's maximum gets the maximum.
            big = c.post("/v1/sessions", json={"resources": {"cpus": 64, "memory_mb": 65536}}).json()
            big_host = docker.from_env().containers.get(big["container"]).attrs["HostConfig"]
            assert big_host["NanoCpus"] == int(gw.settings.max_cpus * 1e9)
            assert big_host["Memory"] == gw.settings.max_memory_mb * 1024 * 1024
            c.delete(f"/v1/sessions/{big['id']}")
        finally:
            c.delete(f"/v1/sessions/{created['id']}")
