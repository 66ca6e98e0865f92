"""Audit records (corral.proxy.addons.trail): one record per CONNECT, request, refusal and failure,
naming the agent action in flight, with secrets redacted; each of the record type's shape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("mitmproxy")

from mitmproxy import http
from mitmproxy.test import tflow, tutils

from corral.proxy import control
from corral.proxy.audit import verify

from .harness import OPTIONS, connect_flow, plain_request, records, session_proxy, tunnel_request, write_policy


async def test_a_request_record_carries_the_action_in_flight(egress) -> None:
    proxy, _, state = egress
    proxy.control("controller", control.ActionEvent("a7", "start"))
    flow = connect_flow("allowed.test")
    await proxy.http_connect(flow)
    inner = tunnel_request(flow, "allowed.test", "/x?token=abc&q=1")
    inner.client_conn.sni = "allowed.test"
    await proxy.requestheaders(inner)
    proxy.control("controller", control.ActionEvent("a7", "end"))
    inner.response = tutils.tresp(headers=http.Headers(((b"set-cookie", b"id=1"), (b"content-type", b"text/html"))))
    await proxy.response(inner)
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
    await proxy.http_connect(later)
    assert records(state)[-1]["action"] is None


async def test_errors_are_logged(egress) -> None:
    proxy, _, state = egress
    flow = connect_flow("allowed.test")
    await proxy.http_connect(flow)
    inner = tunnel_request(flow, "allowed.test")
    await proxy.requestheaders(inner)
    inner.error = tflow.terr("connection reset")
    await proxy.error(inner)
    record = records(state)[-1]
    assert (record["event"], record["error"], record["host"]) == ("error", "connection reset", "allowed.test")


async def test_the_proxy_s_start_is_its_first_record_and_its_end_closes_the_log(tmp_path: Path) -> None:
    write_policy(tmp_path, ["allowed.test"], mode="report")
    with session_proxy(corral_session="ses_test", corral_state_dir=str(tmp_path)) as proxy:
        await proxy.running()
        await proxy.done()
        assert proxy.shared.journal.log is None
    (started,) = records(tmp_path)
    assert (started["event"], started["session"], started["mode"], started["allow"]) == (
        "proxy",
        "ses_test",
        "report",
        ["allowed.test"],
    )
    assert started["hermetic"] is None and started["recorded_responses"] is None and started["version"]
    assert verify(tmp_path / "audit.jsonl").ok


async def test_a_refused_request_is_recorded_once(egress) -> None:
    proxy, _, state = egress
    flow = connect_flow("blocked.test")
    await proxy.http_connect(flow)
    inner = tunnel_request(flow, "blocked.test")
    await proxy.requestheaders(inner)
    await proxy.request(inner)
    await proxy.response(inner)  # mitmproxy calls it for an answer an addon gave, too
    assert [r["event"] for r in records(state)][-2:] == ["connect", "block"]
    failed = tflow.tflow(req=tutils.treq(), err=True)
    await proxy.error(failed)  # a flow no decision was made for: nothing to record
    assert [r["event"] for r in records(state)][-1] == "block"


async def test_the_records_keep_the_format_written_before_the_addon_split(tmp_path: Path) -> None:
    """The scenario that wrote tests/unit/proxy/fixtures/audit-before-split.jsonl (with the single
    ``Egress`` addon), run again: each record has the same fields as then."""
    from mitmproxy.proxy import server_hooks

    before = Path(__file__).parents[1] / "fixtures" / "audit-before-split.jsonl"
    (tmp_path / "audit.jsonl").write_text('{"torn":\n')  # the reopened log says "recovered"
    write_policy(tmp_path, ["allowed.test"], mode="enforce")
    with session_proxy(**{**OPTIONS, "corral_session": "ses_old", "corral_state_dir": str(tmp_path)}) as proxy:
        await proxy.running()
        proxy.control("controller", control.ActionEvent("a1.boot", "start"))
        connect = connect_flow("allowed.test")
        await proxy.http_connect(connect)
        inner = tunnel_request(connect, "allowed.test", "/page?token=abc")
        await proxy.requestheaders(inner)
        inner.response = tutils.tresp(headers=http.Headers(((b"content-type", b"text/html"),)))
        await proxy.response(inner)
        await proxy.requestheaders(plain_request("blocked.test"))
        failed = tunnel_request(connect, "allowed.test", "/x")
        await proxy.requestheaders(failed)
        failed.error = tflow.terr("connection reset")
        await proxy.error(failed)
        stray = tflow.tserver_conn()
        stray.address = ("198.51.100.7", 443)
        await proxy.hook(
            "server_connect", server_hooks.ServerConnectionHookData(server=stray, client=tflow.tclient_conn())
        )
        proxy.control("controller", control.ActionEvent("a1.boot", "end"))
        proxy.control("gateway", control.SetPolicy(("allowed.test", "other.test"), "report", "api-key:k1"))
        await proxy.done()
    log = tmp_path / "audit.jsonl"
    torn, *written = log.read_text().splitlines(keepends=True)
    assert torn == '{"torn":\n'  # kept in place, as before (verify names it)
    log.write_text("".join(written))  # as the fixture keeps it
    old = [json.loads(line) for line in before.read_text().splitlines()]
    assert [(r["event"], sorted(r)) for r in records(tmp_path)] == [(r["event"], sorted(r)) for r in old]
    assert verify(log).ok


async def test_traffic_without_credentials_during_a_human_action_is_never_charged_to_the_human(egress) -> None:
    # The proxy cannot tell Chromium's requests from an agent process's that left its credentials out:
    # neither is vouched for, so neither is charged to the person (corral.proxy.attribution.unvouched).
    proxy, _, state = egress
    proxy.control("controller", control.ActionEvent("h1.boot", "start", actor="human:lnk_3kq9x0a1b2c4"))
    flow = connect_flow("allowed.test")
    await proxy.http_connect(flow)
    inner = tunnel_request(flow, "allowed.test", "/page")
    await proxy.requestheaders(inner)
    inner.response = tutils.tresp()
    await proxy.response(inner)
    denied = connect_flow("denied.test")
    await proxy.http_connect(denied)
    failed = tunnel_request(flow, "allowed.test", "/gone")
    await proxy.requestheaders(failed)
    failed.error = tflow.terr("connection reset")
    await proxy.error(failed)
    proxy.control("controller", control.ActionEvent("h1.boot", "end"))
    proxy.control("controller", control.ActionEvent("a2.boot", "start"))
    agents = connect_flow("allowed.test")
    await proxy.http_connect(agents)
    during = records(state)[-5:-1]
    assert [(r["event"], r["action"], r.get("actor")) for r in during] == [
        ("connect", None, None),
        ("request", None, None),
        ("connect", None, None),
        ("error", None, None),
    ]
    assert during[2]["decision"] == "deny"
    agent = records(state)[-1]
    assert agent["action"] == "a2.boot" and "actor" not in agent  # the agent's records are as before
    assert verify(state / "audit.jsonl").ok


async def test_a_request_as_large_as_a_sender_makes_it_is_recorded_capped_and_marked(egress) -> None:
    from corral.proxy.audit import CUT_MARK, MAX_HEADERS, MAX_URL_CHARS

    proxy, _, state = egress
    connect = connect_flow("allowed.test")
    await proxy.http_connect(connect)
    inner = tunnel_request(connect, "allowed.test", "/x?q=" + "a" * (1 << 20))
    inner.request.headers["x-huge"] = "h" * 200_000
    for n in range(3000):
        inner.request.headers.add(f"x-many-{n}", str(n))
    await proxy.requestheaders(inner)
    inner.response = tutils.tresp()
    await proxy.response(inner)
    raw = (state / "audit.jsonl").read_bytes().splitlines()[-1]
    record = records(state)[-1]
    assert len(raw) < 128 << 10
    assert record["event"] == "request" and record["truncated"] == ["request_headers", "url"]
    assert len(record["url"]) == MAX_URL_CHARS and record["url"].endswith(CUT_MARK)
    assert len(record["request_headers"]) == MAX_HEADERS + 1 and record["request_headers"][-1][0] == CUT_MARK
    assert verify(state / "audit.jsonl").ok


async def test_past_its_budget_the_proxy_counts_and_the_gateway_s_status_brings_a_tally(tmp_path: Path) -> None:
    write_policy(tmp_path, ["allowed.test"], mode="enforce")
    with session_proxy(corral_state_dir=str(tmp_path), corral_audit_max_bytes=16_384, **OPTIONS) as proxy:
        await proxy.running()
        for n in range(200):
            connect = connect_flow("allowed.test")
            await proxy.http_connect(connect)
            inner = tunnel_request(connect, "allowed.test", f"/n/{n}")
            await proxy.requestheaders(inner)
            inner.response = tutils.tresp()
            await proxy.response(inner)
        status = proxy.control("gateway", control.Status())
        assert status is not None
        found = records(tmp_path)
        assert status["head"]["seq"] == found[-1]["seq"] and found[-1]["event"] == "tally"
        await proxy.done()
    found = records(tmp_path)
    assert sum(1 for r in found if r["event"] == "budget") == 1
    written = sum(1 for r in found if r["event"] == "request")
    tally = found[-1]
    counted = {(row["host"], row["event"]): row["count"] for row in tally["counts"]}
    assert written + counted[("allowed.test", "request")] == 200 and counted[("allowed.test", "connect")] > 0
    assert (tmp_path / "audit.jsonl").stat().st_size < 16_384 + (32 << 10)
    assert verify(tmp_path / "audit.jsonl").ok
