"""Brokered secrets at egress (corral.proxy.addons.broker): values put in for bound requests only,
misuse refused and flagged, reflected values scrubbed, and no value in anything the proxy writes."""

from __future__ import annotations

import base64
import gzip
import json
import stat
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mitmproxy")

from mitmproxy import http
from mitmproxy.flow import Error
from mitmproxy.test import tflow
from mitmproxy.websocket import WebSocketMessage
from wsproto.frame_protocol import Opcode

from corral.proxy import control
from corral.proxy.addons.state import NOTE, FlowNote
from corral.proxy.attribution import Attribution
from corral.proxy.audit import verify
from corral.proxy.policy import Decision
from corral.proxy.vetting import Verdict

from .harness import (
    OPTIONS,
    Proxy,
    answered,
    connect_flow,
    plain_request,
    records,
    session_proxy,
    tunnel_request,
    write_policy,
)

VALUE = 'tok-p@ss/w rd+&="é'  # every character an encoding changes
TOKEN = "corral_secret_" + "1" * 32
OTHER = "corral_secret_" + "2" * 32  # another secret of this session, bound to the query
STRANGER = "corral_secret_" + "f" * 32  # not this session's
OTHER_VALUE = "second-secret-value"
HOST = "api.allowed.test"


def _set(proxy: Proxy, *entries: dict[str, Any], actor: str = "api-key:k1") -> dict[str, Any]:
    line = json.dumps({"op": "secrets", "actor": actor, "secrets": list(entries)}).encode()
    reply = proxy.control("gateway", control.parse_message(line))
    assert reply is not None
    return reply


def _token(value: str | None = VALUE, **fields: Any) -> dict[str, Any]:
    entry = {
        "name": "TOKEN",
        "placeholder": TOKEN,
        "value": value,
        "allow": [f"GET,POST {HOST}/v1/"],
        "in": ["header", "body", "basic"],
    }
    return {**entry, **fields}


def _other(value: str | None = OTHER_VALUE) -> dict[str, Any]:
    return {"name": "OTHER", "placeholder": OTHER, "value": value, "allow": [f"{HOST}/v1/"], "in": ["query"]}


def _encodings(value: str) -> list[bytes]:
    raw = value.encode()
    return [
        raw,
        urllib.parse.quote(raw, safe="").encode(),
        urllib.parse.quote_plus(raw).encode(),
        json.dumps(value)[1:-1].encode(),
        base64.b64encode(raw),
        base64.urlsafe_b64encode(raw),
    ]


async def _send(
    proxy: Proxy,
    path: str = "/v1/repos",
    method: str = "POST",
    headers: dict[str, str] | None = None,
    body: bytes = b"",
    host: str = HOST,
) -> http.HTTPFlow:
    connect = connect_flow(host)
    await proxy.http_connect(connect)
    flow = tunnel_request(connect, host, path, method)
    del flow.request.headers["authorization"]
    for name, value in (headers or {}).items():
        flow.request.headers[name] = value
    flow.request.content = body
    await proxy.requestheaders(flow)
    await proxy.request(flow)
    return flow


@pytest.fixture
def broker(tmp_path: Path) -> Any:
    """A recording proxy with the two secrets set."""
    state = tmp_path / "state"
    write_policy(state, ["allowed.test", "*.allowed.test"], mode="enforce")
    with session_proxy(corral_state_dir=str(state), corral_keep_responses=True, **OPTIONS) as proxy:
        _set(proxy, _token(), _other())
        yield proxy, state
        if proxy.shared.responses is not None:
            proxy.shared.responses.close()


def _secret_records(state: Path) -> list[dict[str, Any]]:
    return [dict(r) for r in records(state) if r["event"] == "secret"]


def _refused(flow: http.HTTPFlow, status: int = 403, rule: str = "secret-misuse") -> str:
    assert flow.response is not None and flow.response.status_code == status
    assert flow.response.headers["X-Corral-Rule"] == rule
    return flow.response.get_text() or ""


# -- substitution ---------------------------------------------------------------------------------


async def test_a_bearer_header_gets_the_value_and_the_records_keep_the_placeholder(broker) -> None:
    proxy, state = broker
    flow = await _send(proxy, headers={"authorization": f"Bearer {TOKEN}", "x-api-key": TOKEN})
    assert flow.response is None
    assert flow.request.headers["authorization"] == f"Bearer {VALUE}"  # raw: latin-1 view of UTF-8
    (record,) = _secret_records(state)
    assert (record["secret"], record["location"], record["count"], record["rule"]) == (
        "TOKEN",
        "header",
        2,
        "secret-substitution",
    )
    assert (record["host"], record["method"], record["url"]) == (HOST, "POST", f"https://{HOST}/v1/repos")
    await proxy.response(answered(flow, b"ok"))
    assert flow.request.headers["authorization"] == f"Bearer {TOKEN}"  # put back before the trail saw it
    request = records(state)[-1]
    assert request["event"] == "request" and request["status"] == 200


async def test_the_query_gets_the_value_percent_encoded(broker) -> None:
    proxy, state = broker
    flow = await _send(proxy, path=f"/v1/search?key={OTHER}&q=1", method="GET")
    assert flow.request.path == f"/v1/search?key={urllib.parse.quote(OTHER_VALUE, safe='')}&q=1"
    assert _secret_records(state)[0]["location"] == "query"


@pytest.mark.parametrize(
    ("content_type", "encoded"),
    [
        ("application/x-www-form-urlencoded", urllib.parse.quote_plus(VALUE).encode()),
        ("application/json", json.dumps(VALUE)[1:-1].encode()),
        ("multipart/form-data; boundary=b", VALUE.encode()),
        ("text/plain; charset=utf-8", VALUE.encode()),
    ],
)
async def test_each_body_type_gets_the_value_encoded_for_it(broker, content_type: str, encoded: bytes) -> None:
    proxy, state = broker
    body = {
        "application/x-www-form-urlencoded": f"user=me&password={TOKEN}".encode(),
        "application/json": json.dumps({"password": TOKEN}).encode(),
        "multipart/form-data; boundary=b": (
            f'--b\r\nContent-Disposition: form-data; name="password"\r\n\r\n{TOKEN}\r\n--b--\r\n'.encode()
        ),
        "text/plain; charset=utf-8": f"token {TOKEN}".encode(),
    }[content_type]
    flow = await _send(proxy, headers={"content-type": content_type}, body=body)
    assert flow.response is None and flow.request.content == body.replace(TOKEN.encode(), encoded)
    if content_type == "application/json":
        assert json.loads(flow.request.content or b"") == {"password": VALUE}
    assert int(flow.request.headers["content-length"]) == len(flow.request.content or b"")
    assert _secret_records(state)[0]["location"] == "body"


async def test_a_gzip_body_is_decoded_substituted_and_encoded_again(broker) -> None:
    proxy, _ = broker
    body = gzip.compress(json.dumps({"password": TOKEN}).encode())
    connect = connect_flow(HOST)
    await proxy.http_connect(connect)
    flow = tunnel_request(connect, HOST, "/v1/login", "POST")
    flow.request.headers["content-type"] = "application/json"
    flow.request.headers["content-encoding"] = "gzip"
    flow.request.raw_content = body
    await proxy.requestheaders(flow)
    await proxy.request(flow)
    assert flow.response is None
    assert json.loads(gzip.decompress(flow.request.raw_content or b"")) == {"password": VALUE}


async def test_an_undecodable_body_is_refused_while_secrets_are_live(broker) -> None:
    proxy, state = broker
    connect = connect_flow(HOST)
    await proxy.http_connect(connect)
    flow = tunnel_request(connect, HOST, "/v1/login", "POST")
    flow.request.headers["content-encoding"] = "gzip"
    flow.request.raw_content = b"not gzip at all"
    await proxy.requestheaders(flow)
    await proxy.request(flow)
    assert "cannot be read for secrets" in _refused(flow)
    assert records(state)[-1]["event"] == "block"


async def test_content_encodings_given_twice_are_read_folded_as_mitmproxy_folds_them(broker) -> None:
    """Two Content-Encoding headers are one value ``gzip, gzip``, as ``Headers.get`` folds them: no
    coding the broker decodes, so the body is refused (the first alone would let a second hide)."""
    proxy, state = broker
    connect = connect_flow(HOST)
    await proxy.http_connect(connect)
    flow = tunnel_request(connect, HOST, "/v1/login", "POST")
    flow.request.headers.fields += ((b"Content-Encoding", b"gzip"), (b"content-encoding", b"gzip"))
    flow.request.headers["content-type"] = "text/plain"
    flow.request.raw_content = gzip.compress(gzip.compress(f"t={TOKEN}".encode()))
    await proxy.requestheaders(flow)
    await proxy.request(flow)
    _refused(flow)
    assert "unknown content encoding 'gzip, gzip'" in records(state)[-1]["reason"]


async def test_basic_credentials_are_decoded_substituted_and_encoded_again(broker) -> None:
    proxy, state = broker
    header = "Basic " + base64.b64encode(f"me:{TOKEN}".encode()).decode()
    flow = await _send(proxy, headers={"authorization": header})
    assert flow.response is None
    sent = dict(flow.request.headers.fields)[b"authorization"]
    assert base64.b64decode(sent.split(b" ", 1)[1]) == b"me:" + VALUE.encode()
    assert _secret_records(state)[0]["location"] == "basic"


# -- misuse ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "location", "words"),
    [
        ({"headers": {"authorization": f"Bearer {TOKEN}"}, "host": "allowed.test"}, "header", "not bound to"),
        ({"headers": {"authorization": f"Bearer {TOKEN}"}, "method": "DELETE"}, "header", "not bound to"),
        ({"headers": {"authorization": f"Bearer {TOKEN}"}, "path": "/v2/repos"}, "header", "not bound to"),
        ({"path": f"/v1/search?token={TOKEN}"}, "query", "only: header, body, basic"),
        ({"path": f"/v1/{TOKEN}/x"}, "path", "in a URL"),
        ({"headers": {"x-key": OTHER}}, "header", "only: query"),
        ({"headers": {"content-type": "application/octet-stream"}, "body": TOKEN.encode()}, "body", "type"),
    ],
)
async def test_a_placeholder_anywhere_else_is_refused_and_flagged(
    broker, kwargs: dict[str, Any], location: str, words: str
) -> None:
    proxy, state = broker
    flow = await _send(proxy, **kwargs)
    page = _refused(flow)
    assert words in page and "secret" in page
    block = records(state)[-1]
    assert block["event"] == "block" and block["rule"] == "secret-misuse"
    assert (block["location"], block["exfiltration"]) == (location, True)
    assert block["secret"] in ("TOKEN", "OTHER") and block["secret"] in block["reason"]
    assert not _secret_records(state)  # nothing was substituted


async def test_a_revoked_placeholder_is_refused_and_an_unknown_one_passes_untouched(broker) -> None:
    proxy, state = broker
    reply = _set(proxy, _token())  # OTHER revoked
    assert reply["secrets"]["names"] == ["TOKEN"]
    flow = await _send(proxy, path=f"/v1/search?key={OTHER}", method="GET")
    assert "OTHER was revoked" in _refused(flow)
    assert records(state)[-1]["secret"] == "OTHER"
    stranger = await _send(proxy, headers={"x-old": STRANGER}, path=f"/v1/x?k={STRANGER}")
    assert stranger.response is None and stranger.request.headers["x-old"] == STRANGER


async def test_a_real_value_from_inside_is_refused_and_never_recorded(broker) -> None:
    proxy, state = broker
    for form in _encodings(VALUE):
        flow = await _send(proxy, headers={"content-type": "text/plain"}, body=b"leak=" + form)
        assert "value of secret TOKEN itself" in _refused(flow)
    flow = await _send(proxy, headers={"x-leak": VALUE})
    assert "TOKEN" in _refused(flow)
    assert records(state)[-1]["location"] == "header"
    flow = await _send(proxy, path=f"/v1/x?q={urllib.parse.quote(VALUE)}", host="allowed.test")
    _refused(flow)
    assert records(state)[-1]["location"] == "query"
    _no_value_written(state)


# -- unavailable after a restart ------------------------------------------------------------------


async def test_a_restarted_proxy_refuses_its_placeholders_until_the_values_come_again(broker, tmp_path: Path) -> None:
    proxy, state = broker
    saved = state / "secrets.json"
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    assert all(form not in saved.read_bytes() for form in _encodings(VALUE) + _encodings(OTHER_VALUE))
    await proxy.done()
    with session_proxy(corral_state_dir=str(state), **OPTIONS) as again:
        status = again.control("gateway", control.Status())
        assert status is not None and status["secrets"] == {
            "generation": 1,
            "names": ["OTHER", "TOKEN"],
            "loaded": False,
        }
        flow = await _send(again, headers={"authorization": f"Bearer {TOKEN}"})
        assert "not loaded" in _refused(flow, 503, "secret-unavailable")
        unavailable = records(state)[-1]
        assert (unavailable["secret"], unavailable["location"]) == ("TOKEN", "header")
        assert "exfiltration" not in unavailable  # no misuse: the value is only not there yet
        elsewhere = await _send(again, headers={"authorization": f"Bearer {TOKEN}"}, host="allowed.test")
        _refused(elsewhere)  # misuse is still misuse
        reply = _set(again, _token(), _other(), actor="gateway:reassert")
        assert reply["secrets"] == {"generation": 2, "names": ["OTHER", "TOKEN"], "loaded": True}
        change = [r for r in records(state) if r["event"] == "secrets"][-1]
        assert (change["restored"], change["added"], change["actor"]) == (["TOKEN", "OTHER"], [], "gateway:reassert")
        flow = await _send(again, headers={"authorization": f"Bearer {TOKEN}"})
        assert flow.response is None and flow.request.headers["authorization"] == f"Bearer {VALUE}"
    assert verify(state / "audit.jsonl").ok


async def test_a_restarted_proxy_reaches_no_bound_host_until_the_values_come_again(broker) -> None:
    """A bound host may hand back a value it stored; a restarted proxy cannot scrub a value it does not
    hold, so no request (placeholder or not) reaches a host a secret is bound to till then."""
    proxy, state = broker
    await proxy.done()
    with session_proxy(corral_state_dir=str(state), **OPTIONS) as again:
        recall = await _send(again, path="/v1/recall", method="GET")
        page = _refused(recall, 503, "secret-unavailable")
        assert "restarted" in page and "TOKEN" in page
        block = records(state)[-1]
        assert (block["event"], block["status"], block["rule"]) == ("block", 503, "secret-unavailable")
        assert "exfiltration" not in block and "gateway to send the secrets again" in block["reason"]
        elsewhere = await _send(again, path="/v1/recall", method="GET", host="allowed.test")
        assert elsewhere.response is None  # no secret is bound there
        _set(again, _token(), _other(), actor="gateway:reassert")
        recall = await _send(again, path="/v1/recall", method="GET")
        assert recall.response is None
        await again.response(answered(recall, b"stored: " + VALUE.encode()))
        assert recall.response is not None and recall.response.content == b"stored: " + TOKEN.encode()
    _no_value_written(state)


async def test_an_unreadable_secrets_file_is_a_warning_not_a_dead_proxy(tmp_path: Path, caplog) -> None:
    write_policy(tmp_path, ["allowed.test"])
    (tmp_path / "secrets.json").write_text("{not json")
    with session_proxy(corral_state_dir=str(tmp_path), **OPTIONS) as proxy:
        status = proxy.control("gateway", control.Status())
        assert status is not None and status["secrets"] == {"generation": 0, "names": [], "loaded": True}
    assert "cannot read the persisted secrets" in caplog.text
    assert all(r.levelname != "ERROR" for r in caplog.records)


# -- answers --------------------------------------------------------------------------------------


def _reflecting_body() -> bytes:
    raw = VALUE.encode()
    parts = _encodings(VALUE) + [base64.b64encode(b"x" * offset + raw + b"tail") for offset in (1, 2)]
    return b"<html><title>" + b"|".join(parts) + b"</title></html>"


async def test_a_reflected_value_in_every_encoding_reaches_the_sandbox_as_the_placeholder(broker) -> None:
    proxy, state = broker
    flow = await _send(proxy, headers={"authorization": f"Bearer {TOKEN}"})
    answered(flow, _reflecting_body(), **{"content-type": "text/html", "x-echo": f"Bearer {VALUE}"})
    await proxy.response(flow)
    assert flow.response is not None
    page = flow.response.content or b""
    assert page.count(TOKEN.encode()) == 8
    for form in _encodings(VALUE):
        assert form not in page
    assert flow.response.headers["x-echo"] == f"Bearer {TOKEN}"
    reflections = {r["location"]: r for r in _secret_records(state) if r["rule"] == "secret-reflection"}
    assert reflections["response-body"]["count"] == 8 and reflections["response-header"]["count"] == 1
    assert records(state)[-1]["event"] == "request"


async def test_a_gzip_answer_is_scrubbed_and_stays_gzip(broker) -> None:
    proxy, _ = broker
    flow = await _send(proxy, method="GET")
    answered(flow, gzip.compress(b"token=" + VALUE.encode()), **{"content-encoding": "gzip"})
    await proxy.response(flow)
    assert flow.response is not None and flow.response.headers["content-encoding"] == "gzip"
    assert gzip.decompress(flow.response.raw_content or b"") == b"token=" + TOKEN.encode()


async def test_an_undecodable_answer_while_secrets_are_live_is_refused(broker) -> None:
    proxy, state = broker
    flow = await _send(proxy, method="GET")
    answered(flow, b"\x00garbage", **{"content-encoding": "gzip"})
    await proxy.response(flow)
    _refused(flow, 502, "secret-reflection")
    block = records(state)[-1]
    assert (block["event"], block["status"], block["rule"]) == ("block", 502, "secret-reflection")


# -- values no longer live ------------------------------------------------------------------------


@pytest.mark.parametrize("change", ["revoke", "rotate"])
async def test_a_value_no_longer_live_is_still_scrubbed_and_refused_from_inside(broker, change: str) -> None:
    """Revoking or rotating in Corral revokes nothing at the provider: a host that stored the old value
    may hand it back, and the sandbox may have learnt it; both are met as for a live one."""
    proxy, state = broker
    rotated = "rotated-value-0123456789"
    _set(proxy, _other()) if change == "revoke" else _set(proxy, _token(rotated), _other())
    flow = await _send(proxy, method="GET", host="allowed.test", path="/recall")
    assert flow.response is None
    answered(flow, b"stored: " + VALUE.encode() + b" " + base64.b64encode(VALUE.encode()), **{"x-echo": VALUE})
    await proxy.response(flow)
    assert flow.response is not None
    page = flow.response.content or b""
    assert page.startswith(b"stored: " + TOKEN.encode()) and page.count(TOKEN.encode()) == 2
    assert all(form not in page for form in _encodings(VALUE))
    assert flow.response.headers["x-echo"] == TOKEN
    reflections = [r for r in _secret_records(state) if r["rule"] == "secret-reflection"]
    assert {(r["secret"], r["location"]) for r in reflections} == {
        ("TOKEN", "response-body"),
        ("TOKEN", "response-header"),
    }
    leak = await _send(proxy, headers={"content-type": "text/plain"}, body=b"leak=" + VALUE.encode())
    assert "secret TOKEN itself" in _refused(leak)
    if change == "rotate":  # the live value is what a placeholder becomes
        flow = await _send(proxy, headers={"authorization": f"Bearer {TOKEN}"})
        assert flow.response is None and flow.request.headers["authorization"] == f"Bearer {rotated}"
    _no_value_written(state)


async def test_a_value_no_longer_live_is_forgotten_when_the_proxy_restarts(broker) -> None:
    proxy, state = broker
    _set(proxy, _other())
    assert proxy.shared.secrets.retired
    await proxy.done()
    with session_proxy(corral_state_dir=str(state), **OPTIONS) as again:
        assert not again.shared.secrets.retired  # never persisted
    _no_value_written(state)


# -- WebSocket ------------------------------------------------------------------------------------


def _websocket() -> http.HTTPFlow:
    flow = tflow.twebsocketflow()
    verdict = Verdict(Decision(True, "allowed"), "allow")
    flow.metadata[NOTE] = FlowNote(0.0, Attribution.controller(None), verdict, HOST, logged=True)
    return flow


async def _sent(proxy: Any, text: str, from_client: bool = True, flow: http.HTTPFlow | None = None) -> http.HTTPFlow:
    """A WebSocket text message (on ``flow``, else a new one) through the broker's hook."""
    flow = flow if flow is not None else _websocket()
    assert flow.websocket is not None
    flow.websocket.messages.append(WebSocketMessage(Opcode.TEXT, from_client, text.encode()))
    await proxy.hook("websocket_message", flow)
    return flow


async def test_a_websocket_message_with_a_placeholder_kills_the_flow(broker) -> None:
    proxy, state = broker
    flow = await _sent(proxy, f"auth {TOKEN}")
    assert flow.websocket is not None
    assert flow.websocket.messages[-1].dropped and not flow.live
    block = records(state)[-1]
    assert (block["event"], block["secret"], block["location"], block["exfiltration"]) == (
        "block",
        "TOKEN",
        "websocket",
        True,
    )


async def test_a_websocket_server_message_with_a_value_is_scrubbed(broker) -> None:
    proxy, state = broker
    flow = await _sent(proxy, f"you sent {VALUE}", from_client=False)
    assert flow.websocket is not None
    assert flow.websocket.messages[-1].content == f"you sent {TOKEN}".encode() and flow.live
    assert _secret_records(state)[-1]["location"] == "websocket"


# -- nothing written holds a value ----------------------------------------------------------------


def _no_value_written(state: Path) -> None:
    for path in state.iterdir():
        if path.is_file():
            data = path.read_bytes()
            for form in _encodings(VALUE) + _encodings(OTHER_VALUE):
                assert form not in data, (path.name, form)


async def test_no_file_the_proxy_writes_holds_a_value(broker) -> None:
    proxy, state = broker
    basic = "Basic " + base64.b64encode(f"me:{TOKEN}".encode()).decode()
    sends = [
        {"headers": {"authorization": f"Bearer {TOKEN}"}},
        {"headers": {"authorization": basic}},
        {"path": f"/v1/search?key={OTHER}", "method": "GET"},
        {"headers": {"content-type": "application/x-www-form-urlencoded"}, "body": f"password={TOKEN}".encode()},
        {"headers": {"content-type": "application/json"}, "body": json.dumps({"p": TOKEN}).encode()},
    ]
    for kwargs in sends:
        flow = await _send(proxy, **kwargs)
        assert flow.response is None
        flow.request.data.host = "203.0.113.11"  # mitmproxy names a tunnel's request by the pinned address
        await proxy.response(answered(flow, _reflecting_body(), **{"content-type": "text/html"}))
    failed = await _send(proxy, headers={"authorization": f"Bearer {TOKEN}"})
    failed.error = Error("connection reset")
    await proxy.error(failed)
    assert failed.request.headers["authorization"] == f"Bearer {TOKEN}"
    assert proxy.shared.responses is not None and proxy.shared.responses.kept == len(sends)
    proxy.shared.responses.close()
    _no_value_written(state)
    assert verify(state / "audit.jsonl").ok


# -- no secrets -----------------------------------------------------------------------------------


async def test_without_secrets_nothing_is_looked_at(tmp_path: Path) -> None:
    write_policy(tmp_path, ["allowed.test", "*.allowed.test"])
    with session_proxy(corral_state_dir=str(tmp_path), **OPTIONS) as proxy:
        assert not proxy.shared.secrets.active
        flow = await _send(proxy, headers={"x-a": TOKEN}, path=f"/v1/{TOKEN}")
        assert flow.response is None and flow.request.headers["x-a"] == TOKEN
        await proxy.response(answered(flow, VALUE.encode()))
        assert flow.response is not None and flow.response.content == VALUE.encode()
        assert not [r for r in records(tmp_path) if r["event"] in ("secret", "secrets")]


# -- after the review: each a way around the broker that is now closed ------------------------------


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("/v1//..//admin", "empty segment"),
        ("/v1/#/../../admin", "'#'"),
        ("/v1/..;/admin", "';'"),
        ("/v1/%2E%2e/admin", "dot segment"),
        ("/v1/./repos", "dot segment"),
        ("/v1/repos;x=1", "';'"),
    ],
)
async def test_a_path_servers_may_read_otherwise_gets_no_secret(broker, path: str, why: str) -> None:
    proxy, state = broker
    flow = await _send(proxy, path=path, headers={"authorization": f"Bearer {TOKEN}"})
    page = _refused(flow)
    block = records(state)[-1]
    assert why in block["reason"] and "TOKEN" in page and VALUE not in page
    assert flow.request.headers["authorization"] == f"Bearer {TOKEN}"
    assert not _secret_records(state)


@pytest.mark.parametrize(
    "override",
    [
        {"headers": {"x-http-method-override": "DELETE"}},
        {"headers": {"X-HTTP-Method": "put"}},
        {"headers": {"x-method-override": "PATCH"}},
        {"path": "/v1/repos?_method=DELETE"},
        {"headers": {"content-type": "application/x-www-form-urlencoded"}, "body": b"a=1&_method=DELETE"},
    ],
)
async def test_a_method_override_to_an_unbound_method_gets_no_secret(broker, override: dict[str, Any]) -> None:
    proxy, _state = broker
    headers = {"authorization": f"Bearer {TOKEN}", **override.get("headers", {})}
    flow = await _send(proxy, path=override.get("path", "/v1/repos"), headers=headers, body=override.get("body", b""))
    assert "method override" in _refused(flow)
    flow = await _send(proxy, headers={"authorization": f"Bearer {TOKEN}", "x-http-method-override": "GET"})
    assert flow.response is None  # a bound method, asked for by override, is fine


async def test_a_secret_goes_only_over_https(broker) -> None:
    proxy, _state = broker
    flow = plain_request(HOST, 80, path="/v1/repos")
    flow.request.method = "POST"
    flow.request.headers["authorization"] = f"Bearer {TOKEN}"
    await proxy.requestheaders(flow)
    await proxy.request(flow)
    assert "only over HTTPS" in _refused(flow)
    assert flow.request.headers["authorization"] == f"Bearer {TOKEN}"


@pytest.mark.parametrize("header", ["user-agent", "referer", "x-forwarded-for", "x-echo"])
async def test_a_placeholder_in_a_header_that_is_no_credential_is_refused(broker, header: str) -> None:
    proxy, state = broker
    flow = await _send(proxy, headers={header: f"x/{TOKEN}"})
    assert "credential headers" in _refused(flow)
    assert records(state)[-1]["location"] == "header"
    assert flow.request.headers[header] == f"x/{TOKEN}"


@pytest.mark.parametrize("header", ["cookie", "x-api-key", "x-auth-token", "private-token"])
async def test_a_credential_header_gets_the_value(broker, header: str) -> None:
    proxy, _state = broker
    flow = await _send(proxy, headers={header: f"k={TOKEN}"})
    assert flow.response is None and flow.request.headers[header] == f"k={VALUE}"


async def test_header_names_the_method_and_trailers_are_looked_at(broker) -> None:
    proxy, state = broker
    flow = await _send(proxy, path="/elsewhere", headers={f"x-{OTHER_VALUE}": "1"})
    assert "value of secret OTHER itself" in _refused(flow)
    assert records(state)[-1]["location"] == "header-name"
    flow = await _send(proxy, headers={f"x-{TOKEN}": "1"})
    assert "header-name" in _refused(flow)
    flow = await _send(proxy, method=TOKEN)
    assert "method" in _refused(flow)
    connect = connect_flow(HOST)
    await proxy.http_connect(connect)
    flow = tunnel_request(connect, HOST, "/elsewhere", "POST")
    flow.request.trailers = http.Headers(x_leak=OTHER_VALUE)
    await proxy.requestheaders(flow)
    await proxy.request(flow)
    assert "trailers" in _refused(flow)


async def test_an_answers_reason_trailers_and_header_names_are_scrubbed(broker) -> None:
    proxy, state = broker
    flow = await _send(proxy, headers={"authorization": f"Bearer {TOKEN}"})
    answered(flow, b"denied", 401, **{f"x-{OTHER_VALUE}": "1"})
    assert flow.response is not None
    flow.response.reason = f"bad token {OTHER_VALUE}".encode()
    flow.response.trailers = http.Headers(grpc_message=f"invalid token {OTHER_VALUE}")
    await proxy.response(flow)
    response = flow.response
    assert response.data.reason == f"bad token {OTHER}".encode()
    assert response.trailers is not None and response.trailers["grpc-message"] == f"invalid token {OTHER}"
    assert f"x-{OTHER}" in response.headers and f"x-{OTHER_VALUE}" not in response.headers
    proxy.shared.responses.close()  # type: ignore[union-attr]
    _no_value_written(state)


@pytest.mark.parametrize("coding", ["gzip, chunked", "identity", "x-custom"])
async def test_an_answer_in_another_transfer_encoding_is_refused(broker, coding: str) -> None:
    proxy, _state = broker
    flow = await _send(proxy, headers={"authorization": f"Bearer {TOKEN}"})
    await proxy.response(answered(flow, b"\x1f\x8b...", **{"transfer-encoding": coding}))
    assert "transfer encoding" in _refused(flow, 502, "secret-reflection")


async def test_an_error_quoting_a_value_is_scrubbed_and_the_flow_killed(broker) -> None:
    proxy, state = broker
    flow = await _send(proxy, headers={"authorization": f"Bearer {TOKEN}"})
    flow.error = Error(f"HTTP/1 protocol error in server response: Invalid header line: b'X-Echo {VALUE}'")
    await proxy.error(flow)
    assert flow.error is not None and VALUE not in flow.error.msg
    assert not flow.live and flow.error.msg == Error.KILLED_MESSAGE  # mitmproxy then sends no 502 page
    _no_value_written(state)
    flow = await _send(proxy, headers={"authorization": f"Bearer {TOKEN}"})
    flow.error = Error("connection reset")
    await proxy.error(flow)
    assert flow.live and flow.error.msg == "connection reset"  # nothing to hide: as mitmproxy made it


async def test_a_request_body_past_the_decoding_cap_is_refused(broker) -> None:
    proxy, _state = broker
    bomb = gzip.compress(bytes(65 * 1024 * 1024), compresslevel=1)
    headers = {"authorization": f"Bearer {TOKEN}", "content-type": "text/plain", "content-encoding": "gzip"}
    connect = connect_flow(HOST)
    await proxy.http_connect(connect)
    flow = tunnel_request(connect, HOST, "/v1/repos", "POST")
    for name, value in headers.items():
        flow.request.headers[name] = value
    flow.request.raw_content = bomb
    await proxy.requestheaders(flow)
    await proxy.request(flow)
    assert "too large" in _refused(flow, 413)


async def test_an_answer_past_the_decoding_cap_is_refused(broker) -> None:
    proxy, _state = broker
    flow = await _send(proxy, headers={"authorization": f"Bearer {TOKEN}"})
    answered(flow, b"", **{"content-type": "text/plain", "content-encoding": "gzip"})
    assert flow.response is not None
    flow.response.raw_content = gzip.compress(bytes(65 * 1024 * 1024), compresslevel=1)
    await proxy.response(flow)
    assert "too large" in _refused(flow, 502, "secret-reflection")


@pytest.fixture
def threaded(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the functions the broker hands to asyncio.to_thread (which still runs them)."""
    import asyncio

    from corral.proxy.addons import broker as module

    names: list[str] = []
    to_thread = asyncio.to_thread

    async def recording(work: Any, *args: Any) -> Any:
        names.append(work.__name__)
        return await to_thread(work, *args)

    monkeypatch.setattr(module.asyncio, "to_thread", recording)
    return names


async def test_a_long_body_is_scanned_off_the_event_loop(broker, threaded: list[str]) -> None:
    from corral.proxy.addons import broker as module

    proxy, _state = broker
    body = b"x" * (module.THREAD_MIN + 1)
    flow = await _send(proxy, headers={"content-type": "text/plain"}, body=body + TOKEN.encode())
    assert flow.response is None and flow.request.content == body + VALUE.encode()
    await proxy.response(answered(flow, body + OTHER_VALUE.encode(), **{"content-type": "text/plain"}))
    assert flow.response is not None and flow.response.content == body + OTHER.encode()
    assert threaded == ["_read", "_scrub_body"]
    small = await _send(proxy, headers={"content-type": "text/plain"}, body=TOKEN.encode())
    assert small.response is None and threaded == ["_read", "_scrub_body"]  # short: on the loop


async def test_a_compressed_body_that_may_decode_long_is_scanned_off_the_event_loop(
    broker, threaded: list[str]
) -> None:
    from corral.proxy.addons import broker as module

    proxy, _state = broker
    flow = await _send(proxy, headers={"authorization": f"Bearer {TOKEN}"})
    answered(flow, b"", **{"content-type": "text/plain", "content-encoding": "gzip"})
    assert flow.response is not None
    flow.response.raw_content = gzip.compress(bytes(8 * module.THREAD_MIN) + OTHER_VALUE.encode())
    assert module.THREAD_MIN_COMPRESSED < len(flow.response.raw_content) < module.THREAD_MIN
    await proxy.response(flow)
    assert threaded == ["_scrub_body"] and flow.response.content.endswith(OTHER.encode())  # type: ignore[union-attr]


class Proxyserver:
    """mitmproxy's proxyserver addon as the broker sees it: a handler per live client connection."""

    def __init__(self) -> None:
        self.connections: dict[str, Any] = {}
        self.closed: list[Any] = []

    def serve(self, flow: http.HTTPFlow) -> None:
        server = self

        class Handler:
            def close_connection(self, connection: Any) -> None:
                server.closed.append(connection)

        self.connections[flow.client_conn.id] = Handler()


async def test_the_connection_of_a_websocket_carrying_a_placeholder_is_closed(broker) -> None:
    proxy, _state = broker
    server = Proxyserver()
    proxy.tctx.master.addons.add(server)
    flow = _websocket()
    server.serve(flow)
    assert flow.websocket is not None
    await _sent(proxy, f"auth {TOKEN}", flow=flow)
    assert server.closed == [flow.client_conn]  # mitmproxy's WebSocket layer would only drop the message
    await _sent(proxy, "hello", flow=flow)
    assert server.closed == [flow.client_conn]


async def test_an_error_quoting_a_value_closes_the_client_connection_before_any_page(broker) -> None:
    """mitmproxy answers an answer it refuses to pass (an invalid header name) with a page quoting
    it, whatever the error hook did to the flow; a closed client connection gets no page."""
    proxy, _state = broker
    server = Proxyserver()
    proxy.tctx.master.addons.add(server)
    flow = await _send(proxy, headers={"authorization": f"Bearer {TOKEN}"})
    server.serve(flow)
    flow.error = Error(f"Received invalid header name: b'x-leak-{VALUE}' from server, refusing")
    await proxy.error(flow)
    assert server.closed == [flow.client_conn]
    flow = await _send(proxy, headers={"authorization": f"Bearer {TOKEN}"})
    server.serve(flow)
    flow.error = Error("connection reset")
    await proxy.error(flow)
    assert server.closed != [] and flow.client_conn not in server.closed  # nothing to hide: left alone
