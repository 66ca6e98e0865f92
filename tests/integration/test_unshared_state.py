"""No shared host directory: real proxies that keep their state on a tmpfs of their own (the Docker
driver's tests-only ``shares_proxy_state=False``, the swarm's way on one host), seeded from the
gateway's state directory (corral.proxy.seed) and mirrored back into it over the control channel
(corral.gateway.egress.mirror). Egress is enforced from the seeded policy, every reader of the state
directory (traffic, anchors, recorded responses) sees the proxy's records, and what a process of the
proxy's uid writes into its own log never reaches the gateway's copy."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from corral.proxy import flowfile
from corral.proxy.audit import parse_anchors, verify, verify_anchored
from corral.runtime.docker import DockerRuntime, proxy_name

from .conftest import wait_for
from .dockerutil import DockerHarness
from .egress_fixtures import Upstream, gateway_to, start_upstream
from .gateway_fixtures import RunningGateway
from .test_egress import probe, traffic

pytestmark = pytest.mark.usefixtures("desktop_image", "egress_image")


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory, runtime: DockerHarness) -> Iterator[Upstream]:
    network = f"corral-unshared-it-{os.getpid()}"
    yield from start_upstream(runtime, tmp_path_factory.mktemp("upstream"), network, name="corral-upstream-unshared")


@pytest.fixture(scope="module")
def unshared() -> DockerRuntime:
    return DockerRuntime(shares_proxy_state=False)


@pytest.fixture(scope="module")
def gw(
    tmp_path_factory: pytest.TempPathFactory, upstream: Upstream, runtime: DockerHarness, unshared: DockerRuntime
) -> Iterator[RunningGateway]:
    instance = f"unshared-{os.getpid()}"
    with gateway_to(upstream, tmp_path_factory.mktemp("unshared-gw"), instance, runtime=unshared) as running:
        yield running
    runtime.remove_all({"corral.gateway": instance})


def _in_proxy(runtime: DockerHarness, session_id: str, code: str, uid: int) -> tuple[int, str]:
    """Python run in the session's proxy as ``uid`` (the proxy's own: what a process there could do)."""
    container = runtime.client.containers.get(proxy_name(session_id))
    code_, out = container.exec_run(["python", "-c", code], user=f"{uid}:{uid}")
    return int(code_), out.decode(errors="replace")


def test_a_proxy_without_the_gateways_directory_starts_from_its_seed_and_its_audit_reaches_the_gateway(
    gw: RunningGateway, runtime: DockerHarness, unshared: DockerRuntime, upstream: Upstream
) -> None:
    with gw.client() as c:
        box = c.post("/v1/sessions", json={"allow": ["allowed.test"]}).json()
        sid = box["id"]
        state = gw.settings.data_dir / "egress" / sid
        mounts = runtime.client.containers.get(proxy_name(sid)).attrs["Mounts"]
        assert [(m["Destination"], m["RW"]) for m in mounts] == [("/run/corral-seed", False)]
        assert str(state) not in {m["Source"] for m in mounts}  # the gateway's own directory is not the proxy's
        # The seeded policy is the one in force; the other host is refused.
        allowed = probe(runtime, box["container"], "proxied", tls=True, connect="allowed.test", path="/json")
        refused = probe(runtime, box["container"], "proxied", tls=True, connect="other.test", path="/")
        assert (allowed["status"], refused["status"]) == (200, 403), (allowed, refused)
        # Read through the API: the copy is brought up to date first.
        events = {(r["event"], r.get("host")) for r in traffic(gw, sid)}
        assert {("request", "allowed.test"), ("block", "other.test")} <= events
        assert c.patch(f"/v1/sessions/{sid}", json={"allow": ["allowed.test", "other.test"]}).status_code == 200
        policy = [r for r in traffic(gw, sid, event="policy") if r.get("actor") != "gateway:start"]
        assert policy and policy[-1]["allow"] == ["allowed.test", "other.test"]
        code, own = _in_proxy(
            runtime,
            sid,
            "import sys; sys.stdout.write(open('/var/lib/corral-egress/audit.jsonl').read())",
            unshared.proxy_uid,
        )
        assert code == 0 and (state / "audit.jsonl").read_text() == own  # the copy is the proxy's log
        assert c.delete(f"/v1/sessions/{sid}").status_code == 204
        served = c.get(f"/v1/sessions/{sid}/traffic.anchors")
    anchors = parse_anchors(served.content.splitlines(), (gw.settings.data_dir / "audit-anchors" / "key").read_bytes())
    assert anchors[-1]["reason"] == "end"
    whole = verify_anchored(state / "audit.jsonl", anchors)
    assert whole.status == "intact" and whole.proven == anchors[-1]["seq"], whole.message
    # The recorded answers, mirrored before the proxy went, moved into the session's recording.
    bundled = gw.settings.data_dir / "recordings" / sid / "responses.mitm"
    assert wait_for(bundled.exists, 30), "the mirrored responses never reached the recording"
    responses = bundled.read_bytes()
    checked = flowfile.check(responses)
    assert checked.complete == len(responses) and checked.flows >= 1
    assert not state.with_name(state.name + ".seed").exists()  # the seed went with the proxy


def test_what_the_proxys_uid_writes_into_its_own_log_never_reaches_the_gateways_copy(
    gw: RunningGateway, runtime: DockerHarness, unshared: DockerRuntime
) -> None:
    with gw.client() as c:
        box = c.post("/v1/sessions", json={"allow": ["allowed.test"]}).json()
        sid = box["id"]
        state = gw.settings.data_dir / "egress" / sid
        forge = f"""
import hashlib, json
path = "/var/lib/corral-egress/audit.jsonl"
last = json.loads(open(path, "rb").read().splitlines()[-1])
body = {{"seq": last["seq"] + 1, "event": "request", "host": "forged.test", "session": "{sid}", "prev": last["hash"]}}
body["hash"] = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
open(path, "a").write(json.dumps(body) + "\\n")
open(path, "a").write("not a record\\n")
try:
    open("{state}/audit.jsonl", "a")
    print("REACHED")
except OSError as exc:
    print("UNREACHABLE", type(exc).__name__)
"""
        code, out = _in_proxy(runtime, sid, forge, unshared.proxy_uid)
        assert code == 0 and "UNREACHABLE" in out, out
        allowed = probe(runtime, box["container"], "proxied", tls=True, connect="allowed.test", path="/json")
        assert allowed["status"] == 200, allowed
        records = traffic(gw, sid)
        assert "forged.test" not in json.dumps(records)
        assert any(r["event"] == "request" and r.get("host") == "allowed.test" for r in records)
        assert c.delete(f"/v1/sessions/{sid}").status_code == 204
    assert verify(state / "audit.jsonl").ok
    assert b"forged.test" not in (state / "audit.jsonl").read_bytes()


def test_a_restarted_proxy_starts_again_from_the_gateways_copy_and_its_chain_goes_on(
    gw: RunningGateway, runtime: DockerHarness, unshared: DockerRuntime
) -> None:
    with gw.client() as c:
        box = c.post("/v1/sessions", json={"allow": ["allowed.test"]}).json()
        sid = box["id"]
        state = gw.settings.data_dir / "egress" / sid
        assert (
            probe(runtime, box["container"], "proxied", tls=True, connect="allowed.test", path="/json")["status"] == 200
        )
        before = traffic(gw, sid)
        runtime.client.containers.get(proxy_name(sid)).kill()  # its tmpfs goes with it
        # The reaper restarts it (re-seeded from the copy); the chain carries on from the copy's head.

        def answered() -> dict[str, Any] | None:
            result = probe(
                runtime, box["container"], "proxied", tls=True, connect="allowed.test", path="/json", timeout=3
            )
            return result if result["status"] == 200 else None

        assert wait_for(answered, 60)
        after = traffic(gw, sid)
        assert after[: len(before)] == before and len(after) > len(before)
        assert c.delete(f"/v1/sessions/{sid}").status_code == 204
    assert verify(state / "audit.jsonl").ok
