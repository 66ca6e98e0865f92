"""The egress addon against mitmproxy's own test doubles (taddons, tflow); DNS answers from a table.

Runs where mitmproxy is installed (the proxy's virtualenv, .venv-proxy); skipped elsewhere.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mitmproxy")

from mitmproxy import http
from mitmproxy.proxy import server_hooks
from mitmproxy.test import taddons, tflow, tutils

from corral.proxy import control
from corral.proxy.addon import Egress, parse_authority
from corral.proxy.audit import verify

DNS = {
    "allowed.test": ["203.0.113.10"],
    "api.allowed.test": ["203.0.113.11"],
    "other.test": ["203.0.113.12"],
    "rebind.test": ["203.0.113.13", "10.0.0.5"],
    "private.test": ["192.168.1.20"],
    "meta.test": ["169.254.169.254"],
}


class Lookups:
    def __init__(self) -> None:
        self.asked: list[str] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.asked.append(host)
        if host not in DNS:
            raise OSError(-2, "Name or service not known")
        return DNS[host]


@pytest.fixture
def egress(tmp_path: Path) -> Iterator[tuple[Egress, Lookups, Path]]:
    addon = Egress()
    lookups = Lookups()
    addon.lookup = lookups
    (tmp_path / "policy.json").write_text(
        json.dumps({"allow": ["allowed.test", "*.allowed.test", "GET,HEAD other.test/docs/"], "mode": "enforce"})
    )
    with taddons.context(addon) as tctx:
        # 203.0.113.0/24 is documentation space, globally denied unless the operator trusts it.
        tctx.configure(
            addon,
            corral_session="ses_test",
            corral_state_dir=str(tmp_path),
            corral_trusted_networks="203.0.113.0/24",
            corral_gateway_token="gw-token",
            corral_controller_token="ctl-token",
            corral_own_hosts="corral-proxy",
        )
        yield addon, lookups, tmp_path


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (path / "audit.jsonl").read_text().splitlines() if line]


def connect_flow(host: str, port: int = 443) -> http.HTTPFlow:
    return tflow.tflow(req=tutils.treq(method=b"CONNECT", host=host, port=port, path=b"", headers=http.Headers()))


def tunnel_request(connect: http.HTTPFlow, host_header: str, path: str = "/", method: str = "GET") -> http.HTTPFlow:
    if host_header.startswith("["):
        host, _, port = host_header[1:].partition("]")
        port = port.removeprefix(":")
    else:
        host, _, port = host_header.partition(":")
    req = tutils.treq(
        method=method.encode(),
        scheme=b"https",
        host=host,
        port=int(port or 443),
        path=path.encode(),
        headers=http.Headers(host=host_header, authorization="Bearer s3cret"),
        content=b"",
    )
    connect.client_conn.sni = connect.request.host  # a browser sends the tunnel's host as SNI
    return tflow.tflow(client_conn=connect.client_conn, req=req)


def plain_request(url_host: str, port: int = 80, host_header: str | None = None, path: str = "/") -> http.HTTPFlow:
    req = tutils.treq(
        host=url_host,
        port=port,
        path=path.encode(),
        headers=http.Headers(host=host_header or url_host),
        content=b"",
    )
    return tflow.tflow(req=req)


async def test_denied_connect_is_decided_before_any_lookup_and_its_requests_get_the_403_page(egress) -> None:
    addon, lookups, state = egress
    flow = connect_flow("blocked.test")
    await addon.http_connect(flow)
    assert lookups.asked == []
    assert flow.response is not None and flow.response.status_code == 200  # accepted, never dialled
    inner = tunnel_request(flow, "blocked.test", "/page")
    inner.client_conn.sni = "blocked.test"
    await addon.requestheaders(inner)
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


async def test_a_refused_tunnel_never_opens_a_server_connection(egress) -> None:
    addon, _, _ = egress
    flow = connect_flow("blocked.test")
    await addon.http_connect(flow)
    server = flow.server_conn
    server.address = ("blocked.test", 443)
    await addon.server_connect(server_hooks.ServerConnectionHookData(server=server, client=flow.client_conn))
    assert server.error and "refused" in server.error


async def test_json_clients_get_a_json_refusal(egress) -> None:
    addon, _, _ = egress
    flow = plain_request("blocked.test")
    flow.request.headers["accept"] = "application/json"
    await addon.requestheaders(flow)
    assert flow.response is not None
    body = json.loads(flow.response.get_text() or "")
    assert body["error"] == {
        "code": "egress_denied",
        "host": "blocked.test",
        "rule": "default-deny",
        "reason": "blocked.test:80 is not on the session's allowlist",
    }


async def test_allowed_connect_resolves_once_and_pins_the_vetted_address(egress) -> None:
    addon, lookups, state = egress
    flow = connect_flow("api.allowed.test")
    await addon.http_connect(flow)
    assert flow.response is None
    server = flow.server_conn
    server.address, server.sni = ("api.allowed.test", 443), None
    data = server_hooks.ServerConnectionHookData(server=server, client=flow.client_conn)
    await addon.server_connect(data)
    assert server.error is None
    assert server.address == ("203.0.113.11", 443)
    assert server.sni == "api.allowed.test"
    assert lookups.asked == ["api.allowed.test"]
    # mitmproxy names the tunnel's requests (and any reconnect) by the pinned address: still vetted.
    again = tflow.tserver_conn()
    again.address, again.sni = ("203.0.113.11", 443), None
    await addon.server_connect(server_hooks.ServerConnectionHookData(server=again, client=flow.client_conn))
    assert (again.error, again.address, again.sni) == (None, ("203.0.113.11", 443), "api.allowed.test")
    assert lookups.asked == ["api.allowed.test"]
    record = records(state)[-1]
    assert (record["decision"], record["rule"], record["ip"]) == ("allow", "*.allowed.test", "203.0.113.11")


@pytest.mark.parametrize(
    ("host", "rule"),
    [
        ("private.test", "global-deny"),
        ("meta.test", "global-deny"),
        ("rebind.test", "global-deny"),  # one private answer among public ones refuses the name
    ],
)
async def test_names_resolving_into_the_global_deny_are_refused(egress, host: str, rule: str, tmp_path: Path) -> None:
    addon, _, state = egress
    (state / "policy.json").write_text(json.dumps({"allow": ["*.test"]}))
    addon.configure({"corral_state_dir"})
    flow = connect_flow(host)
    await addon.http_connect(flow)
    record = records(state)[-1]
    assert (record["decision"], record["rule"]) == ("deny", rule)
    inner = tunnel_request(flow, host)
    await addon.requestheaders(inner)
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
    addon, lookups, state = egress
    (state / "policy.json").write_text(json.dumps({"allow": [host.strip("[]") if ":" not in host else host]}))
    addon.configure({"corral_state_dir"})
    flow = connect_flow(host)
    await addon.http_connect(flow)
    record = records(state)[-1]
    assert record["decision"] == "deny"
    assert record["rule"] == "global-deny", record
    assert lookups.asked == []


async def test_host_header_must_match_the_tunnel(egress) -> None:
    addon, _, state = egress
    flow = connect_flow("allowed.test")
    await addon.http_connect(flow)
    spoofed = tunnel_request(flow, "other.test", "/docs/")
    spoofed.client_conn.sni = "allowed.test"
    await addon.requestheaders(spoofed)
    assert spoofed.response is not None and spoofed.response.status_code == 421
    assert records(state)[-1]["rule"] == "host-mismatch"


async def test_sni_must_match_the_tunnel(egress) -> None:
    addon, _, state = egress
    flow = connect_flow("allowed.test")
    await addon.http_connect(flow)
    inner = tunnel_request(flow, "allowed.test")
    inner.client_conn.sni = "other.test"
    await addon.requestheaders(inner)
    assert inner.response is not None and inner.response.status_code == 421
    assert records(state)[-1]["rule"] == "sni-mismatch"


async def test_plain_http_host_header_must_match_the_url(egress) -> None:
    addon, _, _ = egress
    flow = plain_request("allowed.test", host_header="private.test")
    await addon.requestheaders(flow)
    assert flow.response is not None and flow.response.status_code == 421


async def test_plain_http_is_pinned_too(egress) -> None:
    addon, lookups, _ = egress
    flow = plain_request("allowed.test")
    await addon.requestheaders(flow)
    assert flow.response is None
    assert flow.request.host == "203.0.113.10"  # mitmproxy dials, and reuses, the vetted address
    assert flow.request.host_header == "allowed.test"
    server = flow.server_conn
    server.address = (flow.request.host, 80)
    await addon.server_connect(server_hooks.ServerConnectionHookData(server=server, client=flow.client_conn))
    assert server.address == ("203.0.113.10", 80) and server.error is None
    assert lookups.asked == ["allowed.test"]
    stranger = tflow.tserver_conn()
    stranger.address = ("203.0.113.99", 80)  # an address no hook vetted for this client
    await addon.server_connect(server_hooks.ServerConnectionHookData(server=stranger, client=flow.client_conn))
    assert stranger.error and "refused" in stranger.error


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
    addon, _, _ = egress
    flow = connect_flow("other.test")
    await addon.http_connect(flow)
    inner = tunnel_request(flow, "other.test", path, method)
    await addon.requestheaders(inner)
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
    addon, _, state = egress
    flow = connect_flow("allowed.test")
    await addon.http_connect(flow)
    inner = tunnel_request(flow, "allowed.test", path, "POST" if headers.get("content-type") else "GET")
    inner.request.headers.update(headers)
    await addon.requestheaders(inner)
    assert inner.response is not None and inner.response.status_code == 403
    assert records(state)[-1]["rule"] == "doh"


async def test_unresolvable_names_get_a_502_page_and_an_audit_record(egress) -> None:
    addon, _, state = egress
    (state / "policy.json").write_text(json.dumps({"allow": ["*.invalid"]}))
    addon.configure({"corral_state_dir"})
    flow = connect_flow("nowhere.invalid")
    await addon.http_connect(flow)
    assert records(state)[-1]["rule"] == "dns-error"
    inner = tunnel_request(flow, "nowhere.invalid")
    await addon.requestheaders(inner)
    assert inner.response is not None and inner.response.status_code == 502


async def test_report_mode_allows_and_logs_what_it_would_have_denied(egress) -> None:
    addon, _lookups, state = egress
    addon.handle_control("gateway", control.SetPolicy(("allowed.test",), "report", "test"))
    DNS["unlisted.test"] = ["203.0.113.40"]
    try:
        flow = connect_flow("unlisted.test")
        await addon.http_connect(flow)
        assert flow.response is None
        record = records(state)[-1]
        assert (record["decision"], record["rule"], record["ip"]) == ("report", "default-deny", "203.0.113.40")
        inner = tunnel_request(flow, "unlisted.test")
        await addon.requestheaders(inner)
        assert inner.response is None
        inner.response = tutils.tresp()
        addon.response(inner)
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

    addon, lookups, state = egress
    DNS["proxyself.test"] = ["203.0.113.77"]
    ctx.options.update(corral_own_hosts="corral-proxy,203.0.113.77")
    # Nothing on the allowlist that matters: a report-mode session lets the allowlist's refusals through.
    addon.handle_control("gateway", control.SetPolicy(("allowed.test",), "report", "test"))
    try:
        yield addon, lookups, state
    finally:
        del DNS["proxyself.test"]


@pytest.mark.parametrize(("host", "port", "rule"), REPORT_MODE_REFUSALS)
async def test_report_mode_never_lifts_the_global_deny_at_connect(report_mode, host: str, port: int, rule: str) -> None:
    addon, _lookups, state = report_mode
    assert addon.mode == "report"
    flow = connect_flow(host, port)
    await addon.http_connect(flow)
    record = records(state)[-1]
    assert (record["event"], record["decision"], record["rule"], record["ip"]) == ("connect", "deny", rule, None)
    assert flow.response is not None and flow.response.status_code == 200  # accepted, intercepted, never dialled
    server = flow.server_conn
    server.address = (host.strip("[]"), port)
    await addon.server_connect(server_hooks.ServerConnectionHookData(server=server, client=flow.client_conn))
    assert server.error and "refused" in server.error
    inner = tunnel_request(flow, host if port == 443 else f"{host}:{port}")
    await addon.requestheaders(inner)
    assert inner.response is not None and inner.response.status_code == 403
    assert inner.response.headers["X-Corral-Rule"] == rule
    assert records(state)[-1]["decision"] == "deny"


@pytest.mark.parametrize(("host", "port", "rule"), REPORT_MODE_REFUSALS)
async def test_report_mode_never_lifts_the_global_deny_for_plain_http(
    report_mode, host: str, port: int, rule: str
) -> None:
    addon, _lookups, state = report_mode
    flow = plain_request(host, port, host_header=host if port == 80 else f"{host}:{port}")
    await addon.requestheaders(flow)
    assert flow.response is not None and flow.response.status_code == 403, records(state)[-1]
    assert flow.request.host == host.strip("[]") or flow.request.host == host  # never re-pinned to an address
    record = records(state)[-1]
    assert (record["event"], record["decision"], record["rule"]) == ("block", "deny", rule)
    server = flow.server_conn
    server.address = (flow.request.host, port)
    await addon.server_connect(server_hooks.ServerConnectionHookData(server=server, client=flow.client_conn))
    assert server.error and "refused" in server.error


async def test_report_mode_still_refuses_doh_and_protocol_violations(report_mode) -> None:
    addon, _lookups, state = report_mode
    DNS["unlisted.test"] = ["203.0.113.40"]
    try:
        flow = connect_flow("unlisted.test")
        await addon.http_connect(flow)
        assert records(state)[-1]["decision"] == "report"  # the allowlist's refusal: let through
        doh = tunnel_request(flow, "unlisted.test", "/dns-query?dns=AAABAAAB")
        await addon.requestheaders(doh)
        assert doh.response is not None and doh.response.status_code == 403
        assert (records(state)[-1]["decision"], records(state)[-1]["rule"]) == ("deny", "doh")
        spoof = tunnel_request(flow, "private.test")
        spoof.client_conn.sni = "unlisted.test"
        await addon.requestheaders(spoof)
        assert spoof.response is not None and spoof.response.status_code == 421
        # A path the allowlist refuses is an allowlist decision: reported, let through.
        path = tunnel_request(flow, "unlisted.test", "/admin")
        await addon.requestheaders(path)
        assert path.response is None
        path.response = tutils.tresp()
        addon.response(path)
        assert (records(state)[-1]["decision"], records(state)[-1]["rule"]) == ("report", "default-deny")
    finally:
        del DNS["unlisted.test"]


async def test_a_request_record_carries_the_action_in_flight(egress) -> None:
    addon, _, state = egress
    addon.handle_control("controller", control.ActionEvent("a7", "start"))
    flow = connect_flow("allowed.test")
    await addon.http_connect(flow)
    inner = tunnel_request(flow, "allowed.test", "/x?token=abc&q=1")
    inner.client_conn.sni = "allowed.test"
    await addon.requestheaders(inner)
    addon.handle_control("controller", control.ActionEvent("a7", "end"))
    inner.response = tutils.tresp(headers=http.Headers(((b"set-cookie", b"id=1"), (b"content-type", b"text/html"))))
    addon.response(inner)
    record = records(state)[-1]
    assert record["event"] == "request"
    assert record["action"] == "a7"
    assert record["url"] == "https://allowed.test/x?token=[redacted]&q=1"
    assert dict(record["response_headers"])["set-cookie"] == "[redacted]"
    assert (record["status"], record["bytes_in"], record["mime"], record["sni"]) == (
        200,
        len(b"message"),
        "text/html",
        "allowed.test",
    )
    later = connect_flow("allowed.test")
    await addon.http_connect(later)
    assert records(state)[-1]["action"] is None


async def test_policy_change_is_logged_persisted_and_gateway_only(egress) -> None:
    addon, _, state = egress
    with pytest.raises(ValueError, match="only the gateway"):
        addon.handle_control("controller", control.SetPolicy(("x.test",), "enforce", "me"))
    with pytest.raises(ValueError, match="wildcard"):
        addon.handle_control("gateway", control.SetPolicy(("a*.test",), "enforce", "me"))
    reply = addon.handle_control("gateway", control.SetPolicy(("NEW.test.",), "enforce", "api-key:k1"))
    record = records(state)[-1]
    assert reply == {
        "ok": True,
        "allow": ["new.test"],
        "mode": "enforce",
        "generation": 1,
        "head": {"seq": record["seq"], "hash": record["hash"]},  # the chain's head includes the change
    }
    assert record["event"] == "policy"
    assert record["allow"] == ["new.test"] and record["actor"] == "api-key:k1" and record["generation"] == 1
    assert record["previous_allow"] == ["allowed.test", "*.allowed.test", "GET,HEAD other.test/docs/"]
    assert json.loads((state / "policy.json").read_text()) == {
        "allow": ["new.test"],
        "mode": "enforce",
        "generation": 1,
    }
    with pytest.raises(ValueError, match="only the controller"):
        addon.handle_control("gateway", control.ActionEvent("a1", "start"))
    assert verify(state / "audit.jsonl").ok


async def test_errors_are_logged(egress) -> None:
    addon, _, state = egress
    flow = connect_flow("allowed.test")
    await addon.http_connect(flow)
    inner = tunnel_request(flow, "allowed.test")
    await addon.requestheaders(inner)
    inner.error = tflow.terr("connection reset")
    addon.error(inner)
    record = records(state)[-1]
    assert (record["event"], record["error"], record["host"]) == ("error", "connection reset", "allowed.test")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b"nope", "not JSON"),
        (b"[]", "JSON object"),
        (b'{"op":"x"}', "unknown op"),
        (b'{"op":"policy","allow":"a"}', "list of strings"),
        (b'{"op":"policy","allow":[],"mode":"off"}', "mode"),
        (b'{"op":"action","id":"a","phase":"middle"}', "phase"),
        (b'{"op":"hello"}', "token"),
    ],
)
def test_control_messages_are_validated(line: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        control.parse_message(line)


@pytest.mark.parametrize(
    "action_id",
    ["", "a" * 65, "a1\nforged", "a1\r", "a 1", "a1\u2028", "é1", "a1/../x", "<script>", 7, None, ["a1"]],
)
def test_action_ids_are_short_tokens_without_newlines(action_id: object) -> None:
    line = json.dumps({"op": "action", "id": action_id, "phase": "start"}).encode()
    with pytest.raises(control.InvalidMessage) as refused:
        control.parse_message(line)
    assert refused.value.reply() == {
        "ok": False,
        "code": "invalid_field",
        "field": "id",
        "error": "'id' must be 1 to 64 characters from A-Z a-z 0-9 _ . : -",
    }


@pytest.mark.parametrize("action_id", ["a1.ab3f", "a" * 64, "act_1", "a:1-2.x"])
def test_good_action_ids_pass(action_id: str) -> None:
    line = json.dumps({"op": "action", "id": action_id, "phase": "end"}).encode()
    assert control.parse_message(line) == control.ActionEvent(action_id, "end")


async def _serve(addon: Egress) -> int:
    """The addon's control channel on a free loopback port (what the sidecar binds to its session address)."""
    from mitmproxy import ctx

    ctx.options.update(corral_control_host="127.0.0.1", corral_control_port=0)
    await addon.running()
    assert addon._control is not None
    return int(addon._control.sockets[0].getsockname()[1])


async def _exchange(port: int, *messages: dict[str, Any]) -> list[dict[str, Any]]:
    import asyncio

    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    replies = []
    try:
        for message in messages:
            writer.write(control.encode(message))
            await writer.drain()
            replies.append(json.loads(await reader.readline()))
    finally:
        writer.close()
    return replies


async def test_a_forged_action_id_gets_a_structured_refusal_and_never_reaches_the_log(egress) -> None:
    addon, _, state = egress
    port = await _serve(addon)
    try:
        hello, refused, accepted = await _exchange(
            port,
            {"op": "hello", "token": "ctl-token"},
            {"op": "action", "id": 'a1\n{"event":"forged"}', "phase": "start", "ack": True},
            {"op": "action", "id": "a2.beef", "phase": "start", "ack": True},
        )
        flow = connect_flow("allowed.test")
        await addon.http_connect(flow)
    finally:
        await addon.done()
    assert hello == {"ok": True, "role": "controller"}
    assert refused == {
        "ok": False,
        "code": "invalid_field",
        "field": "id",
        "error": "'id' must be 1 to 64 characters from A-Z a-z 0-9 _ . : -",
    }
    assert accepted == {"ok": True}  # the connection carries on
    assert list(addon._actions) == ["a2.beef"]
    assert records(state)[-1]["action"] == "a2.beef"
    assert "forged" not in (state / "audit.jsonl").read_text()


async def test_the_policy_generation_counts_changes_and_survives_a_restart(egress, tmp_path: Path) -> None:
    addon, _, state = egress
    port = await _serve(addon)
    token = {"op": "hello", "token": "gw-token"}
    try:
        _, first = await _exchange(port, token, {"op": "status"})
        _, changed = await _exchange(port, token, {"op": "policy", "allow": ["a.test"], "mode": "report", "actor": "t"})
        _, now = await _exchange(port, token, {"op": "status"})
    finally:
        await addon.done()
    assert first["generation"] == 0 and changed["generation"] == 1 and now["generation"] == 1
    assert (now["allow"], now["mode"]) == (["a.test"], "report")
    last = records(state)[-1]
    assert now["head"] == {"seq": last["seq"], "hash": last["hash"]}
    # A restarted proxy (same state dir) continues the generation and the chain.
    again = Egress()
    with taddons.context(again) as tctx:
        tctx.configure(again, corral_session="ses_test", corral_state_dir=str(state), corral_gateway_token="gw-token")
        status = again.handle_control("gateway", control.Status())
        assert status is not None
        assert (status["generation"], status["allow"], status["mode"]) == (1, ["a.test"], "report")
        assert status["head"] == now["head"]
        await again.done()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a.test", ("a.test", 443)),
        ("A.Test.:8443", ("a.test", 8443)),
        ("[::1]:80", ("::1", 80)),
        ("[2001:db8::1]", ("2001:db8::1", 443)),
    ],
)
def test_parse_authority(text: str, expected: tuple[str, int]) -> None:
    assert parse_authority(text, 443) == expected


@pytest.mark.parametrize("text", ["a.test:x", "[::1", "a.test:70000", "[::1]x"])
def test_parse_authority_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_authority(text, 443)


async def test_absolute_form_inside_a_tunnel_must_name_the_tunnel(egress) -> None:
    addon, _, _ = egress
    flow = connect_flow("allowed.test")
    await addon.http_connect(flow)
    smuggled = tunnel_request(flow, "allowed.test", "/guide/x")
    smuggled.request.authority = "evil.example:443"
    await addon.requestheaders(smuggled)
    assert smuggled.response is not None and smuggled.response.status_code == 421
    same = tunnel_request(flow, "allowed.test", "/x")
    same.request.authority = "allowed.test"
    await addon.requestheaders(same)
    assert same.response is None and same.request.authority == ""  # forwarded in origin form


async def test_raw_tcp_is_never_chosen_inside_a_tunnel(egress) -> None:
    from mitmproxy.proxy import layers
    from mitmproxy.proxy.context import Context

    addon, _, _ = egress
    flow = connect_flow("allowed.test")
    await addon.http_connect(flow)

    class Data:
        def __init__(self) -> None:
            self.context = Context(flow.client_conn, tctx_options())
            self.layer: object = layers.TCPLayer(self.context)

    data = Data()
    addon.next_layer(data)
    assert isinstance(data.layer, layers.HttpLayer)


def tctx_options() -> Any:
    from mitmproxy import options

    return options.Options()


async def test_a_policy_change_redecides_kept_alive_tunnels(egress) -> None:
    addon, lookups, _ = egress
    flow = connect_flow("other.test", 8443)
    await addon.http_connect(flow)
    first = tunnel_request(flow, "other.test:8443")
    await addon.requestheaders(first)
    assert first.response is not None and first.response.status_code == 403
    addon.handle_control("gateway", control.SetPolicy(("other.test:8443",), "enforce", "test"))
    again = tunnel_request(flow, "other.test:8443")
    await addon.requestheaders(again)
    assert again.response is None  # allowed now, on the same kept-alive tunnel
    assert lookups.asked == ["other.test"]
    addon.handle_control("gateway", control.SetPolicy(("allowed.test",), "enforce", "test"))
    later = tunnel_request(flow, "other.test:8443")
    await addon.requestheaders(later)
    assert later.response is not None and later.response.status_code == 403


async def test_refusal_reasons_carry_no_query(egress) -> None:
    addon, _, state = egress
    flow = connect_flow("other.test")
    await addon.http_connect(flow)
    inner = tunnel_request(flow, "other.test", "/private?access_token=SECRET123")
    await addon.requestheaders(inner)
    assert inner.response is not None and inner.response.status_code == 403
    assert "SECRET123" not in (inner.response.get_text() or "")
    assert "SECRET123" not in (state / "audit.jsonl").read_text()


def test_tokens_come_from_a_file_off_the_command_line(tmp_path: Path) -> None:
    addon = Egress()
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"gateway": "gw-file", "controller": "ctl-file"}))
    with taddons.context(addon) as tctx:
        tctx.configure(addon, corral_state_dir=str(tmp_path), corral_tokens_file=str(tokens))
        assert addon._role("gw-file") == "gateway" and addon._role("ctl-file") == "controller"
        assert addon._role("") is None and addon._role("gw-token") is None
