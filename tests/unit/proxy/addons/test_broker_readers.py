"""The broker's records as the audit log's readers take them (corral.proxy.traffic): what the real
addon writes for a substitution, a reflection, a misuse and a restarted proxy's refusal is what
``corral audit summary`` counts, ``audit show --secrets`` keeps and the HAR shows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("mitmproxy")

from mitmproxy import http

from corral.proxy import control
from corral.proxy.traffic import SecretSummary, TrafficFilter, is_har_entry, summarize, summarize_secrets, to_har

from .harness import OPTIONS, Proxy, answered, connect_flow, records, session_proxy, tunnel_request, write_policy

VALUE = "the-real-value-0123"
TOKEN = "corral_secret_" + "3" * 32
HOST = "api.allowed.test"


def _set(proxy: Proxy) -> None:
    entry = {"name": "TOKEN", "placeholder": TOKEN, "value": VALUE, "allow": [f"GET {HOST}/v1/"], "in": ["header"]}
    line = json.dumps({"op": "secrets", "actor": "api-key:k1", "secrets": [entry]}).encode()
    reply = proxy.control("gateway", control.parse_message(line))
    assert reply is not None and reply["ok"] is True


async def _get(proxy: Proxy, host: str = HOST, echo: bytes | None = None) -> http.HTTPFlow:
    connect = connect_flow(host)
    await proxy.http_connect(connect)
    flow = tunnel_request(connect, host, "/v1/user")
    flow.request.headers["authorization"] = f"Bearer {TOKEN}"
    await proxy.requestheaders(flow)
    await proxy.request(flow)
    if flow.response is None:  # sent upstream: its answer
        answered(flow, echo or b"fine", **{"content-type": "text/plain"})
    await proxy.response(flow)
    return flow


async def test_what_the_broker_writes_is_what_the_readers_count(tmp_path: Path) -> None:
    state = tmp_path / "state"
    write_policy(state, ["allowed.test", "*.allowed.test"], mode="enforce")
    with session_proxy(corral_state_dir=str(state), **OPTIONS) as proxy:
        _set(proxy)
        await _get(proxy)  # substituted
        await _get(proxy, echo=b"you sent " + VALUE.encode() + b" and " + VALUE.encode())  # and reflected twice
        refused = await _get(proxy, host="allowed.test")  # not bound there: misuse
        assert refused.response is not None and refused.response.status_code == 403
        await proxy.done()
    with session_proxy(corral_state_dir=str(state), **OPTIONS) as again:  # restarted: no value yet
        unavailable = await _get(again)
        assert unavailable.response is not None and unavailable.response.status_code == 503
        await again.done()

    log = records(state)
    assert summarize_secrets(log) == [
        SecretSummary("allowed.test", "TOKEN", misuse=1, exfiltration=1),
        SecretSummary(HOST, "TOKEN", substitutions=2, reflections=2, unavailable=1),
    ]
    kept = [r["event"] for r in TrafficFilter(secrets=True).apply(log)]
    assert kept == ["secrets", "secret", "secret", "secret", "block", "block"]
    hosts = {row.host: (row.requests, row.blocked) for row in summarize(log)}
    assert hosts == {HOST: (2, 1), "allowed.test": (0, 1)}
    entries = to_har(log, creator_version="test")["log"]["entries"]
    assert len(entries) == sum(is_har_entry(r) for r in log) == 4
    misuse = next(e for e in entries if e["_rule"] == "secret-misuse")
    assert (misuse["_secret"], misuse["_location"], misuse["_exfiltration"]) == ("TOKEN", "header", True)
    assert VALUE not in json.dumps(log)  # nothing a reader shows holds the value
