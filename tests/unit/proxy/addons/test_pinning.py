"""Pinning (corral.proxy.addons.pinning): an upstream connection goes to the vetted address, with
the vetted name as SNI, and nowhere for a refused tunnel or a connection no hook vetted."""

from __future__ import annotations

import pytest

pytest.importorskip("mitmproxy")

from mitmproxy.test import tflow

from .harness import connect_flow, plain_request, records


async def test_a_refused_tunnel_never_opens_a_server_connection(egress) -> None:
    proxy, _, _ = egress
    flow = connect_flow("blocked.test")
    await proxy.http_connect(flow)
    server = flow.server_conn
    server.address = ("blocked.test", 443)
    await proxy.server_connect(flow, server)
    assert server.error and "refused" in server.error


async def test_allowed_connect_resolves_once_and_pins_the_vetted_address(egress) -> None:
    proxy, lookups, state = egress
    flow = connect_flow("api.allowed.test")
    await proxy.http_connect(flow)
    assert flow.response is None
    server = flow.server_conn
    server.address, server.sni = ("api.allowed.test", 443), None
    await proxy.server_connect(flow, server)
    assert server.error is None
    assert server.address == ("203.0.113.11", 443)
    assert server.sni == "api.allowed.test"
    assert lookups.asked == ["api.allowed.test"]
    # mitmproxy names the tunnel's requests (and any reconnect) by the pinned address: still vetted.
    again = tflow.tserver_conn()
    again.address, again.sni = ("203.0.113.11", 443), None
    await proxy.server_connect(flow, again)
    assert (again.error, again.address, again.sni) == (None, ("203.0.113.11", 443), "api.allowed.test")
    assert lookups.asked == ["api.allowed.test"]
    record = records(state)[-1]
    assert (record["decision"], record["rule"], record["ip"]) == ("allow", "*.allowed.test", "203.0.113.11")


async def test_plain_http_is_pinned_too(egress) -> None:
    proxy, lookups, _ = egress
    flow = plain_request("allowed.test")
    await proxy.requestheaders(flow)
    assert flow.response is None
    assert flow.request.host == "203.0.113.10"  # mitmproxy dials, and reuses, the vetted address
    assert flow.request.host_header == "allowed.test"
    server = flow.server_conn
    server.address = (flow.request.host, 80)
    await proxy.server_connect(flow, server)
    assert server.address == ("203.0.113.10", 80) and server.error is None
    assert lookups.asked == ["allowed.test"]
    stranger = tflow.tserver_conn()
    stranger.address = ("203.0.113.99", 80)  # an address no hook vetted for this client
    await proxy.server_connect(flow, stranger)
    assert stranger.error and "refused" in stranger.error


async def test_a_client_s_pins_go_with_it(egress) -> None:
    proxy, _, state = egress
    flow = plain_request("allowed.test")
    await proxy.requestheaders(flow)
    connections = proxy.shared.connections
    assert connections.pins and connections.resolved
    await proxy.hook("client_disconnected", flow.client_conn)
    assert (connections.pins, connections.resolved, connections.tunnels) == ({}, {}, {})
    server = flow.server_conn
    server.address = ("203.0.113.10", 80)  # vetted for a connection that is gone: not for a new one
    await proxy.server_connect(flow, server)
    assert server.error and "refused" in server.error
    assert records(state)[-1]["event"] == "error"
