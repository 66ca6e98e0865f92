"""Attribution (corral.proxy.addons.attribution): a command's requests are charged to the action
its proxy credentials name, tunnel and all, whatever the controller runs meanwhile; the
credentials never go further than the proxy."""

from __future__ import annotations

import base64

import pytest

pytest.importorskip("mitmproxy")

from mitmproxy import http
from mitmproxy.proxy import server_hooks
from mitmproxy.test import tflow

from corral.proxy import control
from corral.proxy.responses import RESPONSES_FILE

from .harness import answered, connect_flow, plain_request, read_flows, records, tunnel_request


def credentials(action: str, user: str = "corral-action") -> str:
    return "Basic " + base64.b64encode(f"{user}:{action}".encode()).decode()


def command_connect(host: str, action: str) -> http.HTTPFlow:
    flow = connect_flow(host)
    flow.request.headers["Proxy-Authorization"] = credentials(action)
    return flow


async def test_a_tunnel_is_charged_to_the_action_its_connect_names_and_so_is_every_request_in_it(egress) -> None:
    proxy, _, state = egress
    proxy.control("controller", control.ActionEvent("a9.boot", "start"))  # another action in flight
    connect = command_connect("allowed.test", "a3.boot")
    await proxy.http_connect(connect)
    assert "proxy-authorization" not in connect.request.headers
    inner = tunnel_request(connect, "allowed.test", "/simple/pkg/")
    await proxy.requestheaders(inner)
    await proxy.response(answered(inner, b"ok"))
    connected, requested = records(state)[-2:]
    assert (connected["event"], connected["action"], connected["action_source"]) == ("connect", "a3.boot", "command")
    assert (requested["event"], requested["action"], requested["action_source"]) == ("request", "a3.boot", "command")
    assert "proxy-authorization" not in {name.lower() for name, _ in requested["request_headers"]}
    # The controller's action is still what everything else is charged to.
    browser = connect_flow("allowed.test")
    await proxy.http_connect(browser)
    assert records(state)[-1]["action"] == "a9.boot" and "action_source" not in records(state)[-1]


async def test_the_tunnel_keeps_its_action_after_the_action_ended(egress) -> None:
    proxy, _, state = egress
    proxy.control("controller", control.ActionEvent("a3.boot", "start"))
    connect = command_connect("allowed.test", "a3.boot")
    await proxy.http_connect(connect)
    proxy.control("controller", control.ActionEvent("a3.boot", "end"))  # a background process runs on
    proxy.control("controller", control.ActionEvent("a4.boot", "start"))
    later = tunnel_request(connect, "allowed.test", "/later")
    await proxy.requestheaders(later)
    await proxy.response(answered(later, b"late"))
    assert (records(state)[-1]["action"], records(state)[-1]["action_source"]) == ("a3.boot", "command")


async def test_a_plain_http_request_is_charged_to_the_action_it_names_and_its_credentials_stay_here(egress) -> None:
    proxy, _, state = egress
    flow = plain_request("allowed.test", path="/file.txt")
    flow.request.headers["Proxy-Authorization"] = credentials("a5.boot")
    await proxy.requestheaders(flow)
    assert "proxy-authorization" not in flow.request.headers  # mitmproxy sends these headers upstream
    await proxy.response(answered(flow, b"text"))
    record = records(state)[-1]
    assert (record["event"], record["action"], record["action_source"]) == ("request", "a5.boot", "command")
    # The next request on the same connection names none: the controller's (none in flight).
    again = tflow.tflow(client_conn=flow.client_conn, req=plain_request("allowed.test").request)
    await proxy.requestheaders(again)
    await proxy.response(answered(again, b"text"))
    assert records(state)[-1]["action"] is None and "action_source" not in records(state)[-1]


async def test_a_refused_request_is_charged_to_the_command_that_made_it(egress) -> None:
    proxy, _, state = egress
    connect = command_connect("blocked.test", "a6.boot")
    await proxy.http_connect(connect)
    inner = tunnel_request(connect, "blocked.test", "/")
    await proxy.requestheaders(inner)
    assert inner.response is not None and inner.response.status_code == 403
    connected, blocked = records(state)[-2:]
    assert (connected["decision"], connected["action"], connected["action_source"]) == ("deny", "a6.boot", "command")
    assert (blocked["event"], blocked["action"], blocked["action_source"]) == ("block", "a6.boot", "command")
    plain = plain_request("blocked.test")
    plain.request.headers["Proxy-Authorization"] = credentials("a7.boot")
    await proxy.requestheaders(plain)
    assert (records(state)[-1]["event"], records(state)[-1]["action"]) == ("block", "a7.boot")


@pytest.mark.parametrize(
    "value",
    [
        credentials("a1.boot", user="someone"),
        credentials("not an id"),
        "Bearer abc",
        "Basic %%%",
    ],
)
async def test_other_proxy_credentials_are_taken_off_and_name_nothing(egress, value: str) -> None:
    proxy, _, state = egress
    proxy.control("controller", control.ActionEvent("a2.boot", "start"))
    connect = connect_flow("allowed.test")
    connect.request.headers["Proxy-Authorization"] = value
    await proxy.http_connect(connect)
    assert "proxy-authorization" not in connect.request.headers
    plain = plain_request("allowed.test")
    plain.request.headers.add("Proxy-Authorization", value)
    plain.request.headers.add("Proxy-Authorization", credentials("a8.boot"))  # the first that names one
    await proxy.requestheaders(plain)
    assert plain.request.headers.get_all("proxy-authorization") == []
    await proxy.response(answered(plain, b"ok"))
    connected, requested = records(state)[-2:]
    assert (connected["event"], connected["action"], "action_source" in connected) == ("connect", "a2.boot", False)
    assert (requested["event"], requested["action"], requested["action_source"]) == ("request", "a8.boot", "command")


async def test_recorded_responses_keep_no_proxy_credentials(recording) -> None:
    proxy, _, state = recording
    connect = command_connect("api.allowed.test", "a3.boot")
    await proxy.http_connect(connect)
    inner = tunnel_request(connect, "api.allowed.test", "/page")
    inner.request.headers["Proxy-Authorization"] = credentials("a3.boot")  # some clients send it inside too
    await proxy.requestheaders(inner)
    inner.request.data.host = "203.0.113.11"
    await proxy.response(answered(inner, b"<p>page</p>"))
    proxy.shared.responses.close()
    (kept,) = read_flows(state / RESPONSES_FILE)
    assert "proxy-authorization" not in kept.request.headers
    assert kept.response is not None and kept.response.content == b"<p>page</p>"


async def test_a_connection_refused_before_any_request_is_charged_to_its_tunnel(egress) -> None:
    proxy, _, state = egress
    connect = command_connect("allowed.test", "a3.boot")
    await proxy.http_connect(connect)
    stray = tflow.tserver_conn()
    stray.address = ("198.51.100.7", 443)  # an address nothing vetted for this client
    await proxy.hook("server_connect", server_hooks.ServerConnectionHookData(server=stray, client=connect.client_conn))
    record = records(state)[-1]
    assert (record["event"], record["action"], record["action_source"]) == ("error", "a3.boot", "command")


async def test_a_closed_connection_forgets_its_tunnel_s_action(egress) -> None:
    proxy, _, _ = egress
    connect = command_connect("allowed.test", "a3.boot")
    await proxy.http_connect(connect)
    assert connect.client_conn.id in proxy.shared.connections.commands
    await proxy.hook("client_disconnected", connect.client_conn)
    assert connect.client_conn.id not in proxy.shared.connections.commands


async def test_a_flow_without_credentials_during_a_human_action_goes_to_the_agent_s_action_in_flight(egress) -> None:
    proxy, _, state = egress
    proxy.control("controller", control.ActionEvent("a5.boot", "start"))  # the agent's, still running
    proxy.control("controller", control.ActionEvent("h1.boot", "start", actor="human:lnk_3kq9x0a1b2c4"))
    flow = connect_flow("allowed.test")  # no Proxy-Authorization: an agent process that left it out
    await proxy.http_connect(flow)
    record = records(state)[-1]
    assert record["action"] == "a5.boot" and "actor" not in record, record
    proxy.control("controller", control.ActionEvent("a5.boot", "end"))
    alone = connect_flow("allowed.test")
    await proxy.http_connect(alone)
    record = records(state)[-1]
    assert record["action"] is None and "actor" not in record, record  # a human's alone: charged to none
