"""Policy decisions (corral.proxy.addons.gate): CONNECT decided before any lookup, every request
judged by its tunnel, its host and the rules; refusals answered with the page that names the rule."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mitmproxy")

from mitmproxy import exceptions
from mitmproxy.test import tutils

from corral.proxy import control

from .harness import DNS, connect_flow, plain_request, records, session_proxy, tunnel_request, write_policy


async def test_denied_connect_is_decided_before_any_lookup_and_its_requests_get_the_403_page(egress) -> None:
    proxy, lookups, state = egress
    flow = connect_flow("blocked.test")
    await proxy.http_connect(flow)
    assert lookups.asked == []
    assert flow.response is not None and flow.response.status_code == 200  # accepted, never dialled
    inner = tunnel_request(flow, "blocked.test", "/page")
    inner.client_conn.sni = "blocked.test"
    await proxy.requestheaders(inner)
    assert inner.response is not None and inner.response.status_code == 403
    page = inner.response.get_text() or ""
    assert "blocked.test" in page and "default-deny" in page
    assert inner.response.headers["X-Corral-Rule"] == "default-deny"
    connect, block = records(state)[-2:]
    assert (connect["event"], connect["decision"], connect["rule"], connect["ip"]) == (
        "connect",
        "deny",
        "default-deny",
        None,
    )
    assert (block["event"], block["status"], block["host"], block["decision"]) == ("block", 403, "blocked.test", "deny")
    assert dict(block["request_headers"])["authorization"] == "[redacted]"


async def test_json_clients_get_a_json_refusal(egress) -> None:
    proxy, _, _ = egress
    flow = plain_request("blocked.test")
    flow.request.headers["accept"] = "application/json"
    await proxy.requestheaders(flow)
    assert flow.response is not None
    body = json.loads(flow.response.get_text() or "")
    assert body["error"] == {
        "code": "egress_denied",
        "host": "blocked.test",
        "rule": "default-deny",
        "reason": "blocked.test:80 is not on the session's allowlist",
    }


@pytest.mark.parametrize(
    ("host", "rule"),
    [
        ("private.test", "global-deny"),
        ("meta.test", "global-deny"),
        ("rebind.test", "global-deny"),  # one private answer among public ones refuses the name
    ],
)
async def test_names_resolving_into_the_global_deny_are_refused(egress, host: str, rule: str, tmp_path: Path) -> None:
    proxy, _, state = egress
    (state / "policy.json").write_text(json.dumps({"allow": ["*.test"]}))
    proxy.configure({"corral_state_dir"})
    flow = connect_flow(host)
    await proxy.http_connect(flow)
    record = records(state)[-1]
    assert (record["decision"], record["rule"]) == ("deny", rule)
    inner = tunnel_request(flow, host)
    await proxy.requestheaders(inner)
    assert inner.response is not None and inner.response.status_code == 403


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1",
        "2130706433",
        "0x7f.0.0.1",
        "0177.0.0.1",
        "127.1",
        "[::1]",
        "[::ffff:127.0.0.1]",
        "169.254.169.254",
        "10.1.2.3",
        "localhost",
        "metadata.google.internal",
        "corral-proxy",
        "dns.google",
    ],
)
async def test_global_deny_refuses_every_spelling(egress, host: str) -> None:
    proxy, lookups, state = egress
    (state / "policy.json").write_text(json.dumps({"allow": [host.strip("[]") if ":" not in host else host]}))
    proxy.configure({"corral_state_dir"})
    flow = connect_flow(host)
    await proxy.http_connect(flow)
    record = records(state)[-1]
    assert record["decision"] == "deny"
    assert record["rule"] == "global-deny", record
    assert lookups.asked == []


async def test_host_header_must_match_the_tunnel(egress) -> None:
    proxy, _, state = egress
    flow = connect_flow("allowed.test")
    await proxy.http_connect(flow)
    spoofed = tunnel_request(flow, "other.test", "/docs/")
    spoofed.client_conn.sni = "allowed.test"
    await proxy.requestheaders(spoofed)
    assert spoofed.response is not None and spoofed.response.status_code == 421
    assert records(state)[-1]["rule"] == "host-mismatch"


async def test_sni_must_match_the_tunnel(egress) -> None:
    proxy, _, state = egress
    flow = connect_flow("allowed.test")
    await proxy.http_connect(flow)
    inner = tunnel_request(flow, "allowed.test")
    inner.client_conn.sni = "other.test"
    await proxy.requestheaders(inner)
    assert inner.response is not None and inner.response.status_code == 421
    assert records(state)[-1]["rule"] == "sni-mismatch"


async def test_plain_http_host_header_must_match_the_url(egress) -> None:
    proxy, _, _ = egress
    flow = plain_request("allowed.test", host_header="private.test")
    await proxy.requestheaders(flow)
    assert flow.response is not None and flow.response.status_code == 421


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/docs/intro", None),
        ("HEAD", "/docs/", None),
        ("POST", "/docs/x", 403),
        ("GET", "/admin", 403),
        ("GET", "/docs/../admin", 403),
        ("GET", "/docs/%2e%2e/admin", 403),
        ("GET", "/docs%2fx", 403),
    ],
)
async def test_methods_and_path_prefixes(egress, method: str, path: str, status: int | None) -> None:
    proxy, _, _ = egress
    flow = connect_flow("other.test")
    await proxy.http_connect(flow)
    inner = tunnel_request(flow, "other.test", path, method)
    await proxy.requestheaders(inner)
    assert (inner.response.status_code if inner.response else None) == status


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        ("/dns-query", {"content-type": "application/dns-message"}),
        ("/dns-query?dns=AAABAAAB", {}),
        ("/resolve?name=x.test", {"accept": "application/dns-json"}),
    ],
)
async def test_doh_is_refused_even_on_allowed_hosts(egress, path: str, headers: dict[str, str]) -> None:
    proxy, _, state = egress
    flow = connect_flow("allowed.test")
    await proxy.http_connect(flow)
    inner = tunnel_request(flow, "allowed.test", path, "POST" if headers.get("content-type") else "GET")
    inner.request.headers.update(headers)
    await proxy.requestheaders(inner)
    assert inner.response is not None and inner.response.status_code == 403
    assert records(state)[-1]["rule"] == "doh"


async def test_unresolvable_names_get_a_502_page_and_an_audit_record(egress) -> None:
    proxy, _, state = egress
    (state / "policy.json").write_text(json.dumps({"allow": ["*.invalid"]}))
    proxy.configure({"corral_state_dir"})
    flow = connect_flow("nowhere.invalid")
    await proxy.http_connect(flow)
    assert records(state)[-1]["rule"] == "dns-error"
    inner = tunnel_request(flow, "nowhere.invalid")
    await proxy.requestheaders(inner)
    assert inner.response is not None and inner.response.status_code == 502


async def test_report_mode_allows_and_logs_what_it_would_have_denied(egress) -> None:
    proxy, _lookups, state = egress
    proxy.control("gateway", control.SetPolicy(("allowed.test",), "report", "test"))
    DNS["unlisted.test"] = ["203.0.113.40"]
    try:
        flow = connect_flow("unlisted.test")
        await proxy.http_connect(flow)
        assert flow.response is None
        record = records(state)[-1]
        assert (record["decision"], record["rule"], record["ip"]) == ("report", "default-deny", "203.0.113.40")
        inner = tunnel_request(flow, "unlisted.test")
        await proxy.requestheaders(inner)
        assert inner.response is None
        inner.response = tutils.tresp()
        await proxy.response(inner)
        assert records(state)[-1]["decision"] == "report"
    finally:
        del DNS["unlisted.test"]


# Report mode relaxes the allowlist only: each of these is refused before any dial, as in enforce mode.

REPORT_MODE_REFUSALS = [
    ("169.254.169.254", 80, "global-deny"),  # cloud metadata
    ("[fd00:ec2::254]", 80, "global-deny"),  # metadata over IPv6 (ULA)
    ("2852039166", 80, "global-deny"),  # 169.254.169.254 as one number
    ("10.1.2.3", 443, "global-deny"),  # private
    ("0x7f.1", 443, "global-deny"),  # loopback in hex
    ("[::ffff:127.0.0.1]", 443, "global-deny"),
    ("localhost", 443, "global-deny"),
    ("metadata.google.internal", 80, "global-deny"),
    ("corral-proxy", 8081, "global-deny"),  # the proxy's own control port, by its name
    ("203.0.113.77", 8081, "global-deny"),  # ... and by its address, even inside a trusted network
    ("proxyself.test", 8081, "global-deny"),  # ... and by a name that resolves to it
    ("private.test", 443, "global-deny"),  # a name resolving to a private address
    ("meta.test", 80, "global-deny"),  # ... to the metadata address
    ("rebind.test", 443, "global-deny"),  # ... one private answer among public ones
    ("dns.google", 443, "global-deny"),  # a DoH resolver
]


@pytest.fixture
def report_mode(egress):
    from mitmproxy import ctx

    proxy, lookups, state = egress
    DNS["proxyself.test"] = ["203.0.113.77"]
    ctx.options.update(corral_own_hosts="corral-proxy,203.0.113.77")
    # Nothing on the allowlist that matters: a report-mode session lets the allowlist's refusals through.
    proxy.control("gateway", control.SetPolicy(("allowed.test",), "report", "test"))
    try:
        yield proxy, lookups, state
    finally:
        del DNS["proxyself.test"]


@pytest.mark.parametrize(("host", "port", "rule"), REPORT_MODE_REFUSALS)
async def test_report_mode_never_lifts_the_global_deny_at_connect(report_mode, host: str, port: int, rule: str) -> None:
    proxy, _lookups, state = report_mode
    assert proxy.shared.policy.mode == "report"
    flow = connect_flow(host, port)
    await proxy.http_connect(flow)
    record = records(state)[-1]
    assert (record["event"], record["decision"], record["rule"], record["ip"]) == ("connect", "deny", rule, None)
    assert flow.response is not None and flow.response.status_code == 200  # accepted, intercepted, never dialled
    server = flow.server_conn
    server.address = (host.strip("[]"), port)
    await proxy.server_connect(flow, server)
    assert server.error and "refused" in server.error
    inner = tunnel_request(flow, host if port == 443 else f"{host}:{port}")
    await proxy.requestheaders(inner)
    assert inner.response is not None and inner.response.status_code == 403
    assert inner.response.headers["X-Corral-Rule"] == rule
    assert records(state)[-1]["decision"] == "deny"


@pytest.mark.parametrize(("host", "port", "rule"), REPORT_MODE_REFUSALS)
async def test_report_mode_never_lifts_the_global_deny_for_plain_http(
    report_mode, host: str, port: int, rule: str
) -> None:
    proxy, _lookups, state = report_mode
    flow = plain_request(host, port, host_header=host if port == 80 else f"{host}:{port}")
    await proxy.requestheaders(flow)
    assert flow.response is not None and flow.response.status_code == 403, records(state)[-1]
    assert flow.request.host == host.strip("[]") or flow.request.host == host  # never re-pinned to an address
    record = records(state)[-1]
    assert (record["event"], record["decision"], record["rule"]) == ("block", "deny", rule)
    server = flow.server_conn
    server.address = (flow.request.host, port)
    await proxy.server_connect(flow, server)
    assert server.error and "refused" in server.error


async def test_report_mode_still_refuses_doh_and_protocol_violations(report_mode) -> None:
    proxy, _lookups, state = report_mode
    DNS["unlisted.test"] = ["203.0.113.40"]
    try:
        flow = connect_flow("unlisted.test")
        await proxy.http_connect(flow)
        assert records(state)[-1]["decision"] == "report"  # the allowlist's refusal: let through
        doh = tunnel_request(flow, "unlisted.test", "/dns-query?dns=AAABAAAB")
        await proxy.requestheaders(doh)
        assert doh.response is not None and doh.response.status_code == 403
        assert (records(state)[-1]["decision"], records(state)[-1]["rule"]) == ("deny", "doh")
        spoof = tunnel_request(flow, "private.test")
        spoof.client_conn.sni = "unlisted.test"
        await proxy.requestheaders(spoof)
        assert spoof.response is not None and spoof.response.status_code == 421
        # A path the allowlist refuses is an allowlist decision: reported, let through.
        path = tunnel_request(flow, "unlisted.test", "/admin")
        await proxy.requestheaders(path)
        assert path.response is None
        path.response = tutils.tresp()
        await proxy.response(path)
        assert (records(state)[-1]["decision"], records(state)[-1]["rule"]) == ("report", "default-deny")
    finally:
        del DNS["unlisted.test"]


async def test_absolute_form_inside_a_tunnel_must_name_the_tunnel(egress) -> None:
    proxy, _, _ = egress
    flow = connect_flow("allowed.test")
    await proxy.http_connect(flow)
    smuggled = tunnel_request(flow, "allowed.test", "/guide/x")
    smuggled.request.authority = "evil.example:443"
    await proxy.requestheaders(smuggled)
    assert smuggled.response is not None and smuggled.response.status_code == 421
    same = tunnel_request(flow, "allowed.test", "/x")
    same.request.authority = "allowed.test"
    await proxy.requestheaders(same)
    assert same.response is None and same.request.authority == ""  # forwarded in origin form


async def test_raw_tcp_is_never_chosen_inside_a_tunnel(egress) -> None:
    from mitmproxy.proxy import layers
    from mitmproxy.proxy.context import Context

    proxy, _, _ = egress
    flow = connect_flow("allowed.test")
    await proxy.http_connect(flow)

    class Data:
        def __init__(self) -> None:
            self.context = Context(flow.client_conn, tctx_options())
            self.layer: object = layers.TCPLayer(self.context)

    data = Data()
    await proxy.hook("next_layer", data)
    assert isinstance(data.layer, layers.HttpLayer)


def tctx_options() -> Any:
    from mitmproxy import options

    return options.Options()


async def test_a_policy_change_redecides_kept_alive_tunnels(egress) -> None:
    proxy, lookups, _ = egress
    flow = connect_flow("other.test", 8443)
    await proxy.http_connect(flow)
    first = tunnel_request(flow, "other.test:8443")
    await proxy.requestheaders(first)
    assert first.response is not None and first.response.status_code == 403
    proxy.control("gateway", control.SetPolicy(("other.test:8443",), "enforce", "test"))
    again = tunnel_request(flow, "other.test:8443")
    await proxy.requestheaders(again)
    assert again.response is None  # allowed now, on the same kept-alive tunnel
    assert lookups.asked == ["other.test"]
    proxy.control("gateway", control.SetPolicy(("allowed.test",), "enforce", "test"))
    later = tunnel_request(flow, "other.test:8443")
    await proxy.requestheaders(later)
    assert later.response is not None and later.response.status_code == 403


async def test_refusal_reasons_carry_no_query(egress) -> None:
    proxy, _, state = egress
    flow = connect_flow("other.test")
    await proxy.http_connect(flow)
    inner = tunnel_request(flow, "other.test", "/private?access_token=SECRET123")
    await proxy.requestheaders(inner)
    assert inner.response is not None and inner.response.status_code == 403
    assert "SECRET123" not in (inner.response.get_text() or "")
    assert "SECRET123" not in (state / "audit.jsonl").read_text()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"corral_mode": "off"}, "corral_mode must be one of enforce, report"),
        ({"corral_trusted_networks": "not-a-network"}, "bad egress policy"),
    ],
)
def test_bad_options_are_options_errors(tmp_path: Path, options: dict[str, Any], message: str) -> None:
    with session_proxy() as proxy, pytest.raises(exceptions.OptionsError, match=message):
        proxy.tctx.configure(proxy.addons[0], corral_state_dir=str(tmp_path), **options)
    assert not (tmp_path / "audit.jsonl").exists() or records(tmp_path) == []


def test_an_unreadable_persisted_policy_is_an_options_error(tmp_path: Path) -> None:
    (tmp_path / "policy.json").write_text("{not json")
    with session_proxy() as proxy, pytest.raises(exceptions.OptionsError, match="persisted policy"):
        proxy.tctx.configure(proxy.addons[0], corral_state_dir=str(tmp_path))
    write_policy(tmp_path, ["a*.test"])  # a rule the policy refuses
    with session_proxy() as proxy, pytest.raises(exceptions.OptionsError, match="bad egress policy"):
        proxy.tctx.configure(proxy.addons[0], corral_state_dir=str(tmp_path))
