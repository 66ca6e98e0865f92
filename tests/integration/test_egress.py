"""Egress end to end: real gateway, real sandbox and Chromium, real mitmproxy sidecar, a fake upstream
container. All traffic stays on this machine (the test's own Docker networks, names under .test)."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.proxy.audit import verify
from corral.sdk import Sandbox

from .conftest import wait_for
from .dockerutil import DockerHarness
from .egress_fixtures import Upstream, gateway_to, start_upstream
from .gateway_fixtures import KEY_A, KEY_B, RunningGateway, gateway

pytestmark = pytest.mark.usefixtures("desktop_image", "egress_image")

# Run inside the sandbox as its user: what any process there (not only Chromium) can and cannot do.
PROBE = r"""
import json, socket, ssl, sys, http.client
kind, args = sys.argv[1], json.loads(sys.argv[2])
def out(value): print(json.dumps(value)); sys.exit(0)
if kind == "tcp":
    try:
        socket.create_connection((args["host"], args["port"]), timeout=2).close(); out("open")
    except OSError as exc: out(type(exc).__name__)
if kind == "udp":
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(1.5)
    try:
        s.sendto(b"ping", (args["host"], args["port"])); s.recvfrom(100); out("answered")
    except OSError as exc: out(type(exc).__name__)
if kind == "resolve":
    try: out(socket.gethostbyname(args["host"]))
    except OSError as exc: out(type(exc).__name__)
if kind == "proxied":
    # A request through the session's proxy, trusting only the system store (which holds the session CA).
    timeout = args.get("timeout", 10)
    proxy = args.get("proxy", "corral-proxy")
    conn = http.client.HTTPConnection(proxy, 8080, timeout=timeout)
    if args.get("tls"):
        conn = http.client.HTTPSConnection(proxy, 8080, timeout=timeout, context=ssl.create_default_context())
        conn.set_tunnel(args["connect"], args.get("port", 443))
    target = args["path"] if args.get("tls") else "http://" + args["connect"] + args["path"]
    headers = args.get("headers", {})
    try:
        conn.request(args.get("method", "GET"), target, body=args.get("body"), headers=headers)
        r = conn.getresponse(); body = r.read().decode(errors="replace")
        out({"status": r.status, "rule": r.getheader("x-corral-rule"), "body": body[:2000]})
    except (OSError, http.client.HTTPException) as exc:
        out({"status": 0, "error": type(exc).__name__ + ": " + str(exc)})
"""


# Every process of the sandbox: name, uid and its effective, permitted and bounding capability sets.
CAPS = r"""
import json, os
out = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try: lines = open(f"/proc/{pid}/status").read().splitlines()
    except OSError: continue
    fields = dict(line.split(":", 1) for line in lines if ":" in line)
    caps = [fields[k].strip() for k in ("CapEff", "CapPrm", "CapBnd")]
    out.append({"pid": int(pid), "name": fields["Name"].strip(), "uid": fields["Uid"].split()[0], "caps": caps})
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory, runtime: DockerHarness) -> Iterator[Upstream]:
    network = f"corral-egress-it-{os.getpid()}"
    yield from start_upstream(runtime, tmp_path_factory.mktemp("upstream"), network)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, upstream: Upstream) -> Iterator[RunningGateway]:
    with gateway_to(upstream, tmp_path_factory.mktemp("egress-gw"), f"egress-{os.getpid()}") as running:
        yield running


def probe(runtime: DockerHarness, container: str, kind: str, user: str = "corral", **args: Any) -> Any:
    code, out = runtime.exec(container, ["python", "-c", PROBE, kind, json.dumps(args)], user=user)
    assert code == 0, out
    return json.loads(out.strip().splitlines()[-1])


def traffic(gw: RunningGateway, session_id: str, key: str = KEY_A, **params: str) -> list[dict[str, Any]]:
    with gw.client(key) as c:
        response = c.get(f"/v1/sessions/{session_id}/traffic", params=params)
    assert response.status_code == 200, response.text
    return [json.loads(line) for line in response.text.splitlines() if line]


@pytest.fixture(scope="module")
def sb(gw: RunningGateway) -> Iterator[Sandbox]:
    with Sandbox.create(url=gw.url, api_key=KEY_A, allow=["allowed.test", "GET,HEAD api.allowed.test/v1/"]) as box:
        yield box


def _title(sb: Sandbox, until: Any, timeout_s: float = 15.0) -> str:
    def current() -> str:
        title = str(sb.page_info().title)
        return title if until(title) else ""

    return str(wait_for(current, timeout_s) or sb.page_info().title)


def test_the_browser_reaches_an_allowed_host_over_intercepted_tls_and_it_is_logged(
    gw: RunningGateway, sb: Sandbox, upstream: Upstream, runtime: DockerHarness
) -> None:
    reply = sb.act({"type": "navigate", "url": "https://allowed.test/hello?token=abc123"})
    assert _title(sb, lambda t: t.startswith("upstream")) == "upstream allowed.test"
    records = traffic(gw, sb.id, host="allowed.test", event="request")
    page = next(r for r in records if r["url"].startswith("https://allowed.test/hello"))
    assert page["status"] == 200 and page["decision"] == "allow" and page["rule"] == "allowed.test"
    assert page["ip"] == upstream.address and page["sni"] == "allowed.test"
    assert "abc123" not in page["url"]  # query secrets redacted
    assert dict(page["response_headers"])["set-cookie"] == "[redacted]"
    assert page["action"] == reply["action_id"]  # tied to the navigate that caused it


def test_a_disallowed_host_is_refused_before_any_lookup_with_a_page_that_says_why(
    gw: RunningGateway, sb: Sandbox, upstream: Upstream, runtime: DockerHarness
) -> None:
    before = len(upstream.hits(runtime))
    sb.navigate("https://other.test/secret")
    assert _title(sb, lambda t: t.startswith("Blocked")) == "Blocked by Corral: other.test"
    connect = [r for r in traffic(gw, sb.id, host="other.test") if r["event"] == "connect"][-1]
    assert (connect["decision"], connect["rule"], connect["ip"]) == ("deny", "default-deny", None)
    blocks = traffic(gw, sb.id, host="other.test", event="block")
    assert blocks and blocks[-1]["status"] == 403
    assert not [h for h in upstream.hits(runtime)[before:] if h["host"] == "other.test"]


def test_nothing_gets_out_around_the_proxy(
    gw: RunningGateway, sb: Sandbox, upstream: Upstream, runtime: DockerHarness
) -> None:
    box = sb.container
    listener = socket.socket()
    listener.bind(("0.0.0.0", 0))  # a host service on every address: the hole --internal leaves open
    listener.listen(4)
    try:
        with gw.client() as c:
            info = c.get(f"/v1/sessions/{sb.id}").json()
        assert info["egress_mode"] == "enforce"
        session_gateway = probe(runtime, box, "resolve", host="corral-proxy")  # the proxy resolves...
        assert session_gateway.count(".") == 3
        assert probe(runtime, box, "resolve", host="allowed.test") != upstream.address  # ...upstreams do not
        assert probe(runtime, box, "tcp", host=upstream.address, port=80) != "open"  # no direct route
        assert probe(runtime, box, "tcp", host=upstream.address, port=443) != "open"
        before = len(upstream.udp_hits(runtime))
        assert probe(runtime, box, "udp", host=upstream.address, port=5353) != "answered"
        assert len(upstream.udp_hits(runtime)) == before
        network = runtime.session_network(f"corral-net-{sb.id}")
        assert network is not None
        assert probe(runtime, box, "tcp", host=network.gateway, port=listener.getsockname()[1]) != "open"
        assert probe(runtime, box, "tcp", host=network.gateway, port=gw.settings.port) != "open"
        # The firewall holds against the sandbox's own user: no capability is left to change it.
        code, out = runtime.exec(box, ["python", "-c", CAPS])
        assert code == 0, out
        caps = json.loads(out)
        assert {"tini", "chromium", "Xvfb", "openbox", "python"} <= {c["name"] for c in caps}
        # Only pid 1 and the supervisor keep SETUID/SETGID/SETPCAP (to start children with nothing), and
        # the launcher and its shepherds (forks of it) SETUID/SETGID (to act as the agent); NET_ADMIN is
        # gone from every set of every process.
        supervisor, launcher = {"00000000000001c0"}, {"00000000000000c0"}
        kept = [c for c in caps if c["caps"] != ["0000000000000000"] * 3]
        launchers = [c for c in kept if set(c["caps"]) == launcher and c["name"] == "python"]
        launcher_argv = "/opt/corral/bin/python -P -m corral.sandbox.agent.launcher"
        _, forks = runtime.exec(box, ["pgrep", "-f", "-x", launcher_argv], "root")
        assert {str(c["pid"]) for c in launchers} <= set(forks.split()), (launchers, forks)
        others = [c for c in kept if c not in launchers]
        assert [c for c in others if set(c["caps"]) != supervisor or c["name"] not in ("tini", "python")] == [], caps
        assert len(others) <= 2, others
        code, out = runtime.exec(box, ["iptables", "-F"])
        assert code != 0
    finally:
        listener.close()


@pytest.mark.parametrize(
    ("connect", "rule"),
    [
        ("169.254.169.254", "global-deny"),  # cloud metadata, even though the allowlist names it
        ("10.0.0.1", "global-deny"),  # private
        ("127.0.0.1:8081", "global-deny"),  # the proxy's own loopback
        ("corral-proxy:8081", "global-deny"),  # the proxy itself by name
        ("2130706433", "global-deny"),  # 127.0.0.1 as one number
        ("0x7f.1", "global-deny"),  # ... in hex, short form
        ("0177.0.0.1", "global-deny"),  # ... in octal
        ("localhost", "global-deny"),
        ("metadata.google.internal", "global-deny"),
    ],
)
def test_special_addresses_are_refused_in_every_spelling(
    gw: RunningGateway, runtime: DockerHarness, special: Sandbox, connect: str, rule: str
) -> None:
    result = probe(runtime, special.container, "proxied", connect=connect, path="/latest/meta-data")
    assert (result["status"], result["rule"]) == (403, rule), result
    host = connect.rsplit(":", 1)[0] if connect.count(":") == 1 else connect
    assert any(r["event"] == "block" and r["rule"] == rule for r in traffic(gw, special.id)), host


@pytest.fixture(scope="module")
def special(gw: RunningGateway) -> Iterator[Sandbox]:
    allow = [
        "169.254.169.254",
        "10.0.0.1",
        "127.0.0.1",
        "corral-proxy",
        "2130706433",
        "localhost",
        "metadata.google.internal",
        "allowed.test",
    ]
    with Sandbox.create(url=gw.url, api_key=KEY_A, allow=allow) as box:
        yield box


def test_host_header_spoofing_and_doh_are_refused(gw: RunningGateway, sb: Sandbox, runtime: DockerHarness) -> None:
    spoof = probe(
        runtime, sb.container, "proxied", tls=True, connect="allowed.test", path="/x", headers={"Host": "other.test"}
    )
    assert (spoof["status"], spoof["rule"]) == (421, "host-mismatch"), spoof
    doh = probe(
        runtime,
        sb.container,
        "proxied",
        tls=True,
        connect="allowed.test",
        path="/dns-query",
        method="POST",
        body="AAABAAABAAAAAAAAA2Zvbwl0ZXN0AAABAAE=",
        headers={"content-type": "application/dns-message"},
    )
    assert (doh["status"], doh["rule"]) == (403, "doh"), doh
    plain = probe(runtime, sb.container, "proxied", connect="allowed.test", path="/x", headers={"Host": "other.test"})
    assert (plain["status"], plain["rule"]) == (421, "host-mismatch"), plain
    rules = {r["rule"] for r in traffic(gw, sb.id, event="block")}
    assert {"host-mismatch", "doh"} <= rules


def test_methods_and_path_prefixes_hold_and_the_system_store_trusts_the_session_ca(
    gw: RunningGateway, sb: Sandbox, runtime: DockerHarness
) -> None:
    ok = probe(runtime, sb.container, "proxied", tls=True, connect="api.allowed.test", path="/v1/items")
    assert ok["status"] == 200, ok  # verified against the system store, which holds the session CA
    post = probe(
        runtime,
        sb.container,
        "proxied",
        tls=True,
        connect="api.allowed.test",
        path="/v1/items",
        method="POST",
        body="{}",
    )
    assert (post["status"], post["rule"]) == (403, "default-deny"), post
    outside = probe(runtime, sb.container, "proxied", tls=True, connect="api.allowed.test", path="/v2/")
    assert outside["status"] == 403


def test_the_session_ca_is_trusted_and_its_key_never_enters_the_sandbox(
    gw: RunningGateway, sb: Sandbox, runtime: DockerHarness
) -> None:
    nssdb = "sql:/tmp/corral-browser/.pki/nssdb"  # the browser's own store (Chromium runs as browser)
    code, out = runtime.exec(sb.container, ["certutil", "-L", "-d", nssdb], user="browser")
    assert code == 0 and "Corral session CA" in out, out
    code, out = runtime.exec(
        sb.container, ["sh", "-c", "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'; cat /run/corral/*"]
    )
    assert "BEGIN CERTIFICATE" in out and "PRIVATE KEY" not in out
    code, out = runtime.exec(sb.container, ["cat", "/etc/chromium/policies/managed/corral.json"])
    policy = json.loads(out)
    assert policy["ProxySettings"] == {"ProxyMode": "fixed_servers", "ProxyServer": "http://corral-proxy:8080"}
    assert (policy["QuicAllowed"], policy["DnsOverHttpsMode"], policy["WebRtcIPHandling"]) == (
        False,
        "off",
        "disable_non_proxied_udp",
    )
    code, out = runtime.exec(sb.container, ["sh", "-c", "tr '\\0' ' ' < /proc/$(pgrep -o -x chromium)/cmdline"])
    for flag in (
        "--proxy-server=http://corral-proxy:8080",
        "--disable-quic",
        "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
        "DnsOverHttps",
    ):
        assert flag in out


def test_the_allowlist_changes_live_and_the_change_is_logged(gw: RunningGateway, runtime: DockerHarness) -> None:
    with Sandbox.create(url=gw.url, api_key=KEY_A, allow=["allowed.test"]) as box, gw.client() as c:

        def fetch() -> int:
            return int(probe(runtime, box.container, "proxied", tls=True, connect="other.test", path="/")["status"])

        assert fetch() == 403
        patched = c.patch(f"/v1/sessions/{box.id}", json={"allow": ["allowed.test", "other.test"]})
        assert patched.status_code == 200, patched.text
        assert patched.json()["allow"] == ["allowed.test", "other.test"]
        assert fetch() == 200
        bad = c.patch(f"/v1/sessions/{box.id}", json={"allow": ["*.*.test"]})
        assert bad.status_code == 422 and bad.json()["error"]["field"] == "allow.0"
        assert c.patch(f"/v1/sessions/{box.id}", json={"allow": ["allowed.test"]}).status_code == 200
        assert fetch() == 403
        changes = traffic(gw, box.id, event="policy")
        assert [r["allow"] for r in changes[-2:]] == [["allowed.test", "other.test"], ["allowed.test"]]
        assert changes[-1]["actor"] == "api-key:" + changes[-1]["actor"].split(":", 1)[1]
        # Another key may neither change nor read it.
        with gw.client(KEY_B) as other:
            assert other.patch(f"/v1/sessions/{box.id}", json={"allow": []}).status_code == 403
            assert other.get(f"/v1/sessions/{box.id}/traffic").status_code == 403


def test_report_mode_allows_and_logs_what_it_would_refuse(gw: RunningGateway, runtime: DockerHarness) -> None:
    with Sandbox.create(url=gw.url, api_key=KEY_A, allow=["allowed.test"], egress_mode="report") as box:
        result = probe(runtime, box.container, "proxied", tls=True, connect="other.test", path="/json")
        assert result["status"] == 200, result
        reported = [r for r in traffic(gw, box.id, host="other.test") if r["event"] in ("connect", "request")]
        assert reported and all(r["decision"] == "report" for r in reported)
        assert all(r["rule"] == "default-deny" for r in reported)


@pytest.fixture(scope="module")
def report_box(gw: RunningGateway) -> Iterator[Sandbox]:
    with Sandbox.create(url=gw.url, api_key=KEY_A, allow=["allowed.test"], egress_mode="report") as box:
        yield box


# Targets only the proxy refuses before dialling, in report mode as in enforce. The metadata address
# is never dialled by a proxy that holds the global deny; the others are the project's own containers.
REPORT_MODE_TARGETS = ["metadata", "sandbox_address", "proxy_control_port_by_name", "proxy_control_port_by_address"]


@pytest.mark.parametrize("target", REPORT_MODE_TARGETS)
def test_report_mode_never_lifts_the_global_deny(
    gw: RunningGateway, runtime: DockerHarness, report_box: Sandbox, target: str
) -> None:
    box = report_box
    host, port = {
        "metadata": ("169.254.169.254", 80),
        "sandbox_address": (runtime.address_on(box.container, f"corral-net-{box.id}"), 80),
        "proxy_control_port_by_name": ("corral-proxy", 8081),
        "proxy_control_port_by_address": (probe(runtime, box.container, "resolve", host="corral-proxy"), 8081),
    }[target]
    assert host
    plain = probe(runtime, box.container, "proxied", connect=f"{host}:{port}", path="/latest/meta-data/", timeout=5)
    assert (plain["status"], plain.get("rule")) == (403, "global-deny"), plain
    tunnel = probe(runtime, box.container, "proxied", tls=True, connect=host, port=port, path="/", timeout=5)
    # Refused at CONNECT: the tunnel is accepted without dialling, and the request in it gets the page.
    assert (tunnel["status"], tunnel.get("rule")) == (403, "global-deny"), tunnel
    seen = [r for r in traffic(gw, box.id) if r.get("host") == host and r["event"] in ("connect", "block", "request")]
    assert {r["event"] for r in seen} >= {"connect", "block"}, seen
    for record in seen:
        assert (record["decision"], record["rule"], record.get("ip")) == ("deny", "global-deny", None), record
    # Report mode still does what it is for: an unlisted upstream is let through and logged.
    reported = probe(runtime, box.container, "proxied", tls=True, connect="other.test", path="/json")
    assert reported["status"] == 200, reported


def test_a_policy_changed_behind_the_gateways_back_is_set_back(gw: RunningGateway, runtime: DockerHarness) -> None:
    with Sandbox.create(url=gw.url, api_key=KEY_A, allow=["allowed.test"]) as box:

        def fetch() -> int:
            return int(probe(runtime, box.container, "proxied", tls=True, connect="other.test", path="/")["status"])

        assert fetch() == 403
        # Someone with the proxy's uid on the host widens the policy file and restarts the proxy.
        state = gw.settings.data_dir / "egress" / box.id
        (state / "policy.json").write_text(json.dumps({"allow": ["allowed.test", "other.test"], "mode": "report"}))
        runtime.restart(f"corral-egress-{box.id}")

        def reasserted() -> list[dict[str, Any]]:
            return [r for r in traffic(gw, box.id, event="policy") if r["actor"] == "gateway:reassert"]

        records = wait_for(reasserted, timeout_s=30)
        assert records, "the gateway never noticed the foreign policy"
        assert (records[-1]["allow"], records[-1]["mode"]) == (["allowed.test"], "enforce")
        assert (records[-1]["previous_allow"], records[-1]["previous_mode"]) == (
            ["allowed.test", "other.test"],
            "report",
        )
        assert fetch() == 403
        with gw.client() as c:
            assert c.get(f"/v1/sessions/{box.id}").json()["allow"] == ["allowed.test"]


def test_the_gateway_anchors_the_chain_so_a_cut_or_rewritten_log_is_caught(
    gw: RunningGateway, runtime: DockerHarness, tmp_path: Path
) -> None:
    from corral.proxy.audit import AuditLog, parse_anchors, verify_anchored

    with gw.client() as c:
        box = c.post("/v1/sessions", json={"allow": ["allowed.test"]}).json()
        result = probe(runtime, box["container"], "proxied", tls=True, connect="allowed.test", path="/json")
        assert result["status"] == 200, result
        assert c.delete(f"/v1/sessions/{box['id']}").status_code == 204
        raw = c.get(f"/v1/sessions/{box['id']}/traffic").content
        served = c.get(f"/v1/sessions/{box['id']}/traffic.anchors")
    assert served.status_code == 200, served.text
    key = (gw.settings.data_dir / "audit-anchors" / "key").read_bytes()
    anchors = parse_anchors(served.content.splitlines(), key)
    assert anchors[0]["reason"] == "start" and anchors[-1]["reason"] == "end"
    log = tmp_path / "audit.jsonl"
    log.write_bytes(raw)
    whole = verify_anchored(log, anchors)
    assert whole.status == "intact", whole.message
    assert whole.proven == anchors[-1]["seq"] >= 3  # proxy start, connect, request: the end anchor covers them
    log.write_bytes(b"".join(raw.splitlines(keepends=True)[:-1]))  # the last record cut off
    assert verify(log).ok and verify_anchored(log, anchors).status == "truncated"
    log.unlink()
    forged = AuditLog(log, box["id"])
    for _ in raw.splitlines():
        forged.write("proxy", mode="enforce", allow=["allowed.test"])  # a whole, consistent, other chain
    forged.close()
    assert verify(log).ok and verify_anchored(log, anchors).status == "rewritten"


def test_logs_verify_har_validates_and_tampering_is_caught(gw: RunningGateway, sb: Sandbox, tmp_path: Path) -> None:
    from jsonschema import Draft6Validator
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT6

    schemas = Path(__file__).parents[1] / "unit" / "proxy" / "har_schema"  # HAR 1.2, vendored
    resources = []
    for path in sorted(schemas.glob("*.json")):
        contents = json.loads(path.read_text())
        resources.append((contents["$id"].removesuffix("#"), Resource.from_contents(contents, DRAFT6)))
    registry: Registry[Any] = Registry().with_resources(resources)
    validator = Draft6Validator(
        json.loads((schemas / "har.json").read_text()), registry=registry, format_checker=Draft6Validator.FORMAT_CHECKER
    )

    with gw.client() as c:
        raw = c.get(f"/v1/sessions/{sb.id}/traffic").content
        har = c.get(f"/v1/sessions/{sb.id}/traffic.har").json()
        listed = c.get("/v1/audit").json()
    log = tmp_path / "audit.jsonl"
    log.write_bytes(raw)
    assert verify(log).ok and verify(log).records == len(raw.splitlines())
    assert list(validator.iter_errors(har)) == []
    assert any(e["request"]["url"].startswith("https://allowed.test/") for e in har["log"]["entries"])
    assert any(item["session"] == sb.id and item["state"] == "live" for item in listed)
    lines = raw.splitlines()
    record = json.loads(lines[2])
    record["status"] = 299
    lines[2] = json.dumps(record, sort_keys=True, separators=(",", ":")).encode()
    log.write_bytes(b"\n".join(lines) + b"\n")
    result = verify(log)
    assert not result.ok and result.first_bad == 3


def test_a_killed_proxy_fails_closed_loses_nothing_and_comes_back(
    tmp_path: Path, upstream: Upstream, runtime: DockerHarness
) -> None:
    # A gateway of its own whose watchdog looks every 8 s: long enough to see the sandbox cut off.
    with (
        gateway(
            tmp_path,
            f"egress-kill-{os.getpid()}",
            reap_interval_s=8.0,
            egress_network=upstream.network,
            egress_trusted_networks=f"{upstream.address}/32",
            egress_upstream_ca=upstream.ca_path,
        ) as own,
        Sandbox.create(url=own.url, api_key=KEY_A, allow=["allowed.test"]) as box,
    ):

        def fetch() -> int:
            result = probe(runtime, box.container, "proxied", tls=True, connect="allowed.test", path="/json")
            return int(result["status"])

        assert fetch() == 200
        before = traffic(own, box.id)
        proxy = f"corral-egress-{box.id}"
        address = probe(runtime, box.container, "resolve", host="corral-proxy")
        runtime.kill(proxy)  # SIGKILL mid-session: nothing flushed at exit, no goodbye
        assert wait_for(lambda: fetch() == 200, timeout_s=30), "the proxy did not come back"
        after = traffic(own, box.id)
        assert after[: len(before)] == before  # nothing already answered was lost
        assert [r["event"] for r in after].count("proxy") >= 2  # a second start, same chain
        runtime.stop(proxy)  # dead for good as far as Docker is concerned: only the gateway revives it
        # By address and with a short timeout: the address is simply gone, so a connect would otherwise
        # wait for it to come back (and Docker's resolver takes its time over a stopped container).
        down = probe(
            runtime,
            box.container,
            "proxied",
            tls=True,
            connect="allowed.test",
            path="/json",
            timeout=1.5,
            proxy=address,
        )
        assert down["status"] == 0, down
        assert runtime.container_states({"corral.session": box.id})[proxy] == "exited"  # down throughout: fail closed
        assert wait_for(lambda: fetch() == 200, timeout_s=30), "the gateway did not bring the proxy back"
        assert [r["event"] for r in traffic(own, box.id)].count("proxy") >= 3
        log = own.settings.data_dir / "egress" / box.id / "audit.jsonl"
        assert verify(log).ok


def test_audit_logs_outlive_their_sessions(gw: RunningGateway, runtime: DockerHarness) -> None:
    with gw.client() as c:
        box = c.post("/v1/sessions", json={"allow": ["allowed.test"]}).json()
        assert c.delete(f"/v1/sessions/{box['id']}").status_code == 204
        assert runtime.session_network(f"corral-net-{box['id']}") is None
        response = c.get(f"/v1/sessions/{box['id']}/traffic")
        assert response.status_code == 200 and b'"event":"proxy"' in response.content
        listed = {item["session"]: item for item in c.get("/v1/audit").json()}
        assert listed[box["id"]]["state"] == "ended"
    with httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {KEY_B}"}) as other:
        assert other.get(f"/v1/sessions/{box['id']}/traffic").status_code == 403


class HostService:
    """A server of the test's own on the host, bound to the host's address on the egress bridge (the
    bridge's gateway), counting what reaches it."""

    def __init__(self, address: str) -> None:
        import http.server
        import threading

        hits: list[str] = []
        self.hits = hits

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                hits.append(self.path)
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"the host's own service")

            def log_message(self, *args: object) -> None:
                return None

        self.server = http.server.ThreadingHTTPServer((address, 0), Handler)
        self.address, self.port = address, self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _bridge(network: str) -> tuple[str, str]:
    """A Docker network's subnet and its gateway (the host's own address on its bridge)."""
    import subprocess

    inspected = subprocess.run(
        ["docker", "network", "inspect", "-f", "{{json .IPAM.Config}}", network],
        capture_output=True,
        text=True,
        check=True,
    )
    config = json.loads(inspected.stdout)[0]
    return str(config["Subnet"]), str(config["Gateway"])


@pytest.fixture(scope="module")
def trusting_gw(tmp_path_factory: pytest.TempPathFactory, upstream: Upstream) -> Iterator[RunningGateway]:
    """A gateway whose operator trusts the whole egress subnet, the host's address on it among them."""
    subnet, _ = _bridge(upstream.network)
    with gateway(
        tmp_path_factory.mktemp("trusting-gw"),
        f"trusting-{os.getpid()}",
        egress_network=upstream.network,
        egress_trusted_networks=subnet,
        egress_upstream_ca=upstream.ca_path,
    ) as running:
        yield running


def test_a_trusted_network_holding_the_host_s_address_does_not_open_the_host_to_report_mode(
    trusting_gw: RunningGateway, upstream: Upstream, runtime: DockerHarness
) -> None:
    """Report mode lets through what the allowlist refuses, and a trusted network lifts the global
    deny: together they sent a session's requests to the gateway host's own services."""
    _, host_address = _bridge(upstream.network)
    service = HostService(host_address)
    try:
        with Sandbox.create(url=trusting_gw.url, api_key=KEY_A, allow=["allowed.test"], egress_mode="report") as box:
            target = f"{host_address}:{service.port}"
            plain = probe(runtime, box.container, "proxied", connect=target, path="/plain", timeout=8, user="agent")
            tunnel = probe(
                runtime, box.container, "proxied", tls=True, connect=host_address, port=service.port, path="/tls"
            )
            assert (plain["status"], plain.get("rule")) == (403, "global-deny"), plain
            assert (tunnel["status"], tunnel.get("rule")) == (403, "global-deny"), tunnel
            seen = [r for r in traffic(trusting_gw, box.id) if r.get("host") == host_address]
            assert {r["event"] for r in seen} >= {"connect", "block"}, seen
            for record in seen:
                assert (record["decision"], record["rule"], record.get("ip")) == ("deny", "global-deny", None), record
            # The rest of the trusted network is what report mode is for: the upstream is reached.
            reported = probe(runtime, box.container, "proxied", tls=True, connect="other.test", path="/json")
            assert reported["status"] == 200, reported
    finally:
        service.close()
    assert service.hits == []
